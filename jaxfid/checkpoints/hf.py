"""Hugging Face T5 checkpoints (and the original FiD readers) <-> jaxfid.

:func:`read_hf` reads ``config.json`` with safetensors or ``.bin`` weights,
sharded or not, without torch; FiD readers are renamed from their
``encoder.encoder.`` prefix. jaxfid's ``tie_word_embeddings`` means both
shared logits and the ``d_model**-0.5`` decoder-output scale; the reader maps
every HF combination of scale and ``lm_head`` onto it exactly.
:func:`write_hf` writes what ``T5ForConditionalGeneration.from_pretrained``
loads with no newly initialised weights: float32 safetensors, sharded above
``max_shard_bytes``, atomically.
"""
from __future__ import annotations

import json
import logging
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from jaxfid.checkpoints import names
from jaxfid.checkpoints.configs import (
    as_fields, config_from_hf_json, hf_json_from_config, replace)
from jaxfid.checkpoints.torch_bin import read_torch_bin
from jaxfid.core.errors import InputError
from jaxfid.runtime.files import atomic_directory, check_destination

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX)

_LOG = logging.getLogger(__name__)


# --------------------------------------------------------------------------
# tensor files


def read_json(path) -> Any:
  """Parses a JSON file; a missing or malformed file is an InputError."""
  path = Path(path)
  try:
    text = path.read_text(encoding="utf-8")
  except FileNotFoundError:
    raise InputError(path, "file not found") from None
  except (OSError, UnicodeDecodeError) as e:
    raise InputError(path, f"cannot read: {e}") from None
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise InputError(path, f"invalid JSON: {e.msg}", where=e.lineno) from None


def _safetensors_dtype(code: str, path, name: str):
  if code == "BF16":
    return np.dtype(ml_dtypes.bfloat16)
  table = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8",
           "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
  if code not in table:
    raise InputError(path, f"tensor {name} has unsupported dtype {code}")
  return np.dtype(table[code])


def safetensors_header(path) -> dict:
  """The JSON header of a safetensors file (name -> dtype, shape, offsets)."""
  path = Path(path)
  try:
    with open(path, "rb") as f:
      head = f.read(8)
      if len(head) != 8:
        raise InputError(path, "not a safetensors file (too short)")
      (size,) = struct.unpack("<Q", head)
      if size > 100_000_000:
        raise InputError(path, "not a safetensors file (bad header size)")
      raw = f.read(size)
  except FileNotFoundError:
    raise InputError(path, "file not found") from None
  except IsADirectoryError:
    raise InputError(path, "is a directory, expected a safetensors "
                     "file") from None
  if len(raw) != size:
    raise InputError(path, "not a safetensors file (truncated header)")
  try:
    header = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError):
    raise InputError(path, "not a safetensors file (bad header)") from None
  if not isinstance(header, dict):
    raise InputError(path, "not a safetensors file (bad header)")
  header["__data_start__"] = 8 + size
  return header


def read_safetensors(path, wanted=None, header=None) -> dict[str, np.ndarray]:
  """Tensors (``wanted``, default all) of a safetensors file as numpy."""
  path = Path(path)
  header = safetensors_header(path) if header is None else header
  start = header["__data_start__"]
  file_size = path.stat().st_size
  out = {}
  with open(path, "rb") as f:
    for name, info in header.items():
      if name.startswith("__") or (wanted is not None and name not in wanted):
        continue
      try:
        dtype = _safetensors_dtype(info["dtype"], path, name)
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
      except (KeyError, TypeError, ValueError):
        raise InputError(path, f"tensor {name}: bad header entry") from None
      count = int(np.prod(shape, dtype=np.int64))
      if end - begin != count * dtype.itemsize or start + end > file_size:
        raise InputError(path, f"tensor {name}: data offsets do not match its "
                         "shape or the file is truncated")
      f.seek(start + begin)
      out[name] = np.frombuffer(f.read(end - begin), dtype=dtype).reshape(shape)
  return out


