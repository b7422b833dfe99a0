"""seqio tasks for jaxfid; importing this package registers them.

See :mod:`tasks.qa` for the FiD open-domain QA tasks (``nq_open_fid``,
``trivia_qa_fid``, ``squad_open_fid`` from FiD files; ``natural_questions_open
_fid``, ``trivia_qa_unfiltered_fid``, ``squad_v1_1_fid`` from TFDS plus
retrieval results) and :mod:`tasks.config` for their gin settings.
Importing imports seqio and TensorFlow.
"""
from tasks.qa import TASK_NAMES, register_tasks

__all__ = ["TASK_NAMES", "register_tasks"]
