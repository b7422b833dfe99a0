"""T5 building blocks in Flax NNX: projections, RMS norm, relative bias, attention, MLP.

Einsum letters:
  B batch (passages flattened in for FiD), L query length, S key length,
  D d_model, H heads, K key/value heads (H or 1), E head width d_kv,
  F feed-forward width, V vocabulary, N relative-position buckets.

Conventions (t5x ``examples/t5/layers.py``):
  * parameters are float32 and carry ``logical_axes`` metadata naming their
    axes (``jaxfid.core.sharding``); activations run in ``config.dtype`` (norm
    outputs, projections, attention, MLP); the residual stream, attention
    logits, softmax and output logits are float32, as under mixed-precision
    autocast — bf16 rounding then does not accumulate over the layers;
  * activations are constrained by logical axis names where t5x/flaxformer
    constrain them (``ax.with_logical_constraint``: the embedding output, the
    query/key/value and attention context ``[B, L, H, E]``, the MLP hidden
    ``[B, L, F]``), so under a mesh with a ``model`` axis the heads and the
    feed-forward width stay sharded (Megatron layout) instead of being left
    to XLA's propagation; without a mesh the constraints are no-ops;
  * no ``1/sqrt(E)`` scaling of attention logits (T5 folds it into the init).

Hooks for the methods built on T5:
  * every projection (``query``, ``key``, ``value``, ``out`` and the MLP's
    ``wi``/``wi_0``/``wi_1``/``wo``) is a module called as ``proj(x, extras)``;
    a method replaces the projections of chosen layers by assigning a module
    with the same signature (``layer.attention.key = MyFusion(layer.attention.key,
    ...)``). ``extras`` is an arbitrary pytree the caller threads through the
    whole model (``None`` on the default path, where it costs nothing);
  * attention can return its pre-softmax logits (``return_logits=True``).

The scores, softmax, dropout and weighted values are
``attention_ops.attend``: the reference einsums or a fused kernel, by
``config.attention``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxfid.core import sharding as ax
from jaxfid.t5 import attention_ops
from jaxfid.t5.config import T5Config
# dropout_keep is re-exported (layers.dropout_keep)
from jaxfid.t5.dropout_masks import dropout, dropout_keep  # noqa: F401

Array = jax.Array
NEG_INF = float(np.finfo(np.float32).min)
# Logical axes of activations (t5x's names: 'batch', 'length', 'heads', ...).
ACT_RESIDUAL = (ax.BATCH, ax.LENGTH, ax.ACT_EMBED)        # [B, L, D]
ACT_QKV = (ax.BATCH, ax.LENGTH, ax.ACT_HEADS, ax.KV)      # [B, L, H, E]
ACT_MQ_KV = (ax.BATCH, ax.LENGTH, None, ax.KV)            # [B, S, 1, E]
ACT_MLP_HIDDEN = (ax.BATCH, ax.LENGTH, ax.ACT_MLP)        # [B, L, F]
ACT_LOGITS = (ax.BATCH, ax.LENGTH, ax.ACT_VOCAB)          # [B, T, V]


def fold(rng: Array | None, *data: int) -> Array | None:
  """Derive a sub-key deterministically (None stays None)."""
  if rng is None:
    return None
  for d in data:
    rng = jax.random.fold_in(rng, d)
  return rng


def _init(rngs: nnx.Rngs, shape, stddev: float) -> Array:
  return jax.random.normal(rngs.params(), shape, jnp.float32) * stddev


class Dense(nnx.Module):
  """A bias-free projection ``y = x @ kernel`` (kernel float32 ``[in, out]``).

  Called as ``dense(x, extras)``; the default projection ignores ``extras``.
  """

  def __init__(self, in_features: int, out_features: int, axes: tuple[str, str],
               *, dtype, stddev: float, rngs: nnx.Rngs):
    self.kernel = nnx.Param(_init(rngs, (in_features, out_features), stddev),
                            logical_axes=axes)
    self.axes = axes
    self.dtype = dtype

  def __call__(self, x: Array, extras: Any = None) -> Array:
    del extras
    kernel = ax.gathered_for_use(self.kernel[...].astype(self.dtype),
                                 self.axes)
    return jnp.einsum("...d,df->...f", x.astype(self.dtype), kernel)  # [..., out]


class Embed(nnx.Module):
  """The shared token embedding ``[V, D]``; also the tied output layer."""

  def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
    self.embedding = nnx.Param(
        _init(rngs, (config.vocab_size, config.d_model), 1.0),
        logical_axes=(ax.VOCAB, ax.EMBED))
    self.dtype = config.activation_dtype

  def __call__(self, tokens: Array) -> Array:
    """float32 [B, L, D]: the residual stream starts (and stays) float32."""
    x = jnp.take(self.embedding[...], tokens, axis=0)  # [B, L, D]
    return ax.with_logical_constraint(x, ACT_RESIDUAL)

  def attend(self, x: Array) -> Array:
    """Logits against the embedding, float32 ``[..., V]``."""
    emb = ax.gathered_for_use(self.embedding[...].astype(self.dtype),
                              (ax.VOCAB, ax.EMBED))
    return jnp.einsum("...d,vd->...v", x, emb,
                      preferred_element_type=jnp.float32)  # [B, T, V]


class RMSNorm(nnx.Module):
  """T5's layer norm: no mean subtraction, no bias; variance in float32."""

  def __init__(self, config: T5Config):
    self.scale = nnx.Param(jnp.ones((config.d_model,), jnp.float32),
                           logical_axes=(ax.EMBED,))
    self.epsilon = config.layer_norm_epsilon
    self.dtype = config.activation_dtype

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + self.epsilon)
    return (self.scale[...] * y).astype(self.dtype)


