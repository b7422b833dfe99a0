"""Dense index directories: a corpus, its vectors, and FAISS over them.

  meta.json            {"type": "dense", "num_passages", "dim", "encoder",
                        "query_encoder", "faiss", "embeddings", "corpus", ...}
  passages.bin ...     the passage store
  embeddings.json, embeddings_00000.npy ...   every passage's vector
  faiss_00000.index .. the FAISS index parts (none for "Flat")

:func:`write_dense_index` takes a :class:`PassageEncoder`,
:class:`DenseSearcher` query vectors or a :class:`QueryEmbedder`. Builds run
in ``.NAME.partial/``, resume from finished shards and reuse the embeddings
of the same encoder and corpus; opening checks every file against
``meta.json``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterator, Protocol, Sequence

import faiss
import numpy as np
from tqdm.auto import tqdm

from jaxfid.core.errors import InputError
from jaxfid.retrieval.dense.embedding_store import (
    DEFAULT_SHARD_SIZE, EmbeddingStore, ShardWriter)
from jaxfid.retrieval.dense.faiss_index import (
    DEFAULT_FACTORY, DEFAULT_TRAIN_SIZE, ShardedIndex, build_faiss_index,
    check_faiss_files, make_index)
from jaxfid.retrieval.dense.vector_files import read_query_vectors
from jaxfid.retrieval.hits import Hits
from jaxfid.retrieval.index_dir import (
    building, check_output, read_meta, write_meta)
from jaxfid.retrieval.store.corpus import Passage, read_corpus
from jaxfid.retrieval.store.passage_store import (
    PassageStore, PassageStoreWriter)
from jaxfid.retrieval.workers import resolve_threads
from jaxfid.runtime.files import remove_stale_temporaries, replace_directory

INDEX_TYPE = "dense"
QUERY_CHUNK = 16  # search batches whose queries are embedded together


class PassageEncoder(Protocol):
  """What :func:`write_dense_index` needs of the model embedding passages."""

  dim: int

  def entry(self) -> dict:
    """Its ``meta.json`` description (``"encoder"`` and ``"query_encoder"``)."""

  def source(self) -> dict:
    """What its vectors depend on (weights, settings): embeddings are reused
    only when this is identical."""

  def embed(self, store: PassageStore, start: int,
            end: int) -> Iterator[np.ndarray]:
    """float32 ``[n, dim]`` batches of the vectors of rows [start, end)."""


class QueryEmbedder(Protocol):
  """What :class:`DenseSearcher` needs to embed query texts itself."""

  options: tuple[str, ...]  # the search options it takes

  def __call__(self, texts: Sequence[str], **options) -> np.ndarray:
    """float32 ``[len(texts), dim]`` query vectors."""


# --------------------------------------------------------------------------
# corpora and sentence files


def read_dense_corpus(path: str | os.PathLike, encoding: str = "utf-8"
                      ) -> Iterator[tuple[int, Passage]]:
  """(line, Passage) of a corpus or sentence file: :func:`jaxfid.retrieval
  .store.corpus.read_corpus`, which reads both."""
  return read_corpus(path, encoding=encoding)


# --------------------------------------------------------------------------
# building


def store_fingerprint(directory: str | os.PathLike) -> str:
  """A hash of a passage store's ids and passage boundaries and sizes."""
  directory = Path(directory)
  h = hashlib.blake2b(digest_size=12)
  for name in ("ids.txt", "offsets.npy"):
    with open(directory / name, "rb") as f:
      for block in iter(lambda: f.read(1 << 24), b""):
        h.update(block)
  h.update(str((directory / "passages.bin").stat().st_size).encode())
  return h.hexdigest()


def staging_dir(output: str | os.PathLike) -> Path:
  """Where a build of ``output`` happens (and resumes from)."""
  output = Path(output)
  return output.parent / f".{output.name}.partial"


def write_store(corpus, staging: Path, progress: bool | None = None,
                encoding: str = "utf-8") -> PassageStore:
  """Reads the corpus into the staging passage store (removing the staging
  directory on a malformed corpus's InputError)."""
  try:
    with PassageStoreWriter(staging, source=corpus) as writer:
      for lineno, passage in tqdm(
          read_dense_corpus(corpus, encoding), desc="reading",
          unit=" passages",
          disable=None if progress is None else not progress):
        writer.add(passage, lineno)
  except InputError:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  if len(writer) == 0:
    shutil.rmtree(staging, ignore_errors=True)
    raise InputError(corpus, "no passages")
  return PassageStore(staging)


