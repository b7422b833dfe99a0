"""Opening index files with checks: a damaged index is one line, never junk.

A missing, truncated or over-long file, a wrong shape or dtype, or bad JSON
is an :class:`~jaxfid.core.errors.InputError` naming the file; only headers
and sizes are read.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxfid.core.errors import InputError

INDEX_DAMAGED = "rebuild the index"


def file_size(path: str | os.PathLike) -> int:
  """The size of an index file; InputError if it is missing."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    raise InputError(path, f"missing index file ({INDEX_DAMAGED})") from None
  if not os.path.isfile(path):
    raise InputError(path, "not a file")
  return st.st_size


def _size_problem(size: int, expected: int) -> str:
  if size < expected:
    return f"truncated: {size} bytes, expected {expected}"
  return f"{size} bytes, expected {expected}"


def check_file_size(path: str | os.PathLike, expected: int) -> None:
  """InputError unless the file exists and holds exactly ``expected`` bytes."""
  size = file_size(path)
  if size != expected:
    raise InputError(path, f"{_size_problem(size, expected)} "
                     f"({INDEX_DAMAGED})")


def _header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
  """(shape, dtype, data offset) from a ``.npy`` header."""
  fmt = np.lib.format
  try:
    with open(path, "rb") as f:
      version = fmt.read_magic(f)
      if version == (1, 0):
        shape, _, dtype = fmt.read_array_header_1_0(f)
      else:
        shape, _, dtype = fmt.read_array_header_2_0(f)
      return tuple(shape), np.dtype(dtype), f.tell()
  except (ValueError, EOFError, SyntaxError, TypeError) as e:
    reason = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, EOFError) or "EOF" in reason:
      raise InputError(path, f"truncated: {os.path.getsize(path)} bytes, "
                       f"within the .npy header ({INDEX_DAMAGED})") from None
    raise InputError(path, f"not a .npy array ({reason}; {INDEX_DAMAGED})"
                     ) from None


def load_array(path: str | os.PathLike,
               shape: Sequence[int | None] | None = None,
               dtypes: Sequence | None = None,
               mmap: bool = True) -> np.ndarray:
  """A checked ``.npy`` array (mapped read-only unless ``mmap`` is False).

  ``shape`` entries of None match any length; ``dtypes`` None accepts any.
  Raises InputError for a missing, truncated or over-long file or another
  shape or dtype.
  """
  path = Path(path)
  size = file_size(path)
  found, dtype, offset = _header(path)
  expected = offset + int(np.prod(found, dtype=np.int64)) * dtype.itemsize
  if size != expected:
    raise InputError(path, f"{_size_problem(size, expected)} for a "
                     f"{dtype} array of shape {list(found)} "
                     f"({INDEX_DAMAGED})")
  if shape is not None and (len(found) != len(shape) or any(
      want is not None and have != want for have, want in zip(found, shape))):
    want = ["*" if s is None else int(s) for s in shape]
    raise InputError(path, f"shape {list(found)}, expected {want} "
                     f"({INDEX_DAMAGED})")
  if dtypes is not None and dtype not in [np.dtype(d) for d in dtypes]:
    raise InputError(path, f"dtype {dtype}, expected "
                     f"{' or '.join(str(np.dtype(d)) for d in dtypes)}")
  array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
  return array.view(np.ndarray)


def read_json(path: str | os.PathLike):
  """A JSON index file; InputError if it is missing or not valid JSON."""
  file_size(path)
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise InputError(path, f"bad JSON: {e.msg} ({INDEX_DAMAGED})",
                     where=e.lineno) from None
  except UnicodeDecodeError:
    raise InputError(path, f"not UTF-8 text ({INDEX_DAMAGED})") from None


def check_json_complete(path: str | os.PathLike) -> None:
  """Cheap check that a (large) JSON object file was not cut short.

  Reads only its last bytes: a complete object ends with ``}``.
  """
  size = file_size(path)
  with open(path, "rb") as f:
    f.seek(max(size - 64, 0))
    tail = f.read().rstrip()
  if not tail.endswith(b"}"):
    raise InputError(path, f"truncated JSON ({size} bytes; "
                     f"{INDEX_DAMAGED})")


__all__ = ["file_size", "check_file_size", "load_array", "read_json",
           "check_json_complete"]
