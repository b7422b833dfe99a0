"""Reading ``pytorch_model.bin`` state dicts without torch.

Both ``torch.save`` formats: the zip archive (``data.pkl`` + ``data/<key>``)
and the legacy sequence of pickles followed by the storages. The unpickler
knows only ``torch._utils._rebuild_tensor_v2``, storage types and
``OrderedDict`` (a hostile file cannot run code); tensors become numpy
arrays of their strided views, float16 and bfloat16 as float32.
"""
from __future__ import annotations

import collections
import dataclasses
import io
import pickle
import struct
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

from jaxfid.core.errors import InputError

LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
LEGACY_PROTOCOL = 1001
# torch.<name> storage class -> element dtype
STORAGE_DTYPES = {
    "DoubleStorage": np.dtype("<f8"), "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"), "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"), "BoolStorage": np.dtype("?"),
}
_TO_FLOAT32 = (np.dtype("<f2"), np.dtype(ml_dtypes.bfloat16))
_LOCAL_HEADER = struct.Struct(zipfile.structFileHeader)


@dataclasses.dataclass(frozen=True)
class _StorageType:
  dtype: np.dtype


@dataclasses.dataclass
class _Storage:
  key: str
  dtype: np.dtype
  numel: int
  data: np.ndarray | None = None  # filled once its bytes are read


@dataclasses.dataclass(frozen=True)
class _Tensor:
  storage: _Storage
  offset: int
  size: tuple[int, ...]
  stride: tuple[int, ...]

  def array(self, path) -> np.ndarray:
    data = self.storage.data
    if any(n == 0 for n in self.size):
      return np.zeros(self.size, self.storage.dtype)
    last = self.offset + sum((n - 1) * s for n, s in zip(self.size,
                                                         self.stride))
    if self.offset < 0 or min(self.stride, default=0) < 0 or last >= len(data):
      raise InputError(path, f"tensor of shape {list(self.size)} reaches "
                       f"past its storage {self.storage.key}")
    view = np.lib.stride_tricks.as_strided(
        data[self.offset:], shape=self.size,
        strides=[s * data.itemsize for s in self.stride], writeable=False)
    return np.array(view)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, *unused):
  del unused  # requires_grad, backward hooks, metadata
  return _Tensor(storage, int(storage_offset), tuple(size), tuple(stride))


def _rebuild_tensor(storage, storage_offset, size, stride):
  return _Tensor(storage, int(storage_offset), tuple(size), tuple(stride))


def _rebuild_parameter(data, *unused):
  del unused
  return data


_ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _Unpickler(pickle.Unpickler):
  """Rebuilds storages and tensors as placeholders; refuses anything else."""

  def __init__(self, file, storages: dict[str, _Storage]):
    super().__init__(file)
    self.storages = storages

  def find_class(self, module, name):
    if (module, name) in _ALLOWED:
      return _ALLOWED[(module, name)]
    if module in ("torch", "torch.cuda") and name in STORAGE_DTYPES:
      return _StorageType(STORAGE_DTYPES[name])
    raise pickle.UnpicklingError(f"refusing to load {module}.{name}")

  def persistent_load(self, pid):
    if not isinstance(pid, tuple) or not pid or pid[0] not in ("storage",
                                                               b"storage"):
      raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")
    storage_type, key, _, numel = pid[1:5]
    view = pid[5] if len(pid) > 5 else None
    if not isinstance(storage_type, _StorageType):
      raise pickle.UnpicklingError(f"unsupported storage {storage_type!r}")
    key = key.decode() if isinstance(key, bytes) else str(key)
    if key not in self.storages:
      self.storages[key] = _Storage(key, storage_type.dtype, int(numel))
    if view is not None:
      raise pickle.UnpicklingError("storage views are not supported")
    return self.storages[key]


