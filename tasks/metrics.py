"""Postprocessing and metrics of the FiD QA tasks, for ``seqio.Evaluator``.

* :func:`postprocess_answer` is the tasks' ``postprocess_fn``: a decoded
  prediction is returned as text; for a target it returns the example's gold
  ``answers`` (all of them, so that scores take the best match, as FiD does),
  or ``[target]`` when the example has a target but no answers, or ``[]``.
* :func:`exact_match` and :func:`f1` are seqio metric functions
  ``fn(targets, predictions) -> {name: value}`` wrapping
  ``jaxfid.evaluation.qa.exact_match`` / ``f1_score`` (SQuAD normalisation, max
  over the gold answers). Scores are fractions (0.5 is 50%), like the rest of
  jaxfid; examples without gold answers are left out of the mean (NaN when
  none has any).

With predictions from a model, ``seqio.Evaluator`` turns them into a NumPy
array before decoding: under NumPy 2 the token rows must all have one length
(pad them, e.g. with 0, to the decode length).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from jaxfid.evaluation import qa as evaluation


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def postprocess_answer(output: Any, example: Mapping | None = None,
                       is_target: bool = False):
  """Prediction text, or the gold answers of ``example`` for a target."""
  if not is_target:
    return _text(output).strip()
  answers = []
  if example is not None and "answers" in example:
    answers = [_text(a) for a in np.asarray(example["answers"]).reshape(-1)]
  if answers:
    return answers
  if example is not None and "target" in example:
    target = _text(example["target"])
    return [target] if target else []
  text = _text(output)
  return [text] if text else []


def _mean_over_answered(score_fn, targets: Sequence[Sequence[str]],
                        predictions: Sequence[str]) -> float:
  if len(targets) != len(predictions):
    raise ValueError(f"{len(predictions)} predictions for {len(targets)} "
                     "targets")
  scores = [score_fn(p, answers) for answers, p in zip(targets, predictions)
            if len(answers)]
  return float(np.mean(scores)) if scores else float("nan")


def exact_match(targets: Sequence[Sequence[str]],
                predictions: Sequence[str]) -> dict[str, float]:
  """Mean exact match (max over each example's answers)."""
  return {"exact_match": _mean_over_answered(evaluation.exact_match, targets,
                                             predictions)}


def f1(targets: Sequence[Sequence[str]],
       predictions: Sequence[str]) -> dict[str, float]:
  """Mean SQuAD token F1 (max over each example's answers)."""
  return {"f1": _mean_over_answered(evaluation.f1_score, targets,
                                    predictions)}
