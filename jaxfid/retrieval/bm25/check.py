"""Opening a saved BM25 index with every file checked against the others.

:func:`open_bm25_index` checks ``bm25.json`` against ``meta.json``, the CSC
arrays against ``indptr`` and the per-term and per-document arrays (from the
``.npy`` headers, nothing read whole); a missing, truncated or inconsistent
file is one :class:`~jaxfid.core.errors.InputError` naming it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.retrieval.bm25.scoring import BM25Index
from jaxfid.retrieval.index_files import (
    check_json_complete, load_array, read_json)


def check_bm25_files(directory: str | os.PathLike, num_docs: int) -> None:
  """Checks the files of a BM25 postings directory (see the module doc)."""
  d = Path(directory)
  meta = read_json(d / "bm25.json")
  if not isinstance(meta, dict) or meta.get("num_docs") != num_docs:
    found = meta.get("num_docs") if isinstance(meta, dict) else None
    raise InputError(d / "bm25.json", f"num_docs {found}, meta.json says "
                     f"{num_docs} (rebuild the index)")
  indptr = load_array(d / "indptr.csc.index.npy", (None,), (np.int64,))
  if len(indptr) == 0:
    raise InputError(d / "indptr.csc.index.npy", "empty (rebuild the index)")
  num_terms, nnz = len(indptr) - 1, int(indptr[-1])
  load_array(d / "data.csc.index.npy", (nnz,), (np.float32,))
  load_array(d / "indices.csc.index.npy", (nnz,), (np.int32,))
  load_array(d / "idf.npy", (num_terms,), (np.float32,))
  load_array(d / "doc_norms.npy", (num_docs,), (np.float32,))
  if (d / "max_scores.npy").exists():  # optional
    load_array(d / "max_scores.npy", (num_terms,), (np.float32,))
  if (d / "impacts.csc.index.npy").exists():  # the same
    load_array(d / "impacts.csc.index.npy", (nnz,), (np.uint16,))
  check_json_complete(d / "vocab.index.json")


def open_bm25_index(directory: str | os.PathLike, num_docs: int) -> BM25Index:
  """The checked, memory-mapped BM25 index of a postings directory."""
  d = Path(directory)
  check_bm25_files(d, num_docs)
  try:
    index = BM25Index.load(d)
  except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError included
    raise InputError(d / "vocab.index.json", f"unreadable "
                     f"({' '.join(str(e).split())}; rebuild the index)"
                     ) from None
  if len(index.vocab) != len(index.indptr) - 1:
    raise InputError(d / "vocab.index.json", f"{len(index.vocab)} terms, "
                     f"the postings have {len(index.indptr) - 1} (rebuild "
                     "the index)")
  return index


__all__ = ["check_bm25_files", "open_bm25_index"]