def embed_missing(encoder: PassageEncoder, store: PassageStore,
                  writer: ShardWriter, progress: bool | None = None) -> int:
  """Embeds the passages of every missing shard; returns how many."""
  missing = writer.missing()
  remaining = sum(writer.shard_rows(i)[1] - writer.shard_rows(i)[0]
                  for i in missing)
  if not remaining:
    return 0
  disable = None if progress is None else not progress
  with tqdm(total=len(store), initial=len(store) - remaining, desc="embedding",
            unit=" passages", disable=disable, smoothing=0.1) as bar:
    for i in missing:
      start, end = writer.shard_rows(i)
      parts = []
      for vectors in encoder.embed(store, start, end):
        parts.append(vectors)
        bar.update(len(vectors))
      writer.write(i, np.concatenate(parts))
  return remaining


def write_dense_index(encoder: PassageEncoder, corpus: str | os.PathLike,
                      output: str | os.PathLike, *,
                      factory: str = DEFAULT_FACTORY, metric: str = "ip",
                      index_shards: int = 1,
                      shard_size: int = DEFAULT_SHARD_SIZE,
                      embedding_dtype: str = "float32",
                      train_size: int = DEFAULT_TRAIN_SIZE,
                      progress: bool | None = None,
                      encoding: str = "utf-8") -> dict:
  """Indexes ``corpus`` into the directory ``output``; returns a summary.

  ``factory``: a FAISS factory string ("Flat" is exact); ``metric``: 'ip' or
  'l2'; ``index_shards``: FAISS sub-indexes over contiguous rows;
  ``embedding_dtype``: 'float32' or 'float16'. Returns ``{"index",
  "num_passages", "dim", "embedded", "reused", ...}``.
  """
  output = Path(output)
  check_output(output)
  dim = encoder.dim
  make_index(dim, factory, metric)  # fails fast on a bad factory string
  if index_shards < 1:
    raise InputError("--index-shards", f"must be positive, got {index_shards}")
  staging = staging_dir(output)
  with building(output, remove=[staging]):
    remove_stale_temporaries(staging)  # a dead build's unfinished files
    staging.mkdir(parents=True, exist_ok=True)
    store = write_store(corpus, staging, progress, encoding)
    source = {**encoder.source(), "passages": store_fingerprint(staging)}
    writer = ShardWriter(staging, len(store), dim, dtype=embedding_dtype,
                         shard_size=shard_size, source=source)
    if output.is_dir():
      writer.adopt(output)
    embedded = embed_missing(encoder, store, writer, progress)
    embeddings = EmbeddingStore(staging)
    for stale in staging.glob("faiss_*.index"):  # from an earlier attempt
      stale.unlink()
    faiss_info = build_faiss_index(embeddings, staging, factory=factory,
                                   metric=metric, index_shards=index_shards,
                                   train_size=train_size, progress=progress)
    entry = encoder.entry()
    meta = write_meta(
        staging, INDEX_TYPE, num_passages=len(store), dim=dim,
        corpus=os.path.abspath(corpus), encoder=entry, query_encoder=entry,
        faiss=faiss_info,
        embeddings={"dtype": embedding_dtype, "shard_size": shard_size,
                    "num_shards": writer.num_shards})
    del store, embeddings
    replace_directory(staging, output)
  return {"index": str(output), "type": INDEX_TYPE,
          "num_passages": meta["num_passages"], "dim": dim,
          "factory": factory, "index_shards": index_shards,
          "embedded": embedded, "reused": meta["num_passages"] - embedded}


# --------------------------------------------------------------------------
# searching


def read_dense_meta(directory: str | os.PathLike) -> dict:
  """``meta.json`` of a dense index directory (InputError if it is not one)."""
  meta = read_meta(directory)
  if meta["type"] != INDEX_TYPE:
    raise InputError(directory, f"a {meta['type']!r} index, not a dense one")
  return meta


def hit_lists(scores: np.ndarray, rows: np.ndarray) -> list[Hits]:
  """[Q, k] FAISS results (row -1 = none, at the end) as each query's
  :class:`~jaxfid.retrieval.hits.Hits`: views of its row of the arrays,
  no Python number made until a consumer reads them."""
  found = (rows >= 0).sum(axis=1).tolist()
  return [Hits(r[:n], s[:n]) for r, s, n in zip(rows, scores, found)]


