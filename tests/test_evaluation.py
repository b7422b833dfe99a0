"""jaxfid.evaluation.qa: SQuAD/FiD answer normalisation, EM, F1, GLUE metrics."""
import math

import numpy as np
import pytest

from jaxfid.evaluation.classification import (
    accuracy, binary_f1, classification_metrics, matthews_corrcoef, pearson,
    spearman)
from jaxfid.evaluation.qa import (
    exact_match, f1_score, normalize_answer, qa_metrics)


@pytest.mark.parametrize("raw, normalized", [
    ("The Beatles!", "beatles"),
    ("an apple a day", "apple day"),
    ("A", ""),
    ("theater another anthem", "theater another anthem"),  # not whole words
    ("U.S.A.", "usa"),
    ("l'été", "lété"),  # ASCII apostrophe removed, accents kept
    ("Théâtre de la Ville", "théâtre de la ville"),
    ("Ä the Ü", "ä ü"),
    ("“Hamlet”", "“hamlet”"),  # curly quotes are not string.punctuation
    ("rock–and–roll", "rock–and–roll"),  # nor is the en dash
    ("rock-and-roll", "rockandroll"),  # the ASCII hyphen is
    ("  x\t y\n", "x y"),
    ("(the) [cat], {sat}; on: the mat?!", "cat sat on mat"),
    ("", ""),
])
def test_normalize_answer(raw, normalized):
  assert normalize_answer(raw) == normalized


def test_exact_match():
  assert exact_match("The Beatles", ["beatles"]) == 1.0
  assert exact_match("beatles.", "The Beatles") == 1.0  # a single string
  assert exact_match("Beatles", ["Rolling Stones", "the  beatles!"]) == 1.0
  assert exact_match("Beatles band", ["beatles"]) == 0.0
  assert exact_match("“Hamlet”", ["Hamlet"]) == 0.0
  assert exact_match("Zurich", ["Zürich"]) == 0.0
  assert exact_match("", ["the"]) == 1.0  # both normalise to ""
  assert exact_match("", ["Paris"]) == 0.0
  with pytest.raises(ValueError):
    exact_match("x", [])


def test_f1_score():
  # pred {cat, sat}; gold {cat, sat, on, mat}: P=1, R=1/2
  assert f1_score("the cat sat", ["a cat sat on the mat"]) == pytest.approx(
      2 / 3)
  assert f1_score("cat cat", ["cat"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
  # max over answers
  assert f1_score("new york city", ["York", "New York City!"]) == 1.0
  assert f1_score("new york city", ["york"]) == pytest.approx(0.5)
  assert f1_score("", ["Paris"]) == 0.0
  assert f1_score("", ["the"]) == 0.0  # SQuAD v1.1: no shared token -> 0
  assert f1_score("Paris", "paris") == 1.0


def test_qa_metrics():
  out = qa_metrics(["Paris", "the moon", "x"],
                   [["paris", "Paris, France"], ["Moon landing"], ["y"]])
  assert out["exact_match"] == pytest.approx(1 / 3)
  assert out["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
  assert out["count"] == 3
  assert qa_metrics([], [])["count"] == 0
  with pytest.raises(ValueError):
    qa_metrics(["a"], [])


def test_accuracy_and_binary_f1():
  assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
  assert accuracy(["yes", "no"], ["yes", "yes"]) == 0.5
  # tp=2, fp=1, fn=1 -> P=R=2/3
  assert binary_f1([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(2 / 3)
  assert binary_f1([0, 0], [1, 0]) == 0.0
  assert binary_f1(["a", "b"], ["a", "a"], positive="a") == pytest.approx(
      2 * 1 * 0.5 / 1.5)
  with pytest.raises(ValueError):
    accuracy([1, 2], [1])
  with pytest.raises(ValueError):
    accuracy([], [])


def test_matthews_corrcoef():
  p = [1, 1, 1, 0, 0, 0, 1]
  y = [1, 1, 0, 1, 0, 0, 1]
  tp, tn, fp, fn = 3, 2, 1, 1
  expected = (tp * tn - fp * fn) / math.sqrt(
      (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  assert matthews_corrcoef(p, y) == pytest.approx(expected)
  assert matthews_corrcoef(y, y) == pytest.approx(1.0)
  assert matthews_corrcoef([1 - v for v in y], y) == pytest.approx(-1.0)
  assert matthews_corrcoef([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0  # undefined
  # multi-class: Gorodkin's R_K from the confusion matrix, by hand
  # (diagonal 1+2+1 -> c=4 correct of s=6; true/predicted class counts t, q)
  yt = [0, 0, 1, 1, 2, 2]
  yp = [0, 1, 1, 1, 2, 0]
  c, s = 4, 6
  t, q = np.array([2, 2, 2]), np.array([2, 3, 1])
  expected = (c * s - t @ q) / math.sqrt((s * s - q @ q) * (s * s - t @ t))
  assert matthews_corrcoef(yp, yt) == pytest.approx(expected)
  # labels of any comparable type; -1 (no label word) is a class of its own
  assert matthews_corrcoef(["b", "a", "a"], ["a", "a", "b"]) == pytest.approx(
      matthews_corrcoef([1, 0, 0], [0, 0, 1]))
  assert matthews_corrcoef([-1, 1, 0], [0, 1, 0]) == pytest.approx(
      (2 * 3 - (1 * 2 + 1 * 1 + 1 * 0)) / math.sqrt((9 - 3) * (9 - 5)))
  # exact integer counts: no overflow or rounding at large sizes
  big = np.tile([1, 0, 1, 0], 250_000)
  assert matthews_corrcoef(big, big) == 1.0


def test_classification_metrics_use_the_same_scores():
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 2, size=200)
  predictions = np.where(rng.random(200) < 0.8, labels, 1 - labels)
  predictions[:5] = -1
  assert classification_metrics("f1", predictions, labels) == {
      "accuracy": accuracy(predictions, labels),
      "f1": binary_f1(predictions, labels)}
  assert classification_metrics("mcc", predictions, labels)["mcc"] == (
      matthews_corrcoef(predictions, labels))


def test_correlations_against_scipy():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(0)
  x = rng.normal(size=50)
  y = 0.5 * x + rng.normal(size=50)
  assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
  assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
  # ties are averaged
  a = [1, 2, 2, 3, 5, 5, 5, 0]
  b = [2, 1, 3, 3, 4, 6, 6, 1]
  assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0])


def test_correlations_known_values():
  assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
  assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
  assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)
  assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # undefined -> 0
  assert spearman([1, 2, 3], [5, 5, 5]) == 0.0
