"""Exact top-k BM25 search that skips what cannot reach the top k (MaxScore).

Term-at-a-time MaxScore (Turtle & Flood 1995), vectorised with numpy:

1. **Expand** terms in decreasing upper bound into a float32 accumulator;
   ``theta`` (the k-th best sum so far) bounds the final k-th score from
   below; stop once the remaining terms' bounds sum below ``theta``.
2. **Candidates**: expanded documents whose sum plus the remaining bounds
   reaches ``theta``.
3. **Update** candidates with each remaining term's scores, dropping those
   that can no longer reach ``theta``.
4. **Exact scores** of the survivors, summed in double as Lucene does.

When postings are evenly spread (``ADD_ALL_RATIO``), :func:`add_all_top_k`
adds every posting instead. Comparisons with ``theta`` allow for the float32
sums' error, so the result equals the exhaustive ranking, ties included.
With stored impacts (boosts summing to at most :data:`MAX_IMPACT_TERMS`)
sums use a uint16 accumulator (:class:`Sums`).
"""
from __future__ import annotations

import threading
from typing import Callable, NamedTuple, Sequence

import numpy as np

try:  # scipy's compiled y += A x over a CSC matrix (scipy comes with jax)
  from scipy.sparse import _sparsetools
  _csc_matvec = _sparsetools.csc_matvec
except (ImportError, AttributeError):  # pragma: no cover - another scipy
  _csc_matvec = None

# a document is dropped only when its bound is below theta by this factor:
# float32 rounding (2^-24 relative) can then never make it tie theta
SAFE = 1.0 - 2.0**-20
# a term is added to the candidates by binary search when they are fewer
# than its postings / LOOKUP_RATIO, else by a mask over its postings
LOOKUP_RATIO = 24
# below this many postings per query, expanding every term in a few numpy
# calls is faster than pruning (calls cost more than the work saved)
EXPAND_ALL_POSTINGS = 50_000
# a query is scored by adding all its postings (add_all_top_k) unless a term
# has more than ADD_ALL_RATIO times the postings of the term of highest bound
ADD_ALL_RATIO = 256
# the accumulator is zeroed whole (a memset) rather than at the touched rows
# (a scatter, ~10x the cost per entry) once they exceed N / RESET_ALL_RATIO
RESET_ALL_RATIO = 8
# impacts are floor(score / step) <= IMPACT_MAX; a query's boosts may sum to
# MAX_IMPACT_TERMS before its uint16 sums could overflow (else: float32 sums)
IMPACT_MAX = 4095
MAX_IMPACT_TERMS = np.iinfo(np.uint16).max // IMPACT_MAX


class Term(NamedTuple):
  """One distinct query term.

  Attributes:
    rows: its postings' rows, ascending (int32, usually memory-mapped).
    scores: float32 scores of those postings at boost 1.
    boost: how many times the term occurs in the query.
    upper: an upper bound of its boosted scores.
    exact: ``exact(rows, scores)``, Lucene's boosted float32 scores.
    impacts: uint16 ``floor(scores / step)``, or None.
  """
  rows: np.ndarray
  scores: np.ndarray
  boost: int
  upper: float
  exact: Callable[[np.ndarray, np.ndarray], np.ndarray]
  impacts: np.ndarray | None = None


class Workspace:
  """Per-thread arrays over all N documents: the float32 and uint16
  accumulators and flags of candidates."""

  def __init__(self, num_docs: int):
    self.acc = np.zeros(num_docs, np.float32)
    self.acc16 = np.zeros(num_docs, np.uint16)
    self.mark = np.zeros(num_docs, bool)


class Workspaces(threading.local):
  """One :class:`Workspace` per thread, made on first use."""

  def get(self, num_docs: int) -> Workspace:
    space = getattr(self, "space", None)
    if space is None or len(space.acc) != num_docs:
      space = self.space = Workspace(num_docs)
    return space


