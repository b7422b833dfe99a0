"""Passage embeddings on disk: fixed-size ``.npy`` shards plus a manifest.

  embeddings.json          {"num_rows", "dim", "dtype", "shard_size",
                            "num_shards", "source": {...}}
  embeddings_00000.npy     rows [0, shard_size)      float32 or float16
  ...

:class:`ShardWriter` keeps a shard on disk only when the manifest's
``source`` and layout are identical, so an interrupted build resumes and a
rebuild with other FAISS settings re-encodes nothing; shards are written
atomically.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.retrieval.index_files import load_array
from jaxfid.runtime.files import (
    atomic_path, atomic_write, link_or_copy, preallocate, write_atomic)

MANIFEST = "embeddings.json"
DTYPES = ("float32", "float16")
DEFAULT_SHARD_SIZE = 100_000


def shard_name(i: int) -> str:
  return f"embeddings_{i:05d}.npy"


def read_manifest(directory: str | os.PathLike) -> dict | None:
  path = Path(directory) / MANIFEST
  if not path.is_file():
    return None
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError):
    return None


def _layout(num_rows: int, dim: int, dtype: str, shard_size: int,
            source: dict) -> dict:
  if dtype not in DTYPES:
    raise ValueError(f"embedding dtype must be one of {DTYPES}, got {dtype!r}")
  if shard_size < 1:
    raise ValueError(f"shard_size must be positive, got {shard_size}")
  return {"num_rows": int(num_rows), "dim": int(dim), "dtype": dtype,
          "shard_size": int(shard_size),
          "num_shards": -(-int(num_rows) // int(shard_size)),
          "source": source}


class EmbeddingStore:
  """Read-only, memory-mapped shards: ``store[rows]`` is float32
  ``[len(rows), dim]`` whatever the stored dtype."""

  def __init__(self, directory: str | os.PathLike):
    self.directory = Path(directory)
    manifest = read_manifest(self.directory)
    if manifest is None:
      raise InputError(self.directory, f"no embeddings ({MANIFEST} missing or "
                       "unreadable)")
    self.manifest = manifest
    try:
      self.num_rows = int(manifest["num_rows"])
      self.dim = int(manifest["dim"])
      self.shard_size = int(manifest["shard_size"])
      self.num_shards = int(manifest["num_shards"])
      self.dtype = np.dtype(manifest.get("dtype", "float32"))
    except (KeyError, TypeError, ValueError) as e:
      raise InputError(self.directory / MANIFEST, f"bad manifest ({e})"
                       ) from None
    if self.shard_size < 1 or self.num_shards != -(-self.num_rows //
                                                   self.shard_size):
      raise InputError(self.directory / MANIFEST, f"{self.num_shards} shards "
                       f"of {self.shard_size} rows cannot hold "
                       f"{self.num_rows} rows")
    self._shards: dict[int, np.ndarray] = {}

  def __len__(self) -> int:
    return self.num_rows

  def shard_rows(self, i: int) -> tuple[int, int]:
    start = i * self.shard_size
    return start, min(start + self.shard_size, self.num_rows)

  def shard(self, i: int) -> np.ndarray:
    """Shard ``i`` as stored (a read-only memory map)."""
    if i not in self._shards:
      start, end = self.shard_rows(i)
      self._shards[i] = load_array(self.directory / shard_name(i),
                                   (end - start, self.dim), (self.dtype,))
    return self._shards[i]

  def check(self) -> None:
    """Checks (maps) every shard's size, shape and dtype; InputError for a
    missing, truncated or mis-shaped one."""
    for i in range(self.num_shards):
      self.shard(i)

  def iter_shards(self) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, float32 array) of every shard, in order."""
    for i in range(self.num_shards):
      yield self.shard_rows(i)[0], np.asarray(self.shard(i), np.float32)

  def rows(self, start: int, end: int) -> np.ndarray:
    """float32 rows [start, end) (may span shards)."""
    out = np.empty((max(end - start, 0), self.dim), np.float32)
    pos = start
    while pos < end:
      i = pos // self.shard_size
      first, last = self.shard_rows(i)
      take = min(end, last) - pos
      out[pos - start:pos - start + take] = self.shard(i)[pos - first:
                                                          pos - first + take]
      pos += take
    return out

  def blocks(self, start: int, end: int, max_rows: int
             ) -> Iterator[np.ndarray]:
    """float32 blocks of at most ``max_rows`` rows covering [start, end);
    views of the memory maps (no copy) when the shards are float32."""
    pos = start
    while pos < end:
      i = pos // self.shard_size
      first, last = self.shard_rows(i)
      take = min(end, last, pos + max_rows) - pos
      block = self.shard(i)[pos - first:pos - first + take]
      yield np.ascontiguousarray(block, dtype=np.float32)
      pos += take

  def __getitem__(self, rows) -> np.ndarray:
    if np.isscalar(rows):
      return self[np.asarray([rows])][0]
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
      raise IndexError(f"embedding row out of range (0..{self.num_rows - 1})")
    out = np.empty((len(rows), self.dim), np.float32)
    shard_of = rows // self.shard_size
    for i in np.unique(shard_of):
      picked = np.flatnonzero(shard_of == i)
      out[picked] = self.shard(int(i))[rows[picked] - i * self.shard_size]
    return out

  def sample(self, n: int, seed: int = 0) -> np.ndarray:
    """float32 vectors of ``n`` distinct random rows (all rows if fewer)."""
    if n >= self.num_rows:
      return self.rows(0, self.num_rows)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(self.num_rows, size=n, replace=False))
    return self[rows]


