"""seqio tasks for jaxfid; importing this package registers them.

FiD open-domain QA tasks (:mod:`tasks.qa`, settings in :mod:`tasks.config`),
ReFusion's few-shot classification tasks (:mod:`tasks.lmbff`) and the
``seqio`` example source of jaxfid's FiD trainer (:mod:`tasks.fid_examples`).
Importing imports seqio and TensorFlow.
"""
from tasks import fid_examples
from tasks.lmbff import TASK_NAMES as LMBFF_TASK_NAMES
from tasks.lmbff import register_tasks as register_lmbff_tasks
from tasks.qa import FID_TASKS, TASK_NAMES, add_fid_task, register_tasks

__all__ = ["FID_TASKS", "LMBFF_TASK_NAMES", "TASK_NAMES", "add_fid_task",
           "fid_examples", "register_lmbff_tasks", "register_tasks"]
