"""Fusion-in-Decoder on the T5 network (Izacard & Grave, 2020).

Einsum letters: B questions, P passages per question, L tokens per passage,
D d_model, H heads, T target length.

Each passage (``question: .. title: .. context: ..``) is encoded alone, and
the encoder's output is concatenated to ``[B, P*L, D]`` so the decoder's
cross-attention runs one softmax over every token of every passage. Two
equal ways to encode alone (``T5Config.passage_encoding``):

  * 'flatten' (the default): tokens ``[B, P, L]`` are reshaped to
    ``[B*P, L]`` and encoded in one call, as the original FiD code does
    (``src/model.py::EncoderWrapper.forward``:
    ``input_ids.view(bsz*self.n_passages, passage_length)``);
  * 'vmap': ``jax.vmap`` of the encoder over the passage axis, the
    parameters broadcast, each passage with its own dropout key
    (``jax.random.split(rng, P)``): the "encoder vmapped over passages" of
    the design.

Without dropout the two are the same function (``tests/test_passage_vmap.py``
compares outputs and gradients); with dropout both draw independent masks
for every passage from one key, but different ones (a flattened mask is one
hash over ``[B*P, L, D]``, a vmapped one a hash over ``[B, L, D]`` per
passage key). docs/fidelity.md says which compiles better and why it is
the default.

Padding passages are masked in the cross-attention, so they change nothing.
FiD needs no parameters beyond T5's: these are functions over a
:class:`~jaxfid.t5.network.T5`. The concatenated encoder output keeps the
residual stream's sharding (batch over the data-parallel mesh axes; no-op
without a mesh).
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

  Args:
    passage_mask: optional bool [B, P]; False masks a whole passage (padding
      passages are also all-zero tokens, which masks them anyway).
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

  The parameters (the network's NNX state) and ``extras`` are broadcast;
  tokens and mask are mapped over axis 1 (each call sees ``[B, L]``, the
  batch axis stays the batch, so its sharding constraints still apply;
  the passage axis is unconstrained, as in the flattened rows); passage
  ``i`` gets the dropout key ``split(dropout_rng, P)[i]``. The result is
  laid out as the flattened call's, row ``b*P + i``.
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
