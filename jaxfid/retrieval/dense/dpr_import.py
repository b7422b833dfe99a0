"""Importing precomputed passage embeddings (DPR's released format).

DPR's ``generate_dense_embeddings.py`` writes ``wiki_passages_{shard}`` files,
each one ``pickle.dump`` of a list of ``(passage id, numpy vector)`` tuples;
ids are the corpus ids (``"123"``) or carry a source prefix (``"wiki:123"``).
:func:`import_embeddings` reads such files (a glob or a list), matches every
vector to its passage in the corpus (``psgs_w100.tsv``), writes the passage
store and embedding shards of a dense index directory, and builds the FAISS
index, exactly as :func:`jaxfid.retrieval.dense.index.build_dense_index` would.
Every corpus passage needs exactly one vector: missing, duplicate or unknown
ids are errors naming the file.

Pickles are read with a restricted unpickler that only rebuilds lists,
tuples, strings, numbers and numpy arrays, so a hostile file cannot run code.

Queries then need vectors from the *same* model: DPR's question encoder is a
BERT, which jaxfid does not run, so an imported index stores no query
encoder unless ``query_encoder`` names a jaxfid/HF T5 checkpoint producing
vectors of the same width; otherwise ``jaxfid retrieve`` needs precomputed
query vectors (``--search-option query_vectors=FILE``, read by
:func:`read_query_vectors`).
"""
from __future__ import annotations

import glob
import io
import itertools
import os
import pickle
import shutil
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.retrieval.dense.embedding_store import (
    DEFAULT_SHARD_SIZE, EmbeddingStore, ShardWriter)
from jaxfid.retrieval.dense.faiss_index import (
    DEFAULT_FACTORY, DEFAULT_TRAIN_SIZE, build_faiss_index, make_index)
from jaxfid.core.files import replace_directory
from jaxfid.retrieval.index_dir import check_output, write_meta

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


def _pairs(path, data) -> Iterator[tuple[int, str, np.ndarray]]:
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


def expand_files(patterns: str | Sequence[str]) -> list[str]:
  """Files matching a glob (or several), sorted; InputError if none."""
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [os.fspath(patterns)]
  files = []
  for pattern in patterns:
    matches = sorted(glob.glob(pattern))
    if not matches:
      raise InputError(pattern, "no embedding file matches")
    files.extend(matches)
  return files


class _IdResolver:
  """Maps DPR ids onto store rows: as is, without or with a 'source:' prefix."""

  def __init__(self, store):
    self.store = store
    self._table: dict[str, int] | None = None
    first = store.id(0) if len(store) else ""
    self.corpus_prefix = first.split(":", 1)[0] + ":" if ":" in first else ""

  def _lookup(self, docid: str) -> int | None:
    if self._table is None:
      self._table = {d: i for i, d in enumerate(
          self.store.ids(np.arange(len(self.store))))}
    return self._table.get(docid)

  def row(self, docid: str, guess: int) -> int | None:
    candidates = [docid]
    if ":" in docid:
      candidates.append(docid.split(":", 1)[1])
    if self.corpus_prefix and not docid.startswith(self.corpus_prefix):
      candidates.append(self.corpus_prefix + docid)
    if 0 <= guess < len(self.store):
      at_guess = self.store.id(guess)
      if at_guess in candidates:
        return guess
    for candidate in candidates:
      row = self._lookup(candidate)
      if row is not None:
        return row
    return None


def import_embeddings(embeddings: str | Sequence[str],
                      corpus: str | os.PathLike, output: str | os.PathLike, *,
                      factory: str = DEFAULT_FACTORY, metric: str = "ip",
                      index_shards: int = 1,
                      shard_size: int = DEFAULT_SHARD_SIZE,
                      embedding_dtype: str = "float32",
                      train_size: int = DEFAULT_TRAIN_SIZE,
                      query_encoder: str | None = None,
                      progress: bool | None = None) -> dict:
  """Builds a dense index directory from DPR embedding pickles.

  Args:
    embeddings: a glob (``'wiki_passages_*'``) or list of globs.
    corpus: the corpus the ids refer to.
    output: the index directory.
    factory, metric, index_shards, shard_size, embedding_dtype, train_size:
      as for :func:`jaxfid.retrieval.dense.index.build_dense_index`.
    query_encoder: a T5 checkpoint that embeds queries into the same space.

  Returns:
    A summary: ``{"index", "num_passages", "dim", "files"}``.
  """
  from jaxfid.retrieval.dense import index as dense
  output = Path(output)
  check_output(output)
  files = expand_files(embeddings)
  loaded = None
  if query_encoder is not None:
    from jaxfid.dual_encoder.checkpoint import load_dual_encoder
    loaded = load_dual_encoder(query_encoder)
  staging = dense.staging_dir(output)
  staging.mkdir(parents=True, exist_ok=True)
  try:
    summary = _import_into(staging, files, corpus, factory=factory,
                           metric=metric, index_shards=index_shards,
                           shard_size=shard_size,
                           embedding_dtype=embedding_dtype,
                           train_size=train_size, loaded=loaded,
                           query_encoder=query_encoder, progress=progress)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  replace_directory(staging, output)
  return {"index": str(output), **summary}


