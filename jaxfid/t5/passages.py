"""Fusion-in-Decoder on the T5 network (Izacard & Grave, 2020).

Einsum letters: B questions, P passages per question, L tokens per passage,
D d_model, H heads, T target length.

Each passage (``question: .. title: .. context: ..``) is encoded alone: tokens
``[B, P, L]`` are flattened to ``[B*P, L]`` for the encoder, and its output is
concatenated to ``[B, P*L, D]`` so the decoder's cross-attention runs one
softmax over every token of every passage. Padding passages are masked in the
cross-attention, so they change nothing. FiD needs no parameters beyond T5's:
these are functions over a :class:`~jaxfid.t5.network.T5`. The concatenated
encoder output keeps the residual stream's sharding (batch over the
data-parallel mesh axes; no-op without a mesh).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxfid.core import sharding as ax
from jaxfid.t5.layers import ACT_RESIDUAL
from jaxfid.t5.network import T5, StackOutput

Array = jax.Array


def as_passages(tokens: Array) -> Array:
  """Accept [B, L] (plain T5, one passage) or [B, P, L]; return [B, P, L]."""
  return tokens[:, None, :] if tokens.ndim == 2 else tokens


def encode_passages(net: T5, tokens: Array, *, passage_mask: Array | None = None,
                    dropout_rng: Array | None = None, extras: Any = None,
                    **stack_kwargs) -> StackOutput:
  """Encode [B, P, L] passages independently -> hidden [B, P*L, D], mask [B, P*L].

  Args:
    passage_mask: optional bool [B, P]; False masks a whole passage (padding
      passages are also all-zero tokens, which masks them anyway).
  """
  tokens = as_passages(tokens)
  b, p, l = tokens.shape
  mask = tokens != 0                              # [B, P, L]
  if passage_mask is not None:
    mask = mask & passage_mask[:, :, None]
  out = net.encode(tokens.reshape(b * p, l), mask=mask.reshape(b * p, l),  # [B*P, L]
                   dropout_rng=dropout_rng, extras=extras, **stack_kwargs)
  hidden = out.hidden.reshape(b, p * l, -1)       # [B, P*L, D]
  hidden = ax.with_logical_constraint(hidden, ACT_RESIDUAL)
  return out.replace(hidden=hidden, mask=mask.reshape(b, p * l))  # mask [B, P*L]


def first_position_scores(net: T5, hidden: Array, mask: Array,
                          num_passages: int, mode: str = "probs") -> Array:
  """Cross-attention passage relevance, float32 [B, P] (FiD-KD / Atlas / ReAtt).

  Computed at the first decoder position (input = the start token) over an
  encoding (``hidden`` [B, P*L, D], ``mask`` bool [B, P*L]): for each decoder
  layer with cross-attention and each head, the attention over all P*L
  encoder tokens; padding tokens excluded; summed over each passage's tokens;
  averaged over heads and layers (:func:`scores_from_attention`).
  """
  start = jnp.zeros((hidden.shape[0], 1), jnp.int32)                # [B, 1]
  _, dec = net.decode(hidden, mask, start, output_attention_logits=True)
  return scores_from_attention(dec.cross_attention_logits, mask,
                               num_passages, mode)


def scores_from_attention(cross_attention_logits, encoder_mask: Array,
                          num_passages: int, mode: str = "probs") -> Array:
  """Passage scores float32 [B, P] from every decoder layer's cross-attention.

  Args:
    cross_attention_logits: per layer float32 [B, H, T, P*L] (pre-softmax);
      the first decoder position is used.
    encoder_mask: bool [B, P*L], False at padding tokens and passages.
    mode: 'probs' — post-softmax attention (each layer/head distributes 1 over
      the passages, so scores sum to 1); 'logits' — the original FiD code's
      pre-softmax logits, averaged over the passage's real tokens.
  """
  logits = jnp.stack([c[:, :, 0, :] for c in cross_attention_logits], 1)    # [B, layers, H, P*L]
  b = logits.shape[0]
  p = num_passages
  l = logits.shape[-1] // p
  mask = encoder_mask.reshape(b, 1, 1, p, l)                                  # [B, 1, 1, P, L]
  if mode == "probs":
    weights = jax.nn.softmax(logits, axis=-1).reshape(*logits.shape[:3], p, l)  # [B, layers, H, P, L]
    per_passage = jnp.sum(jnp.where(mask, weights, 0.0), axis=-1)               # [B, layers, H, P]
  elif mode == "logits":
    lg = logits.reshape(*logits.shape[:3], p, l)                                # [B, layers, H, P, L]
    n_tokens = jnp.maximum(jnp.sum(mask, axis=-1), 1)                           # [B, 1, 1, P]
    per_passage = jnp.sum(jnp.where(mask, lg, 0.0), axis=-1) / n_tokens         # [B, layers, H, P]
  else:
    raise ValueError(f"mode must be 'probs' or 'logits', got {mode!r}")
  return jnp.mean(per_passage, axis=(1, 2))                                     # [B, P]
