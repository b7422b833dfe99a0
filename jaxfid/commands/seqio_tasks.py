"""The seqio tasks, imported by ``jaxfid train`` (``MIXTURE_OR_TASK_NAME``)
and ``jaxfid eval`` only inside their command functions; TensorFlow runs
``tf.data`` only and is kept off the accelerators (as t5x).
"""
from __future__ import annotations

import gin

from jaxfid.core.errors import InputError

MIXTURE_OR_TASK_NAME = "MIXTURE_OR_TASK_NAME"
_HINT = "pip install 'jaxfid[seqio]' (tensorflow, seqio, tfds)"


def gin_macro(name: str, default=None):
  """The value gin's macro ``name`` is bound to (after parsing), else
  ``default``."""
  try:
    return gin.query_parameter(f"%{name}")
  except ValueError:
    return default


def import_tasks(where: str = MIXTURE_OR_TASK_NAME):
  """Imports (so registers) jaxfid's seqio tasks; returns the package.

  Raises InputError if seqio, TensorFlow or ``tasks`` is missing.
  """
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise InputError(where, f"seqio tasks need TensorFlow: {_HINT}") from None
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # TensorFlow already initialised its devices
    pass
  try:
    import tasks  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    if e.name not in ("tasks", "seqio"):
      raise
    raise InputError(where, f"the seqio tasks cannot be imported ({e}): "
                     f"{_HINT}") from None
  return tasks
