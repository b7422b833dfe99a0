"""Classification and regression scores: accuracy, binary F1, MCC, correlations.

LM-BFF (and so ReFusion) reports accuracy for most tasks, the F1 of the
positive class for MRPC and QQP, and the Matthews correlation coefficient for
CoLA (``TaskSpec.metric`` in :mod:`jaxfid.refusion.lmbff`).
:func:`classification_metrics` always returns ``accuracy`` and adds the
task's own metric; :func:`primary` picks the number a task is judged by.
GLUE's regression task (STS-B) is scored with :func:`pearson` and
:func:`spearman`.

Definitions (those of scikit-learn and SciPy, which GLUE's scorer uses):

* :func:`accuracy`: the fraction of predictions equal to their label.
* :func:`binary_f1`: ``2 TP / (2 TP + FP + FN)`` for the positive class (1
  by default); 0 when there is no true positive.
* :func:`matthews_corrcoef`: over the confusion matrix ``C`` of the classes
  seen in either sequence, ``(c s - sum_k p_k t_k) / sqrt((s^2 - sum_k
  p_k^2) (s^2 - sum_k t_k^2))`` with ``s`` examples, ``c`` correct,
  ``p_k``/``t_k`` the predicted/true counts of class ``k`` (Gorodkin's R_K;
  the usual binary formula for two classes), in exact integer arithmetic.
* :func:`pearson`, :func:`spearman` (ranks, ties averaged as
  ``scipy.stats.rankdata`` does).

Where a score is undefined (no positive class, a constant input) it is 0.0
rather than NaN, so that "best checkpoint" comparisons stay well defined.
Predictions and labels may be any comparable values (class indices, label
strings). A prediction may be -1 (generated text that is no label word): it
is wrong for accuracy, not the positive class for F1 and a class of its own
for MCC. Scores are fractions (0.5 is 50%), as everywhere in jaxfid. NumPy
only.
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

  Args:
    metric: ``'accuracy'``, ``'f1'`` or ``'mcc'`` (the task's metric).
    predictions: predicted class indices (-1 for no class).
    labels: gold class indices, as many as ``predictions``.

  Raises:
    ValueError: an unknown metric, different lengths, or no examples.
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
  """The score a task is judged by: ``scores[metric]``.

  Raises:
    ValueError: an unknown metric.
    KeyError: ``scores`` lacks it.
  """
  _check(metric)
  if metric not in scores:
    raise KeyError(f"scores have no {metric!r} (have "
                   f"{', '.join(sorted(scores))})")
  return float(scores[metric])


__all__ = ["METRICS", "accuracy", "binary_f1", "matthews_corrcoef", "pearson",
           "spearman", "classification_metrics", "primary"]
