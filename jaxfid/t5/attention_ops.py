"""The attention computation of every T5 attention layer, by implementation.

Einsum letters (as ``layers.py``): B batch, L query length, S key length,
H heads, K key/value heads (H or 1), E head width.

:func:`attend` is the one dispatch point: ``T5Config.attention`` (gin
``ATTENTION``) names the implementation:

* 'reference': the einsum path: float32 logits ``[B, H, L, S]``, bias and
  mask added, float32 softmax, dropout, weights times values;
* 'pallas': the fused kernel (``jaxfid.t5.fused_attention``) where it
  applies (self-attention shapes it takes, no logits asked for: ReAtt's and
  FiD's passage scores read them); elsewhere the reference path. Off TPU it
  runs in Pallas' interpreter;
* 'cudnn': cuDNN's flash attention (``jaxfid.t5.cudnn_attention``) where
  it applies (bfloat16/float16, no attention dropout, the relative bias
  with a key padding mask or the causal mask, no logits asked for) on a
  GPU; elsewhere, and on every other platform, the reference path;
* 'auto': 'pallas' when the program is built for a TPU (the mesh's devices,
  or JAX's default backend without a mesh), 'cudnn' for a GPU, 'reference'
  elsewhere.

A mask is a bool array or :class:`Segments` (per-token segment ids, e.g.
ReAtt's bi-encoder: question and document attend within themselves), which
the kernel takes without the ``[B, L, S]`` mask ever being written.

Each implementation is one branch in :func:`attend` with its own
``supported`` check.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.t5 import cudnn_attention, fused_attention
from jaxfid.t5.dropout_masks import dropout

Array = jax.Array
NEG_INF = float(np.finfo(np.float32).min)
IMPLEMENTATIONS = ("auto", "reference", "pallas", "cudnn")
GPU_PLATFORMS = ("gpu", "cuda")


class Segments(NamedTuple):
  """A mask by segments: a score is kept where the query's and the key's
  ids are equal and the key is valid."""
  query: Array  # int32 [B, L]
  key: Array    # int32 [B, S]
  valid: Array  # bool [B, S]

  def dense(self) -> Array:
    """bool [B, 1, L, S]: the mask these segments stand for."""
    same = self.query[:, :, None] == self.key[:, None, :]       # [B, L, S]
    return (same & self.valid[:, None, :])[:, None]             # [B, 1, L, S]


def platform() -> str:
  """The platform the program is built for: the current mesh's devices
  ('tpu' when compiling for a TPU topology on any host), else JAX's
  default backend."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh is None or mesh.empty else getattr(
      mesh, "abstract_device", None)
  if device is not None:
    return device.platform
  return jax.default_backend()


def resolve(implementation: str) -> str:
  """The implementation ``implementation`` names on this platform:
  'auto' is 'pallas' on TPU, 'cudnn' on GPU, else 'reference'; 'cudnn'
  off GPU is 'reference'."""
  where = platform()
  if implementation == "auto":
    return {"tpu": "pallas"}.get(
        where, "cudnn" if where in GPU_PLATFORMS else "reference")
  if implementation == "cudnn" and where not in GPU_PLATFORMS:
    return "reference"
  return implementation


def reference(q: Array, k: Array, v: Array, *, bias: Array | None,
              mask: Array | None, rate: float, rng: Array | None
              ) -> tuple[Array, Array]:
  """(context ``[B, L, H, E]``, float32 logits ``[B, H, L, S]``)."""
  if k.shape[2] == 1:  # multi-query: one key/value head
    logits = jnp.einsum("blhe,bse->bhls", q, k[:, :, 0],
                        preferred_element_type=jnp.float32)  # [B, H, L, S]
  else:
    logits = jnp.einsum("blhe,bshe->bhls", q, k,
                        preferred_element_type=jnp.float32)  # [B, H, L, S]
  if bias is not None:
    logits = logits + bias
  if mask is not None:
    logits = jnp.where(mask, logits, NEG_INF)
  weights = jax.nn.softmax(logits, axis=-1)  # float32 [B, H, L, S]
  weights = dropout(weights, rate, rng).astype(q.dtype)
  if k.shape[2] == 1:
    ctx = jnp.einsum("bhls,bse->blhe", weights, v[:, :, 0])  # [B, L, H, E]
  else:
    ctx = jnp.einsum("bhls,bshe->blhe", weights, v)  # [B, L, H, E]
  return ctx, logits


def attend(q: Array, k: Array, v: Array, *, bias: Array | None,
           mask: Array | Segments | None, rate: float, rng: Array | None,
           implementation: str = "reference", return_logits: bool = False,
           causal: bool = False) -> tuple[Array, Array | None]:
  """T5 attention without scaling: (context ``[B, L, H, E]`` in q's dtype,
  float32 logits ``[B, H, L, S]`` when ``return_logits``, else None).

  Args:
    q: ``[B, L, H, E]``; k, v: ``[B, S, K, E]``.
    bias: float32, broadcastable to ``[B, H, L, S]`` (relative positions).
    mask: bool, broadcastable to ``[B, H, L, S]``; False is masked. Or
      :class:`Segments` (the reference path builds their dense mask).
    rate, rng: dropout on the softmax weights (none when ``rng`` is None).
    implementation: one of ``IMPLEMENTATIONS``.
    causal: ``mask`` is the causal mask (query i sees keys up to i), which
      cuDNN applies itself; the other paths read ``mask``.
  """
  segments = None
  if isinstance(mask, Segments):
    segments = (mask.query, mask.key)
    key_mask = mask.valid[:, None, None, :]  # [B, 1, 1, S]
  else:
    key_mask = mask
  chosen = resolve(implementation)
  if (chosen == "cudnn" and not return_logits and segments is None
      and cudnn_attention.supported(
          q.shape, k.shape, q.dtype, None if bias is None else bias.shape,
          None if mask is None else mask.shape, causal=causal,
          dropout=rng is not None and rate > 0)):
    ctx = cudnn_attention.attention(q, k, v, bias=bias, mask=mask,
                                    causal=causal)
    return ctx, None
  if (chosen == "pallas" and not return_logits
      and fused_attention.supported(
          q.shape, k.shape, None if bias is None else bias.shape,
          None if key_mask is None else key_mask.shape,
          None if segments is None else [x.shape for x in segments])):
    ctx = fused_attention.attention(
        q, k, v, bias=bias, mask=key_mask, rate=rate, rng=rng,
        interpret=platform() != "tpu", segments=segments)
    return ctx, None
  if segments is not None:
    mask = mask.dense()
  ctx, logits = reference(q, k, v, bias=bias, mask=mask, rate=rate, rng=rng)
  return ctx, logits if return_logits else None
