"""The Porter stemmer exactly as Lucene's PorterStemFilter applies it.

The reference C version differs from Snowball's ``porter``: words of one or
two characters are not stemmed, step 2 has ``BLI -> BLE`` (not ``ABLI``)
and ``LOGI -> LOG``. :class:`LucenePorterStemmer` uses Snowball's C stemmer
where these cannot apply (no ``bl`` or ``log``) and
:func:`lucene_porter_stem` otherwise.
"""
from __future__ import annotations

import Stemmer


class _Porter:
  """State of one stemming run (b: the word, k: its last index)."""

  def __init__(self, word: str):
    self.b = list(word)
    self.k = len(word) - 1
    self.j = 0

  def cons(self, i: int) -> bool:
    ch = self.b[i]
    if ch in "aeiou":
      return False
    if ch == "y":
      return True if i == 0 else not self.cons(i - 1)
    return True

  def m(self) -> int:
    """Number of consonant-vowel sequences in b[0..j]."""
    n, i, j = 0, 0, self.j
    while True:
      if i > j:
        return n
      if not self.cons(i):
        break
      i += 1
    i += 1
    while True:
      while True:
        if i > j:
          return n
        if self.cons(i):
          break
        i += 1
      i += 1
      n += 1
      while True:
        if i > j:
          return n
        if not self.cons(i):
          break
        i += 1
      i += 1

  def vowel_in_stem(self) -> bool:
    return any(not self.cons(i) for i in range(self.j + 1))

  def doublec(self, j: int) -> bool:
    return j >= 1 and self.b[j] == self.b[j - 1] and self.cons(j)

  def cvc(self, i: int) -> bool:
    if i < 2 or not self.cons(i) or self.cons(i - 1) or not self.cons(i - 2):
      return False
    return self.b[i] not in "wxy"

  def ends(self, s: str) -> bool:
    length = len(s)
    o = self.k - length + 1
    if o < 0 or "".join(self.b[o:self.k + 1]) != s:
      return False
    self.j = self.k - length
    return True

  def setto(self, s: str) -> None:
    o = self.j + 1
    self.b[o:o + len(s)] = list(s)
    self.k = self.j + len(s)

  def r(self, s: str) -> None:
    if self.m() > 0:
      self.setto(s)

  def step1ab(self) -> None:
    b = self.b
    if b[self.k] == "s":
      if self.ends("sses"):
        self.k -= 2
      elif self.ends("ies"):
        self.setto("i")
      elif b[self.k - 1] != "s":
        self.k -= 1
    if self.ends("eed"):
      if self.m() > 0:
        self.k -= 1
    elif (self.ends("ed") or self.ends("ing")) and self.vowel_in_stem():
      self.k = self.j
      if self.ends("at"):
        self.setto("ate")
      elif self.ends("bl"):
        self.setto("ble")
      elif self.ends("iz"):
        self.setto("ize")
      elif self.doublec(self.k):
        ch = b[self.k]
        self.k -= 1
        if ch in "lsz":
          self.k += 1
      elif self.m() == 1 and self.cvc(self.k):
        self.setto("e")

  def step1c(self) -> None:
    if self.ends("y") and self.vowel_in_stem():
      self.b[self.k] = "i"

  _STEP2 = {
      "a": (("ational", "ate"), ("tional", "tion")),
      "c": (("enci", "ence"), ("anci", "ance")),
      "e": (("izer", "ize"),),
      "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"),
            ("ousli", "ous")),
      "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
      "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"),
            ("ousness", "ous")),
      "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
      "g": (("logi", "log"),),
  }
  _STEP3 = {
      "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
      "i": (("iciti", "ic"),),
      "l": (("ical", "ic"), ("ful", "")),
      "s": (("ness", ""),),
  }
  _STEP4 = {
      "a": ("al",), "c": ("ance", "ence"), "e": ("er",), "i": ("ic",),
      "l": ("able", "ible"), "n": ("ant", "ement", "ment", "ent"),
      "s": ("ism",), "t": ("ate", "iti"), "u": ("ous",), "v": ("ive",),
      "z": ("ize",),
  }

  def _rules(self, rules) -> None:
    for suffix, replacement in rules:
      if self.ends(suffix):
        self.r(replacement)
        return

  def step2(self) -> None:
    if self.k == 0:
      return
    self._rules(self._STEP2.get(self.b[self.k - 1], ()))

  def step3(self) -> None:
    self._rules(self._STEP3.get(self.b[self.k], ()))

  def step4(self) -> None:
    if self.k == 0:
      return
    ch = self.b[self.k - 1]
    if ch == "o":
      if not ((self.ends("ion") and self.j >= 0 and self.b[self.j] in "st")
              or self.ends("ou")):
        return
    elif not any(self.ends(s) for s in self._STEP4.get(ch, ())):
      return
    if self.m() > 1:
      self.k = self.j

  def step5(self) -> None:
    self.j = self.k
    if self.b[self.k] == "e":
      a = self.m()
      if a > 1 or (a == 1 and not self.cvc(self.k - 1)):
        self.k -= 1
    if self.b[self.k] == "l" and self.doublec(self.k) and self.m() > 1:
      self.k -= 1

  def stem(self) -> str:
    if self.k > 1:
      self.step1ab()
      self.step1c()
      self.step2()
      self.step3()
      self.step4()
      self.step5()
    return "".join(self.b[:self.k + 1])


def lucene_porter_stem(word: str) -> str:
  """Stems one lowercased word exactly as Lucene's PorterStemmer."""
  if len(word) <= 2:
    return word
  return _Porter(word).stem()


class LucenePorterStemmer:
  """Fast Lucene-exact Porter stemming: Snowball C code where it agrees."""

  def __init__(self):
    self._snowball = Stemmer.Stemmer("porter").stemWord

  def __call__(self, word: str) -> str:
    if len(word) <= 2:
      return word
    if "bl" in word or "log" in word:
      return _Porter(word).stem()
    return self._snowball(word)
