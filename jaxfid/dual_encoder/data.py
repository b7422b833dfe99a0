"""Training data for the dual encoder: questions, positives, hard negatives.

Inputs (JSON list or JSONL, maybe gzipped): FiD JSON (the positive is the
best ctx with ``has_answer``, else the first; hard negatives are the ctxs
without the answer) or DPR's retriever training JSON (first positive; hard
negatives, else negatives). :class:`PairBatcher` makes batches as a pure
function of (seed, step): questions ``[B, Lq]`` and passages
``[B*(1+H), Lp]`` (each question's positive, then its H negatives; missing
ones masked by ``passage_mask``). No example appears twice in one batch; a
process builds only its rows.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterator, Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import encode_padded
from jaxfid.retrieval.text.answer_match import AnswerMatcher
from jaxfid.core.textio import (iter_json_lines, read_json_document,
                                starts_json_array)
from jaxfid.dual_encoder.model import passage_text
from jaxfid.training.sampling import epoch_batch_indices


@dataclasses.dataclass(frozen=True)
class PairExample:
  """One training question with its passages, as (title, text) pairs."""
  question: str
  positive: tuple[str, str]
  hard_negatives: tuple[tuple[str, str], ...] = ()


def records(path) -> Iterator[tuple[object, dict]]:
  """(where, record) of a JSON list (``record N``, 1-based) or JSON lines
  file (the line number)."""
  if starts_json_array(path):
    document = read_json_document(path)
    if not isinstance(document, list):
      raise InputError(path, "expected a JSON list of examples")
    for i, record in enumerate(document):
      yield f"record {i + 1}", record
    return
  yield from iter_json_lines(path)


def read_examples(path: str | os.PathLike, parse: Callable,
                  limit: int | None = None) -> list:
  """``parse(path, where, record)`` of each record, None (an example without
  passages) dropped, at most ``limit``; none at all is an InputError."""
  out = []
  for where, record in records(path):
    example = parse(path, where, record)
    if example is not None:
      out.append(example)
    if limit is not None and len(out) >= limit:
      break
  if not out:
    raise InputError(path, "no training examples with passages")
  return out


def passage(path, where, ctx) -> tuple[str, str]:
  """(title, text) of a passage object, checked."""
  if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str):
    raise InputError(path, "each passage must be an object with a string "
                     "'text'", where=where)
  title = ctx.get("title") or ""
  if not isinstance(title, str):
    raise InputError(path, "passage 'title' must be a string", where=where)
  return title, ctx["text"]


def parse_example(path, where, record) -> PairExample | None:
  """The example of one record; None when it has no passage at all."""
  if not isinstance(record, dict):
    raise InputError(path, "expected a JSON object per example", where=where)
  question = record.get("question")
  if not isinstance(question, str) or not question.strip():
    raise InputError(path, "missing 'question'", where=where)
  if "positive_ctxs" in record:  # DPR's training format
    lists = [record.get(k) or [] for k in ("positive_ctxs",
                                           "hard_negative_ctxs",
                                           "negative_ctxs")]
    if not all(isinstance(x, list) for x in lists):
      raise InputError(path, "positive_ctxs, hard_negative_ctxs and "
                       "negative_ctxs must be lists", where=where)
    positives, hard, plain = [[passage(path, where, c) for c in x]
                              for x in lists]
    if not positives:
      return None
    return PairExample(question, positives[0], tuple(hard or plain))
  ctxs = record.get("ctxs")
  if not isinstance(ctxs, list):
    raise InputError(path, "expected 'ctxs' (FiD) or 'positive_ctxs' (DPR)",
                     where=where)
  if not ctxs:
    return None
  answers = record.get("answers") or []
  if isinstance(answers, str):
    answers = [answers]
  matcher = AnswerMatcher(answers) if answers else None
  passages, hits = [], []
  for ctx in ctxs:
    passages.append(passage(path, where, ctx))
    flag = ctx.get("has_answer")
    if flag is None:
      flag = bool(matcher and matcher(ctx["text"]))
    hits.append(bool(flag))
  first = hits.index(True) if any(hits) else 0
  negatives = tuple(p for k, (p, hit) in enumerate(zip(passages, hits))
                    if not hit and k != first)
  return PairExample(question, passages[first], negatives)


def read_pair_examples(path: str | os.PathLike,
                       limit: int | None = None) -> list[PairExample]:
  """Reads FiD or DPR training data; examples without passages are dropped."""
  return read_examples(path, parse_example, limit)


class QuestionBatcher:
  """What a dual encoder's batchers share: the examples, the tokenizer, the
  lengths, and which examples make each step's batch (every epoch cut into
  whole batches, a function of (seed, step) only)."""

  def __init__(self, examples: Sequence, tokenizer, *, batch_size: int,
               query_maxlength: int, passage_maxlength: int,
               passage_format: str, seed: int):
    if len(examples) < batch_size:
      raise InputError("BATCH_SIZE", f"{batch_size} questions per batch, but "
                       f"the training data has only {len(examples)}")
    self.examples = list(examples)
    self.tokenizer = tokenizer
    self.batch_size = batch_size
    self.query_maxlength = query_maxlength
    self.passage_maxlength = passage_maxlength
    self.passage_format = passage_format
    self.seed = seed

  def indices(self, step: int) -> np.ndarray:
    """The examples of ``step`` (every epoch cut into whole batches)."""
    return epoch_batch_indices(len(self.examples), self.seed, step,
                               self.batch_size)


class PairBatcher(QuestionBatcher):
  """Deterministic batches of questions, positives and H hard negatives each.

  Data order and negative choice depend on (seed, step) only.
  """

  def __init__(self, examples: Sequence[PairExample], tokenizer, *,
               batch_size: int, hard_negatives: int = 1,
               query_maxlength: int = 64, passage_maxlength: int = 256,
               passage_format: str = "title_text", seed: int = 0):
    super().__init__(examples, tokenizer, batch_size=batch_size,
                     query_maxlength=query_maxlength,
                     passage_maxlength=passage_maxlength,
                     passage_format=passage_format, seed=seed)
    if hard_negatives < 0:
      raise InputError("HARD_NEGATIVES", f"must be >= 0, got {hard_negatives}")
    self.hard_negatives = hard_negatives

  def _negatives(self, step: int, indices: np.ndarray) -> list[list]:
    """Each question's H negatives (None: a masked-out row), drawn for the
    whole global batch from one generator of (seed, step)."""
    rng = np.random.default_rng([self.seed, step, 1])
    out = []
    for i in indices:
      negatives = self.examples[int(i)].hard_negatives
      picked = (rng.choice(len(negatives), size=min(len(negatives),
                                                   self.hard_negatives),
                           replace=False) if negatives else [])
      out.append([negatives[int(j)] for j in picked] +
                 [None] * (self.hard_negatives - len(picked)))
    return out

  def batch(self, step: int, rows: slice | None = None) -> dict:
    """Rows ``rows`` (default all) of step ``step``'s batch:
    ``query_tokens [b, Lq]``, ``passage_tokens [b*(1+H), Lp]`` and
    ``passage_mask [b*(1+H)]`` (question q's rows ``q*(1+H) ..``, positive
    first)."""
    indices = self.indices(step)
    rows = rows if rows is not None else slice(0, self.batch_size)
    negatives = self._negatives(step, indices)[rows]
    questions, texts, mask = [], [], []
    for i, picked in zip(indices[rows], negatives):
      example = self.examples[int(i)]
      questions.append(example.question)
      for title_text in (example.positive, *picked):
        texts.append("" if title_text is None else
                     passage_text(*title_text, self.passage_format))
        mask.append(title_text is not None)
    passages = encode_padded(self.tokenizer, texts, self.passage_maxlength)
    passages[~np.asarray(mask, dtype=bool)] = 0
    return {"query_tokens": encode_padded(self.tokenizer, questions,
                                          self.query_maxlength),
            "passage_tokens": passages,
            "passage_mask": np.asarray(mask, dtype=bool)}
