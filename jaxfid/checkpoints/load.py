"""Load a T5 from any supported checkpoint: ``jaxfid.load_t5(path)``.

HF directories, original FiD readers, T5X checkpoints and jaxfid
``MODEL_DIR``s; a MODEL_DIR is loaded by the loader :data:`METHOD_LOADERS`
holds for its ``"method"`` (``"fid"`` built in; each method package
registers its own, all via :mod:`jaxfid.methods`).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.detect import (detect_format, load_flat,
                                      register_loader)
from jaxfid.checkpoints.names import (  # noqa: F401 (unflatten re-exported)
    flatten, param_shapes, unflatten)
from jaxfid.core import paths
from jaxfid.core.errors import InputError
from jaxfid.core.registry import Registry
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

# fn(path, *, dtype, which) -> (model, params, spiece path or None)
RunLoader = Callable[..., tuple[Any, dict, str | None]]
METHOD_LOADERS: Registry[RunLoader] = Registry(
    "MODEL_DIR loader for method",
    "import jaxfid.methods, which registers every method's loader")


def params_from_flat(model: EncoderDecoderModel, flat: dict[str, np.ndarray],
                     source: str) -> dict:
  """Check names and shapes against the model; float32 nested params."""
  expected = flatten(model.abstract_params())
  missing = sorted(set(expected) - set(flat))
  extra = sorted(set(flat) - set(expected))
  if missing:
    raise InputError(source, f"checkpoint lacks parameter {missing[0]}"
                     + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
  if extra:
    raise InputError(source, f"checkpoint has unexpected parameter {extra[0]}"
                     + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
  for name, spec in expected.items():
    if tuple(flat[name].shape) != tuple(spec.shape):
      raise InputError(source, f"parameter {name} has shape "
                       f"{tuple(flat[name].shape)}, expected {tuple(spec.shape)}")
  return unflatten({k: jnp.asarray(np.asarray(v, np.float32))
                    for k, v in flat.items()})


def inference_config(fields: dict, dtype: str | None = None) -> T5Config:
  """A loaded model's T5Config for inference: no dropout, the attention the
  platform it runs on takes (``'auto'``, whatever the training run chose),
  and ``dtype`` when given."""
  config = T5Config.from_dict(fields).replace(dropout_rate=0.0,
                                              attention="auto")
  return config.replace(dtype=dtype) if dtype else config


def load_encoder_decoder(path: str, *, dtype: str | None = None,
                         which: str = "auto"
                         ) -> tuple[EncoderDecoderModel, dict, str | None]:
  """A MODEL_DIR as the plain T5 of its run config's ``"model"`` (FiD's)."""
  run = checkpointing.read_method_config(path)
  model = EncoderDecoderModel(inference_config(run["model"], dtype))
  params = checkpointing.restore_model(path, model.abstract_params(), which)
  return model, params, model_dir_vocabulary(path)


def model_dir_vocabulary(path: str) -> str | None:
  """A MODEL_DIR's ``spiece.model`` as a local file (downloaded from a
  bucket), or None when it has none."""
  spiece = paths.join(path, "spiece.model")
  if not paths.exists(spiece):
    return None
  if not paths.is_url(spiece):
    return spiece
  local = os.path.join(tempfile.mkdtemp(prefix="jaxfid-vocab-"), "spiece.model")
  paths.copy(spiece, local)
  return local


METHOD_LOADERS.register("fid", load_encoder_decoder)


def load_checkpoint(path: str, *, dtype: str | None = None,
                    which: str = "auto") -> tuple[EncoderDecoderModel, dict, str | None]:
  """(model, params, spiece path or None) from any supported checkpoint
  (``which``: a MODEL_DIR's 'best', 'latest' or 'auto'); InputError for a
  missing or unreadable checkpoint or an unregistered method."""
  path = os.fspath(path)
  if not paths.exists(path):
    raise InputError(path, "no such checkpoint")
  fmt = detect_format(path)
  if fmt == "jaxfid":
    config_file = paths.join(path, checkpointing.CONFIG_FILE)
    method = checkpointing.read_run_config(path).get("method", "fid")
    loader = METHOD_LOADERS.get(method, where=config_file)
    return loader(path, dtype=dtype, which=which)
  fields, flat, spiece = load_flat(path, fmt)
  model = EncoderDecoderModel(inference_config(fields, dtype))
  return model, params_from_flat(model, flat, path), spiece


def checkpoint_passage_eos(path: str) -> bool:
  """Whether the passages a checkpoint was trained on end with EOS: a
  MODEL_DIR's ``passage_eos`` (True when absent); False for original FiD
  readers (transformers 3.0.2 appended none); else True."""
  path = os.fspath(path)
  fmt = detect_format(path)
  if fmt == "jaxfid":
    return bool(checkpointing.read_run_config(path).get("passage_eos", True))
  return fmt != "fid"


class LoadedT5:
  """A loaded, deterministic T5: ``logits = model(encoder_input_tokens=..., decoder_input_tokens=...)``."""

  def __init__(self, model: EncoderDecoderModel, params: dict, tokenizer=None):
    self.model = model
    self.params = params
    self.config = model.config
    self.tokenizer = tokenizer
    self._logits = jax.jit(lambda p, e, d: model.logits(p, e, d))

  def __call__(self, encoder_input_tokens, decoder_input_tokens) -> jax.Array:
    """int32 [B, L] (or [B, P, L] for FiD), [B, T] -> float32 [B, T, vocab]."""
    return self._logits(self.params, jnp.asarray(encoder_input_tokens, jnp.int32),
                        jnp.asarray(decoder_input_tokens, jnp.int32))

  def generate(self, encoder_input_tokens, *, max_decode_len: int = 20,
               num_beams: int = 1, alpha: float = 0.6, **kwargs) -> jax.Array:
    """Greedy or beam-search decoding -> int32 [B, max_decode_len]."""
    return self.model.jit_predict(
        self.params, jnp.asarray(encoder_input_tokens, jnp.int32),
        max_decode_len=max_decode_len, num_beams=num_beams, alpha=alpha,
        **kwargs)


def load_t5(path, *, dtype: str | None = None) -> LoadedT5:
  """Load an HF directory, FiD reader, T5X checkpoint or jaxfid MODEL_DIR."""
  model, params, spiece = load_checkpoint(path, dtype=dtype)
  tokenizer = load_tokenizer(os.path.dirname(spiece) if spiece else None)
  return LoadedT5(model, params, tokenizer)


def _load_model_dir_flat(path) -> tuple[dict, dict[str, np.ndarray],
                                         Path | None]:
  """A jaxfid MODEL_DIR for :func:`~jaxfid.checkpoints.detect.load_flat`
  (``jaxfid convert``): its T5's fields and parameters (a method's own
  parameters, such as ReAtt's head weights, are left out)."""
  model, params, spiece = load_checkpoint(os.fspath(path))
  fields = model.config.to_dict()
  wanted = param_shapes(fields)
  flat = {k: np.asarray(v, np.float32)
          for k, v in flatten(jax.device_get(params)).items() if k in wanted}
  return fields, flat, Path(spiece) if spiece else None


register_loader("jaxfid", _load_model_dir_flat)