_ONE = {np.dtype(np.float32): np.ones(1, np.float32),
        np.dtype(np.uint16): np.ones(1, np.uint16)}


def scatter_add(acc: np.ndarray, rows: np.ndarray, values: np.ndarray
                ) -> None:
  """``acc[rows] += values`` for distinct in-range ``rows``: scipy's CSC
  product, the same additions in the same order as ``np.add.at``."""
  one = _ONE.get(acc.dtype)
  if (_csc_matvec is not None and one is not None
      and rows.dtype == np.int32 and values.dtype == acc.dtype
      and rows.flags.c_contiguous and values.flags.c_contiguous):
    _csc_matvec(len(acc), 1, np.array([0, len(rows)], np.int32), rows,
                values, one, acc)
  else:
    np.add.at(acc, rows, values)


def quantize_impacts(scores: np.ndarray, max_score: float,
                     out: np.ndarray | None = None,
                     chunk: int = 1 << 24) -> tuple[np.ndarray, float]:
  """(uint16 ``floor(scores / step)``, ``step``): the step quantises every
  score up to ``max_score`` to at most IMPACT_MAX. Computed in float64, in
  chunks (``scores`` may be a memory map of hundreds of millions of
  postings), into ``out`` if given."""
  step = max_score / IMPACT_MAX * (1 + 2.0**-20) if max_score > 0 else 1.0
  out = np.empty(len(scores), np.uint16) if out is None else out
  for a in range(0, len(scores), chunk):
    part = np.floor(np.asarray(scores[a:a + chunk], np.float64) / step)
    out[a:a + chunk] = part.astype(np.uint16)
  return out, step


class Sums(NamedTuple):
  """A query's accumulator and how its sums bound the true scores.

  ``step`` None: float32 sums of the terms' scores, within a relative
  ``eps`` of the exact ones. Else uint16 sums ``P`` of impacts: the true
  partial score over terms whose boosts sum to ``m`` lies in
  ``[P * step, (P + m) * step)``, up to ``eps``.
  """
  acc: np.ndarray
  step: float | None
  eps: float

  @classmethod
  def choose(cls, terms: Sequence[Term], space: Workspace,
             step: float | None) -> "Sums":
    """uint16 sums where every term has impacts (of ``step``) and the
    boosts allow, else float32 sums."""
    eps = (len(terms) + 16) * 2.0**-23  # float32 sums vs exact, relative
    if (step is not None and all(t.impacts is not None for t in terms)
        and sum(t.boost for t in terms) <= MAX_IMPACT_TERMS):
      return cls(space.acc16, step, eps)
    return cls(space.acc, None, eps)

  def values(self, term: Term, pos=slice(None)) -> np.ndarray:
    """What a term adds to the accumulator (at ``pos`` of its postings)."""
    if self.step is None:
      return _approx(term, term.scores[pos])
    impacts = term.impacts[pos]
    return impacts if term.boost == 1 else impacts * np.uint16(term.boost)

  def low(self, value: float) -> float:
    """A lower bound of the true partial score of an accumulator value."""
    if self.step is None:
      return value * (1 - self.eps)
    return value * self.step * (1 - self.eps)

  def need(self, bound: float, added: int) -> float:
    """The least accumulator value (over terms of boosts summing to
    ``added``) whose true partial score may reach ``bound``."""
    if self.step is None:
      return bound / (1 + self.eps)
    return bound / (self.step * (1 + self.eps)) - added


