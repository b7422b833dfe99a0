"""BM25 scored exactly as Lucene (and so Anserini/pyserini) scores it.

Lucene's ``BM25Similarity`` (pyserini's defaults k1=0.9, b=0.4)::

    idf(t)  = (float) ln(1 + (N - df + 0.5) / (df + 0.5))       (in double)
    norm(d) = 1 / (k1 * ((1 - b) + b * L(d) / avgdl))           (in float)
    s(t, d) = w - w / (1 + tf * norm(d)),  w = boost * idf(t)    (in float)

N counts documents with a term, avgdl is sumTotalTermFreq / N, L(d) is
Lucene's one-byte length (:func:`int_to_byte4`), float arithmetic is
float32 in Lucene's order, document scores are double sums rounded to
float, and ties go to the smaller document id.

Storage is bm25s's term-major CSC of per-(term, document) scores (``data``
float32, ``indices`` int32, ``indptr`` int64), plus ``max_scores.npy`` (per
term) and ``impacts.csc.index.npy`` (uint16 quantised scores). Queries with
few postings are scored exhaustively, others by
:func:`jaxfid.retrieval.bm25.topk.pruned_top_k`.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
from pathlib import Path

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.retrieval.bm25.topk import (
    IMPACT_MAX, Term, Workspaces, pruned_top_k, quantize_impacts)
from jaxfid.retrieval.text.analysis import EnglishAnalyzer

# --- Lucene's SmallFloat: document lengths in one byte ----------------------
_NUM_FREE_VALUES = 24  # 255 - longToInt4(Integer.MAX_VALUE)


def _long_to_int4(i: np.ndarray) -> np.ndarray:
  bits = np.frexp(i.astype(np.float64))[1].astype(np.int64)  # bit length
  shift = np.maximum(bits - 4, 0)
  normal = ((i >> shift) & 0x07) | ((shift + 1) << 3)
  return np.where(bits < 4, i, normal)


def _int4_to_long(i: np.ndarray) -> np.ndarray:
  bits = i & 0x07
  shift = (i >> 3) - 1
  return np.where(shift == -1, bits, (bits | 0x08) << np.maximum(shift, 0))


def int_to_byte4(lengths) -> np.ndarray:
  """SmallFloat.intToByte4: lengths (>= 0) to their one-byte norm codes."""
  i = np.asarray(lengths, dtype=np.int64)
  if np.any(i < 0) or np.any(i > 2**31 - 1):
    raise ValueError("lengths must be in [0, 2^31)")
  code = np.where(i < _NUM_FREE_VALUES, i,
                  _NUM_FREE_VALUES + _long_to_int4(
                      np.maximum(i - _NUM_FREE_VALUES, 0)))
  return code.astype(np.uint8)


def byte4_to_int(codes) -> np.ndarray:
  """SmallFloat.byte4ToInt: one-byte norm codes to (quantised) lengths."""
  i = np.asarray(codes, dtype=np.int64) & 0xFF
  return np.where(i < _NUM_FREE_VALUES, i,
                  _NUM_FREE_VALUES + _int4_to_long(
                      np.maximum(i - _NUM_FREE_VALUES, 0)))


LENGTH_TABLE = byte4_to_int(np.arange(256))  # BM25Similarity.LENGTH_TABLE


# --- the formula ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BM25Params:
  """BM25 parameters (pyserini's defaults).

  Attributes:
    k1: term-frequency saturation.
    b: length normalisation.
    lucene_norms: one-byte document lengths, as Lucene (needed for equal
      scores).
  """
  k1: float = 0.9
  b: float = 0.4
  lucene_norms: bool = True


def lucene_idf(df, num_docs: int) -> np.ndarray:
  """BM25Similarity.idf, computed in double and rounded to float32."""
  df = np.asarray(df, dtype=np.float64)
  return np.log(1.0 + (num_docs - df + 0.5) / (df + 0.5)).astype(np.float32)


def lucene_avgdl(sum_total_term_freq: int, num_docs: int) -> np.float32:
  """BM25Similarity.avgFieldLength (1 for an empty collection)."""
  if num_docs == 0:
    return np.float32(1.0)
  return np.float32(sum_total_term_freq / num_docs)


def norm_inverse(lengths, params: BM25Params, avgdl) -> np.ndarray:
  """1 / (k1 * ((1 - b) + b * L / avgdl)) in float32 per document (with
  ``lucene_norms``, from Lucene's 256-entry table of quantised lengths)."""
  k1, b, avgdl = (np.float32(params.k1), np.float32(params.b),
                  np.float32(avgdl))
  one = np.float32(1.0)

  def formula(length):
    length = np.asarray(length).astype(np.float32)
    return one / (k1 * ((one - b) + b * length / avgdl))

  if params.lucene_norms:
    return formula(LENGTH_TABLE)[int_to_byte4(lengths)]
  return formula(lengths)


def term_scores(weight, tf, norm_inv) -> np.ndarray:
  """Lucene's BM25Scorer.score: w - w / (1 + tf * normInverse), in float32."""
  weight = np.asarray(weight, dtype=np.float32)
  tf = np.asarray(tf, dtype=np.float32)
  return weight - weight / (np.float32(1.0) + tf * norm_inv)


# --- the index --------------------------------------------------------------
_EXHAUSTIVE_POSTINGS = 4096  # queries with fewer postings are not pruned


def term_maxima(data: np.ndarray, indptr: np.ndarray) -> np.ndarray:
  """float32 per term: the largest of its postings' scores (0 if none)."""
  starts = np.asarray(indptr[:-1], np.int64)
  out = np.zeros(len(starts), np.float32)
  nonempty = np.flatnonzero(np.diff(indptr) > 0)
  if len(nonempty):
    out[nonempty] = np.maximum.reduceat(data, starts[nonempty])
  return out


class BM25Index:
  """A BM25 index over N documents (rows 0..N-1): postings and vocabulary.

  Attributes:
    data, indices, indptr: term-major CSC of per-(term, doc) scores.
    idf: float32 idf per term; doc_norms: float32 norm inverse per document.
    max_scores: float32 per term, its largest score (for pruning).
    impacts, impact_step: uint16 ``floor(data / impact_step)`` per posting,
      or None.
    vocab: term -> column.
    num_docs: N.
    params: the BM25Params it was built with.
    analyzer: the EnglishAnalyzer applied to documents and queries.
    stats: ``{"num_nonempty_docs", "sum_total_term_freq", "avgdl"}``.
  """

  def __init__(self, data, indices, indptr, vocab: dict[str, int],
               num_docs: int, params: BM25Params, analyzer: EnglishAnalyzer,
               stats: dict, idf: np.ndarray, doc_norms: np.ndarray,
               max_scores: np.ndarray | None = None,
               impacts: np.ndarray | None = None,
               impact_step: float | None = None):
    self.data, self.indices, self.indptr = data, indices, indptr
    self.max_scores = max_scores  # float32 per term (computed when None)
    self.impacts = impacts if impact_step is not None else None
    self.impact_step = impact_step if impacts is not None else None
    self._workspaces = Workspaces()
    # terms whose postings were checked (ascending rows within the
    # collection: the top-k's compiled scatter does no bounds checks)
    self._checked = np.zeros(len(indptr) - 1, bool)
    self.source = "the BM25 index"  # its directory, once loaded
    self.idf = idf  # float32 per term
    self.doc_norms = doc_norms  # float32 normInverse per document
    self.vocab = vocab
    self.num_docs = num_docs
    self.params = params
    self.analyzer = analyzer
    self.stats = stats

  # -- queries
  def query_terms(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(columns, counts) of the distinct known terms of a query."""
    counts = collections.Counter(self.analyzer.analyze(text))
    cols, reps = [], []
    for term, count in counts.items():
      col = self.vocab.get(term)
      if col is not None:
        cols.append(col)
        reps.append(count)
    return np.asarray(cols, dtype=np.int64), np.asarray(reps, np.float64)

  def _postings(self, text: str) -> list[tuple]:
    """(column, boost, rows, float32 scores at boost 1) per distinct term.

    Rows are ascending within a term (the index keeps postings in row order).
    """
    cols, reps = self.query_terms(text)
    out = []
    for col, rep in zip(cols.tolist(), reps.tolist()):
      start, end = int(self.indptr[col]), int(self.indptr[col + 1])
      rows = self.indices[start:end]
      if not self._checked[col]:
        self._check_rows(col, rows)
      out.append((col, rep, rows, self.data[start:end]))
    return out

  def _check_rows(self, col: int, rows: np.ndarray) -> None:
    """Once per term: its rows ascend within [0, num_docs) and its impacts
    are at most IMPACT_MAX (else the index file is damaged: one error
    naming it, never a write out of bounds or an overflowing sum)."""
    if len(rows) and (rows[0] < 0 or rows[-1] >= self.num_docs
                      or (len(rows) > 1 and not np.all(rows[1:] > rows[:-1]))):
      raise InputError(self.source, f"the postings of term {col} are not "
                       f"ascending rows below {self.num_docs} (a damaged "
                       "indices.csc.index.npy; rebuild the index)")
    impacts = self._impacts(col)
    if impacts is not None and len(impacts) and impacts.max() > IMPACT_MAX:
      raise InputError(self.source, f"the impacts of term {col} exceed "
                       f"{IMPACT_MAX} (a damaged impacts.csc.index.npy; "
                       "rebuild the index)")
    self._checked[col] = True

  def _impacts(self, col: int) -> np.ndarray | None:
    if self.impacts is None:
      return None
    return self.impacts[int(self.indptr[col]):int(self.indptr[col + 1])]

  def _boosted(self, col: int, boost: float, rows: np.ndarray,
               scores: np.ndarray) -> np.ndarray:
    """Lucene's scores of a term's postings at weight ``boost * idf`` (the
    integer tf recovered from the boost-1 scores and document norms)."""
    scores = np.asarray(scores, dtype=np.float32)
    if boost == 1:
      return scores
    idf = self.idf[col]
    norm_inv = self.doc_norms[rows]
    s64, n64 = scores.astype(np.float64), norm_inv.astype(np.float64)
    tf = np.rint(s64 / (n64 * np.maximum(float(idf) - s64, 1e-30)))
    weight = np.float32(np.float32(boost) * idf)
    return term_scores(weight, np.maximum(tf, 1), norm_inv)

  def _sum_sparse(self, terms) -> tuple[np.ndarray, np.ndarray]:
    """Exact scores of all matching rows: sums in double, rounded to float."""
    exact = [(rows, self._boosted(col, rep, rows, scores))
             for col, rep, rows, scores in terms]
    if len(exact) == 1:  # one term: Lucene's TermScorer, no sum
      rows, scores = exact[0]
      return rows.astype(np.int64), scores
    rows = np.concatenate([rows for rows, _ in exact])
    weights = np.concatenate([w.astype(np.float64) for _, w in exact])
    docs, inverse = np.unique(rows, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=weights, minlength=len(docs))
    return docs.astype(np.int64), sums.astype(np.float32)

  def match(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """All documents matching a query: (rows int64, scores float32)."""
    terms = self._postings(text)
    if not terms:
      return np.zeros(0, np.int64), np.zeros(0, np.float32)
    return self._sum_sparse(terms)

  def upper_bounds(self) -> np.ndarray:
    """float32 per term: its largest score (at boost 1) in the index."""
    if self.max_scores is None:  # not stored in this index
      self.max_scores = term_maxima(self.data, self.indptr)
    return self.max_scores

  def _upper(self, col: int, boost: float) -> float:
    """An upper bound of the term's scores with weight ``boost * idf``."""
    bound = float(self.upper_bounds()[col])
    if boost == 1:
      return bound
    weight = float(np.float32(np.float32(boost) * self.idf[col]))
    return bound * weight / max(float(self.idf[col]), 1e-30) * (1 + 2.0**-18)

  def search(self, text: str, k: int,
             tie_rank: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The top ``k`` documents containing a query term, [(row, score)] best
    first, Lucene's exact scores; ties to the lower ``tie_rank[row]``."""
    terms = self._postings(text)
    if not terms or k <= 0:
      return []
    num_postings = sum(len(rows) for _, _, rows, _ in terms)
    if len(terms) == 1 or num_postings <= _EXHAUSTIVE_POSTINGS:
      docs, scores = self._sum_sparse(terms)
      return top_k(docs, scores, k, tie_rank)
    docs, scores = pruned_top_k(
        [Term(rows, scores, int(rep), self._upper(col, rep),
              functools.partial(self._boosted, col, rep), self._impacts(col))
         for col, rep, rows, scores in terms], k,
        self._workspaces.get(self.num_docs), self.impact_step)
    return top_k(docs, scores, k, tie_rank)

  # -- persistence
  def save(self, directory: str | os.PathLike) -> None:
    """Writes bm25s-compatible arrays and vocabulary plus ``bm25.json``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _save_array(d / "data.csc.index.npy", self.data, np.float32)
    _save_array(d / "indices.csc.index.npy", self.indices, np.int32)
    _save_array(d / "indptr.csc.index.npy", self.indptr, np.int64)
    with open(d / "vocab.index.json", "w", encoding="utf-8") as f:
      json.dump(self.vocab, f, ensure_ascii=False)
    with open(d / "params.index.json", "w") as f:  # what bm25s.BM25.load reads
      json.dump({"k1": self.params.k1, "b": self.params.b, "delta": 0.5,
                 "method": "lucene", "idf_method": "lucene",
                 "dtype": "float32", "int_dtype": "int32",
                 "num_docs": self.num_docs, "version": "0.3.16",
                 "backend": "numpy"}, f, indent=2)
    np.save(d / "idf.npy", np.asarray(self.idf, np.float32))
    np.save(d / "doc_norms.npy", np.asarray(self.doc_norms, np.float32))
    np.save(d / "max_scores.npy", self.upper_bounds())
    if self.impacts is None:  # an index loaded from before impacts
      self.impacts, self.impact_step = quantize_impacts(
          self.data, float(self.upper_bounds().max(initial=0.0)))
    _save_array(d / "impacts.csc.index.npy", self.impacts, np.uint16)
    with open(d / "bm25.json", "w") as f:
      json.dump({"params": dataclasses.asdict(self.params),
                 "analyzer": self.analyzer.config(),
                 "num_docs": self.num_docs, "stats": self.stats,
                 "impact_step": self.impact_step}, f, indent=2)

  @classmethod
  def load(cls, directory: str | os.PathLike, mmap: bool = True) -> "BM25Index":
    """Opens a saved index; the postings stay on disk when ``mmap``."""
    d = Path(directory)
    with open(d / "bm25.json") as f:
      meta = json.load(f)
    with open(d / "vocab.index.json", encoding="utf-8") as f:
      vocab = json.load(f)
    mode = "r" if mmap else None

    def load(name):  # a plain ndarray view: np.memmap slicing is slow
      return np.load(d / name, mmap_mode=mode).view(np.ndarray)

    index = cls(data=load("data.csc.index.npy"),
                indices=load("indices.csc.index.npy"),
                indptr=np.load(d / "indptr.csc.index.npy"),
                vocab=vocab, num_docs=meta["num_docs"],
                params=BM25Params(**meta["params"]),
                analyzer=EnglishAnalyzer.from_config(meta["analyzer"]),
                stats=meta["stats"], idf=np.load(d / "idf.npy"),
                doc_norms=load("doc_norms.npy"),
                max_scores=(np.load(d / "max_scores.npy")
                            if (d / "max_scores.npy").exists() else None),
                impacts=(load("impacts.csc.index.npy")
                         if (d / "impacts.csc.index.npy").exists() else None),
                impact_step=meta.get("impact_step"))
    index.source = os.fspath(d)
    return index


def top_k(docs: np.ndarray, scores: np.ndarray, k: int,
          tie_rank: np.ndarray | None = None) -> list[tuple[int, float]]:
  """Best ``k`` of (docs, scores): score descending, then tie_rank ascending."""
  if k <= 0 or len(docs) == 0:
    return []
  if len(docs) > k:
    threshold = np.partition(scores, len(scores) - k)[len(scores) - k]
    keep = scores >= threshold  # may exceed k when the k-th score is tied
    docs, scores = docs[keep], scores[keep]
  ranks = docs if tie_rank is None else np.asarray(tie_rank)[docs]
  order = np.lexsort((ranks, -scores))[:k]
  return list(zip(docs[order].tolist(), scores[order].tolist()))


def _save_array(path: Path, values: np.ndarray, dtype) -> None:
  """np.save, unless ``values`` already is that file (memory-mapped)."""
  filename = getattr(values, "filename", None)
  if filename and path.exists() and os.path.samefile(filename, path):
    values.flush()
    return
  np.save(path, np.asarray(values, dtype))
