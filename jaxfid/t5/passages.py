"""Fusion-in-Decoder on the T5 network (Izacard & Grave, 2020).

Einsum letters: B questions, P passages per question, L tokens per passage,
D d_model, H heads, T target length.

Each passage is encoded alone and the outputs are concatenated to
``[B, P*L, D]``, so the decoder's cross-attention runs one softmax over every
passage's tokens; padding passages are masked. ``T5Config.passage_encoding``:
'flatten' (default; ``[B, P, L]`` -> ``[B*P, L]``, one call, as the original
FiD) or 'vmap' (the encoder vmapped over passages, one dropout key each).
Without dropout they are the same function; with dropout their masks differ.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

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

  ``passage_mask`` (bool [B, P]), optional, masks whole passages.
  """
  tokens = as_passages(tokens)
  b, p, l = tokens.shape
  mask = tokens != 0                              # [B, P, L]
  if passage_mask is not None:
    mask = mask & passage_mask[:, :, None]
  encode = _vmapped if net.config.passage_encoding == "vmap" else _flattened
  out = encode(net, tokens, mask, dropout_rng, extras, stack_kwargs)  # leaves [B*P, ...]
  hidden = out.hidden.reshape(b, p * l, -1)       # [B*P, L, D] -> [B, P*L, D]
  hidden = ax.with_logical_constraint(hidden, ACT_RESIDUAL)
  return out.replace(hidden=hidden, mask=mask.reshape(b, p * l))  # mask [B, P*L]


def _flattened(net: T5, tokens: Array, mask: Array, dropout_rng: Array | None,
               extras: Any, stack_kwargs: dict) -> StackOutput:
  """One encoder call on the passages as rows: every output leaf [B*P, ...]."""
  b, p, l = tokens.shape
  return net.encode(tokens.reshape(b * p, l), mask=mask.reshape(b * p, l),  # [B*P, L]
                    dropout_rng=dropout_rng, extras=extras, **stack_kwargs)


def _vmapped(net: T5, tokens: Array, mask: Array, dropout_rng: Array | None,
             extras: Any, stack_kwargs: dict) -> StackOutput:
  """The encoder vmapped over the passage axis: every output leaf [B*P, ...].

  Parameters and ``extras`` are broadcast; tokens and mask are mapped over
  axis 1; passage ``i`` gets ``split(dropout_rng, P)[i]``; rows are laid out
  as the flattened call's, ``b*P + i``.
  """
  b, p, _ = tokens.shape
  graphdef, state = nnx.split(net)

  def one_passage(state, tok, m, rng):  # tok, m [B, L]
    return nnx.merge(graphdef, state).encode(
        tok, mask=m, dropout_rng=rng, extras=extras, **stack_kwargs)

  keys = None if dropout_rng is None else jax.random.split(dropout_rng, p)  # [P]
  out = jax.vmap(one_passage, in_axes=(None, 1, 1, None if keys is None else 0),
                 out_axes=1)(state, tokens, mask, keys)  # leaves [B, P, ...]
  return jax.tree.map(lambda x: x.reshape(b * p, *x.shape[2:]), out)  # [B*P, ...]


def first_position_scores(net: T5, hidden: Array, mask: Array,
                          num_passages: int, mode: str = "probs") -> Array:
  """Cross-attention passage relevance, float32 [B, P] (FiD-KD / Atlas / ReAtt).

  At the first decoder position: every layer's and head's attention over the
  real encoder tokens, summed per passage, averaged over heads and layers.
  """
  start = jnp.zeros((hidden.shape[0], 1), jnp.int32)                # [B, 1]
  _, dec = net.decode(hidden, mask, start, output_attention_logits=True)
  return scores_from_attention(dec.cross_attention_logits, mask,
                               num_passages, mode)


def answer_attention(net: T5, hidden: Array, mask: Array,
                     decoder_input_tokens: Array) -> Array:
  """The decoder's cross-attention while it reads an answer, float32 [B, T, P*L].

  Teacher-forced on ``decoder_input_tokens`` [B, T] (the answer shifted
  right: position t predicts answer token t) over an encoding (``hidden``
  [B, P*L, D], ``mask`` bool [B, P*L]): each layer with cross-attention and
  each head's post-softmax weights (0 at padding), averaged over heads and
  layers, so each position's weights sum to 1. Position 0 is
  :func:`first_position_scores`' position ('probs'), token by token.
  """
  _, dec = net.decode(hidden, mask, decoder_input_tokens,
                      output_attention_logits=True)
  per_layer = [jnp.mean(jax.nn.softmax(c.astype(jnp.float32), axis=-1), axis=1)
               for c in dec.cross_attention_logits]       # each [B, T, P*L]
  return jnp.mean(jnp.stack(per_layer, 1), axis=1)       # [B, layers, T, P*L] -> [B, T, P*L]


def scores_from_attention(cross_attention_logits, encoder_mask: Array,
                          num_passages: int, mode: str = "probs") -> Array:
  """Passage scores float32 [B, P] from every decoder layer's cross-attention.

  ``cross_attention_logits``: per layer float32 [B, H, T, P*L] (the first
  decoder position is used); ``encoder_mask``: bool [B, P*L]. ``mode``:
  'probs' (post-softmax, scores sum to 1) or 'logits' (the original FiD's
  pre-softmax logits averaged over the passage's real tokens).
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