def gather(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
  """``values[rows]``: ``take`` with platform indices (numpy's fancy
  indexing with the index's int32 rows is several times slower)."""
  return values.take(rows.astype(np.intp, copy=False))


def _kth(values: np.ndarray, k: int) -> float:
  return float(np.partition(values, len(values) - k)[len(values) - k])


def _approx(term: Term, scores: np.ndarray) -> np.ndarray:
  return scores if term.boost == 1 else scores * np.float32(term.boost)


def _lookup(cand: np.ndarray, rows: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
  """(which of the sorted candidates are in ``rows``, their positions)."""
  wanted = cand.astype(rows.dtype)  # rows stay as they are on disk
  pos = np.minimum(np.searchsorted(rows, wanted), len(rows) - 1)
  hit = rows[pos] == wanted
  return hit, pos[hit]


def _union(acc: np.ndarray, mark: np.ndarray,
           expanded: Sequence[np.ndarray], need: float,
           last: np.ndarray | None) -> np.ndarray:
  """The distinct rows of the expanded postings whose sum is >= need
  (``last``: the sums of the last expanded rows, if already gathered)."""
  parts = []
  for j, rows in enumerate(expanded):
    sums = (last if j == len(expanded) - 1 and last is not None
            else gather(acc, rows))
    picked = rows[sums >= need]
    if j:  # a row picked from an earlier term is not taken again
      picked = picked[~mark[picked]]
    if j < len(expanded) - 1:
      mark[picked] = True
    parts.append(picked)
  cand = np.concatenate(parts) if len(parts) > 1 else parts[0]
  mark[cand] = False
  return cand


def _add(sums: Sums, mark: np.ndarray, cand: np.ndarray, term: Term
         ) -> None:
  """Adds a term's approximate scores to the candidates it contains."""
  acc, rows = sums.acc, term.rows
  if len(cand) * LOOKUP_RATIO < len(rows):
    cand = np.sort(cand)
    hit, pos = _lookup(cand, rows)
    acc[cand[hit]] += sums.values(term, pos)
  else:
    mark[cand] = True
    inside = np.flatnonzero(gather(mark, rows))
    mark[cand] = False
    hit = rows[inside].astype(np.intp)
    acc[hit] += sums.values(term, inside)


def _reset(acc: np.ndarray, touched: Sequence[np.ndarray]) -> None:
  """Zeroes the accumulator where the ``touched`` rows were added: by one
  memset once they exceed N / RESET_ALL_RATIO, else at those rows."""
  if sum(len(rows) for rows in touched) * RESET_ALL_RATIO >= len(acc):
    acc.fill(0.0)
  else:
    for rows in touched:
      acc.put(rows.astype(np.intp, copy=False), 0.0)


def exact_scores(terms: Sequence[Term], docs: np.ndarray) -> np.ndarray:
  """float32 scores of ``docs`` (sorted): Lucene's, summed in double."""
  total = np.zeros(len(docs), np.float64)
  for term in terms:
    hit, pos = _lookup(docs, term.rows)
    total[hit] += term.exact(term.rows[pos], term.scores[pos])
  return total.astype(np.float32)


def expand_all_top_k(terms: Sequence[Term], k: int, space: Workspace
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Like :func:`pruned_top_k` with every term expanded, in a few numpy
  calls (for queries with few postings, where calls cost more than work)."""
  eps = (len(terms) + 16) * 2.0**-23
  acc = space.acc
  rows = np.concatenate([t.rows for t in terms]).astype(np.intp)
  np.add.at(acc, rows, np.concatenate([_approx(t, t.scores) for t in terms]))
  try:
    sums = gather(acc, rows)
    theta = -np.inf
    best = len(terms) * k  # a row occurs at most once per term
    if len(rows) > best:
      top = np.argpartition(sums, len(rows) - best)[len(rows) - best:]
      docs = np.unique(rows[top])
    else:
      docs = np.unique(rows)
    if len(docs) >= k:
      theta = _kth(gather(acc, docs), k) * (1 - eps)
    cand = np.unique(rows[sums * (1 + eps) >= theta * SAFE]).astype(np.int64)
    return cand, exact_scores(terms, cand)
  finally:
    _reset(acc, [rows])


def add_all_top_k(terms: Sequence[Term], k: int, sums: Sums
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Like :func:`pruned_top_k` for queries whose terms' postings are of
  similar lengths, where MaxScore's skipping saves little: every posting is
  added (``terms`` sorted by upper bound, descending), then ``theta`` is the
  k-th best complete sum among the first terms' documents, and the
  candidates are the documents of the terms that any top-k document must
  contain (MaxScore's essential terms, for this ``theta``) whose sum
  reaches it: few passes, each over postings, none over all N documents.
  """
  acc = sums.acc
  try:
    for term in terms:
      scatter_add(acc, term.rows, sums.values(term))
    added = sum(term.boost for term in terms)
    docs, j = terms[0].rows, 1
    while len(docs) < k and j < len(terms):  # distinct documents, >= k
      docs = np.union1d(docs, terms[j].rows)
      j += 1
    theta = (sums.low(_kth(gather(acc, docs), k)) if len(docs) >= k
             else -np.inf)
    bounds = np.array([t.upper for t in terms], np.float64)
    rest = np.concatenate([np.cumsum(bounds[::-1])[::-1], [0.0]])
    # a document containing none of terms[:e] scores at most rest[e]
    e = 1
    while e < len(terms) and not rest[e] < theta * SAFE:
      e += 1
    need = sums.need(theta * SAFE, added)
    parts = [t.rows[gather(acc, t.rows) >= need] for t in terms[:e]]
    cand = (np.unique(np.concatenate(parts)) if len(parts) > 1
            else parts[0]).astype(np.int64)
    return cand, exact_scores(terms, cand)
  finally:
    _reset(acc, [t.rows for t in terms])


def pruned_top_k(terms: Sequence[Term], k: int, space: Workspace,
                 step: float | None = None) -> tuple[np.ndarray, np.ndarray]:
  """``(rows int64 ascending, float32 exact scores)`` of every document that
  can be in the top ``k`` (ties included, perhaps a few more), for
  :func:`jaxfid.retrieval.bm25.scoring.top_k`; ``terms`` each have a
  posting, ``space`` is left all zero, ``step`` the impact step if any."""
  if sum(len(t.rows) for t in terms) < EXPAND_ALL_POSTINGS:
    return expand_all_top_k(terms, k, space)
  terms = sorted(terms, key=lambda t: -t.upper)
  sums = Sums.choose(terms, space, step)
  if max(len(t.rows) for t in terms) <= ADD_ALL_RATIO * len(terms[0].rows):
    # no term is long enough for skipping most of its postings to pay
    return add_all_top_k(terms, k, sums)
  bounds = np.array([t.upper for t in terms], np.float64)
  rest = np.concatenate([np.cumsum(bounds[::-1])[::-1], [0.0]])
  done = np.concatenate([[0.0], np.cumsum(bounds)])
  acc = sums.acc
  expanded: list[np.ndarray] = []
  theta = -np.inf
  i = added = 0  # terms added, and their boosts' sum
  try:
    while i < len(terms) and not rest[i] < theta * SAFE:
      term = terms[i]
      rows = term.rows.astype(np.intp)
      expanded.append(rows)
      scatter_add(acc, term.rows, sums.values(term))
      i += 1
      added += term.boost
      last = None
      # theta cannot exceed the bounds summed so far: compute it only when
      # it might stop the expansion
      if i < len(terms) and rest[i] < done[i] and len(rows) >= k:
        last = gather(acc, rows)
        theta = max(theta, sums.low(_kth(last, k)))
    cand = _union(acc, space.mark, expanded,
                  sums.need(theta * SAFE - rest[i], added), last)
    for term in terms[i:]:
      if len(cand) == 0:
        break
      _add(sums, space.mark, cand, term)
      i += 1
      added += term.boost
      partial = gather(acc, cand)
      if len(cand) >= k:
        theta = max(theta, sums.low(_kth(partial, k)))
      cand = cand[partial >= sums.need(theta * SAFE - rest[i], added)]
    cand = np.sort(cand).astype(np.int64)
    return cand, exact_scores(terms, cand)
  finally:
    _reset(acc, expanded)
