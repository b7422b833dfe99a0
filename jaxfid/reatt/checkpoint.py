"""ReAtt ``MODEL_DIR``s: :func:`load_reatt`, and their loader registration.

:func:`load_reatt` loads a ReAtt run as the ReAtt model (FiD plus the
retrieval head) with its parameters and vocabulary; what ``jaxfid index
reatt``, ``INIT_CHECKPOINT`` of a ReAtt run and the tests use. Importing this
module also registers it as the loader of
:func:`jaxfid.checkpoints.load.load_checkpoint` for runs whose
``jaxfid_config.json`` says ``"method": "reatt"``.
"""
from __future__ import annotations

import os

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.load import (METHOD_LOADERS, inference_config,
                                     model_dir_vocabulary)
from jaxfid.reatt.model import ReAttModel, model_from_run_config

METHOD = "reatt"


def load_reatt(path: str, *, dtype: str | None = None, which: str = "auto"
               ) -> tuple[ReAttModel, dict, str | None]:
  """(model, params, spiece path or None) of a ReAtt MODEL_DIR."""
  path = os.fspath(path)
  run = checkpointing.read_method_config(path, METHOD)
  model = model_from_run_config(run, inference_config(run["model"], dtype))
  params = checkpointing.restore_model(path, model.abstract_params(), which)
  return model, params, model_dir_vocabulary(path)


METHOD_LOADERS.register(METHOD, load_reatt)
