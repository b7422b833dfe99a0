"""Tokenising documents in batches: texts -> term ids, ready for indexing.

A :class:`BatchAnalyzer` (one per process) numbers terms in order of first
occurrence and turns a batch of texts into a :class:`TokenBatch`; the
builder maps each analyzer's ids to index columns with one numpy gather, so
columns follow first occurrence in the corpus whichever process tokenised
what. Each distinct raw token is analysed once per process.
"""
from __future__ import annotations

import array
import os
from typing import NamedTuple, Sequence

import numpy as np

from jaxfid.retrieval.text.analysis import EnglishAnalyzer, raw_tokens

_CACHE_LIMIT = 4_000_000  # raw tokens remembered per process


class TokenBatch(NamedTuple):
  """The tokens of a batch of documents.

  Attributes:
    source: which analyzer made it (its ids are its own).
    new_terms: the terms the analyzer met for the first time, in id order.
    ids: int32, the term id of every raw token in order, -1 if not indexed.
    lengths: int32 per document, its number of raw tokens.
  """
  source: tuple
  new_terms: list[str]
  ids: np.ndarray
  lengths: np.ndarray


class BatchAnalyzer:
  """Tokenises batches of texts as ``analyzer`` analyses them."""

  def __init__(self, analyzer: EnglishAnalyzer | None = None):
    self.analyzer = analyzer or EnglishAnalyzer()
    self.source = (os.getpid(), id(self))
    self._ids: dict[str, int] = {}  # raw token -> term id, -1: none
    self._terms: dict[str, int] = {}  # term -> term id
    self._new: list[str] = []

  def _id(self, token: str) -> int:
    term = self.analyzer.raw_term(token)
    if term is None:
      i = -1
    else:
      i = self._terms.get(term, -1)
      if i < 0:
        i = self._terms[term] = len(self._terms)
        self._new.append(term)
    if len(self._ids) < _CACHE_LIMIT:
      self._ids[token] = i
    return i

  def __call__(self, texts: Sequence[str]) -> TokenBatch:
    ids = array.array("i")
    lengths = array.array("i")
    known = self._ids
    get = known.__getitem__
    for text in texts:
      words = raw_tokens(text)
      start = len(ids)
      try:
        ids.extend(map(get, words))
      except KeyError:  # a token met for the first time
        del ids[start:]
        ids.extend([known[w] if w in known else self._id(w) for w in words])
      lengths.append(len(words))
    new, self._new = self._new, []
    return TokenBatch(self.source, new, np.frombuffer(ids, np.int32).copy(),
                      np.frombuffer(lengths, np.int32).copy())
