"""Postprocessing and metrics of the FiD QA tasks, for ``seqio.Evaluator``.

:func:`postprocess_answer` returns a prediction as text and a target as the
example's gold ``answers`` (or ``[target]``, or ``[]``). :func:`exact_match`
and :func:`f1` take the best gold answer (SQuAD normalisation); examples
without answers are left out of the mean (NaN when none has any). Scores are
fractions. Prediction token rows must share one length (NumPy 2).
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
