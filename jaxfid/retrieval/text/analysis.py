"""Text analysis equivalent to Lucene's EnglishAnalyzer (pyserini's default).

  StandardTokenizer -> EnglishPossessiveFilter -> LowerCaseFilter
    -> StopFilter(ENGLISH_STOP_WORDS_SET) -> PorterStemFilter

The tokenizer implements UAX #29's rules that matter for real text
(``u.s.a``, ``isn't``, ``3.14``, ``1,000``; CJK and South-East Asian
scripts; 255-character pieces); lowercasing is Java's; stemming is Lucene's
Porter (:mod:`jaxfid.retrieval.text.porter`). Tokens match Lucene 8.7's
(tests/data/retrieval/lucene_reference) except emoji, letter-like symbols
and a few UAX #29 joining rules. ASCII and most BMP text take faster
``re`` paths equivalent to the ``regex`` rules.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from typing import Iterable

import regex

from jaxfid.retrieval.text.porter import LucenePorterStemmer

# org.apache.lucene.analysis.en.EnglishAnalyzer.ENGLISH_STOP_WORDS_SET
ENGLISH_STOP_WORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in",
    "into", "is", "it", "no", "not", "of", "on", "or", "such", "that", "the",
    "their", "then", "there", "these", "they", "this", "to", "was", "will",
    "with"))

MAX_TOKEN_LENGTH = 255  # StandardTokenizer's default maxTokenLength

# --- ASCII fast path (input already lowercased) ------------------------------
_ASCII_WORD = re.compile(
    r"[a-z0-9_]+"
    r"(?:(?:(?<=[a-z])[.:'](?=[a-z])|(?<=[0-9])[.,;'](?=[0-9]))[a-z0-9_]+)*")

# --- Unicode path (regex module, V1 for set operations) ----------------------
# Scripts that UAX #29 does not treat as ordinary letters.
_SPECIAL = r"\p{Han}\p{Hiragana}\p{Katakana}\p{lb=SA}"
_WORD_CHAR = rf"[\p{{L}}\p{{Nl}}\p{{Nd}}\p{{Pc}}--[{_SPECIAL}]]"
_LETTER = rf"[\p{{L}}\p{{Nl}}--[{_SPECIAL}]]"
# Extend and Format characters stay inside words (U+200B is neither).
_EXTEND = r"[\p{M}\p{Cf}--[\u200b]]"
# MidLetter + MidNumLet + Single_Quote, and MidNum + MidNumLet + Single_Quote.
_MID_LETTER = "[:\u00b7\u0387\u055f\u05f4\u2027\ufe13\ufe55\uff1a" \
              ".\u2018\u2019\u2024\ufe52\uff07\uff0e']"
_MID_NUM = "[,;\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14" \
           "\ufe50\ufe54\uff0c\uff1b.\u2018\u2019\u2024\ufe52\uff07\uff0e']"
_UNICODE_TOKEN = regex.compile(
    rf"\p{{Han}}{_EXTEND}*"
    rf"|\p{{Hiragana}}{_EXTEND}*"
    rf"|(?:\p{{Katakana}}{_EXTEND}*)+"
    rf"|(?:\p{{lb=SA}}{_EXTEND}*)+"
    rf"|(?:{_WORD_CHAR}{_EXTEND}*)+"
    rf"(?:(?:(?<={_LETTER}{_EXTEND}*){_MID_LETTER}(?={_LETTER})"
    rf"|(?<=\p{{Nd}}{_EXTEND}*){_MID_NUM}(?=\p{{Nd}}))"
    rf"(?:{_WORD_CHAR}{_EXTEND}*)+)*",
    flags=regex.V1)

_POSSESSIVE = ("'s", "\u2019s", "\uff07s")
# categories of characters that UAX #29 never puts inside a word
_SEPARATOR_CATEGORIES = frozenset(
    ("Zs", "Zl", "Zp", "Cc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc",
     "Sk", "So"))


@functools.cache
def _separator_table() -> dict[int, str]:
  """str.translate table: BMP word separators (not joiners) -> space."""
  joiners = set(_MID_LETTER[1:-1]) | set(_MID_NUM[1:-1])
  table = {}
  for cp in range(0x80, 0x10000):
    ch = chr(cp)
    if (unicodedata.category(ch) in _SEPARATOR_CATEGORIES
        and ch not in joiners and not ch.isalnum()):
      table[cp] = " "
  return table


def _members(pattern: str, chars: str) -> list[int]:
  return sorted({ord(c) for c in regex.findall(pattern, chars,
                                                 flags=regex.V1)})


def _re_class(codepoints: list[int]) -> str:
  """A stdlib-re character class for sorted code points, as ranges."""
  parts, i = [], 0
  while i < len(codepoints):
    j = i
    while j + 1 < len(codepoints) and codepoints[j + 1] == codepoints[j] + 1:
      j += 1
    first, last = re.escape(chr(codepoints[i])), re.escape(chr(codepoints[j]))
    parts.append(first if i == j else f"{first}-{last}")
    i = j + 1
  return "[" + "".join(parts) + "]"


@functools.cache
def _bmp_patterns() -> tuple[re.Pattern, re.Pattern]:
  """(token pattern, needs-full-path pattern) in the standard re module.

  The token pattern equals ``_UNICODE_TOKEN`` on text made of BMP characters
  without Extend/Format characters (so its look-behinds are one character
  wide); the second pattern finds text that is not like that.
  """
  bmp = "".join(chr(cp) for cp in range(0x10000)
                if not 0xD800 <= cp <= 0xDFFF)
  cls = {name: _re_class(_members(pattern, bmp)) for name, pattern in (
      ("han", r"\p{Han}"), ("hira", r"\p{Hiragana}"),
      ("kata", r"\p{Katakana}"), ("sa", r"\p{lb=SA}"), ("word", _WORD_CHAR),
      ("letter", _LETTER), ("digit", r"\p{Nd}"), ("extend", _EXTEND))}
  mid_letter = _re_class(sorted(map(ord, _MID_LETTER[1:-1])))
  mid_num = _re_class(sorted(map(ord, _MID_NUM[1:-1])))
  token = re.compile(
      f"{cls['han']}|{cls['hira']}|{cls['kata']}+|{cls['sa']}+"
      f"|{cls['word']}+(?:(?:(?<={cls['letter']}){mid_letter}"
      f"(?={cls['letter']})|(?<={cls['digit']}){mid_num}(?={cls['digit']}))"
      f"{cls['word']}+)*")
  needs_full = re.compile(cls["extend"][:-1] + "\U00010000-\U0010ffff]")
  return token, needs_full


def _java_lower(text: str) -> str:
  """Lowercases per code point, like Java's Character.toLowerCase."""
  if text.isascii():
    return text.lower()
  # Python's lower() adds two context rules Java lacks: final sigma and the
  # two-character lowercase of U+0130. Pre-map those two capitals.
  return text.replace("\u03a3", "\u03c3").replace("\u0130", "i").lower()


