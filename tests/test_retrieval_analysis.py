"""The analyzer against Lucene 8.7's EnglishAnalyzer (fixtures made by Java)."""
import os
import random

import pytest

from jaxfid.retrieval.text import analysis
from jaxfid.retrieval.text.analysis import ENGLISH_STOP_WORDS, EnglishAnalyzer
from jaxfid.retrieval.text.porter import LucenePorterStemmer, lucene_porter_stem

LUCENE = os.path.join(os.path.dirname(__file__), "data", "retrieval",
                      "lucene_reference")


def _lucene_analysis():
  with open(os.path.join(LUCENE, "analysis.tsv"), encoding="utf-8") as f:
    return [line.rstrip("\n").split("\t") for line in f]


def test_matches_lucene_english_analyzer():
  rows = _lucene_analysis()
  assert len(rows) > 1000
  analyzer = EnglishAnalyzer()
  mismatches = [(text, expected, " ".join(analyzer.analyze(text)))
                for text, expected in rows
                if " ".join(analyzer.analyze(text)) != expected]
  assert mismatches == []


def test_pure_python_porter_matches_lucene_on_single_words():
  analyzer = EnglishAnalyzer(stemmer=None)
  checked = 0
  for text, expected in _lucene_analysis():
    words = analyzer.analyze(text)
    if len(words) == 1 and len(expected.split()) == 1:
      assert lucene_porter_stem(words[0]) == expected, text
      checked += 1
  assert checked > 1000


@pytest.mark.parametrize("word, stem", [
    ("technology", "technolog"),  # Lucene's extra LOGI -> LOG
    ("assembly", "assembl"),  # BLI -> BLE (published: ABLI -> ABLE)
    ("us", "us"),  # two letters: never stemmed (Snowball: "u")
    ("running", "run"), ("generalizations", "gener"), ("hopping", "hop"),
    ("relational", "relat"), ("agreed", "agre"), ("sky", "sky"),
])
def test_lucene_porter_departures(word, stem):
  assert lucene_porter_stem(word) == stem
  assert LucenePorterStemmer()(word) == stem


def test_stop_words_are_lucenes_33():
  assert len(ENGLISH_STOP_WORDS) == 33
  assert {"the", "a", "with", "will", "their"} <= ENGLISH_STOP_WORDS
  assert "he" not in ENGLISH_STOP_WORDS
  assert EnglishAnalyzer().analyze("The cat and THE hat") == ["cat", "hat"]


def test_possessive_and_joiners():
  a = EnglishAnalyzer()
  assert a.analyze("John's JOHN’S dog") == ["john", "john", "dog"]
  assert a.analyze("U.S.A. 3,000.50 e-mail") == ["u.s.a", "3,000.50", "e",
                                                  "mail"]


def test_long_tokens_are_cut_at_255():
  words = analysis.split_words("a" * 600)
  assert [len(w) for w in words] == [255, 255, 90]


def test_ascii_fast_path_equals_unicode_pattern():
  rng = random.Random(0)
  alphabet = "abcXYZ019_.,;:'-/ @\"()"
  for _ in range(2000):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
    lowered = text.lower()
    fast = analysis._ASCII_WORD.findall(lowered)
    full = analysis._UNICODE_TOKEN.findall(lowered)
    assert fast == full, text


def test_config_round_trip():
  a = EnglishAnalyzer(stopwords=["foo"], stemmer=None)
  b = EnglishAnalyzer.from_config(a.config())
  assert b.analyze("foo running bar") == ["running", "bar"]
  with pytest.raises(ValueError):
    EnglishAnalyzer(stemmer="krovetz")


def test_separator_mapping_keeps_the_fast_path_exact():
  rng = random.Random(1)
  alphabet = ("ab1_.,:'- " "\u2013\u2014\u201c\u201d\u00a0\u00a9\u2022\u2026"
              "\u00ab\u2019\u2018\u00b7\u00e9\u0301\u3000")
  for _ in range(2000):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
    lowered = text.lower()
    mapped = lowered.translate(analysis._separator_table())
    expected = analysis._UNICODE_TOKEN.findall(lowered)
    assert analysis._UNICODE_TOKEN.findall(mapped) == expected, text
    if mapped.isascii():
      assert analysis._ASCII_WORD.findall(mapped) == expected, text


def test_bmp_fast_path_equals_unicode_pattern():
  token, needs_full = analysis._bmp_patterns()
  rng = random.Random(2)
  alphabet = ("ab1_.,:;'- \u00e9\u00fc\u00df\u03c3\u0416\u05d0\u0627"
              "\u2019\u2018\u00b7\u2024\u0661\u0662\u4e00\u4e8c\u3042\u3044"
              "\u30ab\u30fc\uff21\uff10\u0e01\uac00\u2163\u2c00\u00bd\u00b2")
  for _ in range(3000):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
    assert not needs_full.search(text)
    assert token.findall(text) == analysis._UNICODE_TOKEN.findall(text), text
  assert needs_full.search("e\u0301") and needs_full.search("\U0001f600")
  assert not needs_full.search("caf\u00e9 \u2014 na\u00efve")