def relative_position_buckets(query_length: int, key_length: int, *,
                              bidirectional: bool, num_buckets: int,
                              max_distance: int) -> np.ndarray:
  """int32 ``[L, S]`` bucket ids, computed on the host (shapes are static).

  Same arithmetic as HF ``T5Attention._relative_position_bucket`` and t5x,
  in float32, so bucket boundaries agree exactly.
  """
  context = np.arange(query_length, dtype=np.int64)[:, None]
  memory = np.arange(key_length, dtype=np.int64)[None, :]
  relative = memory - context  # [L, S]
  buckets = np.zeros_like(relative)
  if bidirectional:
    num_buckets //= 2
    buckets += (relative > 0).astype(np.int64) * num_buckets
    relative = np.abs(relative)
  else:
    relative = -np.minimum(relative, 0)
  max_exact = num_buckets // 2
  is_small = relative < max_exact
  safe = np.maximum(relative, 1).astype(np.float32)
  large = max_exact + (
      np.log(safe / np.float32(max_exact)) /
      np.float32(math.log(max_distance / max_exact)) *
      np.float32(num_buckets - max_exact)).astype(np.int64)
  large = np.minimum(large, num_buckets - 1)
  buckets += np.where(is_small, relative, large)
  return buckets.astype(np.int32)


class RelativePositionBias(nnx.Module):
  """Learned per-head bias by relative position bucket; one per stack."""

  def __init__(self, config: T5Config, *, bidirectional: bool, rngs: nnx.Rngs):
    self.rel_embedding = nnx.Param(
        _init(rngs, (config.num_heads, config.relative_attention_num_buckets),
              config.d_model ** -0.5),
        logical_axes=(ax.HEADS, ax.RELPOS_BUCKETS))
    self.bidirectional = bidirectional
    self.num_buckets = config.relative_attention_num_buckets
    self.max_distance = config.relative_attention_max_distance

  def __call__(self, query_length: int, key_length: int) -> Array:
    """float32 ``[1, H, L, S]``."""
    buckets = relative_position_buckets(
        query_length, key_length, bidirectional=self.bidirectional,
        num_buckets=self.num_buckets, max_distance=self.max_distance)
    bias = jnp.take(self.rel_embedding[...], jnp.asarray(buckets), axis=1)  # [H, L, S]
    return bias[None]  # [1, H, L, S]


@dataclasses.dataclass
class AttentionOutput:
  out: Array                 # [B, L, D]
  logits: Array | None       # float32 [B, H, L, S] pre-softmax, or None


