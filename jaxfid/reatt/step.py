"""ReAtt's train step with in-batch negatives under gradient accumulation.

Einsum letters / shapes: A microbatches, B questions of the global batch,
b = B/A questions per microbatch, P rows (documents) per question, L tokens
per row, Q question-token positions, H heads, E head width.

Two-pass GradCache keeps the negatives spanning the global batch: pass 1
(no gradients) keeps each microbatch's queries [b, Q, H, E], keys
[b*P, L, H, E] and P_tgt [b, P]; the whole batch's KL gives their
cotangents; pass 2 reruns each microbatch (same dropout keys) under
``jax.vjp``. Loss and gradient equal the A = 1 step's up to rounding.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxfid.reatt.model import PARAMS_KEY, ReAttModel
from jaxfid.t5.model import cross_entropy
from jaxfid.training import microbatches
from jaxfid.training.microbatches import (merge_microbatches, split_batch,
                                          split_microbatches)
from jaxfid.training.step import apply_gradients, target_tokens

Array = jax.Array


def _split_rows(x: Array, n: int, per: int) -> Array:
  """[B*P, ...] rows grouped by question -> [n, B/n*P, ...] (the question
  split of :func:`split_microbatches`)."""
  q = x.reshape(x.shape[0] // per, per, *x.shape[1:])         # [B, P, ...]
  q = split_microbatches(q, n)                                # [A, b, P, ...]
  return q.reshape(n, -1, *x.shape[1:])                       # [A, b*P, ...]


def _merge_rows(x: Array, per: int) -> Array:
  """The inverse of :func:`_split_rows`: [A, b*P, ...] -> [B*P, ...]."""
  a = x.shape[0]
  q = x.reshape(a, x.shape[1] // per, per, *x.shape[2:])      # [A, b, P, ...]
  q = merge_microbatches(q)                                   # [B, P, ...]
  return q.reshape(-1, *x.shape[2:])                          # [B*P, ...]


def grad_cache(model: ReAttModel, params: dict, batch: dict,
               dropout_rng: Array | None, normalizer: Array,
               accumulation_steps: int) -> tuple[Array, dict, dict]:
  """(loss, metrics, grads) of the whole batch in microbatches (GradCache).

  Microbatch ``i`` uses ``fold_in(dropout_rng, i)`` in both passes;
  ``accumulation_steps`` (A) divides B.
  """
  n = accumulation_steps
  per = batch["encoder_input_tokens"].shape[1]

  def key(i):
    return None if dropout_rng is None else jax.random.fold_in(dropout_rng, i)

  def encode(w, i, mb):
    enc, logits, target = model.forward(w, mb, key(i))
    qa, count, acc = cross_entropy(logits, mb["decoder_target_tokens"],
                                   normalizer)
    return qa, (enc.queries, enc.keys), (enc.query_mask, enc.key_mask,
                                         target, count, acc)

  # The KL term of the whole batch: every question against every document.
  def couple(w, reps, aux):
    q, k = reps                                 # [B, Q, H, E], [B*P, L, H, E]
    qm, km, target, _, _ = aux
    return model.retrieval_loss(
        {PARAMS_KEY: w[PARAMS_KEY]}, q, merge_microbatches(qm), k,
        _merge_rows(km, per), merge_microbatches(target),
        batch.get("kl_weight"))

  qa, kl_term, kl_metrics, aux, grads = microbatches.grad_cache(
      encode, couple, params, split_batch(batch, n), n,
      merge=lambda r: (merge_microbatches(r[0]), _merge_rows(r[1], per)),
      split=lambda d: (split_microbatches(d[0], n),     # [A, b, Q, H, E]
                       _split_rows(d[1], n, per)))      # [A, b*P, L, H, E]
  count, acc = aux[3], aux[4]                           # [A], [A]
  qa_loss, total = jnp.sum(qa), jnp.sum(count)
  loss = qa_loss + kl_term
  metrics = {"loss": loss, "qa_loss": qa_loss, "num_target_tokens": total,
             "token_accuracy": jnp.sum(acc * count) / jnp.maximum(total, 1.0),
             **kl_metrics}
  return loss, metrics, grads


def make_grad_cache_step(model: ReAttModel,
                         optimizer: optax.GradientTransformation, *,
                         seed: int, accumulation_steps: int):
  """``step(state, batch) -> (state, metrics)`` (pure; the loop jits it).

  :func:`grad_cache` over ``accumulation_steps`` microbatches, with
  :func:`jaxfid.training.step.make_train_step`'s dropout keys and non-finite
  guard.
  """
  if not model.reatt.in_batch_negatives:
    raise ValueError("GradCache is for in-batch negatives; without them "
                     "plain accumulation is exact")
  base_key = jax.random.key(seed)

  def step(state, batch):
    rng = jax.random.fold_in(base_key, state["step"])
    loss, metrics, grads = grad_cache(model, state["params"], batch, rng,
                                      target_tokens(batch),
                                      accumulation_steps)
    return apply_gradients(optimizer, state, loss, grads, metrics)

  return step
