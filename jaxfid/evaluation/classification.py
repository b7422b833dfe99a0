"""Classification scores of the LM-BFF tasks: accuracy, binary F1, MCC.

LM-BFF (and so ReFusion) reports accuracy for most tasks, the F1 of the
positive class for MRPC and QQP, and the Matthews correlation coefficient for
CoLA (``TaskSpec.metric`` in :mod:`jaxfid.refusion.lmbff`).
:func:`classification_metrics` always returns ``accuracy`` and adds the
task's own metric; :func:`primary` picks the number a task is judged by.

Definitions (those of scikit-learn, which GLUE's scorer uses):

* ``f1``: ``2 TP / (2 TP + FP + FN)`` for class 1; 0 when class 1 is neither
  predicted nor present.
* ``mcc``: over the confusion matrix ``C`` of the classes seen in either
  sequence, ``(c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 -
  sum_k t_k^2))`` with ``s`` examples, ``c`` correct, ``p_k``/``t_k`` the
  predicted/true counts of class ``k`` (Gorodkin's R_K; the usual binary
  formula for two classes); 0 when the denominator is 0.

A prediction may be -1 (generated text that is no label word): it is wrong
for accuracy, not class 1 for F1 and a class of its own for MCC. Scores are
fractions (0.5 is 50%), as everywhere in jaxfid. NumPy only.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

METRICS = ("accuracy", "f1", "mcc")


def _check(metric: str) -> None:
  if metric not in METRICS:
    raise ValueError(f"unknown metric {metric!r}; one of "
                     f"{', '.join(METRICS)}")


def binary_f1(predictions: np.ndarray, labels: np.ndarray) -> float:
  """F1 of class 1."""
  tp = int(np.sum((predictions == 1) & (labels == 1)))
  fp = int(np.sum((predictions == 1) & (labels != 1)))
  fn = int(np.sum((predictions != 1) & (labels == 1)))
  denominator = 2 * tp + fp + fn
  return 2 * tp / denominator if denominator else 0.0


def matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
  """Matthews correlation coefficient (multi-class R_K), in [-1, 1]."""
  classes = np.union1d(predictions, labels)
  p = np.array([int(np.sum(predictions == k)) for k in classes], dtype=object)
  t = np.array([int(np.sum(labels == k)) for k in classes], dtype=object)
  s = int(labels.size)
  c = int(np.sum(predictions == labels))
  numerator = c * s - int(np.dot(p, t))
  denominator = (s * s - int(np.dot(p, p))) * (s * s - int(np.dot(t, t)))
  if denominator == 0:
    return 0.0
  return float(numerator / math.sqrt(denominator))


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
  scores = {"accuracy": float(np.mean(predictions == labels))}
  if metric == "f1":
    scores["f1"] = float(binary_f1(predictions, labels))
  elif metric == "mcc":
    scores["mcc"] = matthews(predictions, labels)
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