class DenseSearcher:
  """Searches a dense index directory (``meta`` read when None).

  Without ``query_embedder`` queries need the ``query_vectors`` option.
  """

  def __init__(self, directory: str | os.PathLike, meta: dict | None = None,
               query_embedder: QueryEmbedder | None = None):
    self.directory = Path(directory)
    self.meta = meta if meta is not None else read_meta(directory)
    self.store = PassageStore(self.directory,
                              num_passages=self.meta.get("num_passages"))
    self.embeddings = EmbeddingStore(self.directory)
    if len(self.embeddings) != len(self.store):
      raise InputError(self.directory, f"{len(self.embeddings)} embeddings "
                       f"for {len(self.store)} passages")
    self.embeddings.check()
    if "faiss" in self.meta:
      check_faiss_files(self.directory, self.meta["faiss"], len(self.store))
    self.query_embedder = query_embedder
    self._index: ShardedIndex | None = None
    self._index_mmap = False
    self._query_vectors: dict[str, dict] = {}
    self._faiss_options: dict = {}

  def index(self, mmap: bool = False) -> ShardedIndex:
    """The FAISS index (loaded on first use)."""
    if self._index is None or self._index_mmap != mmap:
      self._index = ShardedIndex.load(self.directory, self.meta["faiss"],
                                      self.embeddings, mmap=mmap)
      self._index_mmap = mmap
      self._faiss_options = {}
    return self._index

  def vectors(self, rows: Sequence[int]) -> np.ndarray:
    """float32 [len(rows), dim]: the stored embeddings of passages ``rows``."""
    return self.embeddings[rows]

  def embed_queries(self, texts: Sequence[str],
                    query_vectors: str | None = None,
                    **options) -> np.ndarray:
    """float32 [len(texts), dim]: from ``query_vectors`` or the embedder."""
    if query_vectors is not None:
      if query_vectors not in self._query_vectors:
        self._query_vectors[query_vectors] = read_query_vectors(
            query_vectors, self.embeddings.dim)
      table = self._query_vectors[query_vectors]
      missing = [t for t in texts if t not in table]
      if missing:
        raise InputError(query_vectors, f"no vector for query "
                         f"{missing[0][:80]!r}")
      return np.stack([table[t] for t in texts]).astype(np.float32)
    if self.query_embedder is None:
      raise InputError(self.directory, "this index has no query encoder: "
                       "pass precomputed vectors with --search-option "
                       "query_vectors=FILE")
    return self.query_embedder(texts, **options)

  def search_vectors(self, vectors: np.ndarray, top_k: int
                     ) -> list[Hits]:
    """Top ``top_k`` (row, score) per query vector, best first."""
    return hit_lists(*self.index(self._index_mmap).search(vectors, top_k))

  def search_batches(self, batches: Sequence[Sequence[str]], top_k: int,
                     threads: int | None = None, **options
                     ) -> Iterator[list[Hits]]:
    """:meth:`search` of each batch, in order: queries are embedded
    ``QUERY_CHUNK`` batches at a time (the embedder pipelines its device
    batches), and FAISS searches on ``threads`` threads (None: all)."""
    threads = resolve_threads(threads)
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
      for start in range(0, len(batches), QUERY_CHUNK):
        chunk = batches[start:start + QUERY_CHUNK]
        texts = [text for batch in chunk for text in batch]
        found = self.search(texts, top_k, **options)
        for batch in chunk:
          yield found[:len(batch)]
          found = found[len(batch):]
    finally:
      faiss.omp_set_num_threads(previous)

  def search(self, texts: Sequence[str], top_k: int,
             **options) -> list[Hits]:
    """Top ``top_k`` (store row, score) per query text, best first."""
    options = dict(options)
    query_vectors = options.pop("query_vectors", None)
    mmap = str(options.pop("mmap", "0")).lower() in ("1", "true", "yes")
    embedder_names = self.query_embedder.options if self.query_embedder else ()
    embedder_options = {name: options.pop(name) for name in embedder_names
                        if name in options}
    if "token_top_k" in options:
      raise InputError(self.directory, "option --token-top-k does not apply "
                       "to a dense index")
    index = self.index(mmap)
    if options != self._faiss_options:
      index.set_options(self.directory, **options)
      self._faiss_options = options
    if not texts:
      return []
    vectors = self.embed_queries(texts, query_vectors, **embedder_options)
    return self.search_vectors(vectors, top_k)


__all__ = ["INDEX_TYPE", "PassageEncoder", "QueryEmbedder", "DenseSearcher",
           "read_dense_corpus", "read_dense_meta", "write_dense_index",
           "write_store", "embed_missing", "store_fingerprint", "staging_dir"]
