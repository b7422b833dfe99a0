"""Files of precomputed vectors: DPR's pickles, and query vectors.

Pickles are read with a restricted unpickler (lists, tuples, strings,
numbers and numpy arrays only), so a hostile file cannot run code.
:func:`read_query_vectors` reads ``--search-option query_vectors=FILE``.
"""
from __future__ import annotations

import io
import os
import pickle
from typing import Iterable, Iterator

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.core.textio import iter_json_lines

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _SafeUnpickler(pickle.Unpickler):
  def find_class(self, module, name):
    if (module, name) in _ALLOWED:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def load_pickle(path: str | os.PathLike):
  """A pickle holding only containers, numbers, strings and numpy arrays."""
  try:
    with open(path, "rb") as f:
      return _SafeUnpickler(io.BufferedReader(f)).load()
  except FileNotFoundError:
    raise InputError(path, "no such file") from None
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError,
          AttributeError, ImportError, IndexError) as e:
    raise InputError(path, f"not a pickle of (id, vector) pairs: "
                     f"{type(e).__name__}: {e}") from None


def iter_pairs(path, data) -> Iterator[tuple[int, str, np.ndarray]]:
  """(entry index, id, vector) of a loaded DPR embedding file."""
  if not isinstance(data, (list, tuple)):
    raise InputError(path, f"expected a list of (id, vector) pairs, got "
                     f"{type(data).__name__}")
  for k, entry in enumerate(data):
    if not isinstance(entry, (list, tuple)) or len(entry) != 2:
      raise InputError(path, "expected an (id, vector) pair",
                       where=f"entry {k}")
    docid, vector = entry
    if isinstance(docid, (bytes, np.bytes_)):
      docid = docid.decode("utf-8")
    if isinstance(docid, (np.integer, int)) and not isinstance(docid, bool):
      docid = str(int(docid))
    if not isinstance(docid, (str, np.str_)):
      raise InputError(path, f"id must be a string or integer, got "
                       f"{type(docid).__name__}", where=f"entry {k}")
    vector = np.asarray(vector)
    if vector.ndim != 1 or vector.dtype.kind not in "fiu":
      raise InputError(path, f"vector must be a 1-D numeric array, got shape "
                       f"{list(vector.shape)} {vector.dtype}",
                       where=f"entry {k}")
    yield k, str(docid), vector


def _query_pairs(path) -> Iterable[tuple[object, str, object]]:
  name = os.path.basename(str(path)).lower()
  if name.endswith((".jsonl", ".jsonl.gz")):
    for lineno, record in iter_json_lines(path):
      text = None
      if isinstance(record, dict):
        text = next((record[k] for k in ("question", "text", "query")
                     if k in record), None)
      if not isinstance(text, str) or "vector" not in record:
        raise InputError(path, "expected {\"question\" (or \"text\"): ..., "
                         "\"vector\": [...]}", where=lineno)
      yield lineno, text, record["vector"]
    return
  for k, text, vector in iter_pairs(path, load_pickle(path)):
    yield f"entry {k}", text, vector


def read_query_vectors(path: str | os.PathLike, dim: int
                       ) -> dict[str, np.ndarray]:
  """Query text -> float32 vector, from a file of precomputed query vectors.

  ``.jsonl`` of ``{"question" (or text/query), "vector"}``, or a pickle of
  ``(text, vector)`` pairs; looked up by the exact query text.
  """
  table = {}
  for where, text, vector in _query_pairs(path):
    try:
      array = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError):
      raise InputError(path, "vector must be a list of numbers",
                       where=where) from None
    if array.shape != (dim,):
      raise InputError(path, f"vector of shape {list(array.shape)}, expected "
                       f"[{dim}]", where=where)
    table[text] = array
  return table


__all__ = ["load_pickle", "iter_pairs", "read_query_vectors"]
