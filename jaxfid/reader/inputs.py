"""FiD model inputs: passages formatted and tokenized, training targets.

The model input follows FiD's ``Dataset`` and ``Collator`` (``src/data.py``):
passages sorted by score, descending and stable (FiD gives score-less passages
one shared score, which keeps their order; here unscored passages also follow
all scored ones), the first ``n_context`` kept, each rendered as
``"question: Q title: T context: P"``; an example without passages is the
question alone (``"question: Q"``). Each string is tokenized, truncated to
``text_maxlength`` and padded with 0; with ``passage_eos`` (the default) it
ends with EOS, kept on truncation (what T5 tokenizers of transformers >= 3.1
and seqio do); without, it is cut at ``text_maxlength`` tokens and has no EOS
(FiD pinned transformers 3.0.2, whose T5 tokenizer appended none: its
published readers were trained so). Missing passages are all-zero rows with
a False mask. Targets are ``target`` if given, else an answer drawn
uniformly with a NumPy generator (FiD: ``random.choice``); for TriviaQA an
all-uppercase answer is title-cased, as FiD's preprocessing does. Targets
always end with EOS (FiD appended ``" </s>"`` to them explicitly).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxfid.core.tokenization import (
    DECODER_START_ID, PAD_ID, Tokenizer, encode_padded)
from jaxfid.reader.examples import (PASSAGE_PREFIX, QUESTION_PREFIX, TITLE_PREFIX,
                                 TRIVIA_QA, FidExample, sorted_passages)


def format_passages(example: FidExample, n_context: int) -> list[str]:
  """FiD encoder strings: ``"question: Q title: T context: P"`` per passage.

  Args:
    example: the example.
    n_context: the number of passages to keep (the best by score).

  Returns:
    ``min(n_context, len(ctxs))`` strings, or ``["question: Q"]`` when the
    example has no passages.
  """
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
  """Encoder inputs of a batch: tokens int32 ``[B, n_context, L]`` and mask.

  Every passage string is cut to ``text_maxlength`` tokens and padded with
  0; with ``passage_eos`` it ends with EOS inside that length (see the module
  docstring). Passages an example lacks are all-zero rows with mask False.

  Returns:
    ``(tokens, passage_mask)`` with shapes ``[B, n_context, text_maxlength]``
    (int32) and ``[B, n_context]`` (bool).
  """
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
  """The training target: ``target`` if given, else a uniform random answer.

  For ``dataset == "trivia_qa"`` an all-uppercase sampled answer is
  title-cased (``"THE BEATLES"`` -> ``"The Beatles"``), as FiD's TriviaQA
  preprocessing does; an explicit ``target`` is used verbatim.

  Raises:
    ValueError: the example has neither a target nor answers (read files
      with ``require_answers=True`` to report this as an InputError).
  """
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
  """FiD's TriviaQA casing: an all-uppercase text is title-cased
  (``"THE BEATLES"`` -> ``"The Beatles"``, ``"DON'T"`` -> ``"Don'T"``,
  Python's ``str.title``); any other text is returned as it is."""
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
  """Teacher-forcing decoder inputs: targets shifted right along the last axis.

  Position 0 gets the decoder start id (0); negative ids (label padding such
  as -100) become PAD.
  """
  targets = np.asarray(targets)
  if targets.ndim < 1:
    raise ValueError("targets must have at least one axis")
  out = np.full(targets.shape, DECODER_START_ID, dtype=np.int32)
  out[..., 1:] = np.where(targets[..., :-1] < 0, PAD_ID, targets[..., :-1])
  return out
