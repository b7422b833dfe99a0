"""Training data of a retriever distilled from the reader (FiD-KD).

The input is FiD JSON / JSONL whose ``ctxs[i].score`` are the reader's
(``jaxfid predict --passage-scores --scored-data``, FiD's
``test_reader.py --write_crossattention_scores``). Each question keeps its
``n_context`` best passages by score, as FiD's ``train_retriever.py`` (its
``Dataset`` sorts by ``float(score)``, descending and stable, then takes
``ctxs[:n_context]``: ``src/data.py:24,45,64-68``); a passage without a
numeric score is an error (the file was not scored). :class:`ScoredBatcher`
makes batches as a pure function of (seed, step): questions ``[B, Lq]``,
passages ``[B*N, Lp]`` (question b's in rows ``b*N ..``), ``passage_mask
[B*N]`` and ``gold_scores`` float32 ``[B*N]``; a process builds its rows.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import encode_padded
from jaxfid.dual_encoder.data import QuestionBatcher, passage, read_examples
from jaxfid.dual_encoder.model import passage_text

SCORE_HINT = ("score the passages with `jaxfid predict --passage-scores "
              "--scored-data OUT.json`")


@dataclasses.dataclass(frozen=True)
class ScoredExample:
  """A question, its passages as (title, text) and the reader's scores."""
  question: str
  passages: tuple[tuple[str, str], ...]
  scores: tuple[float, ...]


def _score(path, where, value) -> float:
  if isinstance(value, bool):
    value = None
  try:
    score = float(value)
  except (TypeError, ValueError):
    raise InputError(path, f"a passage without a numeric 'score': "
                     f"{SCORE_HINT}", where=where) from None
  if not math.isfinite(score):
    raise InputError(path, f"a passage score is {score}", where=where)
  return score


def parse_scored(path, where, record, n_context: int) -> ScoredExample | None:
  """The example of one record (its ``n_context`` best passages by score,
  descending and stable); None when it has no passage."""
  if not isinstance(record, dict):
    raise InputError(path, "expected a JSON object per example", where=where)
  question = record.get("question")
  if not isinstance(question, str) or not question.strip():
    raise InputError(path, "missing 'question'", where=where)
  ctxs = record.get("ctxs")
  if not isinstance(ctxs, list):
    raise InputError(path, f"expected 'ctxs' with the reader's scores "
                     f"({SCORE_HINT})", where=where)
  scored = [(passage(path, where, ctx), _score(path, where, ctx.get("score")))
            for ctx in ctxs]
  kept = sorted(scored, key=lambda ps: -ps[1])[:n_context]  # stable
  if not kept:
    return None
  return ScoredExample(question, tuple(p for p, _ in kept),
                       tuple(s for _, s in kept))


def read_scored_examples(path: str | os.PathLike, n_context: int,
                         limit: int | None = None) -> list[ScoredExample]:
  """Reads scored FiD data; examples without passages are dropped."""
  return read_examples(
      path, lambda p, where, r: parse_scored(p, where, r, n_context), limit)


class ScoredBatcher(QuestionBatcher):
  """Deterministic batches of questions (B a batch), their ``n_context``
  passages (N) and gold scores; the order depends on (seed, step) only;
  ``passage_format``: :func:`jaxfid.dual_encoder.model.passage_text`'s."""

  def __init__(self, examples: Sequence[ScoredExample], tokenizer, *,
               batch_size: int, n_context: int, query_maxlength: int = 64,
               passage_maxlength: int = 256,
               passage_format: str = "title_text", seed: int = 0):
    super().__init__(examples, tokenizer, batch_size=batch_size,
                     query_maxlength=query_maxlength,
                     passage_maxlength=passage_maxlength,
                     passage_format=passage_format, seed=seed)
    self.n_context = n_context

  def batch(self, step: int, rows: slice | None = None) -> dict:
    """Rows ``rows`` (default: all) of the global batch of step ``step``:
    ``query_tokens [b, Lq]``, ``passage_tokens [b*N, Lp]``, ``passage_mask
    [b*N]`` and ``gold_scores [b*N]`` for its b questions."""
    rows = rows if rows is not None else slice(0, self.batch_size)
    n = self.n_context
    questions, texts, mask, gold = [], [], [], []
    for i in self.indices(step)[rows]:
      example = self.examples[int(i)]
      questions.append(example.question)
      missing = n - len(example.passages)
      texts += [passage_text(*p, self.passage_format)
                for p in example.passages] + [""] * missing
      mask += [True] * len(example.passages) + [False] * missing
      gold += list(example.scores) + [0.0] * missing
    mask = np.asarray(mask, dtype=bool)
    passages = encode_padded(self.tokenizer, texts, self.passage_maxlength)
    passages[~mask] = 0
    return {"query_tokens": encode_padded(self.tokenizer, questions,
                                          self.query_maxlength),
            "passage_tokens": passages, "passage_mask": mask,
            "gold_scores": np.asarray(gold, dtype=np.float32)}
