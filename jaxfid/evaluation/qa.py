"""Answer metrics: SQuAD exact match / F1 for QA, and the GLUE-style metrics.

QA metrics reproduce the SQuAD v1.1 evaluation script, which DPR copied and FiD
(``src/evaluation.py``) uses unchanged:

* :func:`normalize_answer`: lower-case, delete every character in
  ``string.punctuation`` (ASCII only: curly quotes, dashes and accented letters
  survive), delete the whole words ``a``, ``an``, ``the``, collapse whitespace.
* :func:`exact_match`: 1.0 if the normalised prediction equals any normalised
  gold answer.
* :func:`f1_score`: bag-of-tokens F1 on the normalised strings, maximised over
  the gold answers. As in SQuAD v1.1, no shared token means 0 (also when both
  sides normalise to the empty string).

Classification / regression metrics (:func:`accuracy`,
:func:`matthews_corrcoef`, :func:`binary_f1`, :func:`pearson`,
:func:`spearman`) are pure NumPy and follow scikit-learn / SciPy conventions;
where a correlation is undefined (a constant input) they return 0.0 rather
than NaN, so that "best checkpoint" comparisons stay well defined.

All scores are fractions (EM 0.5 is 50%).
"""
from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

import numpy as np

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
  """SQuAD normalisation: lower, strip punctuation and articles, fix spaces."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCTUATION)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def _as_answers(answers: str | Sequence[str]) -> list[str]:
  if isinstance(answers, str):
    return [answers]
  answers = list(answers)
  if not answers:
    raise ValueError("no gold answers to compare with")
  return answers


def exact_match(prediction: str, answers: str | Sequence[str]) -> float:
  """1.0 if ``prediction`` matches any gold answer after normalisation.

  Args:
    prediction: the predicted answer.
    answers: one gold answer or a non-empty list of them.

  Returns:
    1.0 or 0.0.
  """
  pred = normalize_answer(prediction)
  return float(any(pred == normalize_answer(a) for a in _as_answers(answers)))


def _f1(prediction: str, ground_truth: str) -> float:
  pred_tokens = normalize_answer(prediction).split()
  gold_tokens = normalize_answer(ground_truth).split()
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_tokens)
  recall = num_same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: str | Sequence[str]) -> float:
  """SQuAD token F1 of ``prediction``, maximised over the gold answers."""
  return max(_f1(prediction, a) for a in _as_answers(answers))


def qa_metrics(predictions: Sequence[str],
               answers: Sequence[Sequence[str]]) -> dict[str, float]:
  """Mean exact match and F1 over examples.

  Args:
    predictions: one predicted string per example.
    answers: the gold answers of each example (each non-empty).

  Returns:
    ``{"exact_match": ..., "f1": ..., "count": n}`` (fractions; count as float).
  """
  if len(predictions) != len(answers):
    raise ValueError(f"{len(predictions)} predictions for {len(answers)} "
                     "examples")
  n = len(predictions)
  if n == 0:
    return {"exact_match": 0.0, "f1": 0.0, "count": 0.0}
  em = sum(exact_match(p, a) for p, a in zip(predictions, answers))
  f1 = sum(f1_score(p, a) for p, a in zip(predictions, answers))
  return {"exact_match": em / n, "f1": f1 / n, "count": float(n)}


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  p, y = np.asarray(predictions), np.asarray(labels)
  if p.shape != y.shape or p.ndim != 1:
    raise ValueError(f"predictions {p.shape} and labels {y.shape} must be "
                     "1-D of equal length")
  if p.size == 0:
    raise ValueError("no examples")
  return p, y


def accuracy(predictions, labels) -> float:
  """Fraction of predictions equal to their label (any comparable values)."""
  p, y = _pair(predictions, labels)
  return float(np.mean(p == y))


def matthews_corrcoef(predictions, labels) -> float:
  """Matthews correlation (multi-class form, as scikit-learn); 0 if undefined.
  """
  p, y = _pair(predictions, labels)
  classes, inverse = np.unique(np.concatenate([y, p]), return_inverse=True)
  k = len(classes)
  yi, pi = inverse[:len(y)], inverse[len(y):]
  confusion = np.zeros((k, k), dtype=np.float64)
  np.add.at(confusion, (yi, pi), 1.0)
  t = confusion.sum(axis=1)  # true counts per class
  q = confusion.sum(axis=0)  # predicted counts per class
  c = np.trace(confusion)
  s = confusion.sum()
  cov_yp = c * s - t @ q
  cov_pp = s * s - q @ q
  cov_yy = s * s - t @ t
  denom = np.sqrt(cov_yy * cov_pp)
  return float(cov_yp / denom) if denom > 0 else 0.0


def binary_f1(predictions, labels, positive=1) -> float:
  """F1 of the ``positive`` class (GLUE MRPC / QQP); 0 with no true positive.
  """
  p, y = _pair(predictions, labels)
  tp = float(np.sum((p == positive) & (y == positive)))
  if tp == 0:
    return 0.0
  precision = tp / float(np.sum(p == positive))
  recall = tp / float(np.sum(y == positive))
  return 2 * precision * recall / (precision + recall)


def pearson(predictions, labels) -> float:
  """Pearson correlation; 0.0 when either side is constant."""
  p, y = _pair(predictions, labels)
  p = p.astype(np.float64) - np.mean(p, dtype=np.float64)
  y = y.astype(np.float64) - np.mean(y, dtype=np.float64)
  denom = np.sqrt(np.sum(p * p) * np.sum(y * y))
  return float(np.sum(p * y) / denom) if denom > 0 else 0.0


def _average_ranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks, ties get their mean rank (``scipy.stats.rankdata``)."""
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  # start index of each run of equal values
  starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
  ends = np.r_[starts[1:], len(x)]
  mean_rank = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
  ranks = np.empty(len(x), dtype=np.float64)
  ranks[order] = np.repeat(mean_rank, ends - starts)
  return ranks


def spearman(predictions, labels) -> float:
  """Spearman rank correlation (ties averaged); 0.0 when undefined."""
  p, y = _pair(predictions, labels)
  return pearson(_average_ranks(p), _average_ranks(y))
