"""A ReFusion MODEL_DIR as the model of a ``jaxfid eval``: rank classification.

:class:`ReFusionCheckpointEvaluator` scores every label word by
log-likelihood with the run's fused neighbours and predicts the best one's
ids. Everything comes from the run's ``jaxfid_config.json``; neighbours are
retrieved once per task as in training. It knows no seqio: :meth:`prepare`
gets examples as dicts of NumPy values, :meth:`predict` / :meth:`score`
fixed-size batches (``encoder_input_tokens`` [B, L],
``decoder_target_tokens`` [B, T]) with the examples' indices.
"""
from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.checkpoints.model_dir import CONFIG_FILE, read_run_config
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import encode_padded, load_tokenizer
from jaxfid.reader.checkpoint_eval import checkpoint_step
from jaxfid.refusion import batches as batch_lib
from jaxfid.refusion import lmbff
from jaxfid.refusion import neighbours as nb_lib
from jaxfid.refusion.checkpoint import load_refusion


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class ReFusionCheckpointEvaluator:
  """Rank classification with a trained ReFusion run (its last checkpoint)."""
  kinds = ("classification",)

  def __init__(self, checkpoint: str, run_config: dict | None = None, *,
               neighbour_cache: str | None = None, progress: bool = False):
    checkpoint = os.fspath(checkpoint)
    config_file = os.path.join(checkpoint, CONFIG_FILE)
    run = run_config if run_config is not None else read_run_config(
        checkpoint)
    if run.get("method") != "refusion":
      raise InputError(config_file, f"not a ReFusion run (method "
                       f"{run.get('method')!r})")
    for field in ("max_length", "fusion", "model"):
      if field not in run:
        raise InputError(config_file, f"no {field!r}: not a ReFusion run "
                         "config")
    if run.get("retrieval_mode") == "layer":
      raise InputError(config_file, "a RETRIEVAL_MODE 'layer' run: its "
                       "modules search the database inside the model; "
                       "`jaxfid eval` does not rebuild that (the run's own "
                       "test line in metrics.jsonl is its score)")
    self.model, self.params = load_refusion(checkpoint, which="latest")
    self.step = checkpoint_step(checkpoint, "latest")
    self.tokenizer = load_tokenizer(checkpoint)
    self.max_length = int(run["max_length"])
    self.run, self.checkpoint = run, checkpoint
    self.concat = bool(run.get("concat_neighbours"))
    self.fused = self.model.fusion.enabled
    self.hidden = self.fused and run.get("retrieval_mode") == "hidden"
    self.top_k = self.model.fusion.top_k
    self.retrieval_db = run.get("retrieval_db")
    if (self.fused or self.concat) and not self.retrieval_db:
      raise InputError(config_file, "the run fuses or concatenates "
                       "neighbours but names no retrieval_db")
    self.neighbour_cache = neighbour_cache
    self.progress = progress
    self.searcher = (nb_lib.open_database(self.retrieval_db) if self.fused
                     else None)
    model = self.model
    self._label_scores = jax.jit(model.label_scores)
    self._pooled = jax.jit(model.pooled_hidden)
    self._score = jax.jit(model.score)
    self.spec: lmbff.TaskSpec | None = None
    self.label_tokens: np.ndarray | None = None
    self._rows: np.ndarray | None = None
    self._tokens: np.ndarray | None = None

  def label_token_matrix(self, spec: lmbff.TaskSpec) -> np.ndarray:
    """int32 [C, T]: the task's label words + EOS, as the trainer ranks them."""
    return batch_lib.label_token_matrix(spec.label_words, self.tokenizer)

  def sequence_length(self, task_spec: lmbff.TaskSpec) -> dict:
    """seqio's lengths: the run's ``max_length``, the label words' width."""
    return {"inputs": self.max_length,
            "targets": self.label_token_matrix(task_spec).shape[1]}

  def prepare(self, examples: Sequence[dict], task_spec: lmbff.TaskSpec
              ) -> None:
    """Label words and (once per task) the neighbours of ``examples``.

    ``examples`` carry ``text_a``, ``text_b`` and ``inputs_pretokenized``.
    """
    trained = self.run.get("template")
    if trained is not None and trained != task_spec.template:
      raise InputError(os.path.join(self.checkpoint, CONFIG_FILE),
                       f"the run was trained on the template {trained!r}, "
                       f"the task renders {task_spec.template!r}")
    self.spec = task_spec
    self.label_tokens = self.label_token_matrix(task_spec)
    self._rows = self._tokens = None
    if not (self.concat or (self.fused and not self.hidden)):
      return
    queries = [lmbff.segments(task_spec, lmbff.Example(
        text_a=_text(ex["text_a"]), text_b=_text(ex["text_b"]) or None,
        label=-1, guid="")) for ex in examples]
    found = nb_lib.retrieve_neighbours(
        self.retrieval_db, queries, self.top_k, cache_dir=self.neighbour_cache,
        progress=self.progress, with_vectors=False)
    self._rows = found.rows
    if self.concat:
      inputs = batch_lib.with_neighbour_texts(
          [_text(ex["inputs_pretokenized"]) for ex in examples],
          nb_lib.neighbour_texts(self.retrieval_db, found.rows))
      self._tokens = encode_padded(self.tokenizer, inputs, self.max_length)

  def _model_batch(self, indices: np.ndarray, batch: dict) -> dict:
    if self.label_tokens is None:
      raise RuntimeError("prepare() the task before predicting")
    tokens = (self._tokens[indices] if self._tokens is not None
              else np.asarray(batch["encoder_input_tokens"], np.int32))
    out = {"encoder_input_tokens": tokens}
    if self.fused and self.hidden:
      queries = np.asarray(jax.device_get(self._pooled(
          self.params, jnp.asarray(tokens))), np.float32)
      out["neighbours"] = nb_lib.online_neighbours(self.searcher, queries,
                                                   self.top_k)
    elif self.fused:
      out["neighbours"] = nb_lib.gather_vectors(self.searcher,
                                                self._rows[indices])
    return out

  def classify(self, indices: np.ndarray, batch: dict) -> np.ndarray:
    """int32 [B]: the best-scoring class of each example."""
    b = jax.tree.map(jnp.asarray, self._model_batch(indices, batch))
    scores = self._label_scores(self.params, b, jnp.asarray(self.label_tokens))
    return np.asarray(jax.device_get(jnp.argmax(scores, axis=-1)), np.int32)

  def predict(self, indices: np.ndarray, batch: dict) -> np.ndarray:
    """int32 [B, T]: the ids of each example's best label word (+ EOS)."""
    return self.label_tokens[self.classify(indices, batch)]

  def score(self, indices: np.ndarray, batch: dict) -> np.ndarray:
    """float32 [B]: the log-likelihood of each example's target."""
    b = self._model_batch(indices, batch)
    b["decoder_target_tokens"] = np.asarray(batch["decoder_target_tokens"],
                                            np.int32)
    return np.asarray(jax.device_get(self._score(
        self.params, jax.tree.map(jnp.asarray, b))), np.float32)
