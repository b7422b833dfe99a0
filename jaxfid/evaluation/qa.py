"""Answer metrics: SQuAD v1.1 exact match / F1, as DPR and FiD compute them.

:func:`normalize_answer` lower-cases, deletes ASCII punctuation and the words
``a``/``an``/``the`` and collapses whitespace; :func:`exact_match` and
:func:`f1_score` (bag of tokens; no shared token is 0) take the best gold
answer. Scores are fractions.
"""
from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

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
  """1.0 if ``prediction`` matches a gold answer once normalised, else 0.0."""
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
  """Mean exact match and F1 over examples (each with non-empty gold answers).

  Returns ``{"exact_match", "f1", "count"}`` (fractions; count as float).
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
