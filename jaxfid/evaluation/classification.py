"""Classification and regression scores: accuracy, binary F1, MCC, correlations.

Definitions are scikit-learn's and SciPy's: :func:`binary_f1` is
``2 TP / (2 TP + FP + FN)`` for the positive class; :func:`matthews_corrcoef`
is Gorodkin's R_K over the classes seen, in exact integer arithmetic;
:func:`spearman` averages tied ranks. An undefined score is 0.0, not NaN. A
prediction of -1 (no label word) is wrong for accuracy, never positive for F1
and its own class for MCC. Scores are fractions. NumPy only.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

METRICS = ("accuracy", "f1", "mcc")


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  p, y = np.asarray(predictions), np.asarray(labels)
  if p.shape != y.shape or p.ndim != 1:
    raise ValueError(f"predictions {p.shape} and labels {y.shape} must be "
                     "1-D of equal length")
  if p.size == 0:
    raise ValueError("no examples")
  return p, y


def accuracy(predictions, labels) -> float:
  """Fraction of predictions equal to their label."""
  p, y = _pair(predictions, labels)
  return float(np.mean(p == y))


def binary_f1(predictions, labels, positive=1) -> float:
  """F1 of the ``positive`` class (GLUE MRPC / QQP); 0 with no true positive.
  """
  p, y = _pair(predictions, labels)
  tp = int(np.sum((p == positive) & (y == positive)))
  fp = int(np.sum((p == positive) & (y != positive)))
  fn = int(np.sum((p != positive) & (y == positive)))
  return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews_corrcoef(predictions, labels) -> float:
  """Matthews correlation (multi-class R_K), in [-1, 1]; 0 if undefined."""
  p, y = _pair(predictions, labels)
  classes = np.union1d(p, y)
  predicted = [int(np.sum(p == k)) for k in classes]
  true = [int(np.sum(y == k)) for k in classes]
  s = int(y.size)
  c = int(np.sum(p == y))
  numerator = c * s - sum(a * b for a, b in zip(predicted, true))
  denominator = ((s * s - sum(a * a for a in predicted))
                 * (s * s - sum(b * b for b in true)))
  if denominator == 0:
    return 0.0
  return float(numerator / math.sqrt(denominator))


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


def _check(metric: str) -> None:
  if metric not in METRICS:
    raise ValueError(f"unknown metric {metric!r}; one of "
                     f"{', '.join(METRICS)}")


def classification_metrics(metric: str, predictions: Sequence[int],
                           labels: Sequence[int]) -> dict[str, float]:
  """``{"accuracy": ...}`` plus ``"f1"`` or ``"mcc"`` when ``metric`` says.

  Raises ValueError for an unknown metric, different lengths or no examples.
  """
  _check(metric)
  predictions = np.asarray(predictions, dtype=np.int64).reshape(-1)
  labels = np.asarray(labels, dtype=np.int64).reshape(-1)
  if predictions.size != labels.size:
    raise ValueError(f"{predictions.size} predictions for {labels.size} "
                     "labels")
  if not labels.size:
    raise ValueError("no examples to score")
  scores = {"accuracy": accuracy(predictions, labels)}
  if metric == "f1":
    scores["f1"] = binary_f1(predictions, labels)
  elif metric == "mcc":
    scores["mcc"] = matthews_corrcoef(predictions, labels)
  return scores


def primary(metric: str, scores: Mapping[str, float]) -> float:
  """``scores[metric]``: the score a task is judged by."""
  _check(metric)
  if metric not in scores:
    raise KeyError(f"scores have no {metric!r} (have "
                   f"{', '.join(sorted(scores))})")
  return float(scores[metric])


__all__ = ["METRICS", "accuracy", "binary_f1", "matthews_corrcoef", "pearson",
           "spearman", "classification_metrics", "primary"]
