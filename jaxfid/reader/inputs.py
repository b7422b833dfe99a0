"""FiD model inputs: passages formatted and tokenized, training targets.

As FiD's ``Dataset`` and ``Collator`` (``src/data.py``): passages sorted by
score, descending and stable (unscored ones after all scored ones), the
first ``n_context`` kept, each rendered as ``"question: Q title: T context:
P"`` (no passages: ``"question: Q"``), tokenized, cut to ``text_maxlength``
and padded with 0. With ``passage_eos`` (the default, as seqio and T5
tokenizers of transformers >= 3.1) a passage ends with EOS, kept on
truncation; without it has none (as FiD's published readers were trained,
on transformers 3.0.2). Missing passages are all-zero rows with a False
mask. The target is ``target`` if given, else a uniformly drawn answer
(FiD: ``random.choice``; TriviaQA's all-uppercase answers title-cased), and
always ends with EOS.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxfid.core.tokenization import (
    DECODER_START_ID, PAD_ID, Tokenizer, encode_padded)
from jaxfid.reader.examples import (PASSAGE_PREFIX, QUESTION_PREFIX, TITLE_PREFIX,
                                 TRIVIA_QA, FidExample, sorted_passages)


def format_passages(example: FidExample, n_context: int) -> list[str]:
  """FiD encoder strings: ``"question: Q title: T context: P"`` for each of
  the ``n_context`` best-scored passages, or ``["question: Q"]`` for an
  example without passages."""
  if n_context < 1:
    raise ValueError(f"n_context must be at least 1, got {n_context}")
  question = f"{QUESTION_PREFIX} {example.question}"
  if not example.ctxs:
    return [question]
  return [f"{question} {TITLE_PREFIX} {p.title} {PASSAGE_PREFIX} {p.text}"
          for p in sorted_passages(example)[:n_context]]


def encode_examples(tokenizer: Tokenizer, examples: Sequence[FidExample],
                    n_context: int, text_maxlength: int,
                    passage_eos: bool = True
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Encoder inputs of a batch: ``(tokens, passage_mask)``, int32 ``[B,
  n_context, text_maxlength]`` (0-padded; with ``passage_eos``, EOS inside
  that length) and bool ``[B, n_context]`` (False for missing passages)."""
  texts = [format_passages(e, n_context) for e in examples]
  flat = encode_padded(tokenizer, [t for ts in texts for t in ts],
                       text_maxlength, add_eos=passage_eos)
  tokens = np.zeros((len(examples), n_context, text_maxlength), np.int32)
  mask = np.zeros((len(examples), n_context), bool)
  start = 0
  for b, ts in enumerate(texts):
    tokens[b, :len(ts)] = flat[start:start + len(ts)]
    mask[b, :len(ts)] = True
    start += len(ts)
  return tokens, mask


def encode_example(tokenizer: Tokenizer, example: FidExample, n_context: int,
                   text_maxlength: int, passage_eos: bool = True
                   ) -> tuple[np.ndarray, np.ndarray]:
  """:func:`encode_examples` of one example: ``[n_context, L]``, ``[n_context]``.
  """
  tokens, mask = encode_examples(tokenizer, [example], n_context,
                                 text_maxlength, passage_eos)
  return tokens[0], mask[0]


def choose_target(example: FidExample, rng: np.random.Generator,
                  dataset: str = "nq") -> str:
  """The training target: ``target`` verbatim if given, else a uniform
  random answer (``dataset == "trivia_qa"``: an all-uppercase one
  title-cased, as FiD's preprocessing). ValueError if the example has
  neither (read files with ``require_answers=True`` for an InputError)."""
  if example.target is not None:
    return example.target
  if not example.answers:
    raise ValueError(f"example {example.id or example.question!r} has no "
                     "target and no answers")
  answer = example.answers[int(rng.integers(len(example.answers)))]
  if dataset == TRIVIA_QA:
    answer = title_case_if_upper(answer)
  return answer


def title_case_if_upper(text: str) -> str:
  """FiD's TriviaQA casing: an all-uppercase text through ``str.title``
  (``"DON'T"`` -> ``"Don'T"``); any other text as it is."""
  return text.title() if text.isupper() else text


def encode_target(tokenizer: Tokenizer, text: str,
                  target_maxlength: int) -> np.ndarray:
  """Target ids int32 ``[target_maxlength]``: EOS kept on truncation, 0-pad.
  """
  return encode_padded(tokenizer, [text], target_maxlength)[0]


def target_candidates(example: FidExample, dataset: str = "nq") -> list[str]:
  """Every text :func:`choose_target` can return for ``example``."""
  if example.target is not None:
    return [example.target]
  if dataset == TRIVIA_QA:
    return [title_case_if_upper(a) for a in example.answers]
  return list(example.answers)


def longest_target_length(tokenizer: Tokenizer,
                          examples: Sequence[FidExample],
                          dataset: str = "nq") -> int:
  """Tokens of the longest target :func:`choose_target` can draw, EOS
  included (at least 1): the fixed target length that truncates nothing."""
  texts = [t for e in examples for t in target_candidates(e, dataset)]
  return 1 + max((len(ids) for ids in tokenizer.encode_batch(texts)),
                 default=0)


def decoder_inputs_from_targets(targets) -> np.ndarray:
  """Teacher-forcing decoder inputs: targets shifted right along the last
  axis, position 0 the start id (0), negative ids (-100 padding) PAD."""
  targets = np.asarray(targets)
  if targets.ndim < 1:
    raise ValueError("targets must have at least one axis")
  out = np.full(targets.shape, DECODER_START_ID, dtype=np.int32)
  out[..., 1:] = np.where(targets[..., :-1] < 0, PAD_ID, targets[..., :-1])
  return out
