"""DPR's ``has_answer``: does a passage contain an answer, token for token?

DPR's ``SimpleTokenizer`` (NFD, runs of ``[\\p{L}\\p{N}\\p{M}]`` or single
other visible characters, lowercased) and contiguous token match, except
that an empty answer never matches. :class:`AnswerMatcher` prefilters with a
substring test; :class:`PreparedCache` normalises each passage once.
"""
from __future__ import annotations

import unicodedata
from typing import Iterable, Sequence

import regex

_TOKEN = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
                       flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)


def dpr_tokens(text: str) -> list[str]:
  """DPR SimpleTokenizer words, NFD-normalised and lowercased."""
  text = unicodedata.normalize("NFD", text)
  return [m.group().lower() for m in _TOKEN.finditer(text)]


def _sigma_fold(text: str) -> str:
  # str.lower() is context-free except for the Greek final sigma
  return text.replace("\u03c2", "\u03c3")


class PreparedText:
  """A passage normalised for matching once, reused across questions."""
  __slots__ = ("haystack", "_nfd", "_words")

  def __init__(self, text: str):
    self._nfd = unicodedata.normalize("NFD", text)
    self.haystack = _sigma_fold(self._nfd.lower())
    self._words: list[str] | None = None

  @property
  def words(self) -> list[str]:
    if self._words is None:
      self._words = [m.group().lower() for m in _TOKEN.finditer(self._nfd)]
    return self._words


class AnswerMatcher:
  """Tests passages against a fixed set of answers (DPR string matching)."""

  def __init__(self, answers: Iterable[str]):
    self.answers = [toks for toks in map(dpr_tokens, answers) if toks]
    self._folded = [[_sigma_fold(t) for t in toks] for toks in self.answers]

  def __call__(self, text: str | PreparedText) -> bool:
    """True if some answer's token sequence occurs in ``text``."""
    if not self.answers:
      return False
    prepared = text if isinstance(text, PreparedText) else PreparedText(text)
    haystack = prepared.haystack
    candidates = [toks for toks, folded in zip(self.answers, self._folded)
                  if all(t in haystack for t in folded)]
    if not candidates:
      return False
    words = prepared.words
    for answer in candidates:
      n = len(answer)
      first = answer[0]
      for i in range(len(words) - n + 1):
        if words[i] == first and words[i:i + n] == answer:
          return True
    return False


class PreparedCache:
  """A bounded cache of :class:`PreparedText` keyed by passage id or row."""

  def __init__(self, max_size: int = 50_000):
    self.max_size = max_size
    self._items: dict = {}

  def get(self, key, text: str) -> PreparedText:
    prepared = self._items.get(key)
    if prepared is None:
      if len(self._items) >= self.max_size:
        self._items.clear()
      prepared = self._items[key] = PreparedText(text)
    return prepared


def has_answer(answers: Sequence[str], text: str) -> bool:
  """DPR's has_answer(answers, text) with string matching."""
  return AnswerMatcher(answers)(text)
