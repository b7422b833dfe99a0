"""The FiD QA tasks' one preprocessor: jaxfid's own Python FiD preprocessing.

:func:`encode_fid` maps ``tf.numpy_function`` over ``jaxfid.reader.examples``
(``format_passages``, ``encode_example``, ``choose_target``,
``encode_target``), adding:

* ``inputs``: int32 ``[p, text_maxlength]``, rows of the
  ``p = min(n_context, passages)`` best passages (one ``"question: Q"`` row
  without passages), each ending with EOS unless
  :func:`tasks.config.fid_passage_eos` is False, 0-padded;
* ``targets``: int32 ``[t]`` with EOS: ``target``, else an answer drawn from
  seqio's per-example seed (title-cased for all-uppercase TriviaQA answers),
  else ``""``;
* ``inputs_pretokenized`` (string ``[p]``) and ``targets_pretokenized``.

Raw passage fields are dropped. ``sequence_length["inputs"]`` must be a pair
``(n_context, text_maxlength)``; its first entry caps
:func:`tasks.config.fid_n_context`. Without lengths nothing is cut.
"""
from __future__ import annotations

import functools
from typing import Mapping

import numpy as np
import seqio
import tensorflow as tf

from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader import examples as fid_format
from jaxfid.reader import inputs as fid_inputs
from tasks import config
from tasks.sources import example_from_features

RAW_PASSAGE_FIELDS = ("titles", "texts", "scores")


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
  return Tokenizer()  # the vocabulary of the tasks' output features


def _limit(feature: str, length, rank: int):
  """The (passages, tokens) limits of a rank-2 feature, or tokens of rank 1."""
  if rank == 1:
    if length is not None and (not isinstance(length, (int, np.integer))
                               or length < 1):
      raise ValueError(f"sequence_length[{feature!r}] must be a positive int, "
                       f"got {length!r}")
    return None if length is None else int(length)
  if length is None:
    return (None, None)
  if isinstance(length, (int, np.integer)) or len(length) != 2:
    raise ValueError(
        f"sequence_length[{feature!r}] must be a pair (n_context, "
        f"text_maxlength) for the rank-2 FiD inputs, got {length!r}")
  for value in length:
    if value is not None and int(value) < 1:
      raise ValueError(f"sequence_length[{feature!r}] entries must be at "
                       f"least 1, got {length!r}")
  return tuple(None if v is None else int(v) for v in length)


def encode_fid_example(example: fid_format.FidExample,
                       rng: np.random.Generator, dataset_name: str, *,
                       n_context: int, text_maxlength: int | None,
                       answer_maxlength: int | None,
                       tokenizer: Tokenizer | None = None,
                       passage_eos: bool = True
                       ) -> tuple[np.ndarray, list[str], np.ndarray, str]:
  """``(inputs [p, L], passage strings, targets [t], target text)`` of one
  example, by jaxfid's FiD functions (see the module docstring)."""
  tokenizer = tokenizer or _tokenizer()
  n = min(n_context, max(1, len(example.ctxs)))
  strings = fid_inputs.format_passages(example, n)
  if text_maxlength is None:  # no cut: the longest row (and its EOS)
    text_maxlength = max(len(ids) for ids in tokenizer.encode_batch(
        strings)) + int(passage_eos)
  tokens, mask = fid_inputs.encode_example(tokenizer, example, n,
                                           text_maxlength, passage_eos)
  target = ""
  if example.target is not None or example.answers:
    target = fid_inputs.choose_target(example, rng, dataset_name)
  length = answer_maxlength or len(tokenizer.encode(target)) + 1
  targets = fid_inputs.encode_target(tokenizer, target, length)
  return (tokens[mask], strings, targets[:np.count_nonzero(targets)],
          target)


def encode_fid(dataset: tf.data.Dataset,
               sequence_length: Mapping | None = None,
               dataset_name: str = "nq",
               n_context: int | None = None,
               passage_eos: bool | None = None) -> tf.data.Dataset:
  """Adds ``inputs``, ``targets`` and their ``*_pretokenized`` strings.

  ``sequence_length``: ``{"inputs": (n_context, text_maxlength), "targets":
  answer_maxlength}`` (entries may be None). ``n_context`` and
  ``passage_eos`` of None read the gin settings when the dataset is built.
  """
  n = config.fid_n_context() if n_context is None else int(n_context)
  eos = config.fid_passage_eos() if passage_eos is None else bool(passage_eos)
  if n < 1:
    raise ValueError(f"n_context must be at least 1, got {n}")
  lengths = sequence_length or {}
  n_limit, text_maxlength = _limit("inputs", lengths.get("inputs"), rank=2)
  answer_maxlength = _limit("targets", lengths.get("targets"), rank=1)
  if n_limit is not None:
    n = min(n, n_limit)

  def encode(question, answers, target, ident, titles, texts, scores, seed):
    example = example_from_features({
        "question": question, "answers": answers, "target": target,
        "id": ident, "titles": titles, "texts": texts, "scores": scores})
    rng = np.random.default_rng([int(s) % 2**64 for s in seed])
    inputs, strings, targets, text = encode_fid_example(
        example, rng, dataset_name, n_context=n,
        text_maxlength=text_maxlength, answer_maxlength=answer_maxlength,
        passage_eos=eos)
    strings_array = np.empty([len(strings)], object)
    strings_array[:] = [s.encode("utf-8") for s in strings]
    return (inputs.astype(np.int32), strings_array, targets.astype(np.int32),
            np.bytes_(text.encode("utf-8")))

  @seqio.map_over_dataset(num_seeds=1)
  def fn(ex, seed):
    seed = tf.reshape(tf.cast(tf.convert_to_tensor(seed), tf.int64), [-1])
    inputs, strings, targets, text = tf.numpy_function(
        encode, [ex["question"], ex["answers"], ex["target"], ex["id"],
                 ex["titles"], ex["texts"], ex["scores"], seed],
        [tf.int32, tf.string, tf.int32, tf.string], stateful=False)
    inputs.set_shape([None, text_maxlength])
    strings.set_shape([None])
    targets.set_shape([None])
    text.set_shape([])
    out = {k: v for k, v in ex.items() if k not in RAW_PASSAGE_FIELDS}
    out.update(inputs=inputs, inputs_pretokenized=strings, targets=targets,
               targets_pretokenized=text)
    return out
  return fn(dataset)
