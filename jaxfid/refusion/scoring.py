"""Rank classification of a few-shot split, and FLOPs per example.

A split is scored with a given structure's model (the search's current
argmax, a retrained structure, or the fixed scheme): every class's label
word is scored by its log-likelihood, the best one is the prediction
(:meth:`~jaxfid.refusion.model.ReFusionModel.classify`), and the task's
metrics come from :func:`jaxfid.evaluation.classification.classification_metrics`.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.evaluation.classification import classification_metrics
from jaxfid.refusion import batches as batch_lib
from jaxfid.refusion.data import NeighbourVectors
from jaxfid.refusion.model import ReFusionModel

Replicate = Callable[[Any], Any]


def flops_per_example(fn, *args, batch_size: int) -> float | None:
  """XLA's FLOP count of ``fn(*args)`` per example (None where unavailable)."""
  try:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  except Exception:  # pylint: disable=broad-except  # backend without it
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"]) / batch_size


class SplitScorer:
  """Scores the splits of one run (arrays of :mod:`jaxfid.refusion.batches`).

  Args:
    metric: the task's metric ('accuracy', 'f1', 'mcc').
    label_tokens: int32 [C, T], every class's label word + EOS.
    arrays: split name -> arrays (with ``labels``).
    neighbours: adds each batch's neighbour vectors.
    batch_size: examples per scoring call (the last batch is padded).
  """

  def __init__(self, metric: str, label_tokens: np.ndarray,
               arrays: dict[str, dict[str, np.ndarray]],
               neighbours: NeighbourVectors, batch_size: int):
    self.metric = metric
    self.label_tokens = jnp.asarray(label_tokens)
    self.arrays = arrays
    self.neighbours = neighbours
    self.batch_size = batch_size
    self._classifiers: dict = {}

  def _classifier(self, model: ReFusionModel, sharding):
    """The jitted classifier; its output is placed like its (replicated)
    input, so every process of a multi-host run can fetch it."""
    if model.fusion not in self._classifiers:
      self._classifiers[model.fusion] = jax.jit(
          lambda p, b: model.classify(p, b, self.label_tokens),
          out_shardings=sharding)
    return self._classifiers[model.fusion]

  def __call__(self, model: ReFusionModel, params, split: str,
               replicate: Replicate) -> dict:
    """The metrics of ``split`` (fractions; always ``accuracy``)."""
    preds = []
    for b, real in batch_lib.eval_batches(self.arrays[split], self.batch_size):
      b = replicate(self.neighbours(params, b, replicate))
      classify = self._classifier(model, jax.tree.leaves(b)[0].sharding)
      preds.append(np.asarray(jax.device_get(classify(params, b)))[:real])
    preds = np.concatenate(preds) if preds else np.zeros((0,), np.int32)
    return classification_metrics(self.metric, preds.tolist(),
                                  self.arrays[split]["labels"].tolist())

  def flops(self, model: ReFusionModel, params, split: str,
            replicate: Replicate) -> float | None:
    """XLA's FLOPs to score one example of ``split`` (all label words)."""
    one = {k: v[:1] for k, v in self.arrays[split].items() if k != "labels"}
    one = replicate(self.neighbours(params, one, replicate))
    return flops_per_example(
        lambda p, b: model.label_scores(p, b, self.label_tokens), params, one,
        batch_size=1)
