"""A FiD (or ReAtt) checkpoint as the model of a ``jaxfid eval``.

:class:`FidCheckpointEvaluator` knows no seqio: it takes fixed-size batches of
the FiD feature converter's NumPy features (``encoder_input_tokens`` [B, P,
L], ``passage_mask`` [B, P], ``decoder_target_tokens`` [B, T]) and returns
generated ids int32 [B, decode_maxlength] (``jaxfid predict``'s decoding, 0
after EOS) or each target's log-likelihood (teacher forcing, padding
excluded). Its decoding is one :class:`~jaxfid.reader.config.DecodeConfig`:
the checkpoint's ``jaxfid_config.json``, under gin's values that are not None
(``gin/fid/base.gin``). Whether passages end with EOS is the checkpoint's
(:func:`~jaxfid.checkpoints.load.checkpoint_passage_eos`).
"""
from __future__ import annotations

import os
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.checkpoints import t5x
from jaxfid.checkpoints.detect import detect_format
from jaxfid.checkpoints.load import checkpoint_passage_eos, load_checkpoint
from jaxfid.checkpoints.model_dir import CONFIG_FILE
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.reader import config as config_lib
from jaxfid.reader.predict import make_predict_fn

_T5X_STEP = re.compile(r"^checkpoint_(\d+)$")
# restore_params' choices: which -> the MODEL_DIR subdirectories tried, in order
_MODEL_DIR_ORDER = {"best": ("best",), "latest": ("checkpoints",),
                    "auto": ("best", "checkpoints")}


def _saved_steps(directory: str) -> list[int]:
  """The finished orbax steps in ``directory`` (temporary dirs excluded)."""
  try:
    names = os.listdir(directory)
  except (FileNotFoundError, NotADirectoryError):
    return []
  return sorted(int(n) for n in names
                if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


def checkpoint_step(path: str, which: str = "auto") -> int:
  """The training step of the parameters ``load_checkpoint(path)`` loads: a
  MODEL_DIR's checkpoint that ``which`` selects (as
  ``checkpoints.model_dir.restore_params``), a T5X ``checkpoint_<step>``'s
  step, else 0."""
  path = os.fspath(path)
  if os.path.isfile(os.path.join(path, CONFIG_FILE)):
    for sub in _MODEL_DIR_ORDER[which]:
      steps = _saved_steps(os.path.join(path, sub))
      if steps:
        return steps[-1]
    return 0
  if detect_format(path) in ("t5x", "t5x-orbax"):
    located, _ = t5x.locate(path)
    for part in reversed(located.parts):
      match = _T5X_STEP.match(part)
      if match:
        return int(match.group(1))
  return 0


class FidCheckpointEvaluator:
  """Generation and target scores of a FiD (or ReAtt) checkpoint.

  Args:
    checkpoint: anything ``load_checkpoint`` reads (a MODEL_DIR: its best
      checkpoint, else the latest, as ``jaxfid predict``).
    run_config: the checkpoint's ``jaxfid_config.json`` ({} for other
      formats): the decoding settings' :meth:`~jaxfid.reader.config.
      DecodeConfig.from_run_config`.
    decode: gin's decoding settings; those that are not None win over the
      run's (:meth:`~jaxfid.reader.config.DecodeConfig.override`).
    dtype: activation dtype override.

  Attributes:
    decode: the DecodeConfig this evaluator decodes and scores with.
  """
  kinds = ("qa",)

  def __init__(self, checkpoint: str, run_config: dict | None = None, *,
               decode: config_lib.DecodeConfig | None = None,
               dtype: str | None = None):
    self.decode = config_lib.DecodeConfig.from_run_config(
        run_config).override(decode)
    self.n_context = self.decode.n_context
    self.text_maxlength = self.decode.text_maxlength
    self.decode_maxlength = self.decode.decode_length
    self.target_maxlength = self.decode.target_length
    self.passage_eos = checkpoint_passage_eos(checkpoint)
    self.model, self.params, spiece = load_checkpoint(checkpoint, dtype=dtype)
    self.tokenizer = load_tokenizer(os.path.dirname(spiece) if spiece
                                    else None)
    self.step = checkpoint_step(checkpoint)
    self._predict = make_predict_fn(self.model,
                                    max_decode_len=self.decode_maxlength,
                                    num_beams=self.decode.num_beams,
                                    alpha=self.decode.alpha)
    self._score = jax.jit(self.model.score)

  def sequence_length(self, task_spec=None) -> dict:
    """seqio's task feature lengths for this evaluation."""
    del task_spec
    return {"inputs": (self.n_context, self.text_maxlength),
            "targets": self.target_maxlength}

  def prepare(self, examples: Sequence[dict], task_spec=None) -> None:
    """Nothing to do before a task: FiD reads its passages from ``inputs``."""
    del examples, task_spec

  @staticmethod
  def _inputs(batch: dict, with_targets: bool = False) -> dict:
    keys = ["encoder_input_tokens", "passage_mask"]
    if with_targets:
      keys.append("decoder_target_tokens")
    return {k: jnp.asarray(batch[k]) for k in keys}

  def predict(self, indices: np.ndarray, batch: dict) -> np.ndarray:
    """Generated ids int32 [B, decode_maxlength]."""
    del indices
    return np.asarray(jax.device_get(
        self._predict(self.params, self._inputs(batch))), np.int32)

  def score(self, indices: np.ndarray, batch: dict) -> np.ndarray:
    """Target log-likelihoods float32 [B]."""
    del indices
    return np.asarray(jax.device_get(
        self._score(self.params, self._inputs(batch, with_targets=True))),
        np.float32)