def _import_into(staging: Path, files: list[str], corpus, *, factory, metric,
                 index_shards, shard_size, embedding_dtype, train_size,
                 loaded, query_encoder, progress) -> dict:
  from tqdm.auto import tqdm

  from jaxfid.retrieval.dense import index as dense
  store = dense.write_store(corpus, staging, progress)
  resolver = _IdResolver(store)
  pairs = ((path, *pair) for path in files
           for pair in _pairs(path, load_pickle(path)))
  first = next(pairs, None)
  if first is None:
    raise InputError(files[0], "no (id, vector) pairs in the embedding files")
  dim = len(first[3])
  make_index(dim, factory, metric)
  if loaded is not None and loaded.encoder.dim != dim:
    raise InputError(query_encoder, f"encoder gives {loaded.encoder.dim}-d "
                     f"vectors, the embeddings are {dim}-d")
  writer = ShardWriter(staging, len(store), dim, dtype=embedding_dtype,
                       shard_size=shard_size,
                       source={"imported": [os.path.abspath(f) for f in files],
                               "passages": dense.store_fingerprint(staging)})
  seen = np.zeros(len(store), dtype=bool)
  disable = None if progress is None else not progress
  with writer.scatter() as maps, tqdm(total=len(store), desc="importing",
                                      unit=" vectors", disable=disable) as bar:
    position = 0
    for path, k, docid, vector in itertools.chain([first], pairs):
      if len(vector) != dim:
        raise InputError(path, f"vector of {len(vector)} dimensions, "
                         f"expected {dim}", where=f"entry {k} (id {docid})")
      row = resolver.row(docid, position)
      if row is None:
        raise InputError(path, f"id {docid!r} is not in the corpus {corpus}",
                         where=f"entry {k}")
      if seen[row]:
        raise InputError(path, f"second vector for passage "
                         f"{store.id(row)!r}", where=f"entry {k}")
      seen[row] = True
      shard, offset = divmod(row, shard_size)
      maps[shard][offset] = vector
      position = row + 1
      bar.update(1)
    if not seen.all():
      row = int(np.flatnonzero(~seen)[0])
      raise InputError(corpus, f"no embedding for passage {store.id(row)!r} "
                       f"({int((~seen).sum())} passages have none)")
    del maps
  embeddings_store = EmbeddingStore(staging)
  faiss_info = build_faiss_index(embeddings_store, staging, factory=factory,
                                 metric=metric, index_shards=index_shards,
                                 train_size=train_size, progress=progress)
  write_meta(staging, dense.INDEX_TYPE, num_passages=len(store), dim=dim,
             corpus=os.path.abspath(corpus), encoder=None,
             imported=[os.path.abspath(f) for f in files],
             query_encoder=(dense.encoder_entry(loaded) if loaded is not None
                            else None),
             faiss=faiss_info,
             embeddings={"dtype": embedding_dtype, "shard_size": shard_size,
                         "num_shards": writer.num_shards})
  return {"type": dense.INDEX_TYPE, "num_passages": len(store), "dim": dim,
          "files": len(files), "factory": factory}


# --------------------------------------------------------------------------
# precomputed query vectors


def _query_pairs(path) -> Iterable[tuple[object, str, object]]:
  name = os.path.basename(str(path)).lower()
  if name.endswith((".jsonl", ".jsonl.gz")):
    from jaxfid.retrieval.store.corpus import iter_json_lines
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
  for k, text, vector in _pairs(path, load_pickle(path)):
    yield f"entry {k}", text, vector


def read_query_vectors(path: str | os.PathLike, dim: int
                       ) -> dict[str, np.ndarray]:
  """Query text -> float32 vector, from a file of precomputed query vectors.

  Formats: ``.jsonl`` with ``{"question": TEXT, "vector": [...]}`` per line
  (``text``/``query`` accepted for ``question``), or a pickle of
  ``(question text, vector)`` pairs (DPR's embedding format, keyed by text).
  Vectors are looked up by the exact query text ``jaxfid retrieve`` reads.
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
