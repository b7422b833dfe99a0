"""TensorFlow preprocessors shared by the FiD QA tasks.

Every task's data source yields the same features (see :mod:`tasks.sources`):
``question`` (string), ``passages`` (string ``[n]``: FiD encoder strings,
best passage first), ``answers`` (string ``[k]``), ``target`` (string, ``""``
when absent) and ``id`` (string). The task preprocessors then run in order:

1. :func:`select_passages` -- ``inputs`` = the first ``n_context`` passages
   (gin :func:`tasks.config.fid_n_context`, default 100, or fewer when
   ``sequence_length["inputs"]`` asks for fewer).
2. :func:`choose_target` -- ``targets`` = ``target`` when it is not empty,
   else one answer drawn with a stateless random op from a per-example seed
   that seqio derives from ``get_dataset(seed=...)``. seqio repeats the data
   before this step, so every epoch draws afresh (FiD: ``random.choice`` per
   step). For TriviaQA an all-uppercase drawn answer is title-cased
   (:func:`title_case_if_upper`), as FiD's preprocessing does; an explicit
   target is used verbatim.
3. ``seqio.preprocessors.tokenize`` (no EOS; keeps ``*_pretokenized``
   copies): ``inputs`` becomes a ragged int32 ``[P, None]``, ``targets`` an
   int32 ``[None]``.
4. :func:`append_eos_after_trim` -- truncates each token row to leave room
   for EOS and appends it, as ``jaxfid.fid.examples.encode_example`` does.

Because ``inputs`` is rank 2, its sequence length is a pair: pass
``sequence_length={"inputs": (n_context, text_maxlength), "targets":
answer_maxlength}`` to ``Task.get_dataset`` (seqio trims rank-2 features
with one limit per axis; a single int would cut the passage axis, so it is
refused here). ``None`` keeps the full lengths.
"""
from __future__ import annotations

from typing import Mapping

import seqio
import tensorflow as tf

from tasks import config

EOS_ID = 1
TRIVIA_QA = "trivia_qa"


def title_case_if_upper(text: tf.Tensor) -> tf.Tensor:
  """Python's ``t.title() if t.isupper() else t`` for a scalar UTF-8 string.

  A character is cased when its upper- and lower-case forms differ; the text
  is "upper" when it has a cased character and every cased character is its
  own upper case. Title case upper-cases a character that follows an uncased
  one (or starts the text) and lower-cases the others, which is
  ``str.title``'s rule (``"DON'T"`` -> ``"Don'T"``).
  """
  chars = tf.strings.unicode_split(text, "UTF-8")
  upper = tf.strings.upper(chars, encoding="utf-8")
  lower = tf.strings.lower(chars, encoding="utf-8")
  cased = tf.not_equal(upper, lower)
  is_upper = tf.logical_and(
      tf.reduce_any(cased),
      tf.reduce_all(tf.logical_or(tf.equal(chars, upper),
                                  tf.logical_not(cased))))
  after_cased = tf.concat([[False], cased], axis=0)[:-1]
  titled = tf.strings.reduce_join(tf.where(after_cased, lower, upper))
  return tf.where(is_upper, titled, text)


def select_passages(dataset: tf.data.Dataset,
                    sequence_length: Mapping | None = None,
                    n_context: int | None = None) -> tf.data.Dataset:
  """Adds ``inputs``: the first ``n_context`` strings of ``passages``.

  Args:
    dataset: examples with a ``passages`` string vector (best first).
    sequence_length: seqio's lengths; a pair ``sequence_length["inputs"]``
      caps the passages at its first entry.
    n_context: passages to keep; None reads the gin setting
      :func:`tasks.config.fid_n_context` when the dataset is built.
  """
  n = config.fid_n_context() if n_context is None else int(n_context)
  if n < 1:
    raise ValueError(f"n_context must be at least 1, got {n}")
  limit = _limit("inputs", (sequence_length or {}).get("inputs"), rank=2)[0]
  if limit is not None:
    n = min(n, int(limit))

  def fn(ex):
    return {**ex, "inputs": ex["passages"][:n]}
  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


@seqio.map_over_dataset(num_seeds=1)
def choose_target(ex: Mapping[str, tf.Tensor], seed: tf.Tensor,
                  dataset_name: str = "nq") -> dict[str, tf.Tensor]:
  """Adds ``targets``: ``target`` if not empty, else a seeded random answer.

  An example with neither gets ``""`` (prediction-only data; training files
  are checked for answers when read).

  Args:
    ex: one example (``answers``, ``target``).
    seed: the per-example stateless seed seqio passes.
    dataset_name: ``"trivia_qa"`` title-cases all-uppercase drawn answers.
  """
  answers = ex["answers"]
  n = tf.size(answers)
  index = tf.random.stateless_uniform([], seed=seed, minval=0,
                                      maxval=tf.maximum(n, 1), dtype=tf.int32)
  drawn = tf.cond(n > 0, lambda: tf.gather(answers, index),
                  lambda: tf.constant("", tf.string))
  if dataset_name == TRIVIA_QA:
    drawn = title_case_if_upper(drawn)
  given = ex["target"]
  target = tf.where(tf.strings.length(given) > 0, given, drawn)
  return {**ex, "targets": target}


def _limit(feature: str, length, rank: int):
  """The (passages, tokens) limits of a rank-2 feature, or tokens of rank 1."""
  if rank == 1:
    if length is not None and not isinstance(length, int):
      raise ValueError(f"sequence_length[{feature!r}] must be an int, got "
                       f"{length!r}")
    return length
  if length is None:
    return (None, None)
  if isinstance(length, int) or len(length) != 2:
    raise ValueError(
        f"sequence_length[{feature!r}] must be a pair (n_context, "
        f"text_maxlength) for the rank-2 FiD inputs, got {length!r}")
  return tuple(length)


def _append_eos(value, max_tokens: int | None):
  """``value[..., :max_tokens - 1] + [EOS]`` along the last axis."""
  if max_tokens is not None:
    if max_tokens < 1:
      raise ValueError(f"a sequence length must be at least 1, got "
                       f"{max_tokens}")
    value = value[..., :max_tokens - 1]
  if value.shape.rank == 1:
    return tf.concat([value, tf.constant([EOS_ID], value.dtype)], axis=0)
  rows = value.nrows() if isinstance(value, tf.RaggedTensor) else tf.shape(
      value)[0]
  eos = tf.fill(tf.stack([rows, 1]), tf.constant(EOS_ID, value.dtype))
  return tf.concat([value, eos], axis=1)


def append_eos_after_trim(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, seqio.Feature],
    sequence_length: Mapping | None = None) -> tf.data.Dataset:
  """Truncates each token row of the EOS features to fit EOS, then adds it.

  Rank-1 features take an int length, rank-2 ones a pair ``(n_context,
  text_maxlength)`` (passages beyond ``n_context`` are dropped); a missing
  or None length adds EOS without truncating.
  """
  limits = {}
  for name, feature in output_features.items():
    if feature.add_eos:
      length = (sequence_length or {}).get(name)
      limits[name] = _limit(name, length, feature.rank)

  def fn(ex):
    ex = dict(ex)
    for name, limit in limits.items():
      if name not in ex:
        continue
      if isinstance(limit, tuple):
        n_rows, n_tokens = limit
        value = ex[name] if n_rows is None else ex[name][:n_rows]
        ex[name] = _append_eos(value, n_tokens)
      else:
        ex[name] = _append_eos(ex[name], limit)
    return ex
  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)
