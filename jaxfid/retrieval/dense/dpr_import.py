"""Importing precomputed passage embeddings (DPR's released format).

:func:`import_embeddings` reads DPR's ``wiki_passages_{shard}`` pickles of
``(passage id, vector)`` (ids ``"123"`` or ``"wiki:123"``), matches each
vector to its corpus passage and writes a dense index as
:func:`jaxfid.retrieval.dense.index.write_dense_index` would; missing,
duplicate or unknown ids are errors naming the file. Without a query encoder
of the same width, queries need precomputed vectors
(``--search-option query_vectors=FILE``).
"""
from __future__ import annotations

import glob
import itertools
import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxfid.core.errors import InputError
from jaxfid.retrieval.dense.embedding_store import (
    DEFAULT_SHARD_SIZE, EmbeddingStore, ShardWriter)
from jaxfid.retrieval.dense.faiss_index import (
    DEFAULT_FACTORY, DEFAULT_TRAIN_SIZE, build_faiss_index, make_index)
from jaxfid.retrieval.dense.index import (
    INDEX_TYPE, staging_dir, store_fingerprint, write_store)
from jaxfid.retrieval.dense.vector_files import iter_pairs, load_pickle
from jaxfid.retrieval.index_dir import building, check_output, write_meta
from jaxfid.runtime.files import replace_directory


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
                      query_encoder_entry: dict | None = None,
                      progress: bool | None = None,
                      encoding: str = "utf-8") -> dict:
  """Builds a dense index directory from DPR embedding pickles.

  ``embeddings``: a glob or list of globs; other arguments as for
  :func:`jaxfid.retrieval.dense.index.write_dense_index`;
  ``query_encoder_entry``: the ``meta.json`` entry of an encoder of the same
  ``dim``, or None. Returns ``{"index", "num_passages", "dim", "files"}``.
  """
  output = Path(output)
  check_output(output)
  files = expand_files(embeddings)
  staging = staging_dir(output)
  with building(output, remove=[staging]):
    shutil.rmtree(staging, ignore_errors=True)  # imports do not resume
    staging.mkdir(parents=True, exist_ok=True)
    try:
      summary = _import_into(staging, files, corpus, factory=factory,
                             metric=metric, index_shards=index_shards,
                             shard_size=shard_size,
                             embedding_dtype=embedding_dtype,
                             train_size=train_size,
                             query_encoder_entry=query_encoder_entry,
                             progress=progress, encoding=encoding)
    except BaseException:
      shutil.rmtree(staging, ignore_errors=True)
      raise
    replace_directory(staging, output)
  return {"index": str(output), **summary}


def _import_into(staging: Path, files: list[str], corpus, *, factory, metric,
                 index_shards, shard_size, embedding_dtype, train_size,
                 query_encoder_entry, progress, encoding) -> dict:
  store = write_store(corpus, staging, progress, encoding)
  resolver = _IdResolver(store)
  pairs = ((path, *pair) for path in files
           for pair in iter_pairs(path, load_pickle(path)))
  first = next(pairs, None)
  if first is None:
    raise InputError(files[0], "no (id, vector) pairs in the embedding files")
  dim = len(first[3])
  make_index(dim, factory, metric)
  if query_encoder_entry is not None and query_encoder_entry["dim"] != dim:
    raise InputError(query_encoder_entry["checkpoint"], f"encoder gives "
                     f"{query_encoder_entry['dim']}-d vectors, the embeddings "
                     f"are {dim}-d")
  writer = ShardWriter(staging, len(store), dim, dtype=embedding_dtype,
                       shard_size=shard_size,
                       source={"imported": [os.path.abspath(f) for f in files],
                               "passages": store_fingerprint(staging)})
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
  write_meta(staging, INDEX_TYPE, num_passages=len(store), dim=dim,
             corpus=os.path.abspath(corpus), encoder=None,
             imported=[os.path.abspath(f) for f in files],
             query_encoder=query_encoder_entry,
             faiss=faiss_info,
             embeddings={"dtype": embedding_dtype, "shard_size": shard_size,
                         "num_shards": writer.num_shards})
  return {"type": INDEX_TYPE, "num_passages": len(store), "dim": dim,
          "files": len(files), "factory": factory}


__all__ = ["import_embeddings", "expand_files"]
