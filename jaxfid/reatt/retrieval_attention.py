"""ReAtt's retrieval attention: the bi-encoder and avg-max relevance.

Einsum letters: B questions, N document rows, Q question-token positions,
S document-token positions, L tokens per row, H heads, E head width,
D d_model.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from jaxfid.t5 import attention_ops, stack
from jaxfid.t5.layers import NEG_INF
from jaxfid.t5.network import Encoder

Array = jax.Array


# ------------------------------------------------------------ the bi-encoder


def question_lengths_from_tokens(tokens: Array, separator_ids: Sequence[int]
                                 ) -> Array:
  """int32 [...]: index of the first ``separator_ids`` run in each row.

  Rows without it are all question (the row's real token count).
  """
  sep = jnp.asarray(separator_ids, jnp.int32)
  m = sep.shape[0]
  length = tokens.shape[-1]
  real = jnp.sum(tokens != 0, axis=-1).astype(jnp.int32)
  if m == 0 or length < m:
    return real
  hits = jnp.ones(tokens.shape[:-1] + (length - m + 1,), bool)
  for j in range(m):
    hits = hits & (tokens[..., j:length - m + 1 + j] == sep[j])
  first = jnp.argmax(hits, axis=-1)
  return jnp.where(jnp.any(hits, axis=-1), first, real).astype(jnp.int32)


def block_mask(valid: Array, question_length: Array) -> Array:
  """bool [N, 1, L, L]: question and document blocks attend within themselves."""
  pos = jnp.arange(valid.shape[-1])
  seg = pos[None, :] >= question_length[:, None]                  # [N, L]
  same = seg[:, :, None] == seg[:, None, :]                       # [N, L, L]
  return (same & valid[:, None, :])[:, None]                      # [N, 1, L, L]


def block_segments(valid: Array, question_length: Array
                   ) -> attention_ops.Segments:
  """``block_mask`` as segment ids (0 question, 1 document), which the
  fused attention takes without writing the [N, L, L] mask."""
  pos = jnp.arange(valid.shape[-1])
  seg = (pos[None, :] >= question_length[:, None]).astype(jnp.int32)  # [N, L]
  return attention_ops.Segments(seg, seg, valid)


def bi_encode(encoder: Encoder, x: Array, valid: Array, question_length: Array,
              num_layers: int, *, dropout_rng: Array | None = None) -> Array:
  """Layers ``[0, num_layers)`` on embedded rows ``x`` [N, L, D] with the block mask.

  Where the layers' attention is the fused kernel the mask goes as
  ``block_segments``, elsewhere as ``block_mask``. Per-layer dropout keys are ``fold(dropout_rng, i)``, as ``Encoder.__call__``
  draws them, so the split encoder equals the plain one when nothing is split.
  """
  length = x.shape[1]
  bias = encoder.relpos_bias(length, length)                      # [1, H, L, L]
  kernel = attention_ops.resolve(
      encoder.layer(0).attention.implementation) == "pallas"
  mask = (block_segments(valid, question_length) if kernel
          else block_mask(valid, question_length))                # [N, 1, L, L]

  def run(layer, h, rng):
    out, _ = layer(h, mask=mask, bias=bias, dropout_rng=rng)
    return out, None

  cfg = encoder.config
  x, _ = stack.run_layers([encoder.layer(i) for i in range(num_layers)], x,
                          run, rng=dropout_rng, remat=cfg.remat,
                          scan=cfg.scan_layers)
  return x


def retrieval_queries(encoder: Encoder, hidden: Array, layer: int) -> Array:
  """Layer ``layer``'s query vectors [N, L, H, E] of bi-encoder states."""
  lyr = encoder.layer(layer)
  return lyr.attention.project_q(lyr.pre_attention_layer_norm(hidden))


def retrieval_keys(encoder: Encoder, hidden: Array, layer: int) -> Array:
  """Layer ``layer``'s key vectors [N, L, H, E] of bi-encoder states."""
  lyr = encoder.layer(layer)
  keys, _ = lyr.attention.project_kv(lyr.pre_attention_layer_norm(hidden))
  return keys


# ---------------------------------------------------------------- relevance


def _max_over_doc_tokens(q: Array, k: Array, k_mask: Array,
                         bias: Array | None = None) -> Array:
  """float32 [B, H, Q, N]: max over each document's real tokens of q . k
  (+ ``bias`` [H, Q, S] by position)."""
  s = jnp.einsum("bqhe,nshe->bhqns", q, k,
                 preferred_element_type=jnp.float32)              # [B, H, Q, N, S]
  if bias is not None:
    s = s + bias[None, :, :, None, :]                             # [B, H, Q, N, S]
  s = jnp.where(k_mask[None, None, None], s, NEG_INF)
  best = jnp.max(s, axis=-1)                                      # [B, H, Q, N]
  return jnp.where(jnp.any(k_mask, -1)[None, None, None], best, 0.0)


def avg_max_relevance(q: Array, q_mask: Array, k: Array, k_mask: Array, *,
                      chunk: int = 0, bias: Array | None = None) -> Array:
  """Per-head avg-max relevance float32 [B, H, N] of B queries and N documents.

  ``q`` [B, Q, H, E] with ``q_mask`` [B, Q]; ``k`` [N, S, H, E] with
  ``k_mask`` [N, S]. ``r_h = mean_i max_j q_i . k_j`` over real tokens; a
  document without tokens scores 0. ``chunk`` > 0 scores that many documents
  at a time (recomputed in the backward pass); ``bias`` [H, Q, S] is added
  before the max.
  """
  n = k.shape[0]
  if chunk and chunk < n:
    pad = (-n) % chunk
    kp = jnp.pad(k, ((0, pad),) + ((0, 0),) * 3)
    mp = jnp.pad(k_mask, ((0, pad), (0, 0)))
    kc = kp.reshape(-1, chunk, *k.shape[1:])                      # [C, chunk, S, H, E]
    mc = mp.reshape(-1, chunk, k.shape[1])                        # [C, chunk, S]
    fn = jax.checkpoint(lambda args: _max_over_doc_tokens(q, *args, bias))
    best = jax.lax.map(fn, (kc, mc))                              # [C, B, H, Q, chunk]
    best = jnp.moveaxis(best, 0, 3).reshape(*best.shape[1:4], -1)[..., :n]
  else:
    best = _max_over_doc_tokens(q, k, k_mask, bias)               # [B, H, Q, N]
  qm = q_mask[:, None, :, None]
  total = jnp.sum(jnp.where(qm, best, 0.0), axis=2)               # [B, H, N]
  count = jnp.maximum(jnp.sum(q_mask, axis=1), 1)[:, None, None]
  return total / count


def head_probabilities(head_weights: Array, temperature: float) -> Array:
  """The head selector ``softmax(w / tau)`` [H]."""
  return jax.nn.softmax(head_weights.astype(jnp.float32) / temperature)
