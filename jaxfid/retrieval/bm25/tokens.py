"""Tokenising documents in batches: texts -> term ids, ready for indexing.

A :class:`BatchAnalyzer` (one per process) gives every term it meets an id
of its own, in order of first occurrence, and turns a batch of texts into a
:class:`TokenBatch`: per raw token the id of its term (-1 for tokens Lucene
does not index: stop words and runs of connector punctuation), per document
its number of raw tokens, and the terms it met for the first time in this
batch. The index builder keeps, per analyzer, a table from these ids to the
index's columns, extended with each batch's new terms (one dictionary
lookup per new term, not per token), and maps the ids with one numpy
gather. So batches can be tokenised in other processes (``--threads``) and
sent back as compact arrays, and the columns are assigned in order of first
occurrence in the corpus whatever process tokenised what.

Per token the work is the tokenizer's regular expression and one dictionary
lookup done in C (``map``); each distinct raw token is analysed (possessive,
stop word, Porter stem) once per process and remembered.
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
    new_terms: the terms the analyzer met for the first time, in order: the
      first gets the next id after all earlier batches' new terms.
    ids: int32, the term id of every raw token of the batch in order, -1
      for a token that is not indexed.
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