class Attention(nnx.Module):
  """Multi-head (or multi-query) dot-product attention without scaling.

  ``key``/``value`` project to ``K * E`` with K = H, or K = 1 for multi-query
  attention (FiDO).
  """

  def __init__(self, config: T5Config, *, rngs: nnx.Rngs,
               multi_query: bool = False):
    d, h, e = config.d_model, config.num_heads, config.d_kv
    kv_heads = 1 if multi_query else h
    dt = config.activation_dtype
    kv_axis = ax.KV if multi_query else ax.JOINED_KV
    self.query = Dense(d, h * e, (ax.EMBED, ax.JOINED_KV), dtype=dt,
                       stddev=(d * e) ** -0.5, rngs=rngs)
    self.key = Dense(d, kv_heads * e, (ax.EMBED, kv_axis), dtype=dt,
                     stddev=d ** -0.5, rngs=rngs)
    self.value = Dense(d, kv_heads * e, (ax.EMBED, kv_axis), dtype=dt,
                       stddev=d ** -0.5, rngs=rngs)
    self.out = Dense(h * e, d, (ax.JOINED_KV, ax.EMBED), dtype=dt,
                     stddev=(h * e) ** -0.5, rngs=rngs)
    self.num_heads, self.kv_heads, self.head_dim = h, kv_heads, e
    self.dropout_rate = config.dropout_rate
    self.dtype = dt
    # the kernel's TPU lowering does not take the batch dimension vmap adds
    # (PASSAGE_ENCODING='vmap'), nor does jax 0.10.2's batching of cuDNN's
    # attention (it reshapes the key lengths to the vmapped batch and
    # fails): 'auto' and 'cudnn' keep the einsums there
    self.implementation = ("reference" if config.attention in ("auto", "cudnn")
                           and config.passage_encoding == "vmap"
                           else config.attention)

  def project_kv(self, x: Array, extras: Any = None) -> tuple[Array, Array]:
    """Keys and values ``[B, S, K, E]`` (cached once per input when decoding).

    Heads are sharded like the query's; the single head of multi-query
    attention is replicated.
    """
    b, s, _ = x.shape
    k = self.key(x, extras).reshape(b, s, self.kv_heads, self.head_dim)    # [B, S, K, E]
    v = self.value(x, extras).reshape(b, s, self.kv_heads, self.head_dim)  # [B, S, K, E]
    axes = ACT_MQ_KV if self.kv_heads == 1 else ACT_QKV
    return (ax.with_logical_constraint(k, axes),
            ax.with_logical_constraint(v, axes))

  def project_q(self, x: Array, extras: Any = None) -> Array:
    """Queries ``[B, L, H, E]``."""
    b, l, _ = x.shape
    q = self.query(x, extras).reshape(b, l, self.num_heads, self.head_dim)  # [B, L, H, E]
    return ax.with_logical_constraint(q, ACT_QKV)

  def __call__(self, x: Array, kv_input: Array | None = None, *,
               mask: Array | attention_ops.Segments | None = None,
               bias: Array | None = None,
               kv: tuple[Array, Array] | None = None,
               dropout_rng: Array | None = None, extras: Any = None,
               return_logits: bool = False,
               causal: bool = False) -> AttentionOutput:
    """Attend from ``x`` [B, L, D] to ``kv_input`` [B, S, D] (or given ``kv``).

    Args:
      mask: bool, broadcastable to [B, H, L, S]; False positions are masked;
        or ``attention_ops.Segments`` (per-token segment ids).
      bias: float32, broadcastable to [B, H, L, S] (relative position bias).
      kv: precomputed (keys, values) ``[B, S, K, E]``; skips the projections.
      causal: ``mask`` is the causal mask (``attention_ops.attend``).
    """
    q = self.project_q(x, extras)  # [B, L, H, E]
    if kv is None:
      kv = self.project_kv(x if kv_input is None else kv_input, extras)
    k, v = kv
    ctx, logits = attention_ops.attend(
        q, k, v, bias=bias, mask=mask, rate=self.dropout_rate,
        rng=dropout_rng, implementation=self.implementation,
        return_logits=return_logits, causal=causal)  # [B, L, H, E]
    ctx = checkpoint_name(ax.with_logical_constraint(ctx, ACT_QKV), "context")
    b, l = ctx.shape[:2]
    ctx = ctx.reshape(b, l, self.num_heads * self.head_dim)  # [B, L, H*E]
    out = checkpoint_name(self.out(ctx, extras), "out_proj")  # [B, L, D]
    return AttentionOutput(out, logits)


class MLP(nnx.Module):
  """T5 feed-forward: ``wo(act(wi x))`` or gated ``wo(act(wi_0 x) * wi_1 x)``."""

  def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
    d, f = config.d_model, config.d_ff
    dt = config.activation_dtype
    if config.is_gated:
      self.wi_0 = Dense(d, f, (ax.EMBED, ax.MLP), dtype=dt, stddev=d ** -0.5,
                        rngs=rngs)
      self.wi_1 = Dense(d, f, (ax.EMBED, ax.MLP), dtype=dt, stddev=d ** -0.5,
                        rngs=rngs)
    else:
      self.wi = Dense(d, f, (ax.EMBED, ax.MLP), dtype=dt, stddev=d ** -0.5,
                      rngs=rngs)
    self.wo = Dense(f, d, (ax.MLP, ax.EMBED), dtype=dt, stddev=f ** -0.5,
                    rngs=rngs)
    self.gated = config.is_gated
    self.activation = config.activation
    self.dropout_rate = config.dropout_rate

  def _act(self, x: Array) -> Array:
    if self.activation == "relu":
      return jax.nn.relu(x)
    return jax.nn.gelu(x, approximate=True)  # HF 'gelu_new' / t5x 'gelu'

  def __call__(self, x: Array, *, dropout_rng: Array | None = None,
               extras: Any = None) -> Array:
    if self.gated:
      hidden = self._act(self.wi_0(x, extras)) * self.wi_1(x, extras)  # [B, L, F]
    else:
      hidden = self._act(self.wi(x, extras))  # [B, L, F]
    hidden = dropout(hidden, self.dropout_rate, dropout_rng)
    hidden = ax.with_logical_constraint(hidden, ACT_MLP_HIDDEN)
    return self.wo(hidden, extras)  # [B, L, D]


# REMAT values that save named activations (``checkpoint_name`` in
# ``Attention``; MaxText's names): the attention's context ``[B, L, H, E]``
# and its output projection ``[B, L, D]``.
SAVED_NAMES = {"save_out_proj_with_context": ("context", "out_proj")}


def remat_policy(name: str):
  """The ``jax.checkpoint`` policy of a REMAT value ('full': None, save
  nothing but each layer's input)."""
  if name == "dots":
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  if name in SAVED_NAMES:
    return jax.checkpoint_policies.save_only_these_names(*SAVED_NAMES[name])
  return None
