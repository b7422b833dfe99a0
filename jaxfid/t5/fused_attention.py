"""Fused T5 attention: a Pallas TPU kernel whose scores never leave VMEM.

Einsum letters (as ``layers.py``): B batch, L query length, S key length,
H heads, E head width.

For attention whose whole key length fits in VMEM (FiD's encoder: 100
passages of 250 tokens each attend within themselves), one grid step takes
a block of passages with all their heads: queries ``[b, L, H*E]``, keys
and values ``[b, S, H*E]`` (the projections' own layout, no transposes in
HBM), the relative position bias ``[H, L, S]`` (float32; its block index is
the same at every step, so it is read once per call, not per passage),
each passage's key mask ``[b, 1, S]`` and, where attention is split into
segments (ReAtt's bi-encoder: question and document attend within
themselves), per-token segment ids of the queries ``[b, L, 1]`` and keys
``[b, 1, S]``: a score is kept where the two ids are equal and the key is
valid, so the ``[B, L, S]`` mask is never written to HBM. It loops over the
heads inside the kernel and writes only the context ``[b, L, H*E]``. The
logits, the float32 softmax and the dropout mask stay in VMEM.

T5's arithmetic: no ``1/sqrt(E)`` scaling; masked logits are replaced by
float32's lowest value (a passage with no real token attends uniformly, as
the reference does); dropout on the softmax weights is the hash of
``jaxfid.t5.dropout_masks`` computed in the kernel on each element's linear
index in the global ``[B, H, L, S]`` shape, so the kernel drops exactly the
elements the reference drops.

Where a chip's VMEM does not hold all heads' bias and its gradient (v4's
16 MiB at 16 heads x 250 tokens), the grid's first axis splits the heads
into groups of 128 lanes (``fused_attention_fit.tiling``): each step takes
a group's columns of q/k/v and its rows of the bias.

The backward kernel recomputes the softmax (the whole key row is in VMEM,
so nothing but the inputs is saved) and writes dq, dk, dv and the bias
gradient, summed over the batch inside the kernel (a group's block is the
same at every step of the batch axis, which runs in order).

Mosaic kernels are not partitioned by XLA: under a mesh the kernels run
inside ``jax.shard_map``, the batch split as the activations are and the
heads as ``activation_heads`` is (the bias by the same heads); the bias
gradient is summed over the batch shards with ``psum``. Off TPU the kernels
run in Pallas' interpreter (tests).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxfid.t5 import dropout_masks
from jaxfid.t5.fused_attention_fit import (  # noqa: F401 (supported: the API)
    VMEM_LIMIT, layout, supported, tiling)

Array = jax.Array
NEG_INF = float(np.finfo(np.float32).min)
def _i32(c: int) -> int:
  """A uint32 constant as the int32 with the same bits."""
  return c - (1 << 32) if c >= (1 << 31) else c


def _srl(z: Array, n: int) -> Array:
  return jax.lax.shift_right_logical(z, jnp.int32(n))


def _fmix32(z: Array) -> Array:
  """``dropout_masks._fmix32`` in int32 (the same bits; multiplies wrap)."""
  z = (z ^ _srl(z, 16)) * jnp.int32(_i32(dropout_masks.FMIX_1))
  z = (z ^ _srl(z, 13)) * jnp.int32(_i32(dropout_masks.FMIX_2))
  return z ^ _srl(z, 16)


class Spec(NamedTuple):
  """What the kernels are compiled for (static)."""
  heads: int            # heads per grid step (a group of a shard's heads)
  groups: int           # head groups: the grid's first axis
  head_dim: int         # E
  rate: float           # dropout rate; 0 = no dropout
  global_heads: int     # H of the [B, H, L, S] shape the dropout hash counts
  block: int            # passages per grid step
  has_bias: bool
  has_mask: bool
  has_segments: bool
  interpret: bool


def _dot(a: Array, b: Array, dims) -> Array:
  """float32 ``dot_general``: bf16 operands at the MXU's own precision (the
  only one Mosaic takes for them, whatever ``jax_default_matmul_precision``
  says), float32 ones at that default precision, as the reference's."""
  precision = None if a.dtype == jnp.float32 else jax.lax.Precision.DEFAULT
  return jax.lax.dot_general(a, b, (dims, ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)


NN, NT, TN = ((1,), (0,)), ((1,), (1,)), ((0,), (0,))  # x@y, x@y^T, x^T@y


def _keep(scalars, spec: Spec, b: Array, h: Array, shape) -> Array:
  """bool [L, S]: the dropout mask of passage ``b`` and head ``h`` (indices
  in the call: the shard's offsets are in ``scalars``)."""
  l, s = shape
  bg = scalars[2] + b
  hg = scalars[3] + h
  base = (bg * spec.global_heads + hg) * (l * s)  # int32 wraps as uint32
  index = (jax.lax.broadcasted_iota(jnp.int32, shape, 0) * s
           + jax.lax.broadcasted_iota(jnp.int32, shape, 1) + base)
  z = _fmix32(index * jnp.int32(_i32(dropout_masks.GOLDEN)) + scalars[0])
  z = _fmix32(z ^ scalars[1])
  flip = jnp.int32(_i32(1 << 31))  # unsigned order as signed order
  limit = _i32(dropout_masks.threshold(spec.rate) ^ (1 << 31))
  return (z ^ flip) >= jnp.int32(limit)


def _valid(mask_ref, segment_refs, b, spec: Spec, shape) -> Array | None:
  """bool [L, S] of passage ``b``: its key mask and, with segments, equal
  query and key segment ids; None when nothing is masked."""
  valid = None
  if spec.has_mask:
    valid = jnp.broadcast_to(mask_ref[b] != 0, shape)  # [1, S] -> [L, S]
  if spec.has_segments:
    q_ref, kv_ref = segment_refs
    same = q_ref[b] == kv_ref[b]  # [L, 1] == [1, S] -> [L, S]
    valid = same if valid is None else valid & same
  return valid


def _softmax(q, k, bias_ref, valid, h: int, spec: Spec):
  """float32 [L, S] logits of one head -> softmax weights."""
  s = _dot(q, k, NT)  # [L, S]
  if spec.has_bias:
    s = s + bias_ref[h]
  if valid is not None:
    s = jnp.where(valid, s, NEG_INF)
  m = jnp.max(s, axis=-1, keepdims=True)
  p = jnp.exp(s - m)
  return p / jnp.sum(p, axis=-1, keepdims=True)


def _refs(refs, spec: Spec):
  """(scalars, q, k, v, bias or None, mask or None, (q segments, kv
  segments) or None, rest)."""
  scalars, q, k, v, *rest = refs
  bias = rest.pop(0) if spec.has_bias else None
  mask = rest.pop(0) if spec.has_mask else None
  segments = (rest.pop(0), rest.pop(0)) if spec.has_segments else None
  return scalars, q, k, v, bias, mask, segments, rest


def _forward_kernel(*refs, spec: Spec):
  scalars, q_ref, k_ref, v_ref, bias_ref, mask_ref, seg_refs, (o_ref,) = (
      _refs(refs, spec))
  e, first = spec.head_dim, pl.program_id(1) * spec.block
  head0 = pl.program_id(0) * spec.heads
  shape = (q_ref.shape[1], k_ref.shape[1])

  def one(b, carry):
    valid = _valid(mask_ref, seg_refs, b, spec, shape)  # [L, S] or None
    for h in range(spec.heads):
      cols = pl.ds(h * e, e)
      q, k, v = q_ref[b, :, cols], k_ref[b, :, cols], v_ref[b, :, cols]
      w = _softmax(q, k, bias_ref, valid, h, spec)
      if spec.rate > 0:
        keep = _keep(scalars, spec, first + b, head0 + h, w.shape)
        w = jnp.where(keep, w / (1.0 - spec.rate), 0.0)
      ctx = _dot(w.astype(v.dtype), v, NN)  # [L, E]
      o_ref[b, :, cols] = ctx.astype(o_ref.dtype)
    return carry

  jax.lax.fori_loop(0, spec.block, one, 0)


def _backward_kernel(*refs, spec: Spec):
  scalars, q_ref, k_ref, v_ref, bias_ref, mask_ref, seg_refs, rest = _refs(
      refs, spec)
  do_ref, dq_ref, dk_ref, dv_ref, *dbias = rest
  dbias_ref = dbias[0] if spec.has_bias else None
  e, first = spec.head_dim, pl.program_id(1) * spec.block
  head0 = pl.program_id(0) * spec.heads
  shape = (q_ref.shape[1], k_ref.shape[1])

  if spec.has_bias:  # a group's bias gradient sums over the batch axis
    @pl.when(pl.program_id(1) == 0)
    def _():
      dbias_ref[...] = jnp.zeros_like(dbias_ref)

  def one(b, carry):
    valid = _valid(mask_ref, seg_refs, b, spec, shape)  # [L, S] or None
    for h in range(spec.heads):
      cols = pl.ds(h * e, e)
      q, k, v = q_ref[b, :, cols], k_ref[b, :, cols], v_ref[b, :, cols]
      do = do_ref[b, :, cols]  # [L, E]
      w = _softmax(q, k, bias_ref, valid, h, spec)
      dw = _dot(do, v, NT)  # [L, S]
      wd = w
      if spec.rate > 0:
        keep = _keep(scalars, spec, first + b, head0 + h, w.shape)
        wd = jnp.where(keep, w / (1.0 - spec.rate), 0.0)
        dw = jnp.where(keep, dw / (1.0 - spec.rate), 0.0)
      dv = _dot(wd.astype(do.dtype), do, TN)  # [S, E]
      ds = w * (dw - jnp.sum(dw * w, axis=-1, keepdims=True))  # [L, S]
      if valid is not None:
        ds = jnp.where(valid, ds, 0.0)
      if spec.has_bias:
        dbias_ref[h] += ds
      dsc = ds.astype(q.dtype)
      dq = _dot(dsc, k, NN)  # [L, E]
      dk = _dot(dsc, q, TN)  # [S, E]
      dq_ref[b, :, cols] = dq.astype(dq_ref.dtype)
      dk_ref[b, :, cols] = dk.astype(dk_ref.dtype)
      dv_ref[b, :, cols] = dv.astype(dv_ref.dtype)
    return carry

  jax.lax.fori_loop(0, spec.block, one, 0)


def _rows(spec: Spec, length: int, width: int):
  """The block of a ``[B, length, H*E]`` array: a block of passages, a
  group's heads."""
  return pl.BlockSpec((spec.block, length, width // spec.groups),
                      lambda g, i: (i, 0, g))


def _in_specs(spec: Spec, q: Array, k: Array, n_rows: int):
  """Block specs of (scalars, q, k, v, [bias], [mask], [q segments, kv
  segments], then ``n_rows`` more arrays shaped like q)."""
  _, l, he = q.shape
  s = k.shape[1]
  blk = spec.block
  rows = lambda n: _rows(spec, n, he)  # noqa: E731
  specs = [pl.BlockSpec(memory_space=pltpu.SMEM), rows(l), rows(s), rows(s)]
  if spec.has_bias:
    specs.append(pl.BlockSpec((spec.heads, l, s), lambda g, i: (g, 0, 0)))
  if spec.has_mask:
    specs.append(pl.BlockSpec((blk, 1, s), lambda g, i: (i, 0, 0)))
  if spec.has_segments:
    specs.append(pl.BlockSpec((blk, l, 1), lambda g, i: (i, 0, 0)))
    specs.append(pl.BlockSpec((blk, 1, s), lambda g, i: (i, 0, 0)))
  return specs + [rows(l)] * n_rows


def _operands(scalars, q, k, v, bias, masks: tuple, spec: Spec) -> list:
  """The kernels' inputs; ``masks`` are the present int32 masks in
  ``_in_specs``' order (key mask, query segments, key segments)."""
  return [scalars, q, k, v] + ([bias] if spec.has_bias else []) + list(masks)


def _cost(spec: Spec, q: Array, k: Array, matmuls: int, arrays: list):
  b, l, he = q.shape
  s = k.shape[1]
  return pl.CostEstimate(
      flops=2 * matmuls * b * l * s * he,
      transcendentals=b * spec.heads * spec.groups * l * s,
      bytes_accessed=sum(int(np.prod(a.shape)) * a.dtype.itemsize
                         for a in arrays))


def _params(arbitrary: bool):
  """The head groups run in parallel; the batch in order where the bias
  gradient sums over it."""
  sem = "arbitrary" if arbitrary else "parallel"
  return pltpu.CompilerParams(dimension_semantics=("parallel", sem),
                              vmem_limit_bytes=VMEM_LIMIT)


def _forward_local(scalars, q, k, v, bias, masks, spec: Spec) -> Array:
  """Context [b, L, H*E] of one shard's passages."""
  ops = _operands(scalars, q, k, v, bias, masks, spec)
  out = jax.ShapeDtypeStruct(q.shape, q.dtype)
  return pl.pallas_call(
      functools.partial(_forward_kernel, spec=spec), out_shape=out,
      grid=(spec.groups, q.shape[0] // spec.block),
      in_specs=_in_specs(spec, q, k, 0),
      out_specs=_in_specs(spec, q, k, 1)[-1],
      compiler_params=_params(False), interpret=spec.interpret,
      cost_estimate=_cost(spec, q, k, 2, ops + [q]), name="t5_attention_fwd",
  )(*ops)


def _backward_local(scalars, q, k, v, bias, masks, do, spec: Spec):
  """(dq, dk, dv, dbias or None) of one shard's passages; dbias is summed
  over them."""
  ops = _operands(scalars, q, k, v, bias, masks, spec) + [do]
  specs = _in_specs(spec, q, k, 1)
  row = lambda n: _rows(spec, n, q.shape[2])  # noqa: E731
  outs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
  out_specs = [row(q.shape[1]), row(k.shape[1]), row(k.shape[1])]
  if spec.has_bias:
    outs.append(jax.ShapeDtypeStruct(bias.shape, jnp.float32))
    out_specs.append(specs[4])
  grads = pl.pallas_call(
      functools.partial(_backward_kernel, spec=spec), out_shape=outs,
      grid=(spec.groups, q.shape[0] // spec.block), in_specs=specs,
      out_specs=out_specs,
      compiler_params=_params(spec.has_bias), interpret=spec.interpret,
      cost_estimate=_cost(spec, q, k, 5, ops + outs), name="t5_attention_bwd",
  )(*ops)
  return (*grads, None) if not spec.has_bias else tuple(grads)


class Plan(NamedTuple):
  """The kernels' spec and, under a mesh, how the call is split (static)."""
  spec: Spec
  mesh: jax.sharding.AbstractMesh | None
  batch_axes: str | tuple[str, ...] | None
  head_axes: str | tuple[str, ...] | None


def _split(plan: Plan, local, operands: list, specs: list, out_specs):
  """``local(scalars, *operands)`` on each shard, the scalars holding the
  dropout seeds and the shard's first passage and head."""
  if plan.mesh is None:
    return local(jnp.zeros((2,), jnp.int32), *operands)

  def body(*ops):
    offsets = []
    for axes, size in ((plan.batch_axes, ops[1].shape[0]),
                       (plan.head_axes, plan.spec.heads * plan.spec.groups)):
      offsets.append(0 if axes is None else
                     jax.lax.axis_index(axes).astype(jnp.int32) * size)
    return local(jnp.stack(offsets).astype(jnp.int32), *ops)

  return jax.shard_map(body, mesh=plan.mesh, in_specs=tuple(specs),
                       out_specs=out_specs, check_vma=False)(*operands)


def _layout(plan: Plan, bias, masks: tuple):
  P = jax.sharding.PartitionSpec
  rows = P(plan.batch_axes, None, plan.head_axes)
  specs = [rows, rows, rows]
  if bias is not None:
    specs.append(P(plan.head_axes, None, None))
  specs.extend(P(plan.batch_axes, None, None) for _ in masks)
  return rows, specs


def _unpack(plan: Plan, ops):
  """(q, k, v, bias or None, masks, rest) of the flat operands."""
  q, k, v, *rest = ops
  bias = rest.pop(0) if plan.spec.has_bias else None
  n = int(plan.spec.has_mask) + 2 * int(plan.spec.has_segments)
  return q, k, v, bias, tuple(rest[:n]), rest[n:]


def _run_forward(plan: Plan, q, k, v, bias, masks, seeds):
  rows, specs = _layout(plan, bias, masks)
  ops = [x for x in (q, k, v, bias) if x is not None] + list(masks)

  def local(offsets, seeds, *ops):
    q, k, v, bias, masks, _ = _unpack(plan, ops)
    scalars = jnp.concatenate([seeds, offsets])
    return _forward_local(scalars, q, k, v, bias, masks, plan.spec)

  return _split(plan, local, [seeds, *ops], [jax.sharding.PartitionSpec(),
                                             *specs], rows)


def _run_backward(plan: Plan, q, k, v, bias, masks, seeds, do):
  rows, specs = _layout(plan, bias, masks)
  ops = [x for x in (q, k, v, bias) if x is not None] + list(masks) + [do]

  def local(offsets, seeds, *ops):
    q, k, v, bias, masks, (do,) = _unpack(plan, ops)
    scalars = jnp.concatenate([seeds, offsets])
    dq, dk, dv, dbias = _backward_local(scalars, q, k, v, bias, masks, do,
                                        plan.spec)
    if dbias is None:
      return dq, dk, dv
    if plan.mesh is not None and plan.batch_axes is not None:
      dbias = jax.lax.psum(dbias, plan.batch_axes)
    return dq, dk, dv, dbias

  out_specs = (rows, rows, rows)
  if bias is not None:
    out_specs += (specs[3],)
  grads = _split(plan, local, [seeds, *ops],
                 [jax.sharding.PartitionSpec(), *specs, rows], out_specs)
  return (*grads, None) if bias is None else tuple(grads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(plan: Plan, q, k, v, bias, masks, seeds):
  return _run_forward(plan, q, k, v, bias, masks, seeds)


def _attention_fwd(plan: Plan, q, k, v, bias, masks, seeds):
  return (_run_forward(plan, q, k, v, bias, masks, seeds),
          (q, k, v, bias, masks, seeds))


def _attention_bwd(plan: Plan, residuals, do):
  q, k, v, bias, masks, seeds = residuals
  dq, dk, dv, dbias = _run_backward(plan, q, k, v, bias, masks, seeds, do)
  return dq, dk, dv, dbias, tuple(None for _ in masks), None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q: Array, k: Array, v: Array, *, bias: Array | None,
              mask: Array | None, rate: float, rng: Array | None,
              interpret: bool,
              segments: tuple[Array, Array] | None = None) -> Array:
  """Context ``[B, L, H, E]`` (q's dtype) of T5 attention (``supported``
  shapes): ``softmax(q k^T + bias, masked)`` with dropout ``rate`` under
  ``rng`` (none when ``rng`` is None), times v. ``segments``, int32 ids of
  the queries ``[B, L]`` and keys ``[B, S]``, masks the scores whose ids
  differ (beside ``mask``'s keys)."""
  b, l, h, e = q.shape
  s = k.shape[1]
  mesh, batch_axes, head_axes, _, local_b, local_h = layout(b, h)
  # what fits in float32 (``supported``) fits in a narrower dtype
  groups, block = (tiling(local_b, local_h, e, l, s, q.dtype.itemsize)
                   or tiling(local_b, local_h, e, l, s, 4))
  rate = rate if rng is not None else 0.0
  spec = Spec(heads=local_h // groups, groups=groups, head_dim=e,
              rate=float(rate), global_heads=h, block=block,
              has_bias=bias is not None, has_mask=mask is not None,
              has_segments=segments is not None, interpret=interpret)
  plan = Plan(spec, mesh, batch_axes, head_axes)
  seeds = (jax.lax.bitcast_convert_type(dropout_masks.seeds(rng), jnp.int32)
           if spec.rate > 0 else jnp.zeros((2,), jnp.int32))
  if bias is not None:
    bias = bias[0].astype(jnp.float32)  # [H, L, S]
  if mask is not None:
    mask = jnp.broadcast_to(mask[:, 0, 0, :], (b, s)).astype(jnp.int32)
    mask = mask[:, None, :]  # [B, 1, S]
  masks = () if mask is None else (mask,)
  if segments is not None:
    q_seg, kv_seg = (x.astype(jnp.int32) for x in segments)
    masks += (q_seg[:, :, None], kv_seg[:, None, :])  # [B, L, 1], [B, 1, S]
  k = k.astype(q.dtype)
  v = v.astype(q.dtype)
  ctx = _attention(plan, q.reshape(b, l, h * e), k.reshape(b, s, h * e),
                   v.reshape(b, s, h * e), bias, masks, seeds)  # [B, L, H*E]
  return ctx.reshape(b, l, h, e)  # [B, L, H, E]
