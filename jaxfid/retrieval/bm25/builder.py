"""Building a BM25 index from a stream of documents in bounded memory.

:class:`BM25Builder` adds documents' term ids to a flat int32 buffer, reduced
every ``flush_tokens`` tokens to a chunk of term-major (term, document, tf)
triples (in memory or spilled to ``spill_dir``). ``finish`` then scores each
chunk with the whole collection's statistics and scatters it into the final
term-major arrays (memory-mapped files with ``directory``), so peak memory is
one chunk plus per-document and per-term arrays. :func:`build_index` indexes
an iterable of texts in memory.
"""
from __future__ import annotations

import array
import itertools
import os
import shutil
from pathlib import Path
from typing import Iterable

import numpy as np
from tqdm.auto import tqdm

from jaxfid.retrieval.bm25.scoring import (
    BM25Index, BM25Params, lucene_avgdl, lucene_idf, norm_inverse, term_scores)
from jaxfid.retrieval.bm25.tokens import BatchAnalyzer, TokenBatch
from jaxfid.retrieval.bm25.topk import quantize_impacts
from jaxfid.retrieval.text.analysis import EnglishAnalyzer
from jaxfid.runtime.files import preallocate

_FIELDS = ("terms", "docs", "tfs")


class BM25Builder:
  """Incremental indexing: ``add_batch``/``add`` documents, then
  ``finish()``; chunks of ``flush_tokens`` tokens spill to ``spill_dir``."""

  def __init__(self, analyzer: EnglishAnalyzer | None = None,
               flush_tokens: int = 1 << 24,
               spill_dir: str | os.PathLike | None = None):
    self.analyzer = analyzer or EnglishAnalyzer()
    self.flush_tokens = flush_tokens
    self.spill_dir = Path(spill_dir) if spill_dir is not None else None
    self.vocab: dict[str, int] = {}
    self._batcher: BatchAnalyzer | None = None
    self._tables: dict[tuple, array.array] = {}  # per analyzer: id+1 -> col
    self._tokens: list[np.ndarray] = []  # column per raw token, -1: none
    self._raw_lengths: list[np.ndarray] = []
    self._buffered_tokens = 0
    self._num_docs = 0
    self._buffered_docs = 0
    self._doc_lengths: list[np.ndarray] = []
    self._chunks: list = []  # dicts of arrays, or paths of saved chunks

  def __len__(self) -> int:
    return self._num_docs

  def add_batch(self, batch: TokenBatch) -> None:
    """Appends the documents of a tokenised batch (the next rows)."""
    table = self._tables.get(batch.source)
    if table is None:
      table = self._tables[batch.source] = array.array("i", [-1])
    vocab = self.vocab
    table.extend([vocab.setdefault(t, len(vocab)) for t in batch.new_terms])
    self._tokens.append(np.frombuffer(table, np.int32)[batch.ids + 1])
    self._raw_lengths.append(np.asarray(batch.lengths, np.int32))
    self._buffered_tokens += len(batch.ids)
    self._num_docs += len(batch.lengths)
    self._buffered_docs += len(batch.lengths)
    if self._buffered_tokens >= self.flush_tokens:
      self._flush()

  def add(self, text: str) -> None:
    """Tokenises and appends one document (the next row)."""
    if self._batcher is None:
      self._batcher = BatchAnalyzer(self.analyzer)
    self.add_batch(self._batcher([text]))

  def _flush(self) -> None:
    n = self._buffered_docs
    if n == 0:
      return
    first = self._num_docs - n
    tokens = np.concatenate(self._tokens)
    rows = np.repeat(np.arange(n, dtype=np.int64),
                     np.concatenate(self._raw_lengths))
    kept = tokens >= 0  # drop stop words
    tokens, rows = tokens[kept], rows[kept]
    self._doc_lengths.append(np.bincount(rows, minlength=n).astype(np.int64))
    keys, tfs = np.unique((tokens.astype(np.int64) << 32) | rows,
                          return_counts=True)  # term-major, then document
    chunk = {"terms": (keys >> 32).astype(np.int32),
             "docs": ((keys & 0xFFFFFFFF) + first).astype(np.int32),
             "tfs": tfs.astype(np.int32)}
    if self.spill_dir is not None:
      self.spill_dir.mkdir(parents=True, exist_ok=True)
      prefix = self.spill_dir / f"chunk{len(self._chunks):05d}"
      for name in _FIELDS:
        np.save(f"{prefix}.{name}.npy", chunk[name])
      self._chunks.append(prefix)
    else:
      self._chunks.append(chunk)
    self._tokens, self._raw_lengths = [], []
    self._buffered_tokens = 0
    self._buffered_docs = 0

  def _load(self, chunk, name: str) -> np.ndarray:
    if isinstance(chunk, dict):
      return chunk[name]
    return np.load(f"{chunk}.{name}.npy")

  def finish(self, params: BM25Params = BM25Params(),
             directory: str | os.PathLike | None = None,
             progress: bool | None = False) -> BM25Index:
    """Computes the score matrix (memory-mapped ``.npy`` files in
    ``directory`` if given); the builder is spent afterwards."""
    self._flush()
    self._batcher = None
    self._tables = {}
    lengths = (np.concatenate(self._doc_lengths) if self._doc_lengths
               else np.zeros(0, np.int64))
    num_terms = len(self.vocab)
    df = np.zeros(num_terms, np.int64)
    for chunk in self._chunks:
      df += np.bincount(self._load(chunk, "terms"), minlength=num_terms)
    nonempty = int(np.count_nonzero(lengths))
    total = int(lengths.sum())
    avgdl = lucene_avgdl(total, nonempty)
    idf = lucene_idf(df, nonempty)
    norm_inv = norm_inverse(lengths, params, avgdl)
    indptr = np.zeros(num_terms + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    data, indices = self._allocate(int(indptr[-1]), directory)
    cursor = indptr[:-1].copy()  # next free slot of every term
    max_scores = np.zeros(num_terms, np.float32)
    bar = tqdm(total=int(indptr[-1]), desc="writing postings",
               unit=" postings", unit_scale=True,
               disable=None if progress is None else not progress)
    for chunk in self._chunks:
      terms, docs, tfs = (self._load(chunk, name) for name in _FIELDS)
      counts = np.bincount(terms, minlength=num_terms)
      run_start = np.cumsum(counts) - counts  # where each term's run begins
      dest = cursor[terms] + (np.arange(len(terms)) - run_start[terms])
      scores = term_scores(idf[terms], tfs, norm_inv[docs])
      data[dest] = scores
      present = np.flatnonzero(counts)
      if len(present):
        np.maximum.at(max_scores, present,
                      np.maximum.reduceat(scores, run_start[present]))
      indices[dest] = docs
      cursor += counts
      bar.update(len(terms))
      if not isinstance(chunk, dict):
        for name in _FIELDS:
          os.unlink(f"{chunk}.{name}.npy")
    bar.close()
    self._chunks = []
    if self.spill_dir is not None:
      shutil.rmtree(self.spill_dir, ignore_errors=True)
    stats = {"num_nonempty_docs": nonempty, "sum_total_term_freq": total,
             "avgdl": float(avgdl)}
    impacts, step = quantize_impacts(
        data, float(max_scores.max(initial=0.0)),
        self._allocate_impacts(len(data), directory))
    return BM25Index(data, indices, indptr, self.vocab,
                     num_docs=self._num_docs, params=params,
                     analyzer=self.analyzer, stats=stats, idf=idf,
                     doc_norms=norm_inv, max_scores=max_scores,
                     impacts=impacts, impact_step=step)

  @staticmethod
  def _allocate(size: int, directory) -> tuple[np.ndarray, np.ndarray]:
    if directory is None:
      return np.empty(size, np.float32), np.empty(size, np.int32)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    open_memmap = np.lib.format.open_memmap
    arrays = (open_memmap(d / "data.csc.index.npy", mode="w+",
                          dtype=np.float32, shape=(size,)),
              open_memmap(d / "indices.csc.index.npy", mode="w+",
                          dtype=np.int32, shape=(size,)))
    # a full disk is then an OSError here, not SIGBUS while writing the map
    preallocate(d / "data.csc.index.npy")
    preallocate(d / "indices.csc.index.npy")
    return arrays

  @staticmethod
  def _allocate_impacts(size: int, directory) -> np.ndarray:
    if directory is None:
      return np.empty(size, np.uint16)
    path = Path(directory) / "impacts.csc.index.npy"
    impacts = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16,
                                        shape=(size,))
    preallocate(path)
    return impacts


def build_index(texts: Iterable[str], params: BM25Params = BM25Params(),
                analyzer: EnglishAnalyzer | None = None,
                batch_size: int = 1024) -> BM25Index:
  """Indexes ``texts`` (document i is row i) in memory."""
  builder = BM25Builder(analyzer)
  batcher = BatchAnalyzer(builder.analyzer)
  texts = iter(texts)
  while batch := list(itertools.islice(texts, batch_size)):
    builder.add_batch(batcher(batch))
  return builder.finish(params)
