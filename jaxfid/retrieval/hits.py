"""One query's search results: (row, score) pairs held as two lists.

A searcher returns, per query, a sequence of (store row, score) pairs, best
first (:mod:`jaxfid.retrieval.search`). :class:`Hits` is that sequence
without a tuple per pair: it keeps the rows and the scores as two Python
lists (what ``ndarray.tolist()`` of FAISS's result arrays gives in one C
call) and makes a pair only when one is read. Building 100 tuples for each
query, and the garbage collector's passes over them, cost about a tenth of
an IVF-PQ search's time (issue #28); the pairs a consumer reads are freed as
it goes, so they set off no collection.

It is a ``Sequence``: iteration, indexing, slicing, ``len``, ``bool`` and
``==`` against any sequence of pairs behave as for a list of tuples.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Iterator, overload


class Hits(Sequence):
  """(row, score) pairs, best first, over ``rows`` and ``scores`` lists."""

  __slots__ = ("rows", "scores")

  def __init__(self, rows: list[int], scores: list[float]):
    if len(rows) != len(scores):
      raise ValueError(f"{len(rows)} rows for {len(scores)} scores")
    self.rows = rows
    self.scores = scores

  def __len__(self) -> int:
    return len(self.rows)

  def __iter__(self) -> Iterator[tuple[int, float]]:
    return zip(self.rows, self.scores)

  @overload
  def __getitem__(self, i: int) -> tuple[int, float]: ...

  @overload
  def __getitem__(self, i: slice) -> Hits: ...

  def __getitem__(self, i):
    if isinstance(i, slice):
      return Hits(self.rows[i], self.scores[i])
    return self.rows[i], self.scores[i]

  def __eq__(self, other: object) -> bool:
    if isinstance(other, Hits):
      return self.rows == other.rows and self.scores == other.scores
    if isinstance(other, (list, tuple)):
      return len(other) == len(self) and all(
          a == b for a, b in zip(self, other))
    return NotImplemented

  __hash__ = None  # mutable lists inside, as a list of pairs

  def __repr__(self) -> str:
    return f"Hits({list(self)!r})"
