"""A run's device state: mesh, shardings, global batches, init or restore.

The train state is a dict ``{"step", "params", "opt_state", ...}``. A
parameter is sharded by its logical axes, an optimizer-state leaf like the
parameter it mirrors (same path suffix and shape), anything else
replicated.
"""
from __future__ import annotations

import dataclasses
import signal
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxfid.checkpoints.model_dir import RunCheckpoints
from jaxfid.core import sharding as shd
from jaxfid.core.errors import InputError


def checked_mesh(mesh: str, batch_size: int, accumulation_steps: int = 1,
                 devices=None) -> Mesh:
  """The device mesh of a ``MESH`` spec over ``devices`` (default
  ``jax.devices()``; AOT passes a topology's); InputError (MESH, BATCH_SIZE)
  for a bad spec or a batch that does not split over the data devices."""
  try:
    device_mesh = shd.parse_mesh(mesh, devices=devices)
  except ValueError as e:
    raise InputError("MESH", str(e)) from None
  data_parallel = device_mesh.shape["data"] * device_mesh.shape["fsdp"]
  if batch_size % (data_parallel * accumulation_steps):
    raise InputError("BATCH_SIZE", f"{batch_size} is not divisible by the "
                     f"data-parallel size {data_parallel} (MESH {mesh!r}, "
                     f"{len(device_mesh.devices.flat)} devices) times "
                     f"ACCUMULATION_STEPS {accumulation_steps}")
  return device_mesh


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a run's arrays live: parameters, batches, replicated values."""
  mesh: Mesh
  params: Any                 # NamedSharding per parameter (the params tree)
  batch: NamedSharding        # leading (batch) axis over data and fsdp
  replicated: NamedSharding

  def state(self, abstract_state: Any, abstract_params: Any) -> Any:
    """Shardings of a train state (see the module docstring)."""
    return state_shardings(abstract_state, abstract_params, self.params,
                           self.replicated)

  def batch_rows(self, batch_size: int) -> slice:
    """The rows of a global batch this process supplies (contiguous)."""
    index_map = self.batch.addressable_devices_indices_map((batch_size,))
    starts = sorted({(i[0].start or 0, i[0].stop if i[0].stop is not None
                      else batch_size) for i in index_map.values()})
    lo, hi = starts[0][0], max(stop for _, stop in starts)
    covered = sum(stop - start for start, stop in starts)
    if covered != hi - lo:
      raise InputError("MESH", "this process's devices hold rows of the batch "
                       "that are not contiguous; reorder the mesh")
    return slice(lo, hi)

  def global_batch(self, host_batch: Any, rows: slice, batch_size: int) -> Any:
    """Global arrays from this process's rows, every leaf's leading axis the
    batch axis or a multiple of it (a dual encoder's B*(1+H) passages)."""
    local = rows.stop - rows.start

    def put(x):
      x = np.asarray(x)
      shape = (x.shape[0] * batch_size // local, *x.shape[1:])
      return jax.make_array_from_process_local_data(self.batch, x, shape)
    return jax.tree.map(put, host_batch)

  def replicate(self, tree: Any) -> Any:
    return jax.device_put(tree, self.replicated)

  @property
  def data_parallel(self) -> int:
    return self.mesh.shape["data"] * self.mesh.shape["fsdp"]

  def eval_batch_size(self, batch_size: int) -> int:
    """``batch_size`` rounded up to split over the data-parallel devices."""
    return -(-batch_size // self.data_parallel) * self.data_parallel

  def shard(self, host_batch: Any) -> Any:
    """An evaluation batch (the same on every process) sharded over the data
    axes; evaluating functions must return replicated outputs."""
    return jax.device_put(host_batch, self.batch)


def placement(mesh: Mesh, param_axes: Any) -> Placement:
  """The placement of a model whose parameters carry ``param_axes``."""
  is_axes = lambda x: isinstance(x, tuple) and all(
      isinstance(a, (str, type(None))) for a in x)
  params = jax.tree.map(
      lambda axes: NamedSharding(mesh, shd.logical_to_mesh(axes, mesh=mesh)),
      param_axes, is_leaf=is_axes)
  batch = NamedSharding(mesh, shd.logical_to_mesh((shd.BATCH,), mesh=mesh))
  return Placement(mesh, params, batch, NamedSharding(mesh, PartitionSpec()))


def _names(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
               for k in path)


def state_shardings(abstract_state: Any, abstract_params: Any,
                    param_shardings: Any, replicated: NamedSharding) -> Any:
  """A sharding for every leaf of ``abstract_state`` (module docstring)."""
  by_path, shapes = {}, {}
  jax.tree_util.tree_map_with_path(
      lambda p, s: by_path.setdefault(_names(p), s), param_shardings)
  jax.tree_util.tree_map_with_path(
      lambda p, a: shapes.setdefault(_names(p), tuple(a.shape)),
      abstract_params)

  def pick(path, leaf):
    names = _names(path)
    for i in range(len(names)):
      tail = names[i:]
      if tail in by_path and shapes[tail] == tuple(leaf.shape):
        return by_path[tail]
    return replicated

  return jax.tree_util.tree_map_with_path(pick, abstract_state)


def abstract_with(abstract: Any, shardings: Any) -> Any:
  """``ShapeDtypeStruct`` leaves carrying the given shardings (for restores)."""
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(
      s.shape, s.dtype, sharding=sh), abstract, shardings)


def restore_state(ckpts: RunCheckpoints, step: int, abstract_state: Any,
                  shardings: Any) -> Any:
  """The checkpoint of ``step``, placed with ``shardings`` (any mesh)."""
  return ckpts.restore(abstract_with(abstract_state, shardings), step)


def fresh_state(make_state: Callable[[Any, int], Any], params: Any, step: int,
                shardings: Any) -> Any:
  """``make_state(params, step)`` computed sharded (params may be host)."""
  return jax.jit(lambda p: make_state(p, jnp.asarray(step, jnp.int32)),
                 out_shardings=shardings)(params)


class Preemption:
  """SIGTERM and Ctrl-C as a flag the loop checks after each step (which
  finishes, checkpoints and stops; a second Ctrl-C stops at once);
  :meth:`agreed` all-gathers it so every process stops at the same step."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self.signal_name = ""
    self._previous: dict = {}

  def agreed(self) -> bool:
    """Whether any process was asked to stop (the same answer everywhere)."""
    if jax.process_count() == 1:
      return self.requested
    flags = multihost_utils.process_allgather(
        np.asarray(self.requested, np.int32))
    if np.any(flags) and not self.signal_name:
      self.signal_name = "SIGTERM"  # another process's
    return bool(np.any(flags))

  def __enter__(self):
    for sig in self.SIGNALS:
      try:
        self._previous[sig] = signal.signal(sig, self._handler)
      except ValueError:  # not the main thread
        pass
    return self

  def _handler(self, signum, frame):
    del frame
    self.requested = True
    self.signal_name = signal.Signals(signum).name
    if signum == signal.SIGINT:  # the next Ctrl-C interrupts at once
      signal.signal(signal.SIGINT, self._previous.get(
          signal.SIGINT, signal.default_int_handler))
      print("\nCtrl-C: saving a checkpoint after this step (again to stop "
            "at once)", file=sys.stderr)

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)
