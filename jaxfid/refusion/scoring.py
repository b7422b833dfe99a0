"""Classification of a few-shot split, and FLOPs per example.

``SCORING='rank'``: each label word scored by log-likelihood
(:meth:`~jaxfid.refusion.model.ReFusionModel.classify`). ``'generate'``:
greedy decoding of at most ``generate_tokens`` tokens, decoded without
special tokens and matched exactly (ignoring case and outer whitespace) to
the label words; no match is class -1, wrong for every metric.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.core.tokenization import Tokenizer
from jaxfid.evaluation.classification import classification_metrics
from jaxfid.refusion import batches as batch_lib
from jaxfid.refusion import lmbff
from jaxfid.refusion.data import NeighbourVectors
from jaxfid.refusion.model import ReFusionModel

Replicate = Callable[[Any], Any]
SCORINGS = ("rank", "generate")


def predicted_classes(spec: lmbff.TaskSpec, tokenizer: Tokenizer,
                      generated: np.ndarray) -> list[int]:
  """The class of each generated row int32 [N, T] (-1: none): its text up
  to EOS matched by :func:`lmbff.word_label`."""
  rows = [[i for i in row if i < tokenizer.vocab_size]
          for row in np.asarray(generated).tolist()]
  return [lmbff.word_label(spec, tokenizer.decode(row)) for row in rows]


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
  """Scores the splits of one run: ``label_tokens`` int32 [C, T] (label
  words + EOS), ``neighbours`` adding each batch's vectors, last batch
  padded; ``spec`` and ``tokenizer`` for ``'generate'`` only."""

  def __init__(self, metric: str, label_tokens: np.ndarray,
               arrays: dict[str, dict[str, np.ndarray]],
               neighbours: NeighbourVectors, batch_size: int, *,
               scoring: str = "rank", generate_tokens: int = 2,
               spec: lmbff.TaskSpec | None = None,
               tokenizer: Tokenizer | None = None):
    if scoring not in SCORINGS:
      raise ValueError(f"scoring {scoring!r}: one of {SCORINGS}")
    if scoring == "generate" and (spec is None or tokenizer is None):
      raise ValueError("scoring 'generate' needs the task and a tokenizer")
    self.metric = metric
    self.label_tokens = jnp.asarray(label_tokens)
    self.arrays = arrays
    self.neighbours = neighbours
    self.batch_size = batch_size
    self.scoring, self.generate_tokens = scoring, generate_tokens
    self.spec, self.tokenizer = spec, tokenizer
    self._classifiers: dict = {}

  def program(self, model: ReFusionModel):
    """``fn(params, batch)``: int32 [B] classes ('rank') or int32 [B, T]
    generated tokens ('generate')."""
    if self.scoring == "generate":
      return lambda p, b: model.generate(p, b, self.generate_tokens)
    return lambda p, b: model.classify(p, b, self.label_tokens)

  def _classifier(self, model: ReFusionModel, sharding):
    """The jitted :meth:`program`; its output is placed like its
    (replicated) input, so every process of a multi-host run can fetch it."""
    if model.fusion not in self._classifiers:
      self._classifiers[model.fusion] = jax.jit(self.program(model),
                                                out_shardings=sharding)
    return self._classifiers[model.fusion]

  def __call__(self, model: ReFusionModel, params, split: str,
               replicate: Replicate) -> dict:
    """The metrics of ``split`` (fractions; always ``accuracy``)."""
    preds = []
    for b, real in batch_lib.eval_batches(self.arrays[split], self.batch_size):
      b = replicate(self.neighbours(params, b, replicate))
      classify = self._classifier(model, jax.tree.leaves(b)[0].sharding)
      out = np.asarray(jax.device_get(classify(params, b)))[:real]
      if self.scoring == "generate":                             # [B, T]
        out = np.asarray(predicted_classes(self.spec, self.tokenizer, out),
                         np.int32).reshape(-1)
      preds.append(out)
    preds = np.concatenate(preds) if preds else np.zeros((0,), np.int32)
    return classification_metrics(self.metric, preds.tolist(),
                                  self.arrays[split]["labels"].tolist())

  def flops(self, model: ReFusionModel, params, split: str,
            replicate: Replicate) -> float | None:
    """XLA's FLOPs to classify one example of ``split`` (all label words,
    or the decoding of ``generate_tokens`` tokens)."""
    one = {k: v[:1] for k, v in self.arrays[split].items() if k != "labels"}
    one = replicate(self.neighbours(params, one, replicate))
    fn = (self.program(model) if self.scoring == "generate" else
          lambda p, b: model.label_scores(p, b, self.label_tokens))
    return flops_per_example(fn, params, one, batch_size=1)
