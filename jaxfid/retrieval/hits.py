"""One query's search results: (row, score) pairs held as two arrays.

:class:`Hits` keeps views of a query's FAISS result rows (int64 rows,
float32 scores) and makes Python numbers only when read. It is a
``Sequence`` that behaves as a list of ``(int, float)`` tuples.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Iterator, overload

import numpy as np


class Hits(Sequence):
  """(row, score) pairs, best first, over ``rows`` (int64 [n]) and
  ``scores`` (float32 [n])."""

  __slots__ = ("rows", "scores")

  def __init__(self, rows: np.ndarray, scores: np.ndarray):
    rows, scores = np.asarray(rows, np.int64), np.asarray(scores, np.float32)
    if rows.shape != scores.shape or rows.ndim != 1:
      raise ValueError(f"rows {rows.shape} and scores {scores.shape}: "
                       "two vectors of one length")
    self.rows = rows
    self.scores = scores

  def __len__(self) -> int:
    return len(self.rows)

  def __iter__(self) -> Iterator[tuple[int, float]]:
    return zip(self.rows.tolist(), self.scores.tolist())

  @overload
  def __getitem__(self, i: int) -> tuple[int, float]: ...

  @overload
  def __getitem__(self, i: slice) -> Hits: ...

  def __getitem__(self, i):
    if isinstance(i, slice):
      return Hits(self.rows[i], self.scores[i])
    return int(self.rows[i]), float(self.scores[i])

  def __eq__(self, other: object) -> bool:
    if isinstance(other, Hits):
      return (np.array_equal(self.rows, other.rows)
              and np.array_equal(self.scores, other.scores))
    if isinstance(other, (list, tuple)):
      return len(other) == len(self) and all(
          a == b for a, b in zip(self, other))
    return NotImplemented

  __hash__ = None  # mutable arrays inside, as a list of pairs

  def __repr__(self) -> str:
    return f"Hits({list(self)!r})"