class _PlainUnpickler(pickle.Unpickler):
  """For the legacy format's other pickles: plain values, no globals."""

  def find_class(self, module, name):
    raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _load_zip(path: Path) -> tuple[object, dict[str, _Storage]]:
  with zipfile.ZipFile(path) as archive:
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")
               or n == "data.pkl"]
    if len(pickles) != 1:
      raise InputError(path, "not a torch.save archive (no single data.pkl)")
    prefix = pickles[0][:-len("data.pkl")]
    byteorder = prefix + "byteorder"
    if (byteorder in archive.namelist()
        and archive.read(byteorder).strip() != b"little"):
      raise InputError(path, "big-endian tensors are not supported")
    storages: dict[str, _Storage] = {}
    obj = _Unpickler(io.BytesIO(archive.read(pickles[0])), storages).load()
    for key, storage in storages.items():
      storage.data = _zip_elements(path, archive, f"{prefix}data/{key}",
                                   storage)
  return obj, storages


def _zip_elements(path: Path, archive: zipfile.ZipFile, name: str,
                  storage: _Storage) -> np.ndarray:
  """A storage's elements; memory-mapped when stored uncompressed (always,
  for torch.save), so a large checkpoint is not read into memory twice."""
  info = archive.getinfo(name)
  if info.file_size < storage.numel * storage.dtype.itemsize:
    raise InputError(path, f"storage {storage.key} is truncated")
  if info.compress_type != zipfile.ZIP_STORED or not storage.numel:
    return _elements(path, storage, archive.read(name))
  with open(path, "rb") as f:  # the local header's name and extra lengths
    f.seek(info.header_offset)
    local = f.read(_LOCAL_HEADER.size)
  fields = _LOCAL_HEADER.unpack(local)
  if fields[0] != zipfile.stringFileHeader:
    raise InputError(path, f"bad zip entry {name}")
  start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
  return np.memmap(path, storage.dtype, "r", offset=start,
                   shape=(storage.numel,))


def _load_legacy(path: Path, f) -> tuple[object, dict[str, _Storage]]:
  for expected in (LEGACY_MAGIC, LEGACY_PROTOCOL):
    if _PlainUnpickler(f).load() != expected:
      raise InputError(path, "not a torch.save file (neither a zip archive "
                       "nor the legacy format)")
  system = _PlainUnpickler(f).load()
  if isinstance(system, dict) and not system.get("little_endian", True):
    raise InputError(path, "big-endian tensors are not supported")
  storages: dict[str, _Storage] = {}
  obj = _Unpickler(f, storages).load()
  keys = _PlainUnpickler(f).load()
  for key in keys:
    storage = storages[str(key)]
    (count,) = struct.unpack("<q", f.read(8))
    if count != storage.numel:
      raise InputError(path, f"storage {key} holds {count} elements, "
                       f"expected {storage.numel}")
    storage.data = _elements(path, storage,
                             f.read(count * storage.dtype.itemsize))
  return obj, storages


def _elements(path, storage: _Storage, raw: bytes) -> np.ndarray:
  if len(raw) < storage.numel * storage.dtype.itemsize:
    raise InputError(path, f"storage {storage.key} is truncated")
  return np.frombuffer(raw, storage.dtype, count=storage.numel)


def read_torch_bin(path) -> dict[str, np.ndarray]:
  """Tensors of a ``pytorch_model.bin`` (InputError if not a state dict)."""
  path = Path(path)
  if not path.is_file():
    raise InputError(path, "file not found")
  try:
    if zipfile.is_zipfile(path):
      state, _ = _load_zip(path)
    else:
      with open(path, "rb") as f:
        state, _ = _load_legacy(path, f)
  except InputError:
    raise
  except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError,
          IndexError, struct.error, zipfile.BadZipFile) as e:
    raise InputError(path, f"cannot read this torch.save file: "
                     f"{type(e).__name__}: {e}") from None
  if not isinstance(state, dict):
    raise InputError(path, "expected a state dict (tensor name -> tensor)")
  out = {}
  for name, tensor in state.items():
    if not isinstance(tensor, _Tensor):
      raise InputError(path, f"entry {name} is not a tensor")
    array = tensor.array(path)
    out[str(name)] = (array.astype(np.float32) if array.dtype in _TO_FLOAT32
                      else array)
  return out


__all__ = ["read_torch_bin", "STORAGE_DTYPES"]
