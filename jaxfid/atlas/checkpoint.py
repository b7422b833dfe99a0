"""Atlas ``MODEL_DIR``s: the run config's model, :func:`load_atlas` (reader
and retriever) and the MODEL_DIR loader of its reader.

An Atlas run config holds the reader's T5 config under ``"model"`` (as
FiD's) and the retriever's under ``"retriever"`` (its T5 config and
:class:`~jaxfid.dual_encoder.model.DualEncoderConfig`). Importing this
module registers :func:`load_atlas_reader` as the loader of
:func:`jaxfid.checkpoints.load.load_checkpoint` for ``"method": "atlas"``:
``jaxfid predict`` / ``eval`` read an Atlas run as its FiD reader.
"""
from __future__ import annotations

import os


from jaxfid.atlas.config import AtlasConfig
from jaxfid.atlas.model import READER, AtlasModel
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.load import (METHOD_LOADERS, inference_config,
                                     model_dir_vocabulary)
from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.model import DualEncoder, DualEncoderConfig
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

METHOD = "atlas"


def run_config_fields(model: AtlasModel) -> dict:
  """What an Atlas run config adds to its reader's."""
  retriever = model.retriever
  return {"method": METHOD, "atlas": model.atlas.to_dict(),
          "retriever": {"model": retriever.config.to_dict(),
                        "dual_encoder": retriever.settings.to_dict()}}


def is_atlas_dir(path: str) -> bool:
  return (os.path.exists(os.path.join(path, checkpointing.CONFIG_FILE))
          and checkpointing.read_run_config(path).get("method") == METHOD)


def model_from_run_config(run: dict, dtype: str | None = None) -> AtlasModel:
  config = inference_config(run["model"], dtype)
  retriever = DualEncoder(
      T5Config.from_dict(run["retriever"]["model"]),
      DualEncoderConfig.from_dict(run["retriever"]["dual_encoder"]))
  # a run config without prompt_format is of a run trained on FiD's rows
  atlas = AtlasConfig.from_dict({"prompt_format": "fid", **run["atlas"]})
  return AtlasModel(EncoderDecoderModel(config), retriever, atlas)


def load_atlas(path: str, *, dtype: str | None = None, which: str = "auto"
               ) -> tuple[AtlasModel, dict]:
  """(model, params {"reader", "retriever"}) of an Atlas MODEL_DIR."""
  path = os.fspath(path)
  if not is_atlas_dir(path):
    raise InputError(path, "not an Atlas MODEL_DIR")
  model = model_from_run_config(checkpointing.read_run_config(path), dtype)
  return model, checkpointing.restore_model(path, model.abstract_params(),
                                            which)


def load_atlas_reader(path: str, *, dtype: str | None = None,
                      which: str = "auto"
                      ) -> tuple[EncoderDecoderModel, dict, str | None]:
  """An Atlas MODEL_DIR as its reader: (model, params, spiece or None)."""
  model, params = load_atlas(path, dtype=dtype, which=which)
  return model.reader, params[READER], model_dir_vocabulary(path)


METHOD_LOADERS.register(METHOD, load_atlas_reader)
