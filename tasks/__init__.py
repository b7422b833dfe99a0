"""seqio tasks for jaxfid; importing this package registers them.

See :mod:`tasks.qa` for the FiD open-domain QA tasks (``nq_open_fid``,
``trivia_qa_fid``, ``squad_open_fid`` from FiD files; ``natural_questions_open
_fid``, ``trivia_qa_unfiltered_fid``, ``squad_v1_1_fid`` from TFDS plus
retrieval results) and :mod:`tasks.config` for their gin settings, and
:mod:`tasks.lmbff` for ReFusion's few-shot classification tasks
(``lmbff_<task>_16_<seed>`` from LM-BFF's files, ``glue_<task>_prompt`` from
TFDS). Importing imports seqio and TensorFlow.
"""
from tasks.lmbff import TASK_NAMES as LMBFF_TASK_NAMES
from tasks.lmbff import register_tasks as register_lmbff_tasks
from tasks.qa import TASK_NAMES, register_tasks

__all__ = ["LMBFF_TASK_NAMES", "TASK_NAMES", "register_lmbff_tasks",
           "register_tasks"]