class ShardWriter:
  """Writes one directory's shards, keeping valid ones (same ``source``)."""

  def __init__(self, directory: str | os.PathLike, num_rows: int, dim: int,
               *, dtype: str = "float32",
               shard_size: int = DEFAULT_SHARD_SIZE, source: dict):
    self.directory = Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self.layout = _layout(num_rows, dim, dtype, shard_size, source)
    old = read_manifest(self.directory)
    if old != self.layout:
      for i in range(int(old.get("num_shards", 0)) if isinstance(old, dict)
                     else 0):
        with contextlib.suppress(FileNotFoundError):
          os.unlink(self.directory / shard_name(i))
      write_atomic(self.directory / MANIFEST,
                   json.dumps(self.layout, indent=2) + "\n")

  @property
  def num_shards(self) -> int:
    return self.layout["num_shards"]

  def shard_rows(self, i: int) -> tuple[int, int]:
    start = i * self.layout["shard_size"]
    return start, min(start + self.layout["shard_size"],
                      self.layout["num_rows"])

  def is_complete(self, i: int) -> bool:
    """Whether shard ``i`` is on disk with the right shape and dtype."""
    path = self.directory / shard_name(i)
    if not path.is_file():
      return False
    try:
      array = np.load(path, mmap_mode="r")
    except (ValueError, OSError):
      return False
    start, end = self.shard_rows(i)
    return (array.shape == (end - start, self.layout["dim"])
            and array.dtype == np.dtype(self.layout["dtype"]))

  def missing(self) -> list[int]:
    return [i for i in range(self.num_shards) if not self.is_complete(i)]

  def adopt(self, other: str | os.PathLike) -> int:
    """Hard-links (or copies) valid shards of another directory whose
    manifest equals this layout; returns how many were taken."""
    other = Path(other)
    if read_manifest(other) != self.layout:
      return 0
    taken = 0
    for i in self.missing():
      src = other / shard_name(i)
      if not src.is_file():
        continue
      link_or_copy(src, self.directory / shard_name(i))
      if self.is_complete(i):
        taken += 1
    return taken

  def write(self, i: int, array: np.ndarray) -> None:
    """Writes shard ``i`` atomically."""
    start, end = self.shard_rows(i)
    array = np.asarray(array, dtype=self.layout["dtype"])
    if array.shape != (end - start, self.layout["dim"]):
      raise ValueError(f"shard {i}: shape {array.shape}, expected "
                       f"{(end - start, self.layout['dim'])}")
    with atomic_write(self.directory / shard_name(i), "wb") as f:
      np.save(f, array)

  @contextlib.contextmanager
  def scatter(self) -> Iterator[Sequence[np.ndarray]]:
    """Writable memory maps of every shard, for rows in any order, renamed
    into place only when the block ends without an exception."""
    with contextlib.ExitStack() as renames:
      maps = []
      for i in range(self.num_shards):
        start, end = self.shard_rows(i)
        tmp = renames.enter_context(
            atomic_path(self.directory / shard_name(i)))
        maps.append(np.lib.format.open_memmap(
            tmp, mode="w+", dtype=self.layout["dtype"],
            shape=(end - start, self.layout["dim"])))
        preallocate(tmp)  # a full disk: an OSError now, not SIGBUS later
      try:
        yield maps
      except BaseException:
        maps.clear()  # drop our references to the memory maps before unlinking
        raise
      for array in maps:
        array.flush()
      maps.clear()
