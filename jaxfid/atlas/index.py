"""The in-loop passage index: every passage's embedding on the device mesh,
its rows sharded over all devices, searched exactly.

Letters: N passages, S shards (the mesh's devices), B = ``INDEX_BATCH_SIZE``
(the most passages a device embeds per encoder call), J build steps, b'
passages a device embeds a step, R = S * J * b' rows (N rounded up), P
tokens per passage, D embedding width, Q queries, k hits.

* Storage: one array [R, D] of ``INDEX_DTYPE`` (bfloat16 by default) with
  ``PartitionSpec(<every mesh axis>, None)``: each device holds R/S
  consecutive rows (Atlas's ``src/index.py`` keeps each GPU's share the
  same way). Rows past N are padding and never returned.
* int8 (:func:`quantize_int8`): symmetric per-row quantisation, row r
  stored as int8 codes ``c[r] = round(x[r] / s[r])`` in [-127, 127] with
  one float32 scale ``s[r] = max|x[r]| / 127`` (0 for a zero row), the
  scales [R] sharded by rows like the codes: D + 4 bytes a row, against
  2D (bfloat16) and 4D (float32).
* Search (:meth:`PassageIndex.search`): ``shard_map`` over the mesh; each
  device scores the queries against its rows (queries cast to the storage
  dtype, products accumulated in float32; int8: float32 queries against
  the codes, then times each row's scale, ``q . c[r] * s[r]``) in L =
  ceil((R/S) / max(``search_block``, k)) blocks of C = max(k, ceil((R/S) / L))
  rows (at most R/S; the last block ends at R/S and masks the rows it shares
  with the one before), keeping a running top k (``fori_loop``: each block's
  [Q, C] scores merged with the [Q, k] kept so far, kept first). A search so
  holds [Q, C] float32 scores (int8: a [C, D] float32 copy of the codes),
  not [Q, R/S]; a tie keeps the lower id, as one top k over all the
  device's rows would. The S x k candidates are all-gathered and merged by
  a second top k: the exact inner-product top k of the whole (quantised)
  index, on every device.
* Build (:meth:`PassageIndex.build`): each device embeds the passages of
  its own rows, as each Atlas GPU embeds its share (``src/index.py``,
  ``src/atlas.py`` ``build_index``). J = ceil(N / (S * B)) steps of
  b' = ceil(N / (S * J)) <= B passages a device (the batch evened out over
  the steps, so a small corpus is not padded to S * B rows): step j gives
  device i the tokens of rows i * R/S + j * b' .. + b', one global array
  [S, b', P] sharded on its first axis over every mesh axis, and writes the
  embeddings [S, b', D] into the rows viewed as [S, R/S, D] at
  (0, j * b', 0): a write local to each shard, no collective, and nothing
  gathered to a host. Per device a build is J encoder calls of b'
  passages: 1/S of the corpus's compute.
* Save / load (:func:`save_index`, :func:`load_index`): ``DIR/meta.json``
  (``"type": "atlas"``, what ``jaxfid retrieve`` opens it by) and
  ``DIR/embeddings.npy`` (the first N rows, bfloat16 stored as its uint16
  bits, int8 as its codes, with ``DIR/scales.npy`` float32 [N]); a save
  gathers the rows to every process and process 0 writes them; a load
  places the rows on any mesh, so a saved index re-shards to another
  device count, and memory-maps the files, so each process reads only its
  own devices' rows. ``meta.json`` is written last: a directory without it
  is an interrupted save.
"""
from __future__ import annotations

import json
import os
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxfid.core.errors import InputError
from jaxfid.runtime.files import atomic_write

Array = jax.Array
META, EMBEDDINGS, SCALES = "meta.json", "embeddings.npy", "scales.npy"
INDEX_TYPE = "atlas"  # meta.json's "type" (jaxfid.retrieval.search)
DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "int8": jnp.int8}
INT8_MAX = 127
# The most rows a device scores at once in a search (C, unless k is more):
# [Q, C] float32 scores, 128 MiB for 256 queries (int8: and a [C, D]
# float32 copy of the codes where XLA does not fuse the conversion).
SEARCH_BLOCK = 131072


