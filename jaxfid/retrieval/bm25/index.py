"""BM25 index directories: building one from a corpus, and searching it.

Layout of ``INDEX_DIR`` (``jaxfid index bm25``)::

  meta.json        {"type": "bm25", "k1", "b", "lucene_norms", "num_passages",
                    "corpus", "analyzer"}
  passages.bin ... the passage store (jaxfid.retrieval.store.passage_store)
  bm25/            the postings, in bm25s's file layout (jaxfid.retrieval.bm25.scoring)

Documents are indexed as title and text together (Anserini's "contents").
Building streams the corpus once, tokenising on ``threads`` processes and
spilling postings to disk; the directory appears only when complete.
Importing this module registers the ``"bm25"`` index type.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxfid.core.errors import InputError
from jaxfid.retrieval.bm25.builder import BM25Builder
from jaxfid.retrieval.bm25.check import open_bm25_index
from jaxfid.retrieval.bm25.scoring import BM25Params
from jaxfid.retrieval.bm25.tokens import BatchAnalyzer, TokenBatch
from jaxfid.retrieval.index_dir import (
    building, check_output, read_meta, write_meta)
from jaxfid.retrieval.search import register_index_type
from jaxfid.retrieval.store.corpus import passage_contents, read_corpus
from jaxfid.retrieval.store.passage_store import (
    PassageStore, PassageStoreWriter)
from jaxfid.retrieval.text.analysis import EnglishAnalyzer
from jaxfid.retrieval.workers import ordered_map, resolve_threads
from jaxfid.runtime.files import atomic_directory

INDEX_TYPE = "bm25"


BATCH_DOCS = 2048  # documents per tokenising task
MIN_PARALLEL_WORK = 20_000_000  # queries x passages worth worker processes

_BATCHER: BatchAnalyzer | None = None  # a worker's tokenizer


def _init_tokenizer(config: dict) -> None:
  global _BATCHER
  _BATCHER = BatchAnalyzer(EnglishAnalyzer.from_config(config))


def _tokenize(texts: list[str]) -> TokenBatch:
  return _BATCHER(texts)


def build_bm25_index(corpus: str | os.PathLike, output: str | os.PathLike,
                     params: BM25Params = BM25Params(),
                     progress: bool | None = None, encoding: str = "utf-8",
                     threads: int | None = None) -> dict:
  """Indexes a corpus file into ``output`` on ``threads`` processes (None:
  all CPUs); returns meta.json. InputError for a bad or empty corpus or a
  concurrent build, StorageError for a full disk (an earlier index kept)."""
  if params.k1 < 0 or not 0 <= params.b <= 1:
    raise InputError(corpus, f"invalid BM25 parameters k1={params.k1} "
                     f"b={params.b} (need k1 >= 0, 0 <= b <= 1)")
  threads = resolve_threads(threads)
  with building(output), \
      atomic_directory(output, check=check_output) as tmp:
    builder = BM25Builder(spill_dir=tmp / "chunks")
    with PassageStoreWriter(tmp, source=corpus) as store, \
        tqdm(desc="indexing", unit=" passages", disable=_quiet(progress),
             smoothing=0.05) as bar:
      batches = _text_batches(read_corpus(corpus, encoding=encoding), store)
      for tokens in ordered_map(_tokenize, batches, threads, _init_tokenizer,
                                (builder.analyzer.config(),)):
        builder.add_batch(tokens)
        bar.update(len(tokens.lengths))
    if len(builder) == 0:
      raise InputError(corpus, "no passages in the corpus")
    index = builder.finish(params, directory=tmp / "bm25",
                           progress=progress)
    index.save(tmp / "bm25")
    meta = write_meta(tmp, INDEX_TYPE, k1=params.k1, b=params.b,
                      lucene_norms=params.lucene_norms,
                      num_passages=len(builder),
                      corpus=os.path.abspath(corpus),
                      analyzer=index.analyzer.config()["name"],
                      stats=index.stats)
  return meta


def _text_batches(passages: Iterable, store: PassageStoreWriter
                  ) -> Iterator[list[str]]:
  """Stores each (line, passage) and yields their indexed texts in batches."""
  batch: list[str] = []
  for lineno, passage in passages:
    store.add(passage, lineno)
    batch.append(passage_contents(passage))
    if len(batch) == BATCH_DOCS:
      yield batch
      batch = []
  if batch:
    yield batch


def _quiet(progress: bool | None) -> bool | None:
  return None if progress is None else not progress


class BM25Searcher:
  """Searches a BM25 index directory (the ``"bm25"`` index type)."""

  def __init__(self, directory: str | os.PathLike, meta: dict):
    self.directory = Path(directory)
    self.meta = meta
    self.store = PassageStore(directory, num_passages=meta.get(
        "num_passages"))
    self.index = open_bm25_index(self.directory / "bm25", len(self.store))

  def _check(self, options: dict) -> None:
    if options:
      names = ", ".join("--" + k.replace("_", "-") for k in sorted(options))
      raise InputError(self.directory, f"option {names} does not apply to a "
                       "bm25 index")

  def search(self, texts: Sequence[str], top_k: int,
             **options) -> list[list[tuple[int, float]]]:
    """Top ``top_k`` (store row, score) per query text, best first."""
    self._check(options)
    rank = self.store.id_rank
    return [self.index.search(text, top_k, rank) for text in texts]

  def search_batches(self, batches: Sequence[Sequence[str]], top_k: int,
                     threads: int | None = None, **options
                     ) -> Iterator[list[list[tuple[int, float]]]]:
    """:meth:`search` of each batch, in order, on ``threads`` processes
    that each map the index (None: all CPUs); small jobs (queries times
    passages under ``MIN_PARALLEL_WORK``) run here, without workers."""
    self._check(options)
    threads = resolve_threads(threads)
    queries = sum(len(batch) for batch in batches)
    if (threads == 1 or len(batches) < 2
        or queries * len(self.store) < MIN_PARALLEL_WORK):
      for batch in batches:
        yield self.search(batch, top_k)
      return
    # forked workers inherit this open searcher (and the analyzer's tables,
    # built here once) instead of each opening the index again
    self.index.analyzer.prepare(text for batch in batches for text in batch)
    key = str(self.directory)
    _OPEN[key] = self
    try:
      for counts, rows, scores in ordered_map(
          _search_batch, batches, threads, _open_searcher, (key, top_k)):
        rows, scores = rows.tolist(), scores.tolist()
        ends = np.cumsum(counts).tolist()
        yield [list(zip(rows[a:b], scores[a:b]))
               for a, b in zip([0] + ends[:-1], ends)]
    finally:
      _OPEN.pop(key, None)


_SEARCH: tuple | None = None  # a worker's (searcher, top_k)
# searchers the parent has open while its workers start, by directory: a
# forked worker finds its searcher here; a spawned one opens the index
_OPEN: dict[str, BM25Searcher] = {}


def _open_searcher(directory: str, top_k: int) -> None:
  global _SEARCH
  searcher = _OPEN.get(directory)
  if searcher is None:
    searcher = BM25Searcher(directory, read_meta(directory))
  _SEARCH = searcher, top_k


def _search_batch(texts: Sequence[str]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A batch's results, compactly: (count per query, rows, scores)."""
  searcher, top_k = _SEARCH
  found = searcher.search(texts, top_k)
  flat = [hit for hits in found for hit in hits]
  return (np.array([len(hits) for hits in found], np.int64),
          np.array([row for row, _ in flat], np.int64),
          np.array([score for _, score in flat], np.float32))


register_index_type(INDEX_TYPE, BM25Searcher)
