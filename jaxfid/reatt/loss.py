"""ReAtt's distillation target and loss: decoder attention -> retrieval.

Einsum letters: B questions, P documents per question, L tokens per row,
H heads, T target length.

``P_tgt``: the last decoder layer's cross-attention at the first decoder
position, summed per row, averaged over heads, under a stop-gradient; the
loss is ``KL(P_tgt || softmax(relevance))`` per question (other questions'
documents get target 0).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxfid.t5.layers import NEG_INF

Array = jax.Array


def target_distribution(cross_logits: Array, encoder_mask: Array,
                        num_passages: int) -> Array:
  """P_tgt [B, P] from a decoder layer's cross-attention logits [B, H, T, P*L].

  The first decoder position's softmax over all P*L tokens (``encoder_mask``
  bool [B, P*L]), summed per row, averaged over heads.
  """
  first = cross_logits[:, :, 0, :]                                # [B, H, P*L]
  probs = jax.nn.softmax(first, axis=-1)
  probs = jnp.where(encoder_mask[:, None, :], probs, 0.0)
  b, h, _ = probs.shape
  per_row = probs.reshape(b, h, num_passages, -1).sum(-1)         # [B, H, P]
  return jnp.mean(per_row, axis=1)                                # [B, P]


def in_batch_targets(target: Array) -> Array:
  """[B, P] own-document targets -> [B, B*P]: other questions' documents get 0."""
  b, p = target.shape
  return (jnp.eye(b, dtype=target.dtype)[:, :, None]
          * target[:, None, :]).reshape(b, b * p)


def kl_to_target(target: Array, scores: Array, valid: Array) -> Array:
  """KL(target || softmax(scores over valid)) per row [B]; target rows sum to 1."""
  logp = jax.nn.log_softmax(jnp.where(valid, scores, NEG_INF), axis=-1)
  t_log_t = target * jnp.log(jnp.where(target > 0, target, 1.0))
  return jnp.sum(jnp.where(target > 0, t_log_t - target * logp, 0.0), axis=-1)