_LONG_RUN = re.compile(r"\S{%d}" % (MAX_TOKEN_LENGTH + 1))


def raw_tokens(text: str) -> list[str]:
  """StandardTokenizer + LowerCaseFilter, before the per-token rules.

  The tokens may still be runs of connector punctuation only (``___``, which
  are no words) and end with a possessive ``'s``; :func:`finish_token`
  applies those two rules to one token, :func:`split_words` to all.
  """
  lowered = _java_lower(text)
  if not lowered.isascii():
    lowered = lowered.translate(_separator_table())
  if lowered.isascii():
    tokens = _ASCII_WORD.findall(lowered)
  else:
    bmp_token, needs_full = _bmp_patterns()
    if needs_full.search(lowered):
      tokens = _UNICODE_TOKEN.findall(lowered)
    else:
      tokens = bmp_token.findall(lowered)
  if _LONG_RUN.search(lowered):  # a token may exceed the maximum length
    tokens = [tok[i:i + MAX_TOKEN_LENGTH] for tok in tokens
              for i in range(0, len(tok), MAX_TOKEN_LENGTH)]
  return tokens


def finish_token(token: str) -> str | None:
  """EnglishPossessiveFilter on one raw token; None if it is no word."""
  if not token[0].isalnum() and not any(map(str.isalnum, token)):
    return None  # only connector punctuation
  return token[:-2] if token[-2:] in _POSSESSIVE else token


def split_words(text: str) -> list[str]:
  """StandardTokenizer + EnglishPossessiveFilter + LowerCaseFilter.

  Returns lowercased word tokens, before stop-word removal and stemming.
  """
  return [t for t in map(finish_token, raw_tokens(text)) if t is not None]


class EnglishAnalyzer:
  """Lucene EnglishAnalyzer: ``analyze(text)`` returns the indexed terms.

  Stems are cached per surface word.

  Attributes:
    stopwords: the stop words removed (Lucene's English list by default).
    stemmer: ``"porter"`` (Lucene's PorterStemFilter) or ``None``.
  """
  STEMMERS = ("porter", None)

  def __init__(self, stopwords: Iterable[str] = ENGLISH_STOP_WORDS,
               stemmer: str | None = "porter"):
    if stemmer not in self.STEMMERS:
      raise ValueError(f"unknown stemmer {stemmer!r}; one of {self.STEMMERS}")
    self.stopwords = frozenset(stopwords)
    self.stemmer = stemmer
    self._stem = LucenePorterStemmer() if stemmer else None
    self._cache: dict[str, str | None] = {}

  def config(self) -> dict:
    """JSON-serialisable description, stored in an index's meta.json."""
    return {"name": "lucene-english", "stemmer": self.stemmer,
            "stopwords": sorted(self.stopwords)}

  @classmethod
  def from_config(cls, config: dict) -> "EnglishAnalyzer":
    return cls(stopwords=config["stopwords"], stemmer=config["stemmer"])

  def term_uncached(self, word: str) -> str | None:
    """Maps one lowercased word to its indexed term, or None (stop word)."""
    if word in self.stopwords:
      return None
    if self._stem is not None:
      return self._stem(word)
    return word

  def raw_term(self, token: str) -> str | None:
    """The term of one :func:`raw_tokens` token, or None; not cached."""
    word = finish_token(token)
    return None if word is None else self.term_uncached(word)

  def term(self, word: str) -> str | None:
    """Like :meth:`term_uncached`, remembering the answer."""
    try:
      return self._cache[word]
    except KeyError:
      pass
    term = self.term_uncached(word)
    if len(self._cache) < 1_000_000:  # bound memory on huge vocabularies
      self._cache[word] = term
    return term

  def prepare(self, texts: Iterable[str]) -> None:
    """Builds now the tables that analysing ``texts`` will need (the BMP
    pattern, on first non-ASCII text), so that worker processes forked
    afterwards inherit them instead of each building them again."""
    if not all(text.isascii() for text in texts):
      _bmp_patterns()

  def analyze(self, text: str) -> list[str]:
    """The full chain: the terms Lucene would index for ``text``."""
    term = self.term
    return [t for t in map(term, split_words(text)) if t is not None]
