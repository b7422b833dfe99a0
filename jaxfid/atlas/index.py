"""The in-loop passage index: every passage's embedding on the device mesh,
its rows sharded over all devices, searched exactly.

Letters: N passages, R = N rounded up (rows), S shards (the mesh's devices),
D embedding width, Q queries, k hits.

* Storage: one array [R, D] of ``INDEX_DTYPE`` (bfloat16 by default) with
  ``PartitionSpec(<every mesh axis>, None)``: each device holds R/S
  consecutive rows (Atlas's ``src/index.py`` keeps each GPU's share the
  same way). Rows past N are padding and never returned.
* Search (:meth:`PassageIndex.search`): ``shard_map`` over the mesh; each
  device scores the queries against its rows (queries cast to the storage
  dtype, products accumulated in float32), keeps its own top k, and the
  S x k candidates are all-gathered and merged by a second top k: the
  exact inner-product top k of the whole index, on every device.
* Build (:meth:`PassageIndex.build`): the passage encoder over the corpus's
  tokens, ``INDEX_BATCH_SIZE`` rows per call, each batch written into its
  rows of the sharded array on the device (nothing is gathered to a host).
* Save / load (:func:`save_index`, :func:`load_index`): ``DIR/meta.json``
  and ``DIR/embeddings.npy`` (the first N rows, bfloat16 stored as its
  uint16 bits); a load places the rows on any mesh, so a saved index
  re-shards to another device count. ``meta.json`` is written last: a
  directory without it is an interrupted save.
"""
from __future__ import annotations

import json
import math
import os
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxfid.core.errors import InputError
from jaxfid.core.files import atomic_write

Array = jax.Array
META, EMBEDDINGS = "meta.json", "embeddings.npy"
DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}


