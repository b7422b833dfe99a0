"""What the fused attention kernel (``fused_attention``) takes and how it
is tiled: shapes, the mesh layout, and the head groups and passages per
grid step that fit the target chip's VMEM."""
from __future__ import annotations

import jax
import numpy as np

from jaxfid.core import sharding as ax

# The longest key length the kernel takes: the [L, S] float32 scores of a
# head and their few temporaries stay within VMEM.
MAX_LENGTH = 1024
# The fewest queries it takes: one decoding position's scores are a row,
# which the reference keeps as small.
MIN_QUERIES = 8
# Bytes of one q/k/v block: passages per grid step are as many as fit.
BLOCK_BYTES = 1 << 20
VMEM_LIMIT = 64 * (1 << 20)  # the scoped VMEM the kernels ask for
# A TensorCore's VMEM where it is less than VMEM_LIMIT (v4: the compiler's
# "Used 16.82M of 16.00M vmem" for ReAtt-large's 16 heads at one group)
VMEM_BYTES = {"TPU v2": 16 << 20, "TPU v3": 16 << 20, "TPU v4": 16 << 20}


def _axis_size(mesh, axes) -> int:
  if axes is None:
    return 1
  names = (axes,) if isinstance(axes, str) else axes
  return int(np.prod([mesh.shape[a] for a in names]))


def _mesh_axes(mesh) -> tuple:
  """(batch axes, head axes, or None when the layout is not the kernel's:
  length or head width split)."""
  if mesh is None:
    return None, None, True
  spec = ax.logical_to_mesh((ax.BATCH, ax.LENGTH, ax.ACT_HEADS, ax.KV),
                            mesh=mesh)
  spec = tuple(spec) + (None,) * (4 - len(spec))
  return spec[0], spec[2], spec[1] is None and spec[3] is None


def _vmem_bytes() -> int:
  """The scoped VMEM the kernels get on the target chip."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh is None or mesh.empty else mesh.abstract_device
  if device is None and jax.default_backend() == "tpu":
    device = jax.devices()[0]
  kind = getattr(device, "device_kind", "")
  return min(VMEM_LIMIT, VMEM_BYTES.get(kind, VMEM_LIMIT))


def layout(b: int, h: int):
  """(mesh or None, batch axes, head axes, whether the layout is the
  kernel's, passages and heads of a shard)."""
  mesh = jax.sharding.get_abstract_mesh()
  mesh = None if mesh is None or mesh.empty else mesh
  batch_axes, head_axes, ok = _mesh_axes(mesh)
  return (mesh, batch_axes, head_axes, ok,
          b // _axis_size(mesh, batch_axes), h // _axis_size(mesh, head_axes))


def supported(q_shape, k_shape, bias_shape, mask_shape,
              segment_shapes=None) -> bool:
  """Whether the kernels take these shapes: q ``[B, L, H, E]``, k/v
  ``[B, S, H, E]`` (as many key heads as query heads), the bias ``[1, H, L,
  S]`` or none, the mask a key mask ``[B or 1, 1, 1, S]`` or none, segment
  ids of queries and keys ``([B, L], [B, S])`` or none, both lengths at
  most ``MAX_LENGTH`` with a :func:`tiling` within VMEM, at least
  ``MIN_QUERIES`` queries (not a decoding step), and a mesh layout that
  splits neither the lengths nor the head width."""
  b, l, h, e = q_shape
  s = k_shape[1]
  if k_shape[0] != b or k_shape[2] != h or max(l, s) > MAX_LENGTH:
    return False
  if bias_shape is not None and tuple(bias_shape) != (1, h, l, s):
    return False
  if mask_shape is not None and (
      len(mask_shape) != 4 or tuple(mask_shape[1:]) != (1, 1, s)
      or mask_shape[0] not in (1, b)):
    return False
  if segment_shapes is not None and tuple(map(tuple, segment_shapes)) != (
      (b, l), (b, s)):
    return False
  _, _, _, ok, local_b, local_h = layout(b, h)
  return ok and l >= MIN_QUERIES and tiling(local_b, local_h, e, l, s,
                                            4) is not None


def vmem_estimate(heads: int, length: int, keys: int, row_bytes: int) -> int:
  """The backward kernel's VMEM (bytes) with ``heads`` per grid step: the
  float32 bias and its gradient ``[H, L, S]`` and 8 float32 score
  temporaries of a head (in tiles of 8 x 128), and 7 q-shaped blocks of
  ``row_bytes``, double-buffered. ReAtt-large's 16 heads x 250 tokens with
  blocks of 512 KB: 17.0 MB; the compiler used 16.82 MB (v4)."""
  scores = -(-length // 8) * 8 * -(-keys // 128) * 128 * 4
  return 2 * heads * scores + 8 * scores + 14 * row_bytes


def tiling(batch: int, heads: int, head_dim: int, length: int, keys: int,
           itemsize: int) -> tuple[int, int] | None:
  """(head groups, passages per grid step) within 3/4 of the target's VMEM:
  the fewest groups (each a multiple of 128 lanes wide, or all heads), then
  the most passages (a divisor of ``batch``; q/k/v blocks of at most
  ``BLOCK_BYTES`` unless one passage is more); None when nothing fits.
  FiD's 12 or 16 heads at 250 tokens are one group on v5e; ReAtt-large's 16
  heads on v4 (16 MiB) two groups of 8."""
  for groups in range(1, heads + 1):
    width = heads // groups * head_dim
    if heads % groups or (groups > 1 and width % 128):
      continue
    per = max(length, keys) * width * itemsize
    for n in range(batch, 0, -1):
      if batch % n or (n > 1 and n * per > BLOCK_BYTES):
        continue
      if (vmem_estimate(heads // groups, length, keys, n * per)
          <= _vmem_bytes() * 3 // 4):
        return groups, n
  return None