class WeightFiles:
  """The tensors of a HF checkpoint ``directory``: ``files`` (name -> file)
  and ``source`` (weights file or shard index, named in errors)."""

  def __init__(self, directory):
    self.directory = Path(directory)
    self.files: dict[str, Path] = {}
    self._headers: dict[Path, dict] = {}
    self._cache: dict[Path, dict[str, np.ndarray]] = {}
    for candidate in WEIGHT_FILES:
      if (self.directory / candidate).is_file():
        self.source = self.directory / candidate
        break
    else:
      raise InputError(self.directory, "no weights: expected one of "
                       + ", ".join(WEIGHT_FILES))
    if self.source.name.endswith(".index.json"):
      index = read_json(self.source)
      weight_map = index.get("weight_map") if isinstance(index, dict) else None
      if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(self.source, "no 'weight_map' object")
      for name, shard in weight_map.items():
        shard_path = self.directory / str(shard)
        if not shard_path.is_file():
          raise InputError(shard_path, f"shard listed for tensor {name} in "
                           f"{self.source.name} is missing")
        self.files[name] = shard_path
    elif self.source.name == SAFETENSORS:
      header = self._header(self.source)
      self.files = {n: self.source for n in header if not n.startswith("__")}
    else:
      self.files = {n: self.source for n in self._torch_file(self.source)}

  def _header(self, path: Path) -> dict:
    if path not in self._headers:
      self._headers[path] = safetensors_header(path)
    return self._headers[path]

  def _torch_file(self, path: Path) -> dict[str, np.ndarray]:
    if path not in self._cache:  # keeps one .bin file at a time
      self._cache = {path: read_torch_bin(path)}
    return self._cache[path]

  def load(self, name: str) -> np.ndarray:
    """One tensor as numpy (safetensors: read alone; .bin: file cached)."""
    path = self.files[name]
    if path.name.endswith(".safetensors"):
      tensors = read_safetensors(path, {name}, self._header(path))
    else:
      tensors = self._torch_file(path)
    if name not in tensors:
      raise InputError(path, f"tensor {name} listed in {self.source.name} is "
                       "not in this file")
    return tensors[name]


def is_fid_layout(tensor_names) -> bool:
  """Whether tensor names follow the original FiD wrapper (encoder.encoder.)."""
  return any(n.startswith("encoder.encoder.") for n in tensor_names)


# --------------------------------------------------------------------------
# reading


def _shape_str(shape) -> str:
  return "[" + ", ".join(str(d) for d in shape) + "]"


def read_hf(directory) -> tuple[dict, dict[str, np.ndarray]]:
  """``(fields, flat_params)`` of a HF T5 (or original FiD) directory;
  InputError naming file and tensor for missing files, missing, unexpected
  or mis-shaped tensors, or embedding copies unlike ``shared.weight``."""
  directory = Path(directory)
  if not directory.is_dir():
    raise InputError(directory, "not a directory (expected a Hugging Face "
                     "checkpoint with config.json)")
  config_path = directory / "config.json"
  if not config_path.is_file():
    raise InputError(config_path, "missing: a Hugging Face T5 checkpoint "
                     "needs config.json beside its weights")
  fields = config_from_hf_json(read_json(config_path), config_path)
  weights = WeightFiles(directory)
  fid = is_fid_layout(weights.files)
  raw_of = {}  # HF name -> name in the files
  for raw in weights.files:
    hf = names.fid_wrapper_to_hf(raw) if fid else raw
    if hf in raw_of:
      raise InputError(weights.files[raw], f"tensors {raw_of[hf]} and {raw} "
                       f"both map to {hf}")
    raw_of[hf] = raw

  def display(hf: str) -> str:
    return names.hf_to_fid_wrapper(hf) if fid else hf

  # Expected tensors, taking lm_head as optional (see the module docstring).
  untied = replace(fields, tie_word_embeddings=False)
  expected = {r.hf: r for r in names.renames(untied)}
  shapes = names.param_shapes(untied)
  optional = {"lm_head.weight", *names.HF_EMBEDDING_COPIES, *names.HF_IGNORED}
  for hf in expected:
    if hf not in raw_of and hf not in optional:
      raise InputError(weights.source, f"missing tensor {display(hf)}")
  for hf, raw in raw_of.items():
    if hf not in expected and hf not in optional:
      raise InputError(weights.files[raw], f"unexpected tensor {raw}")

  def load(hf: str, shape) -> np.ndarray:
    raw = raw_of[hf]
    array = weights.load(raw)
    if tuple(array.shape) != tuple(shape):
      raise InputError(weights.files[raw], f"tensor {raw} has shape "
                       f"{_shape_str(array.shape)}, expected "
                       f"{_shape_str(shape)} from config.json")
    return np.asarray(array, dtype=np.float32)

  flat = {}
  # grouped by file, so that each (shard) file is read once
  in_order = sorted((hf for hf in expected if hf != "lm_head.weight"),
                    key=lambda hf: str(weights.files[raw_of[hf]]))
  for hf in in_order:
    rename = expected[hf]
    array = load(hf, names.hf_shape(rename, shapes[rename.path]))
    flat[rename.path] = np.ascontiguousarray(rename.from_hf(array))
  flat = {r.path: flat[r.path] for r in expected.values() if r.path in flat}
  shared = flat["token_embedder/embedding"]
  for copy in names.HF_EMBEDDING_COPIES:
    if copy in raw_of and not np.array_equal(load(copy, shared.shape), shared):
      raise InputError(weights.files[raw_of[copy]], f"tensor {raw_of[copy]} "
                       "differs from shared.weight (untied input embeddings "
                       "are not supported)")
  for ignored in names.HF_IGNORED:
    if ignored in raw_of and np.any(weights.load(raw_of[ignored])):
      _LOG.warning(
          "%s: dropping %s: transformers < 4 (e.g. the original FiD readers) "
          "added this position bias to every cross-attention; jaxfid, like "
          "transformers >= 4, has none, so outputs differ slightly from the "
          "original code", weights.files[raw_of[ignored]], raw_of[ignored])
  lm_head = load("lm_head.weight", shared.shape) if (
      "lm_head.weight" in raw_of) else None
  scaled = fields["tie_word_embeddings"]
  if lm_head is None or np.array_equal(lm_head, shared):
    if not scaled:  # unscaled output through the shared embedding
      flat["decoder/logits_dense/kernel"] = np.ascontiguousarray(shared.T)
  else:
    kernel = lm_head.T
    if scaled:  # fold HF's output scaling into the own output layer
      kernel = kernel * np.float32(fields["d_model"] ** -0.5)
    flat["decoder/logits_dense/kernel"] = np.ascontiguousarray(
        kernel, dtype=np.float32)
  fields["tie_word_embeddings"] = "decoder/logits_dense/kernel" not in flat
  return fields, flat