def quantize_int8(x, xp=jnp) -> tuple[Array, Array]:
  """Symmetric per-row int8: (codes int8 [n, D], scales float32 [n]) with
  ``x[r] ~= codes[r] * scales[r]``; a zero row has scale 0 and codes 0.
  ``xp``: ``jax.numpy`` (on a device) or ``numpy`` (on the host)."""
  x = xp.asarray(x, xp.float32)                                    # [n, D]
  scales = xp.max(xp.abs(x), axis=1) / xp.float32(INT8_MAX)        # [n]
  safe = xp.where(scales > 0, scales, xp.float32(1))
  codes = xp.clip(xp.round(x / safe[:, None]), -INT8_MAX, INT8_MAX)
  return codes.astype(xp.int8), scales


class PassageIndex:
  """N passage embeddings sharded by rows over ``mesh`` (module docstring).

  Args:
    mesh: the run's device mesh; rows are split over all its axes.
    num_passages: N.
    dim: D.
    dtype: 'bfloat16', 'float32' or 'int8' (codes and per-row scales).
    batch_size: B, the most passages each device embeds per encoder call
      of :meth:`build` (Atlas's ``--per_gpu_embedder_batch_size``; on one
      device, the passages per call). R = S * J * b' (module docstring),
      so no step is cut.
    search_block: C, the most rows a device scores at once in a
      :meth:`search` (at least k; module docstring).
  """

  def __init__(self, mesh: Mesh, num_passages: int, dim: int,
               dtype: str = "bfloat16", batch_size: int = 256,
               search_block: int = SEARCH_BLOCK):
    if num_passages < 1:
      raise ValueError("an index needs at least one passage")
    self.mesh, self.num_passages, self.dim = mesh, num_passages, dim
    self.dtype_name, self.dtype = dtype, DTYPES[dtype]
    self.axes = tuple(mesh.axis_names)
    self.shards = mesh.size
    self.batch_size, self.search_block = batch_size, search_block
    self.steps = -(-num_passages // (self.shards * batch_size))     # J
    self.local_batch = -(-num_passages // (self.shards * self.steps))  # b'
    self.rows = self.shards * self.steps * self.local_batch          # R
    self.local_rows = self.rows // self.shards                       # R/S
    self.sharding = NamedSharding(mesh, PartitionSpec(self.axes, None))
    self.row_sharding = NamedSharding(mesh, PartitionSpec(self.axes))
    self.step_sharding = NamedSharding(mesh, PartitionSpec(self.axes, None,
                                                           None))
    self.replicated = NamedSharding(mesh, PartitionSpec())
    self.quantized = dtype == "int8"
    self.embeddings: Array | None = None   # [R, D] of dtype (int8: codes)
    self.scales: Array | None = None       # int8: float32 [R], else None
    self._search_fns: dict[int, Callable] = {}
    self._write_fn: tuple | None = None

  # ---- contents ------------------------------------------------------------

  def zeros(self) -> tuple[Array, Array | None]:
    """(embeddings [R, D], scales [R] or None), zero, on the mesh."""
    return jax.jit(
        lambda: (jnp.zeros((self.rows, self.dim), self.dtype),
                 jnp.zeros((self.rows,), jnp.float32) if self.quantized
                 else None),
        out_shardings=(self.sharding, self.row_sharding))()

  def _place(self, host: np.ndarray, sharding, shape, dtype) -> Array:
    """``host`` (its first axis the first N rows; an array or a memory-mapped
    file) padded to ``shape`` with zeros, cast to ``dtype`` and placed with
    ``sharding``. Each device's rows are read from ``host`` alone: a process
    reads only its own devices' rows of a memory-mapped file, and no padded
    copy of the whole index is made."""
    n = self.num_passages

    def rows(index):                       # index[0]: the rows wanted
      first, end, _ = index[0].indices(shape[0])
      part = np.zeros((end - first,) + shape[1:], dtype)
      if first < n:
        part[:min(end, n) - first] = host[first:min(end, n)]
      return part[(slice(None),) + tuple(index[1:])]
    return jax.make_array_from_callback(shape, sharding, rows)

  def set_rows(self, host: np.ndarray) -> None:
    """The first N rows from a host array [N, D] (any float dtype; int8
    storage quantises it, :func:`quantize_int8`)."""
    host = np.asarray(host)
    if host.shape != (self.num_passages, self.dim):
      raise ValueError(f"expected [{self.num_passages}, {self.dim}] "
                       f"embeddings, got {list(host.shape)}")
    if self.quantized:  # on the host: no device holds all N rows at once
      self.set_codes(*quantize_int8(host, xp=np))
      return
    self.embeddings = self._place(host, self.sharding,
                                  (self.rows, self.dim), self.dtype)

  def set_codes(self, codes: np.ndarray, scales: np.ndarray) -> None:
    """int8 storage: the first N rows' codes [N, D] and scales [N]."""
    if not self.quantized:
      raise ValueError(f"a {self.dtype_name} index has no int8 codes")
    if codes.shape != (self.num_passages, self.dim) or scales.shape != (
        self.num_passages,):
      raise ValueError(f"expected codes [{self.num_passages}, {self.dim}] "
                       f"and scales [{self.num_passages}], got "
                       f"{list(codes.shape)} and {list(scales.shape)}")
    self.embeddings = self._place(codes, self.sharding,
                                  (self.rows, self.dim), np.int8)
    self.scales = self._place(scales, self.row_sharding, (self.rows,),
                              np.float32)

  def _host(self, stored: Array) -> np.ndarray:
    """The first N rows of a row-sharded array, gathered to every host."""
    full = multihost_utils.process_allgather(stored, tiled=True)
    return np.asarray(full)[:self.num_passages]

  def host_rows(self) -> np.ndarray:
    """The first N rows as a host array of the storage dtype (int8: the
    codes; :meth:`host_scales` their scales)."""
    return self._host(self.embeddings)

  def host_scales(self) -> np.ndarray:
    """int8 storage: the first N rows' scales, float32 [N]."""
    return self._host(self.scales)

  def device_bytes(self) -> int:
    """Bytes of the index on each device (its rows, and int8's scales)."""
    per_row = self.dim * np.dtype(self.dtype).itemsize + 4 * self.quantized
    return self.rows // self.shards * per_row

  def build(self, embed: Callable[[object, Array], Array], params,
            tokens: np.ndarray,
            progress: Callable[[int], None] | None = None) -> None:
    """Embed every passage: ``embed(params, tokens [b, P]) -> [b, D]`` (a
    pure function of each row, jitted once per index), ``tokens`` the
    corpus's retriever tokens [N, P]; J steps, each device embedding b' of
    its own rows a step (module docstring). ``progress(n)`` after each step,
    n the passages (not padding) it embedded."""
    if len(tokens) != self.num_passages:
      raise ValueError(f"{len(tokens)} token rows for {self.num_passages} "
                       "passages")
    write = self.write_program(embed)
    out = self.zeros()
    for step in range(self.steps):
      start = step * self.local_batch
      out = write(out, params, self.step_tokens(tokens, step),
                  np.int32(start))
      if progress is not None:
        progress(sum(max(0, min(self.local_batch,
                                self.num_passages - i * self.local_rows
                                - start))
                     for i in range(self.shards)))
    self.embeddings, self.scales = out

  def step_tokens(self, tokens: np.ndarray, step: int) -> Array:
    """Step ``step``'s tokens, int32 [S, b', P] sharded on the first axis:
    row (i, t) holds passage i * R/S + step * b' + t (zeros past N). Each
    process slices only its own devices' rows (multi-host)."""
    b, shape = self.local_batch, (self.shards, self.local_batch,
                                  tokens.shape[1])

    def rows(index):                       # index[0]: the shards wanted
      shards = range(*index[0].indices(self.shards))
      part = np.zeros((len(shards),) + shape[1:], np.int32)   # [s, b', P]
      for n, i in enumerate(shards):
        first = i * self.local_rows + step * b
        got = tokens[first:min(first + b, self.num_passages)]
        part[n, :len(got)] = got
      return part[(slice(None),) + tuple(index[1:])]
    return jax.make_array_from_callback(shape, self.step_sharding, rows)

  def write_program(self, embed: Callable[[object, Array], Array]):
    """The jitted step of :meth:`build` for ``embed`` (compiled once per
    index): (index, params, tokens [S, b', P], start) -> the index with
    each shard's rows start..start+b' embedded (int8: quantised on the
    device); the index's buffers are donated."""
    if self._write_fn is None or self._write_fn[0] is not embed:
      self._write_fn = (embed, jax.jit(
          self._write_program(embed), donate_argnums=0,
          out_shardings=(self.sharding, self.row_sharding)))
    return self._write_fn[1]

  def _write_program(self, embed):
    """(index (rows [R, D], scales [R] or None), params, tokens [S, b', P],
    start) -> the index with rows i * R/S + start .. + b' of every shard i
    embedded (:meth:`write_program`)."""
    s, local, d = self.shards, self.local_rows, self.dim

    def put(stored, new, start):
      """``new`` [S, b', ...] into ``stored`` [R, ...] viewed as
      [S, R/S, ...] at (0, start, 0...): each shard writes its own rows."""
      view = stored.reshape((s, local) + stored.shape[1:])    # [S, R/S, ...]
      at = (0, start) + (0,) * (stored.ndim - 1)
      return jax.lax.dynamic_update_slice(view, new, at).reshape(stored.shape)

    def write(index, params, tokens, start):
      rows, scales = index                          # [R, D], [R] or None
      _, b, p = tokens.shape                        # [S, b', P]
      x = embed(params, tokens.reshape(s * b, p))                # [S*b', D]
      x = jax.lax.with_sharding_constraint(
          x.reshape(s, b, d), self.step_sharding)                # [S, b', D]
      if not self.quantized:
        return put(rows, x.astype(self.dtype), start), None
      codes, sc = quantize_int8(x.reshape(s * b, d))  # [S*b', D], [S*b']
      return (put(rows, codes.reshape(s, b, d), start),
              put(scales, sc.reshape(s, b), start))
    return write

  # ---- search --------------------------------------------------------------

  def search(self, queries: Array, k: int) -> tuple[Array, Array]:
    """(scores float32 [Q, k], ids int32 [Q, k]) of the best k passages per
    query [Q, D] by inner product, best first; replicated."""
    if k > self.num_passages:
      raise ValueError(f"k={k} is more than the {self.num_passages} passages")
    stored = ((self.embeddings, self.scales) if self.quantized
              else (self.embeddings,))
    return self.search_program(k)(queries, *stored)

  def search_program(self, k: int):
    """The jitted search for ``k`` hits (compiled once per query shape):
    (queries [Q, D], rows [R, D][, scales [R]]) -> (scores [Q, k], ids
    [Q, k]), replicated."""
    if k not in self._search_fns:
      self._search_fns[k] = jax.jit(self._search_program(k),
                                    out_shardings=(self.replicated,
                                                   self.replicated))
    return self._search_fns[k]

  def _search_program(self, k: int):
    """(queries [Q, D], rows [R, D][, scales [R]]) -> (scores [Q, k], ids
    [Q, k]); each device's rows scored in blocks of C with a running top k
    (module docstring)."""
    axes, n, local_rows = self.axes, self.num_passages, self.local_rows
    kk = min(k, local_rows)
    blocks = -(-local_rows // max(self.search_block, kk))     # L
    c = min(local_rows, max(kk, -(-local_rows // blocks)))    # C (evened out)
    quantized = self.quantized

    def local(q, rows, *scales):           # q [Q, D], rows [R/S, D]
      offset = jax.lax.axis_index(axes) * local_rows
      q = q.astype(jnp.float32 if quantized else rows.dtype)

      def block(b):
        """(scores float32 [Q, C], the id of its first row) of local rows
        b*C .. +C; the last block ends at R/S, its rows before b*C (scored
        already) and the padding past N at -inf."""
        start = jnp.minimum(b * c, local_rows - c)
        part = jax.lax.dynamic_slice_in_dim(rows, start, c)     # [C, D]
        if quantized:                      # scales: ([R/S],)
          part = part.astype(jnp.float32)
        scores = jax.lax.dot_general(
            q, part, (((1,), (1,)), ((), ())),
            preferred_element_type=jnp.float32)               # [Q, C]
        if quantized:
          scores = scores * jax.lax.dynamic_slice_in_dim(
              scales[0], start, c)[None, :]
        at = start + jnp.arange(c, dtype=jnp.int32)             # [C]
        keep = (offset + at < n) & (at >= b * c)
        return jnp.where(keep[None, :], scores, -jnp.inf), offset + start

      scores, first = block(0)
      top, pos = jax.lax.top_k(scores, kk)                    # [Q, kk]
      top_ids = first + pos

      def merge(b, carry):
        """The running top kk and block b's rows: [Q, kk + C] -> [Q, kk];
        the kept hits first, so a tie keeps the lower id (as one top k)."""
        kept, kept_ids = carry                                # [Q, kk] each
        scores, first = block(b)
        top, pos = jax.lax.top_k(jnp.concatenate([kept, scores], axis=1),
                                 kk)                          # [Q, kk]
        old = jnp.take_along_axis(kept_ids, jnp.minimum(pos, kk - 1), axis=1)
        return top, jnp.where(pos < kk, old, first + pos - kk)
      if blocks > 1:
        top, top_ids = jax.lax.fori_loop(1, blocks, merge, (top, top_ids))
      all_top = jax.lax.all_gather(top, axes, axis=1, tiled=True)  # [Q, S*kk]
      all_ids = jax.lax.all_gather(top_ids, axes, axis=1, tiled=True)
      best, where = jax.lax.top_k(all_top, k)                 # [Q, k]
      return best, jnp.take_along_axis(all_ids, where, axis=1)

    in_specs = (PartitionSpec(), PartitionSpec(axes, None))
    if quantized:
      in_specs += (PartitionSpec(axes),)
    return jax.shard_map(local, mesh=self.mesh, in_specs=in_specs,
                         out_specs=(PartitionSpec(), PartitionSpec()),
                         check_vma=False)


# ---- on disk ------------------------------------------------------------------


def save_index(index: PassageIndex, directory: str, **meta) -> None:
  """Writes ``index`` to ``directory`` (process 0; every process gathers)."""
  rows = index.host_rows()
  scales = index.host_scales() if index.quantized else None
  if jax.process_index() != 0:
    return
  os.makedirs(directory, exist_ok=True)
  bits = rows.view(np.uint16) if index.dtype_name == "bfloat16" else rows
  with atomic_write(os.path.join(directory, EMBEDDINGS), "wb") as f:
    np.save(f, bits)
  if scales is not None:
    with atomic_write(os.path.join(directory, SCALES), "wb") as f:
      np.save(f, scales)
  with atomic_write(os.path.join(directory, META)) as f:
    json.dump({"type": INDEX_TYPE, "num_passages": index.num_passages,
               "dim": index.dim, "dtype": index.dtype_name, **meta}, f)


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
  # memory-mapped: each process reads its own devices' rows (_place)
  rows = np.load(os.path.join(directory, EMBEDDINGS), mmap_mode="r")
  if meta["dtype"] == "int8":
    index.set_codes(rows, np.load(os.path.join(directory, SCALES),
                                  mmap_mode="r"))
    return index
  if meta["dtype"] == "bfloat16":
    rows = rows.view(ml_dtypes.bfloat16)
  index.set_rows(rows)
  return index
