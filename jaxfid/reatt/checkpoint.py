"""ReAtt ``MODEL_DIR``s: :func:`load_reatt`, and their loader registration.

:func:`load_reatt` loads a ReAtt run as the ReAtt model (FiD plus the
retrieval head) with its parameters and vocabulary; what ``jaxfid index
reatt``, ``INIT_CHECKPOINT`` of a ReAtt run and the tests use. Importing this
module also registers it as the loader of
:func:`jaxfid.checkpoints.load.load_checkpoint` for runs whose
``jaxfid_config.json`` says ``"method": "reatt"``.
"""
from __future__ import annotations

import json
import os

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.load import METHOD_LOADERS, model_dir_vocabulary
from jaxfid.core import paths
from jaxfid.core.errors import InputError
from jaxfid.reatt.model import ReAttModel, model_from_run_config
from jaxfid.t5.config import T5Config

METHOD = "reatt"


def load_reatt(path: str, *, dtype: str | None = None, which: str = "auto"
               ) -> tuple[ReAttModel, dict, str | None]:
  """(model, params, spiece path or None) of a ReAtt MODEL_DIR."""
  path = os.fspath(path)
  config_file = paths.join(path, checkpointing.CONFIG_FILE)
  if not paths.exists(config_file):
    raise InputError(path, f"not a jaxfid MODEL_DIR (no {checkpointing.CONFIG_FILE})")
  try:
    run = checkpointing.read_run_config(path)
  except json.JSONDecodeError as e:
    raise InputError(config_file, f"bad JSON: {e.msg}", where=e.lineno) from None
  if run.get("method") != METHOD:
    raise InputError(config_file, f"not a ReAtt model (method "
                     f"{run.get('method')!r})")
  config = T5Config.from_dict(run["model"]).replace(dropout_rate=0.0)
  if dtype:
    config = config.replace(dtype=dtype)
  model = model_from_run_config(run, config)
  try:
    params, _, _ = checkpointing.restore_params(path, model.abstract_params(),
                                                which)
  except FileNotFoundError as e:
    raise InputError(path, str(e).split(": ", 1)[-1]) from None
  return model, params, model_dir_vocabulary(path)


METHOD_LOADERS.register(METHOD, load_reatt)