# --------------------------------------------------------------------------
# writing


def check_params(config: Any, flat: Mapping[str, Any]) -> dict:
  """The config's fields, after checking a parameter set against it
  (ValueError, a programming error, for missing or mis-shaped ones)."""
  fields = as_fields(config)
  shapes = names.param_shapes(fields)
  missing = sorted(set(shapes) - set(flat))
  extra = sorted(set(flat) - set(shapes))
  bad = [f"{p}: {list(np.shape(flat[p]))} != {list(s)}"
         for p, s in shapes.items()
         if p in flat and tuple(np.shape(flat[p])) != s]
  if missing or extra or bad:
    raise ValueError(f"parameters do not match the config: missing "
                     f"{missing[:5]}, unexpected {extra[:5]}, mis-shaped "
                     f"{bad[:5]}")
  return fields


def _shards(tensors: dict[str, np.ndarray], max_bytes: int) -> list[list[str]]:
  shards, current, size = [], [], 0
  for name, array in tensors.items():
    if current and size + array.nbytes > max_bytes:
      shards.append(current)
      current, size = [], 0
    current.append(name)
    size += array.nbytes
  if current:
    shards.append(current)
  return shards


def write_hf(directory, config: Any, flat: Mapping[str, Any],
             spiece_path=None, *, overwrite: bool = False,
             max_shard_bytes: int = 5 * 1024**3) -> Path:
  """Writes a HF T5ForConditionalGeneration directory (empty or new unless
  ``overwrite``) of ``flat`` (exactly ``config``'s parameters, sharded above
  ``max_shard_bytes``), ``spiece_path`` as ``spiece.model``; returns it."""
  fields = check_params(config, flat)
  if spiece_path is not None and not Path(spiece_path).is_file():
    raise InputError(spiece_path, "SentencePiece model not found")
  check_destination(directory, overwrite)
  tensors = {}
  for rename in names.renames(fields):
    array = np.asarray(flat[rename.path], dtype=np.float32)
    tensors[rename.hf] = np.ascontiguousarray(rename.to_hf(array))
  with atomic_directory(directory, overwrite) as tmp:
    meta = {"format": "pt"}
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
      save_file(tensors, str(tmp / SAFETENSORS), metadata=meta)
    else:
      weight_map = {}
      for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, str(tmp / file),
                  metadata=meta)
        weight_map.update({n: file for n in shard})
      index = {"metadata": {"total_size": sum(a.nbytes for a in
                                              tensors.values())},
               "weight_map": weight_map}
      (tmp / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    (tmp / "config.json").write_text(
        json.dumps(hf_json_from_config(fields), indent=2, sort_keys=True)
        + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0},
        indent=2) + "\n")
    if spiece_path is not None:
      shutil.copyfile(spiece_path, tmp / "spiece.model")
  return Path(directory)
