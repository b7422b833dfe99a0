"""Which checkpoint format a path holds, and one loader for all of them.

:func:`detect_format` reads only file names and, for HF directories, tensor
names: ``'jaxfid'`` (``jaxfid_config.json``; loaded by the hook registered
with :func:`register_loader`), ``'hf'`` / ``'fid'`` (``encoder.encoder.``
prefix), ``'t5x'`` / ``'t5x-orbax'``. :func:`load_flat` loads any of them and
returns the SentencePiece model beside it, if any.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxfid.checkpoints import hf, t5x
from jaxfid.core import paths
from jaxfid.core.errors import InputError

FORMATS = ("hf", "fid", "t5x", "t5x-orbax", "jaxfid")
JAXFID_MARKER = "jaxfid_config.json"

# fn(path) -> (fields, flat_params, spiece_path_or_None)
Loader = Callable[[Path], tuple[dict, dict[str, np.ndarray], "Path | None"]]
_LOADERS: dict[str, Loader] = {}


def register_loader(fmt: str, fn: Loader) -> None:
  """Registers (or replaces) the loader :func:`load_flat` uses for ``fmt``."""
  if fmt not in FORMATS:
    raise ValueError(f"unknown checkpoint format {fmt!r}; known: {FORMATS}")
  _LOADERS[fmt] = fn


def _has_hf_weights(directory: Path) -> bool:
  return any((directory / name).is_file() for name in hf.WEIGHT_FILES)


def detect_format(path) -> str:
  """One of :data:`FORMATS` for ``path``; InputError if none is recognised.

  The one place a checkpoint's format is decided. A jaxfid MODEL_DIR may be
  a bucket URL; the other formats are local."""
  if paths.exists(paths.join(path, JAXFID_MARKER)):
    return "jaxfid"
  if paths.is_url(path):
    raise InputError(path, "does not exist" if not paths.exists(path)
                     else f"has no {JAXFID_MARKER}: only a jaxfid model "
                     "directory is read from a bucket")
  path = Path(path)
  if not path.exists():
    raise InputError(path, "does not exist")
  if path.is_dir() and (path / "config.json").is_file() and _has_hf_weights(
      path):
    return "fid" if hf.is_fid_layout(hf.WeightFiles(path).files) else "hf"
  if path.is_dir() and (path / "config.json").is_file():
    raise InputError(path, "has config.json but no weights (expected one of "
                     + ", ".join(hf.WEIGHT_FILES) + ")")
  if path.is_dir() and _has_hf_weights(path):
    raise InputError(path / "config.json", "missing: a Hugging Face T5 "
                     "checkpoint needs config.json beside its weights")
  try:
    _, kind = t5x.locate(path)
  except InputError:
    raise InputError(path, "not a recognised checkpoint: expected a Hugging "
                     "Face directory (config.json + model.safetensors or "
                     "pytorch_model.bin), an original FiD reader, a T5X "
                     "checkpoint_<step> directory or a jaxfid model "
                     "directory") from None
  return "t5x-orbax" if kind == "orbax" else "t5x"


def _spiece_near(*directories: Path) -> Path | None:
  for directory in directories:
    candidate = directory / "spiece.model"
    if candidate.is_file():
      return candidate
  return None


def _load_hf(path: Path):
  fields, flat = hf.read_hf(path)
  return fields, flat, _spiece_near(path)


def _load_t5x(path: Path):
  fields, flat = t5x.read_t5x(path)
  ckpt_dir, _ = t5x.locate(path)
  return fields, flat, _spiece_near(ckpt_dir, ckpt_dir.parent,
                                    ckpt_dir.parent.parent)


for _fmt in ("hf", "fid"):
  register_loader(_fmt, _load_hf)
for _fmt in ("t5x", "t5x-orbax"):
  register_loader(_fmt, _load_t5x)


def load_flat(path, fmt: str | None = None
              ) -> tuple[dict, dict[str, np.ndarray], Path | None]:
  """Loads any checkpoint: ``(fields, flat_params, spiece_path_or_None)``;
  ``fmt``: its :func:`detect_format`, when the caller has it."""
  fmt = fmt or detect_format(path)
  path = Path(path)
  if fmt not in _LOADERS:
    raise InputError(path, f"a {fmt} checkpoint, but no loader is registered "
                     "for it (jaxfid.checkpoints.register_loader"
                     f"({fmt!r}, fn))")
  return _LOADERS[fmt](path)
