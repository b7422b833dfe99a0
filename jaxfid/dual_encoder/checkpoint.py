"""Loading a dual encoder from any checkpoint jaxfid reads.

:func:`load_dual_encoder` accepts a jaxfid MODEL_DIR (a trained dual
encoder, or any other model's encoder, mean-pooled), a HF T5 directory
(``T5ForConditionalGeneration``, ``T5EncoderModel`` or FiD readers), a
sentence-transformers directory (GTR, Sentence-T5: pooling, ``2_Dense``
projection and ``Normalize`` from its modules) or a T5X checkpoint. The
vocabulary is the checkpoint's ``spiece.model``, else the bundled one.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxfid.checkpoints import hf, names
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.configs import config_from_hf_json
from jaxfid.checkpoints.detect import detect_format, load_flat
from jaxfid.checkpoints.load import (
    METHOD_LOADERS, load_checkpoint, load_encoder_decoder)
from jaxfid.checkpoints.torch_bin import read_torch_bin
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.dual_encoder.model import (
    DualEncoder, DualEncoderConfig, params_fingerprint)
from jaxfid.t5.config import T5Config

METHOD = "dual_encoder"
_ENCODER_PREFIXES = ("token_embedder/", "encoder/")


@dataclasses.dataclass
class LoadedEncoder:
  """A dual encoder ready to embed: ``encoder``, host ``params``,
  ``tokenizer``, ``source`` path, ``kind`` ('dual_encoder', 'jaxfid',
  'hf', 'sentence-transformers', 't5x') and ``fingerprint``."""
  encoder: DualEncoder
  params: dict
  tokenizer: Any
  source: str
  kind: str
  fingerprint: str


# --------------------------------------------------------------------------
# HF encoder weights


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
  return names.unflatten({k: jnp.asarray(np.asarray(v, np.float32))
                    for k, v in flat.items()})


def read_hf_encoder(directory) -> tuple[dict, dict[str, np.ndarray]]:
  """T5Config fields and the encoder's flat parameters of a HF directory
  (decoder not read); InputError for missing or mis-shaped tensors."""
  directory = Path(directory)
  config_path = directory / "config.json"
  if not config_path.is_file():
    raise InputError(config_path, "missing: a Hugging Face T5 checkpoint "
                     "needs config.json beside its weights")
  fields = config_from_hf_json(hf.read_json(config_path), config_path)
  weights = hf.WeightFiles(directory)
  fid = hf.is_fid_layout(weights.files)
  raw_of = {}
  for raw in weights.files:
    raw_of[names.fid_wrapper_to_hf(raw) if fid else raw] = raw
  if "shared.weight" not in raw_of and "encoder.embed_tokens.weight" in raw_of:
    raw_of["shared.weight"] = raw_of.pop("encoder.embed_tokens.weight")
  expected = {r.hf: r for r in names.renames(fields)
              if r.path.startswith(_ENCODER_PREFIXES)}
  for name in expected:
    if name not in raw_of:
      raise InputError(weights.source, f"missing tensor {name}")
  for name, raw in raw_of.items():
    if (name.startswith("encoder.") and name not in expected
        and name not in names.HF_EMBEDDING_COPIES):
      raise InputError(weights.files[raw], f"unexpected tensor {raw} (not a "
                       "parameter of the encoder config.json describes)")
  shapes = names.param_shapes(fields)
  flat = {}
  for name, rename in expected.items():
    array = weights.load(raw_of[name])
    want = names.hf_shape(rename, shapes[rename.path])
    if tuple(array.shape) != tuple(want):
      raise InputError(weights.files[raw_of[name]], f"tensor {raw_of[name]} "
                       f"has shape {list(array.shape)}, expected {list(want)} "
                       "from config.json")
    flat[rename.path] = np.ascontiguousarray(
        rename.from_hf(np.asarray(array, np.float32)))
  return fields, flat


# --------------------------------------------------------------------------
# sentence-transformers modules


def _module_dirs(directory: Path) -> dict[str, Path]:
  """sentence-transformers module kind ('Transformer', ...) -> folder."""
  modules_file = directory / "modules.json"
  found: dict[str, Path] = {}
  if modules_file.is_file():
    modules = hf.read_json(modules_file)
    if not isinstance(modules, list):
      raise InputError(modules_file, "expected a JSON list of modules")
    for entry in modules:
      if not isinstance(entry, dict) or "type" not in entry:
        raise InputError(modules_file, "each module needs a 'type'")
      kind = str(entry["type"]).rsplit(".", 1)[-1]
      found.setdefault(kind, directory / str(entry.get("path", "")))
    return found
  for kind, name in (("Pooling", "1_Pooling"), ("Dense", "2_Dense"),
                     ("Normalize", "3_Normalize")):
    if (directory / name).is_dir():
      found[kind] = directory / name
  return found


def _read_dense(folder: Path, d_model: int) -> tuple[dict, dict]:
  """The projection of a sentence-transformers Dense module."""
  config = hf.read_json(folder / "config.json")
  activation = str(config.get("activation_function", "")).rsplit(".", 1)[-1]
  activations = {"Identity": "identity", "Tanh": "tanh", "": "identity"}
  if activation not in activations:
    raise InputError(folder / "config.json", f"activation_function "
                     f"{config.get('activation_function')!r} is not supported "
                     "(Identity or Tanh)")
  for candidate in ("model.safetensors", "pytorch_model.bin"):
    path = folder / candidate
    if path.is_file():
      tensors = (hf.read_safetensors(path) if candidate.endswith("safetensors")
                 else read_torch_bin(path))
      break
  else:
    raise InputError(folder, "Dense module without model.safetensors or "
                     "pytorch_model.bin")
  if "linear.weight" not in tensors:
    raise InputError(path, "missing tensor linear.weight")
  weight = np.asarray(tensors["linear.weight"], np.float32)
  if weight.ndim != 2 or weight.shape[1] != d_model:
    raise InputError(path, f"linear.weight has shape {list(weight.shape)}, "
                     f"expected [out, {d_model}]")
  projection = {"kernel": jnp.asarray(np.ascontiguousarray(weight.T))}
  if "linear.bias" in tensors:
    projection["bias"] = jnp.asarray(np.asarray(tensors["linear.bias"],
                                                np.float32))
  settings = {"projection_dim": int(weight.shape[0]),
              "projection_bias": "bias" in projection,
              "projection_activation": activations[activation]}
  return projection, settings


def _pooling(folder: Path) -> str:
  config = hf.read_json(folder / "config.json")
  if config.get("pooling_mode_mean_tokens"):
    return "mean"
  if config.get("pooling_mode_cls_token"):
    return "first"
  raise InputError(folder / "config.json", "only mean-token or first-token "
                   "(cls) pooling is supported")


def _load_hf_like(path: Path):
  """(kind, fields, encoder params, projection, settings dict, spiece dir)."""
  modules = _module_dirs(path)
  weights_dir = modules.get("Transformer", path)
  fields, flat = read_hf_encoder(weights_dir)
  settings: dict = {}
  projection = None
  if "Pooling" in modules:
    settings["pooling"] = _pooling(modules["Pooling"])
  if "Dense" in modules:
    projection, dense = _read_dense(modules["Dense"], fields["d_model"])
    settings.update(dense)
  if modules:
    settings["normalize"] = "Normalize" in modules
  kind = "sentence-transformers" if modules else "hf"
  spiece_dir = weights_dir if (weights_dir / "spiece.model").is_file() else path
  return kind, fields, _unflatten(flat), projection, settings, spiece_dir


# --------------------------------------------------------------------------
# jaxfid MODEL_DIRs


def _restore_dual_encoder(path: str, run: dict, which: str):
  config = T5Config.from_dict(run["model"])
  settings = DualEncoderConfig.from_dict(run.get(METHOD, {}))
  encoder = DualEncoder(config, settings)
  return encoder, checkpointing.restore_model(path, encoder.abstract_params(),
                                              which)


def dual_encoder_run_config(encoder: DualEncoder, **extra) -> dict:
  """``jaxfid_config.json`` of a dual encoder's MODEL_DIR (what
  :func:`load_dual_encoder` reads back): the method, the T5 config without
  decoder layers, the :class:`DualEncoderConfig` and ``extra`` fields."""
  return {"method": METHOD, "model": encoder.config.to_dict(),
          METHOD: encoder.settings.to_dict(), **extra}


# --------------------------------------------------------------------------
# the one entry point


def load_dual_encoder(path, *, dtype: str | None = None,
                      which: str = "auto", **overrides) -> LoadedEncoder:
  """A dual encoder from any supported checkpoint (module docstring), in
  ``dtype`` activations; ``which``: a MODEL_DIR's 'best', 'latest' or
  'auto'; ``overrides``: DualEncoderConfig fields that do not shape the
  parameters. InputError for a missing or unreadable checkpoint."""
  source = os.fspath(path)
  path = Path(source)
  if not path.exists():
    raise InputError(source, "no such checkpoint")
  overrides = {k: v for k, v in overrides.items() if v is not None}
  fixed = {"projection_dim", "projection_bias", "shared"} & set(overrides)
  if fixed:
    raise ValueError(f"cannot override {sorted(fixed)} when loading")
  spiece_dir: Path | None = path
  if (path / checkpointing.CONFIG_FILE).is_file():
    run = checkpointing.read_run_config(source)
    if run.get("method") == METHOD:
      kind = METHOD
      encoder, params = _restore_dual_encoder(source, run, which)
      settings = encoder.settings
    else:
      kind = "jaxfid"
      model, full, _ = load_checkpoint(source, which=which)
      settings = DualEncoderConfig()
      encoder = DualEncoder(model.config, settings)
      params = encoder.from_encoder_params(full)
  elif (path / "modules.json").is_file() or detect_format(
      path) in ("hf", "fid"):
    kind, fields, t5, projection, found, spiece_dir = _load_hf_like(path)
    settings = DualEncoderConfig().replace(**found)
    encoder = DualEncoder(T5Config.from_dict(fields), settings)
    params = encoder.from_encoder_params(t5, projection)
  else:
    kind = "t5x"
    fields, flat, spiece = load_flat(path)
    flat = {k: v for k, v in flat.items() if k.startswith(_ENCODER_PREFIXES)}
    settings = DualEncoderConfig()
    encoder = DualEncoder(T5Config.from_dict(fields), settings)
    params = encoder.from_encoder_params(_unflatten(flat))
    spiece_dir = Path(spiece).parent if spiece else None
  config = encoder.config.replace(dropout_rate=0.0)
  if dtype:
    config = config.replace(dtype=dtype)
  try:
    settings = settings.replace(**overrides)
  except InputError as e:
    raise InputError(source, e.message) from None
  encoder = DualEncoder(config, settings)
  fingerprint = params_fingerprint(
      params, json.dumps(dataclasses.asdict(config), sort_keys=True))
  return LoadedEncoder(encoder, params, load_tokenizer(spiece_dir), source,
                       kind, fingerprint)


# As a plain T5 (load_checkpoint), a dual encoder's MODEL_DIR is its
# encoder-decoder config with the shared tower's weights: what ReFusion
# reads an encoder as.
METHOD_LOADERS.register(METHOD, load_encoder_decoder)
