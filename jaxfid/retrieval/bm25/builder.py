"""Building a BM25 index from a stream of documents in bounded memory.

:class:`BM25Builder` takes documents one at a time (``add``). Tokens go into
a flat int32 buffer (one dictionary lookup per token: raw token -> term
column, filled on a word's first occurrence with the analyzer's possessive,
stop-word and stemming rules). Every ``flush_tokens`` tokens the buffer is
reduced to a *chunk*: its (term, document, tf) triples sorted term-major,
kept in memory or, with ``spill_dir``, saved to disk.

``finish`` needs the whole collection's statistics (document frequencies,
N, avgdl) before any score can be computed, so it makes a second pass over
the chunks: each chunk's scores are computed and scattered into the final
term-major arrays (chunks are in document order, so every term's postings
stay sorted by document). With ``directory`` those arrays are memory-mapped
files written in place; then peak memory is one chunk plus per-document and
per-term arrays, not the collection's postings, which is what makes a
21M-passage Wikipedia index possible on an ordinary machine.

:func:`build_index` indexes an iterable of texts in memory.
"""
from __future__ import annotations

import array
import os
import shutil
from pathlib import Path
from typing import Iterable

import numpy as np

from jaxfid.core.files import preallocate
from jaxfid.retrieval.bm25.scoring import (
    BM25Index, BM25Params, lucene_avgdl, lucene_idf, norm_inverse, term_scores)
from jaxfid.retrieval.text.analysis import EnglishAnalyzer, raw_tokens

_FIELDS = ("terms", "docs", "tfs")


class BM25Builder:
  """Incremental indexing: ``add(text)`` per document, then ``finish()``.

  Args:
    analyzer: the analyzer (Lucene English by default).
    flush_tokens: tokens buffered before they are reduced to a chunk.
    spill_dir: if given, chunks are saved there (and deleted by ``finish``)
      instead of being kept in memory.
  """

  def __init__(self, analyzer: EnglishAnalyzer | None = None,
               flush_tokens: int = 1 << 24,
               spill_dir: str | os.PathLike | None = None):
    self.analyzer = analyzer or EnglishAnalyzer()
    self.flush_tokens = flush_tokens
    self.spill_dir = Path(spill_dir) if spill_dir is not None else None
    self.vocab: dict[str, int] = {}
    self._word_ids: dict[str, int] = {}  # raw token -> column, -1: none
    self._tokens = array.array("i")
    self._raw_lengths = array.array("i")
    self._num_docs = 0
    self._buffered_docs = 0
    self._doc_lengths: list[np.ndarray] = []
    self._chunks: list = []  # dicts of arrays, or paths of saved chunks

  def __len__(self) -> int:
    return self._num_docs

  def _word_id(self, token: str) -> int:
    term = self.analyzer.raw_term(token)
    col = -1 if term is None else self.vocab.setdefault(term, len(self.vocab))
    self._word_ids[token] = col
    return col

  def add(self, text: str) -> None:
    """Tokenises one document (the next row)."""
    words = raw_tokens(text)
    word_ids = self._word_ids
    try:
      cols = [word_ids[w] for w in words]
    except KeyError:
      cols = [word_ids[w] if w in word_ids else self._word_id(w)
              for w in words]
    self._tokens.extend(cols)
    self._raw_lengths.append(len(cols))
    self._num_docs += 1
    self._buffered_docs += 1
    if len(self._tokens) >= self.flush_tokens:
      self._flush()

  def _flush(self) -> None:
    n = self._buffered_docs
    if n == 0:
      return
    first = self._num_docs - n
    tokens = np.frombuffer(self._tokens, dtype=np.int32)
    rows = np.repeat(np.arange(n, dtype=np.int64),
                     np.frombuffer(self._raw_lengths, dtype=np.int32))
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
    self._tokens = array.array("i")
    self._raw_lengths = array.array("i")
    self._buffered_docs = 0

  def _load(self, chunk, name: str) -> np.ndarray:
    if isinstance(chunk, dict):
      return chunk[name]
    return np.load(f"{chunk}.{name}.npy")

  def finish(self, params: BM25Params = BM25Params(),
             directory: str | os.PathLike | None = None) -> BM25Index:
    """Computes the score matrix; the builder is spent afterwards.

    Args:
      params: BM25 parameters.
      directory: if given, the postings arrays are created there as
        memory-mapped ``.npy`` files (``BM25Index.save`` to the same
        directory then leaves them in place).
    """
    self._flush()
    self._word_ids = {}
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
    for chunk in self._chunks:
      terms, docs, tfs = (self._load(chunk, name) for name in _FIELDS)
      counts = np.bincount(terms, minlength=num_terms)
      run_start = np.cumsum(counts) - counts  # where each term's run begins
      dest = cursor[terms] + (np.arange(len(terms)) - run_start[terms])
      data[dest] = term_scores(idf[terms], tfs, norm_inv[docs])
      indices[dest] = docs
      cursor += counts
      if not isinstance(chunk, dict):
        for name in _FIELDS:
          os.unlink(f"{chunk}.{name}.npy")
    self._chunks = []
    if self.spill_dir is not None:
      shutil.rmtree(self.spill_dir, ignore_errors=True)
    stats = {"num_nonempty_docs": nonempty, "sum_total_term_freq": total,
             "avgdl": float(avgdl)}
    return BM25Index(data, indices, indptr, self.vocab,
                     num_docs=self._num_docs, params=params,
                     analyzer=self.analyzer, stats=stats, idf=idf,
                     doc_norms=norm_inv)

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


def build_index(texts: Iterable[str], params: BM25Params = BM25Params(),
                analyzer: EnglishAnalyzer | None = None) -> BM25Index:
  """Indexes ``texts`` (document i is row i) in memory."""
  builder = BM25Builder(analyzer)
  for text in texts:
    builder.add(text)
  return builder.finish(params)
