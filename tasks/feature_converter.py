"""FiD task features -> the model batch features jaxfid trains and predicts on.

:func:`fid_feature_converter` maps ``inputs`` int32 ``[p, L]`` (or ragged)
and ``targets`` int32 ``[None]`` to the arrays ``jaxfid.reader.batches.
FidBatcher`` builds:

* ``encoder_input_tokens``: int32 ``[n_context, text_maxlength]``;
* ``passage_mask``: bool ``[n_context]``, True for real passages;
* ``decoder_target_tokens``: int32 ``[answer_maxlength]``.

A too-long row keeps its first ``length - 1`` tokens and EOS (passage rows
are just cut when ``passage_eos`` is False); missing passages are zero rows;
padding is 0. :class:`FidFeatureConverter` wraps it for seqio, with
``task_feature_lengths`` ``{"inputs": (n_context, text_maxlength) or
text_maxlength, "targets": answer_maxlength}``; no packing, and seqio's
length assertions are off since it pads and truncates itself.
"""
from __future__ import annotations

from typing import Mapping

import seqio
import tensorflow as tf

EOS_ID = 1
_Spec = seqio.FeatureConverter.FeatureSpec


def _fit_rows(rows, n_rows: int, length: int, eos: bool = True):
  """Ragged int rows -> ``([n_rows, length] int32, [n_rows] bool)``; with
  ``eos`` a cut row ends with EOS."""
  if not isinstance(rows, tf.RaggedTensor):
    rows = tf.RaggedTensor.from_tensor(rows, padding=0)
  rows = tf.cast(rows[:n_rows], tf.int32)
  lengths = rows.row_lengths()
  real = tf.shape(lengths)[0]
  dense = rows.to_tensor(default_value=0, shape=[n_rows, length])
  if eos:
    too_long = tf.pad(lengths > length, [[0, n_rows - real]])
    last = tf.where(too_long, EOS_ID, dense[:, length - 1])
    dense = tf.concat([dense[:, :length - 1], last[:, None]], axis=1)
  dense = tf.ensure_shape(dense, [n_rows, length])
  mask = tf.ensure_shape(tf.range(n_rows) < real, [n_rows])
  return dense, mask


def _fit_tokens(tokens, length: int):
  """Int tokens -> int32 ``[length]``, EOS kept when cut."""
  tokens = tf.cast(tokens, tf.int32)
  n = tf.shape(tokens)[0]
  kept = tokens[:length]
  padded = tf.pad(kept, [[0, length - tf.shape(kept)[0]]])
  last = tf.where(n > length, EOS_ID, padded[length - 1])
  out = tf.concat([padded[:length - 1], last[None]], axis=0)
  return tf.ensure_shape(out, [length])


def convert_example(ex: Mapping[str, tf.Tensor], n_context: int,
                    text_maxlength: int, answer_maxlength: int,
                    passage_eos: bool = True) -> dict[str, tf.Tensor]:
  """The model features of one task example (see the module docstring)."""
  tokens, mask = _fit_rows(ex["inputs"], n_context, text_maxlength,
                           passage_eos)
  return {"encoder_input_tokens": tokens, "passage_mask": mask,
          "decoder_target_tokens": _fit_tokens(ex["targets"],
                                               answer_maxlength)}


def fid_feature_converter(ds: tf.data.Dataset, n_context: int,
                          text_maxlength: int, answer_maxlength: int,
                          passage_eos: bool = True) -> tf.data.Dataset:
  """Maps FiD task examples to fixed-shape model features (unbatched).

  ``passage_eos``: a passage row cut to ``text_maxlength`` ends with EOS.
  """
  for name, value in (("n_context", n_context),
                      ("text_maxlength", text_maxlength),
                      ("answer_maxlength", answer_maxlength)):
    if int(value) < 1:
      raise ValueError(f"{name} must be at least 1, got {value}")
  return ds.map(
      lambda ex: convert_example(ex, int(n_context), int(text_maxlength),
                                 int(answer_maxlength), bool(passage_eos)),
      num_parallel_calls=tf.data.AUTOTUNE)


class FidFeatureConverter(seqio.FeatureConverter):
  """``seqio.FeatureConverter`` around :func:`fid_feature_converter`.

  Args:
    n_context: passages per example when ``task_feature_lengths["inputs"]``
      is an int (the text length); a pair overrides it.
    passage_eos: a passage row cut to its length ends with EOS (False for
      checkpoints trained without a passage EOS).
  """

  TASK_FEATURES = {"inputs": _Spec(dtype=tf.int32, rank=2, sequence_dim=1),
                   "targets": _Spec(dtype=tf.int32)}
  MODEL_FEATURES = {"encoder_input_tokens": _Spec(dtype=tf.int32, rank=2),
                    "passage_mask": _Spec(dtype=tf.bool),
                    "decoder_target_tokens": _Spec(dtype=tf.int32)}
  PACKING_FEATURE_DTYPES = {}

  def __init__(self, n_context: int | None = None, pack: bool = False,
               passage_eos: bool = True, **kwargs):
    if pack:
      raise ValueError("FidFeatureConverter does not pack examples")
    kwargs.setdefault("apply_length_check", False)
    super().__init__(pack=False, **kwargs)
    self._n_context = n_context
    self._passage_eos = bool(passage_eos)

  def _lengths(self, task_feature_lengths: Mapping) -> tuple[int, int, int]:
    inputs = task_feature_lengths["inputs"]
    if isinstance(inputs, int):
      if self._n_context is None:
        raise ValueError("task_feature_lengths['inputs'] is an int: give the "
                         "converter n_context, or pass (n_context, "
                         "text_maxlength)")
      n_context, text_maxlength = self._n_context, inputs
    else:
      n_context, text_maxlength = inputs
    return int(n_context), int(text_maxlength), int(
        task_feature_lengths["targets"])

  def _convert_features(self, ds: tf.data.Dataset,
                        task_feature_lengths: Mapping) -> tf.data.Dataset:
    return fid_feature_converter(ds, *self._lengths(task_feature_lengths),
                                 passage_eos=self._passage_eos)

  def get_model_feature_lengths(self, task_feature_lengths: Mapping
                                ) -> dict[str, int]:
    n_context, text_maxlength, answer_maxlength = self._lengths(
        task_feature_lengths)
    return {"encoder_input_tokens": text_maxlength,
            "passage_mask": n_context,
            "decoder_target_tokens": answer_maxlength}
