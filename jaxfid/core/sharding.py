"""Logical axis names and the one table that maps them onto a device mesh.

Models only *name* axes (constants below); they never see a mesh. The trainer
builds a ``jax.sharding.Mesh`` with axes ``data``, ``fsdp`` and ``model`` and
turns logical names into ``PartitionSpec``s with :func:`logical_to_mesh`.
Follows t5x's ``standard_logical_axis_rules`` and maxtext's ``common_types``.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

# Parameter axes.
VOCAB = "vocab"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV = "kv"
JOINED_KV = "joined_kv"  # heads * kv, flattened (T5X kernel layout)
RELPOS_BUCKETS = "relpos_buckets"
NEIGHBOURS = "neighbours"      # ReFusion: retrieved neighbours (top-k ranks)
DB_EMBED = "db_embed"          # ReFusion: the retrieval database's width
ARCH_CHOICES = "arch_choices"  # ReFusion: the integrator's candidate modules
# Activation axes (``jaxfid.t5.layers.ACT_*`` combines them per tensor).
BATCH = "batch"
LENGTH = "length"
ACT_EMBED = "activation_embed"  # the residual stream's d_model
ACT_HEADS = "activation_heads"  # attention heads of q/k/v and the context
ACT_MLP = "activation_mlp"      # the MLP hidden
ACT_VOCAB = "activation_vocab"  # output logits

MESH_AXES = ("data", "fsdp", "model")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated).
# Parameters: tensor-parallel over `model` (Megatron layout), and the embed
# dimension sharded over `fsdp` (ZeRO-3 style, gathered by XLA per use).
# Activations: batch over every data-parallel axis; heads, MLP hidden and
# logits over `model` like the kernels that produce them, so tensor
# parallelism keeps them sharded; the residual stream replicated over `model`.
LOGICAL_AXIS_RULES: tuple[tuple[str, object], ...] = (
    (VOCAB, "model"),
    (EMBED, "fsdp"),
    (MLP, "model"),
    (HEADS, "model"),
    (JOINED_KV, "model"),
    (KV, None),
    (RELPOS_BUCKETS, None),
    (NEIGHBOURS, None),
    (DB_EMBED, None),
    (ARCH_CHOICES, None),
    (BATCH, ("data", "fsdp")),
    (LENGTH, None),
    (ACT_EMBED, None),
    (ACT_HEADS, "model"),
    (ACT_MLP, "model"),
    (ACT_VOCAB, "model"),
)


def logical_to_mesh(axes: Sequence[str | None], rules=LOGICAL_AXIS_RULES,
                    mesh: Mesh | None = None) -> PartitionSpec:
  """PartitionSpec for logical axis names; each mesh axis used at most once,
  those of size 1 (or absent) dropped."""
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for name in axes:
    target = table.get(name) if name is not None else None
    if target is None:
      spec.append(None)
      continue
    targets = (target,) if isinstance(target, str) else tuple(target)
    keep = []
    for t in targets:
      if t in used:
        continue
      if mesh is not None and (t not in mesh.shape or mesh.shape[t] == 1):
        continue
      keep.append(t)
    used.update(keep)
    spec.append(None if not keep else keep[0] if len(keep) == 1 else tuple(keep))
  return PartitionSpec(*spec)


def mesh_axis_sizes(spec: str) -> dict[str, int]:
  """The axis sizes a ``MESH`` string asks for, without devices: '' ->
  ``{}``, else ``axis=size,...`` over :data:`MESH_AXES` (missing ones 1, at
  most one -1 kept as -1). ValueError naming the problem."""
  spec = (spec or "").strip()
  if not spec:
    return {}
  sizes = {a: 1 for a in MESH_AXES}
  for part in spec.split(","):
    name, _, value = part.partition("=")
    name, value = name.strip(), value.strip()
    if (name not in sizes or not value.lstrip("-").isdigit()
        or (int(value) < 1 and int(value) != -1)):
      raise ValueError(f"bad MESH {spec!r}: expected e.g. 'data=4,model=2' "
                       f"with axes from {MESH_AXES} and sizes >= 1 (or one "
                       "-1)")
    sizes[name] = int(value)
  if list(sizes.values()).count(-1) > 1:
    raise ValueError(f"bad MESH {spec!r}: at most one axis may be -1")
  return sizes


def data_parallel_size(sizes: dict[str, int]) -> int | None:
  """``data * fsdp`` of :func:`mesh_axis_sizes`' answer, where the string
  fixes them (None: they depend on the device count)."""
  data, fsdp = sizes.get("data", -1), sizes.get("fsdp", 1)
  return None if -1 in (data, fsdp) else data * fsdp


def parse_mesh(spec: str, devices=None) -> Mesh:
  """A mesh from a string such as ``'data=4,model=2'`` (missing axes 1, one
  -1 takes the remaining devices, '' all on ``data``; fewer than all devices
  uses the first). ValueError for a bad string or too few devices."""
  devices = list(devices if devices is not None else jax.devices())
  sizes = mesh_axis_sizes(spec) or {"data": len(devices), "fsdp": 1,
                                    "model": 1}
  free = [a for a, s in sizes.items() if s == -1]
  if free:
    known = int(np.prod([s for s in sizes.values() if s != -1]))
    sizes[free[0]] = len(devices) // known
  total = int(np.prod(list(sizes.values())))
  if total > len(devices) or total < 1:
    raise ValueError(f"MESH {spec!r} needs {total} devices; "
                     f"{len(devices)} are available")
  devices = devices[:total]  # a smaller mesh uses the first devices
  grid = np.asarray(devices).reshape([sizes[a] for a in MESH_AXES])
  return Mesh(grid, MESH_AXES)


def with_logical_constraint(x: jax.Array, axes: Sequence[str | None]):
  """Activation sharding constraint by logical names; a no-op without a
  mesh (the T5 layers' ``jaxfid.t5.layers.ACT_*`` points)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return x
  spec = logical_to_mesh(axes, mesh=mesh)
  return jax.lax.with_sharding_constraint(x, spec)


def gathered_for_use(kernel: jax.Array, axes: Sequence[str | None]):
  """A parameter constrained to its layout at use (no-op without a mesh):
  its ``embed`` axis's ``fsdp`` shards gathered inside the layer's remat, so
  the gradient is reduce-scattered back (ZeRO-3)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return kernel
  spec = logical_to_mesh([None if a == EMBED else a for a in axes], mesh=mesh)
  if spec == logical_to_mesh(axes, mesh=mesh):
    return kernel  # no fsdp split of it on this mesh: the program is unchanged
  return jax.lax.with_sharding_constraint(kernel, spec)

