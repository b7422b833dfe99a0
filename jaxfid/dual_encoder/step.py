"""The dual encoder's train step: in-batch negatives, exact accumulation.

Each question is scored against all B*(1+H) passages of the global batch
(``softmax(q . p / temperature)``, cross-entropy of its positive). With
``accumulation_steps > 1`` the negatives still span the whole batch
(GradCache, :mod:`jaxfid.training.microbatches`). Any loss of the batch's
embeddings (``loss_fn(q, p, batch)``, e.g. distillation) runs through it.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxfid.dual_encoder.model import DualEncoder
from jaxfid.training import microbatches
from jaxfid.training.microbatches import split_batch
from jaxfid.training.step import apply_gradients

Array = jax.Array
# (q [B, D], p [P, D], batch) -> (loss, metrics): a loss of the embeddings.
EmbeddingLoss = Callable[[Array, Array, dict], tuple[Array, dict]]


def in_batch_loss(q: Array, p: Array, passage_mask: Array,
                  temperature: float = 1.0) -> tuple[Array, dict]:
  """In-batch-negative cross-entropy of embeddings; returns (loss, metrics).

  ``q`` float32 [B, D]; ``p`` float32 [B*(1+H), D], question b's positive at
  row ``b*(1+H)``; ``passage_mask`` False rows are no candidates.
  """
  scores = jnp.einsum("qd,pd->qp", q, p) / temperature   # [B, B*(1+H)]
  scores = jnp.where(passage_mask[None, :], scores, -1e9)
  per = p.shape[0] // q.shape[0]
  targets = jnp.arange(q.shape[0]) * per                  # [B]
  logp = jax.nn.log_softmax(scores, axis=-1)
  loss = -jnp.mean(jnp.take_along_axis(logp, targets[:, None], axis=1))
  positive = jnp.take_along_axis(scores, targets[:, None], axis=1)  # [B, 1]
  rank = 1 + jnp.sum(scores > positive, axis=1)           # [B]
  return loss, {"accuracy": jnp.mean((rank == 1).astype(jnp.float32)),
                "mean_rank": jnp.mean(rank.astype(jnp.float32))}


def _tower_keys(dropout_rng: Array | None):
  if dropout_rng is None:
    return None, None
  rq, rp = jax.random.split(dropout_rng)
  return rq, rp


def in_batch(temperature: float = 1.0) -> EmbeddingLoss:
  """:func:`in_batch_loss` as an :data:`EmbeddingLoss`."""
  return lambda q, p, batch: in_batch_loss(q, p, batch["passage_mask"],
                                           temperature)


def contrastive_loss(encoder: DualEncoder, params: dict, batch: dict,
                     dropout_rng: Array | None = None,
                     temperature: float = 1.0,
                     loss_fn: EmbeddingLoss | None = None
                     ) -> tuple[Array, dict]:
  """``loss_fn`` (default :func:`in_batch_loss`) of the batch's embeddings
  (one pass, A = 1)."""
  loss_fn = loss_fn or in_batch(temperature)
  rq, rp = _tower_keys(dropout_rng)
  q = encoder.embed(params, batch["query_tokens"], tower="query",
                    dropout_rng=rq)                          # [B, D]
  p = encoder.embed(params, batch["passage_tokens"], tower="passage",
                    dropout_rng=rp)                          # [B*(1+H), D]
  return loss_fn(q, p, batch)


def grad_cache(encoder: DualEncoder, params: dict, batch: dict,
               dropout_rng: Array | None, temperature: float,
               accumulation_steps: int, loss_fn: EmbeddingLoss | None = None
               ) -> tuple[Array, dict, dict]:
  """(loss, metrics, grads) over the whole batch in microbatches
  (:func:`jaxfid.training.microbatches.grad_cache` of the embeddings)."""
  loss_fn = loss_fn or in_batch(temperature)
  n = accumulation_steps
  rq, rp = _tower_keys(dropout_rng)
  key = lambda k, i: None if k is None else jax.random.fold_in(k, i)
  micro = split_batch({"q": batch["query_tokens"],             # [A, B/A, Lq]
                       "p": batch["passage_tokens"]}, n)       # [A, P/A, Lp]

  def encode(w, i, mb):
    q = encoder.embed(w, mb["q"], tower="query", dropout_rng=key(rq, i))
    p = encoder.embed(w, mb["p"], tower="passage", dropout_rng=key(rp, i))
    return jnp.zeros((), jnp.float32), (q, p), None

  def couple(_, reps, aux):
    del aux
    q, p = reps                                                # [B, D], [P, D]
    return loss_fn(q, p, batch)

  _, loss, metrics, _, grads = microbatches.grad_cache(
      encode, couple, params, micro, n)
  return loss, metrics, grads


def make_contrastive_step(encoder: DualEncoder,
                          optimizer: optax.GradientTransformation, *,
                          seed: int, temperature: float = 1.0,
                          accumulation_steps: int = 1,
                          loss_fn: EmbeddingLoss | None = None):
  """``step(state, batch) -> (state, metrics)``, pure: ``loss_fn`` (default
  in-batch negatives at ``temperature``); a non-finite update is dropped."""
  base_key = jax.random.key(seed)

  def step(state, batch):
    params = state["params"]
    rng = jax.random.fold_in(base_key, state["step"])
    if accumulation_steps == 1:
      (loss, metrics), grads = jax.value_and_grad(
          lambda w: contrastive_loss(encoder, w, batch, rng, temperature,
                                     loss_fn),
          has_aux=True)(params)
    else:
      loss, metrics, grads = grad_cache(encoder, params, batch, rng,
                                        temperature, accumulation_steps,
                                        loss_fn)
    return apply_gradients(optimizer, state, loss, grads, metrics)

  return step
