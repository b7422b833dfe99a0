"""T5 attention through cuDNN's flash attention on NVIDIA GPUs.

Einsum letters (as ``layers.py``): B batch, L query length, S key length,
H heads, K key/value heads (H or 1), E head width.

``jax.nn.dot_product_attention(..., implementation='cudnn')`` computes the
scores, the softmax and the weighted values in one cuDNN kernel (one for
the backward), so the ``[B, H, L, S]`` logits and weights never reach HBM.
What it takes of T5's attention (:func:`supported`):

* the relative position bias ``[1, H, L, S]``, shared over the batch, in
  the inputs' dtype (cuDNN adds a bias of the q/k/v type; the reference
  adds the float32 bias to float32 logits). Its gradient is cuDNN's dbias
  of the same shape, summed over the batch by cuDNN. With a bias, cuDNN's
  training kernels want even lengths;
* a key padding mask ``[B or 1, 1, 1, S]`` as key lengths (the mask's
  sum per row), only together with the bias, i.e. a stack's self-attention
  over its own tokens, where every jaxfid input is padded on the right. A
  row whose mask is not a prefix (a False before a True) gets a NaN context,
  so a run fails on its non-finite loss rather than attend to padding. A row
  with no real token attends to its first key (the reference: uniformly to
  all); such rows are masked out everywhere downstream. The decoder's
  cross-attention mask (passages concatenated, each padded) is not a prefix:
  cross-attention with a mask keeps the einsums;
* the decoder's causal mask, named by ``causal=True`` (cuDNN skips the
  masked half instead of reading the mask);
* bfloat16 or float16 q/k/v (cuDNN has no float32 flash attention), head
  width a multiple of 8 up to 128, at least ``MIN_QUERIES`` queries (a
  decoding position keeps the einsums), as many key heads as query heads
  or one (multi-query);
* no attention dropout: ``jax.nn.dot_product_attention`` has none, and the
  private cuDNN API's dropout draws from cuDNN's own generator (a seed fixed
  at trace time and a counter on the device), not from the step's key, so a
  resumed run would not drop what the original dropped. Training with
  ``DROPOUT_RATE > 0`` keeps the einsums for the attention weights;
  evaluation, decoding and training without dropout use cuDNN.

Compiled without a GPU (``jaxfid bench compile --topology h100-1``) the
program holds cuDNN's custom calls (``__cudnn$fmha*``), but XLA builds the
cuDNN graphs only with a device (``RunCudnnCompilerPasses`` runs when the
compiler has a stream executor): the deviceless compile neither checks that
this cuDNN takes the graph nor sizes its workspace (0 bytes in the program;
with dbias cuDNN's backward may use a ``[B, H, L, S]`` bfloat16 workspace).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
DTYPES = (jnp.bfloat16, jnp.float16)
MAX_HEAD_DIM = 128  # cuDNN's limit before Hopper (256 from Hopper on)
MIN_QUERIES = 8


def supported(q_shape, k_shape, dtype, bias_shape, mask_shape, *,
              causal: bool, dropout: bool) -> bool:
  """Whether cuDNN computes this attention (module docstring): q ``[B, L, H,
  E]``, k/v ``[B, S, K, E]`` of ``dtype``, the bias ``[1, H, L, S]`` or none,
  the mask a key mask with the bias, or the causal mask (``causal``), or
  none; ``dropout`` when attention dropout applies."""
  b, l, h, e = q_shape
  s, kv_heads = k_shape[1], k_shape[2]
  if (dropout or jnp.dtype(dtype) not in [jnp.dtype(d) for d in DTYPES]
      or e % 8 or e > MAX_HEAD_DIM or l < MIN_QUERIES
      or k_shape[0] != b or kv_heads not in (1, h)):
    return False
  if bias_shape is not None:
    if tuple(bias_shape) != (1, h, l, s) or l % 2 or s % 2:
      return False
  if causal:
    return l == s
  if mask_shape is None:
    return True
  return (bias_shape is not None and len(mask_shape) == 4
          and tuple(mask_shape[1:]) == (1, 1, s) and mask_shape[0] in (1, b))


def attention(q: Array, k: Array, v: Array, *, bias: Array | None,
              mask: Array | None, causal: bool,
              implementation: str = "cudnn") -> Array:
  """Context ``[B, L, H, E]`` (q's dtype) of T5 attention, no scaling, for
  :func:`supported` inputs; ``mask`` is ignored when ``causal``.
  ``implementation='xla'`` runs the same call through JAX's own einsums
  (any platform: the tests check this module's arithmetic with it)."""
  b, _, _, _ = q.shape
  s = k.shape[1]
  k = k.astype(q.dtype)
  v = v.astype(q.dtype)
  lengths = ok = None
  if mask is not None and not causal:
    keys = jnp.broadcast_to(mask[:, 0, 0, :], (b, s))  # [B, S]
    count = jnp.sum(keys, axis=-1, dtype=jnp.int32)  # [B]
    ok = jnp.all(keys == (jnp.arange(s)[None, :] < count[:, None]), axis=-1)
    lengths = jnp.maximum(count, 1)
  ctx = jax.nn.dot_product_attention(
      q, k, v, bias=None if bias is None else bias.astype(q.dtype),
      scale=1.0, is_causal=causal, key_value_seq_lengths=lengths,
      implementation=implementation)  # [B, L, H, E]
  if ok is not None:
    ctx = jnp.where(ok[:, None, None, None], ctx,
                    jnp.asarray(jnp.nan, ctx.dtype))
  return ctx
