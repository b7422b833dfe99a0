"""ReFusion ``MODEL_DIR``s: :func:`load_refusion`, and their loader registration.

:func:`load_refusion` loads the model with its fusion modules (fixed to the
searched structure) and parameters; :func:`jaxfid.checkpoints.load.
load_checkpoint` loads a ReFusion MODEL_DIR as its T5 backbone.
"""
from __future__ import annotations

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.load import METHOD_LOADERS, load_encoder_decoder
from jaxfid.refusion.fusion import FusionConfig
from jaxfid.refusion.model import ReFusionModel
from jaxfid.refusion.search import read_structure
from jaxfid.t5.config import T5Config

METHOD = "refusion"


def load_refusion(model_dir: str, which: str = "latest"
                  ) -> tuple[ReFusionModel, dict]:
  """A trained ReFusion run: the model with the structure the search wrote
  (else its configured scheme), and params."""
  run = checkpointing.read_method_config(model_dir, METHOD)
  fusion = FusionConfig.from_dict(run["fusion"])
  record = read_structure(model_dir)
  if record is not None:
    fusion = FusionConfig.from_dict({**fusion.to_dict(), "search": False,
                                     "structure": list(record["structure"])})
  model = ReFusionModel(T5Config.from_dict(run["model"]), fusion)
  return model, checkpointing.restore_model(model_dir, model.abstract_params(),
                                           which)


METHOD_LOADERS.register(METHOD, load_encoder_decoder)