class PassageIndex:
  """N passage embeddings sharded by rows over ``mesh`` (module docstring).

  Args:
    mesh: the run's device mesh; rows are split over all its axes.
    num_passages: N.
    dim: D.
    dtype: 'bfloat16' or 'float32'.
    batch_size: rows per encoder call of :meth:`build` (R is a multiple of
      it and of the device count, so no batch is cut).
  """

  def __init__(self, mesh: Mesh, num_passages: int, dim: int,
               dtype: str = "bfloat16", batch_size: int = 256):
    if num_passages < 1:
      raise ValueError("an index needs at least one passage")
    self.mesh, self.num_passages, self.dim = mesh, num_passages, dim
    self.dtype_name, self.dtype = dtype, DTYPES[dtype]
    self.axes = tuple(mesh.axis_names)
    self.shards = mesh.size
    self.batch_size = batch_size
    unit = math.lcm(self.shards, batch_size)
    self.rows = -(-num_passages // unit) * unit
    self.sharding = NamedSharding(mesh, PartitionSpec(self.axes, None))
    self.replicated = NamedSharding(mesh, PartitionSpec())
    self.embeddings: Array | None = None
    self._search_fns: dict[int, Callable] = {}
    self._write_fn: tuple | None = None

  # ---- contents ------------------------------------------------------------

  def zeros(self) -> Array:
    return jax.jit(lambda: jnp.zeros((self.rows, self.dim), self.dtype),
                   out_shardings=self.sharding)()

  def set_rows(self, host: np.ndarray) -> None:
    """The first N rows from a host array [N, D] (any float dtype)."""
    host = np.asarray(host)
    if host.shape != (self.num_passages, self.dim):
      raise ValueError(f"expected [{self.num_passages}, {self.dim}] "
                       f"embeddings, got {list(host.shape)}")
    full = np.zeros((self.rows, self.dim), self.dtype)
    full[:self.num_passages] = host.astype(self.dtype)
    self.embeddings = jax.make_array_from_callback(
        full.shape, self.sharding, lambda index: full[index])

  def host_rows(self) -> np.ndarray:
    """The first N rows as a host array of the storage dtype."""
    full = multihost_utils.process_allgather(self.embeddings, tiled=True)
    return np.asarray(full)[:self.num_passages]

  def build(self, embed: Callable[[object, Array], Array], params,
            tokens: np.ndarray,
            progress: Callable[[int], None] | None = None) -> None:
    """Embed every passage: ``embed(params, tokens [b, P]) -> [b, D]`` (a
    pure function, jitted once per index), ``tokens`` the corpus's
    retriever tokens [N, P]."""
    if len(tokens) != self.num_passages:
      raise ValueError(f"{len(tokens)} token rows for {self.num_passages} "
                       "passages")
    if self._write_fn is None or self._write_fn[0] is not embed:
      self._write_fn = (embed, jax.jit(
          lambda index, p, toks, start: jax.lax.dynamic_update_slice(
              index, embed(p, toks).astype(self.dtype), (start, 0)),
          out_shardings=self.sharding, donate_argnums=0))
    write = self._write_fn[1]
    out = self.zeros()
    b = self.batch_size
    for start in range(0, self.num_passages, b):
      chunk = np.zeros((b, tokens.shape[1]), np.int32)
      part = tokens[start:start + b]
      chunk[:len(part)] = part
      out = write(out, params, jax.device_put(chunk, self.replicated),
                  np.int32(start))
      if progress is not None:
        progress(len(part))
    self.embeddings = out

  # ---- search --------------------------------------------------------------

  def search(self, queries: Array, k: int) -> tuple[Array, Array]:
    """(scores float32 [Q, k], ids int32 [Q, k]) of the best k passages per
    query [Q, D] by inner product, best first; replicated."""
    if k > self.num_passages:
      raise ValueError(f"k={k} is more than the {self.num_passages} passages")
    if k not in self._search_fns:
      self._search_fns[k] = jax.jit(self._search_program(k),
                                    out_shardings=(self.replicated,
                                                   self.replicated))
    return self._search_fns[k](queries, self.embeddings)

  def _search_program(self, k: int):
    axes, n = self.axes, self.num_passages
    local_rows = self.rows // self.shards
    kk = min(k, local_rows)

    def local(q, rows):                    # q [Q, D], rows [R/S, D]
      offset = jax.lax.axis_index(axes) * local_rows
      scores = jax.lax.dot_general(
          q.astype(rows.dtype), rows, (((1,), (1,)), ((), ())),
          preferred_element_type=jnp.float32)                 # [Q, R/S]
      ids = offset + jnp.arange(local_rows, dtype=jnp.int32)  # [R/S]
      scores = jnp.where(ids[None, :] < n, scores, -jnp.inf)
      top, pos = jax.lax.top_k(scores, kk)                    # [Q, kk]
      all_top = jax.lax.all_gather(top, axes, axis=1, tiled=True)  # [Q, S*kk]
      all_ids = jax.lax.all_gather(ids[pos], axes, axis=1, tiled=True)
      best, where = jax.lax.top_k(all_top, k)                 # [Q, k]
      return best, jnp.take_along_axis(all_ids, where, axis=1)

    return jax.shard_map(local, mesh=self.mesh,
                         in_specs=(PartitionSpec(), PartitionSpec(axes, None)),
                         out_specs=(PartitionSpec(), PartitionSpec()),
                         check_vma=False)


# ---- on disk ------------------------------------------------------------------


def save_index(index: PassageIndex, directory: str, **meta) -> None:
  """Writes ``index`` to ``directory`` (process 0; every process gathers)."""
  rows = index.host_rows()
  if jax.process_index() != 0:
    return
  os.makedirs(directory, exist_ok=True)
  bits = rows.view(np.uint16) if index.dtype_name == "bfloat16" else rows
  with atomic_write(os.path.join(directory, EMBEDDINGS), "wb") as f:
    np.save(f, bits)
  with atomic_write(os.path.join(directory, META)) as f:
    json.dump({"num_passages": index.num_passages, "dim": index.dim,
               "dtype": index.dtype_name, **meta}, f)


def read_meta(directory: str) -> dict | None:
  """A saved index's meta.json, or None when there is no complete one."""
  path = os.path.join(directory, META)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def load_index(directory: str, mesh: Mesh, batch_size: int = 256
               ) -> PassageIndex:
  """A saved index, its rows sharded over ``mesh`` (any device count)."""
  meta = read_meta(directory)
  if meta is None:
    raise InputError(directory, f"no complete index ({META} missing)")
  index = PassageIndex(mesh, meta["num_passages"], meta["dim"], meta["dtype"],
                       batch_size)
  rows = np.load(os.path.join(directory, EMBEDDINGS))
  if meta["dtype"] == "bfloat16":
    rows = rows.view(ml_dtypes.bfloat16)
  index.set_rows(rows)
  return index
