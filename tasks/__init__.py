"""seqio tasks for jaxfid; importing this package registers them.

See :mod:`tasks.qa` for the FiD open-domain QA tasks (``nq_open_fid``,
``trivia_qa_fid``, ``squad_open_fid`` from FiD files; ``natural_questions_open
_fid``, ``trivia_qa_unfiltered_fid``, ``squad_v1_1_fid`` from TFDS plus
retrieval results) and :mod:`tasks.config` for their gin settings, and
:mod:`tasks.lmbff` for ReFusion's few-shot classification tasks
(``lmbff_<task>_16_<seed>`` from LM-BFF's files, ``glue_<task>_prompt`` from
TFDS). Importing also registers the ``seqio`` example source of jaxfid's FiD
trainer (:mod:`tasks.fid_examples`: ``jaxfid train`` with
``MIXTURE_OR_TASK_NAME``). Importing imports seqio and TensorFlow.
"""
from tasks import fid_examples
from tasks.lmbff import TASK_NAMES as LMBFF_TASK_NAMES
from tasks.lmbff import register_tasks as register_lmbff_tasks
from tasks.qa import FID_TASKS, TASK_NAMES, add_fid_task, register_tasks

__all__ = ["FID_TASKS", "LMBFF_TASK_NAMES", "TASK_NAMES", "add_fid_task",
           "fid_examples", "register_lmbff_tasks", "register_tasks"]
