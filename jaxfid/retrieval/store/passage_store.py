"""Passage text stored once on disk, memory-mapped and addressable by id.

* ``passages.bin``: UTF-8 title then text of every passage, concatenated;
* ``offsets.npy``: int64, 2N+1 byte offsets: passage i's title is
  ``passages.bin[o[2i]:o[2i+1]]``, its text ``[o[2i+1]:o[2i+2]]``;
* ``ids.txt``: the passage ids, one per line (ids hold no whitespace);
* ``id_offsets.npy``: int64, N+1 byte offsets of the lines of ``ids.txt``;
* ``id_order.npy``: passage indices sorted by id (bytewise).

Opening maps the files and checks their sizes (a damaged file is an
InputError naming it); ``store[i]`` decodes one passage.
:class:`PassageStoreWriter` streams passages and rejects duplicate ids on
close.
"""
from __future__ import annotations

import array
import bisect
import mmap
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.retrieval.index_files import check_file_size, load_array
from jaxfid.retrieval.store.corpus import Passage

STORE_FILES = ("passages.bin", "offsets.npy", "ids.txt", "id_offsets.npy",
               "id_order.npy")
_ENCODING_ERRORS = "surrogatepass"  # lone surrogates in JSON round-trip
_MAX_SORT_BYTES = 1 << 30  # padded-id matrix size above which we sort in Python


def _map_file(path: Path):
  """Read-only mmap of a file (an empty bytes object for an empty file)."""
  if path.stat().st_size == 0:
    return b""
  with open(path, "rb") as f:
    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


_OFFSET_DTYPES = (np.int64,)
_ORDER_DTYPES = (np.int32, np.int64)


class _SortedIds(Sequence):
  """The ids in sorted order, as bytes, for :func:`bisect.bisect_left`."""

  def __init__(self, store: "PassageStore"):
    self._store = store

  def __len__(self) -> int:
    return len(self._store)

  def __getitem__(self, i):
    return self._store.id_bytes(int(self._store.id_order[i]))


class PassageStore:
  """Read-only, memory-mapped passages: ``store[i]`` a :class:`Passage`,
  ``store.id(i)`` its id, ``store.index_of(docid)`` the inverse."""

  def __init__(self, directory: str | os.PathLike,
               num_passages: int | None = None):
    self.directory = d = Path(directory)
    missing = [f for f in STORE_FILES if not (d / f).exists()]
    if missing:
      raise InputError(d, "not an index directory (missing "
                       f"{', '.join(missing)})")
    # plain ndarray views of the maps: np.memmap's indexing is slow
    self.id_offsets = load_array(d / "id_offsets.npy", (None,), _OFFSET_DTYPES)
    n = len(self.id_offsets) - 1
    if n < 0:
      raise InputError(d / "id_offsets.npy", "empty (rebuild the index)")
    if num_passages is not None and n != int(num_passages):
      raise InputError(d / "id_offsets.npy", f"{n} passages, meta.json says "
                       f"{num_passages} (rebuild the index)")
    self.offsets = load_array(d / "offsets.npy", (2 * n + 1,), _OFFSET_DTYPES)
    self.id_order = load_array(d / "id_order.npy", (n,), _ORDER_DTYPES)
    check_file_size(d / "passages.bin", int(self.offsets[-1]))
    check_file_size(d / "ids.txt", int(self.id_offsets[-1]))
    self._text = _map_file(d / "passages.bin")
    self._ids = _map_file(d / "ids.txt")
    self._rank = None

  @classmethod
  def open(cls, directory: str | os.PathLike) -> "PassageStore":
    return cls(directory)

  def __len__(self) -> int:
    return len(self.id_offsets) - 1

  def _check(self, i) -> int:
    i = int(i)
    n = len(self)
    if i < 0:
      i += n
    if not 0 <= i < n:
      raise IndexError(f"passage index {i} out of range (0..{n - 1})")
    return i

  def id_bytes(self, i: int) -> bytes:
    return self._ids[int(self.id_offsets[i]):int(self.id_offsets[i + 1]) - 1]

  def id(self, i) -> str:
    """The id of passage ``i``."""
    return self.id_bytes(self._check(i)).decode("utf-8", _ENCODING_ERRORS)

  def ids(self, rows: Sequence[int]) -> list[str]:
    """The ids of many passages (faster than calling :meth:`id` each time)."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
      raise IndexError(f"passage index out of range (0..{len(self) - 1})")
    starts = self.id_offsets[rows].tolist()
    ends = self.id_offsets[rows + 1].tolist()
    data = self._ids
    return [data[a:b - 1].decode("utf-8", _ENCODING_ERRORS)
            for a, b in zip(starts, ends)]

  def _slice(self, a, b) -> str:
    return self._text[int(a):int(b)].decode("utf-8", _ENCODING_ERRORS)

  def title(self, i) -> str:
    i = self._check(i)
    return self._slice(self.offsets[2 * i], self.offsets[2 * i + 1])

  def text(self, i) -> str:
    i = self._check(i)
    return self._slice(self.offsets[2 * i + 1], self.offsets[2 * i + 2])

  def __getitem__(self, i) -> Passage:
    i = self._check(i)
    a, b, c = self.offsets[2 * i:2 * i + 3]
    return Passage(self.id_bytes(i).decode("utf-8", _ENCODING_ERRORS),
                   self._slice(a, b), self._slice(b, c))

  def __iter__(self) -> Iterator[Passage]:
    for i in range(len(self)):
      yield self[i]

  def index_of(self, docid: str) -> int:
    """The index of the passage with id ``docid``; KeyError if none."""
    key = docid.encode("utf-8", _ENCODING_ERRORS)
    sorted_ids = _SortedIds(self)
    pos = bisect.bisect_left(sorted_ids, key)
    if pos < len(self) and sorted_ids[pos] == key:
      return int(self.id_order[pos])
    raise KeyError(docid)

  def __contains__(self, docid: str) -> bool:
    try:
      self.index_of(docid)
    except KeyError:
      return False
    return True

  @property
  def id_rank(self) -> np.ndarray:
    """int array: position of each passage's id in bytewise sorted order."""
    if self._rank is None:
      n = len(self)
      rank = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
      rank[np.asarray(self.id_order)] = np.arange(n, dtype=rank.dtype)
      self._rank = rank
    return self._rank


def _sort_ids(ids_path: Path,
              id_offsets: np.ndarray) -> tuple[np.ndarray, tuple | None]:
  """(passage indices in bytewise-sorted id order, a duplicate pair (i, j),
  i < j, or None) of ``ids.txt``."""
  n = len(id_offsets) - 1
  if n == 0:
    return np.zeros(0, dtype=np.int64), None
  data = np.fromfile(ids_path, dtype=np.uint8)
  lengths = np.diff(id_offsets) - 1  # without the newline
  width = int(lengths.max())
  if n * width <= _MAX_SORT_BYTES:
    padded = np.zeros((n, width), dtype=np.uint8)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(len(rows)) - np.repeat(
        np.cumsum(lengths) - lengths, lengths)
    padded[rows, cols] = data[np.repeat(id_offsets[:-1], lengths) + cols]
    keys = padded.view(f"S{width}").ravel()
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_lengths = keys[order], lengths[order]
    equal = ((sorted_keys[1:] == sorted_keys[:-1])
             & (sorted_lengths[1:] == sorted_lengths[:-1]))
  else:
    raw = data.tobytes()
    ids = [raw[id_offsets[i]:id_offsets[i + 1]] for i in range(n)]
    order = np.asarray(sorted(range(n), key=ids.__getitem__), dtype=np.int64)
    equal = np.array([ids[order[k]] == ids[order[k + 1]]
                      for k in range(n - 1)], dtype=bool)
  hits = np.flatnonzero(equal)
  if len(hits) == 0:
    return order, None
  k = int(hits[0])
  a, b = int(order[k]), int(order[k + 1])
  return order, (min(a, b), max(a, b))


class PassageStoreWriter:
  """Streams passages into ``directory``; ``close()`` finalises it."""

  def __init__(self, directory: str | os.PathLike,
               source: str | os.PathLike | None = None):
    self.directory = Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self.source = source if source is not None else self.directory
    self._text = open(self.directory / "passages.bin", "wb")
    self._ids = open(self.directory / "ids.txt", "wb")
    self._offsets = array.array("q", [0])
    self._id_offsets = array.array("q", [0])
    self._lines = array.array("q")
    self._pos = 0
    self._id_pos = 0
    self._closed = False

  def __len__(self) -> int:
    return len(self._id_offsets) - 1

  def add(self, passage: Passage, lineno: int | None = None) -> int:
    """Appends one passage; returns its index."""
    title = passage.title.encode("utf-8", _ENCODING_ERRORS)
    text = passage.text.encode("utf-8", _ENCODING_ERRORS)
    docid = passage.id.encode("utf-8", _ENCODING_ERRORS)
    self._text.write(title)
    self._text.write(text)
    self._pos += len(title)
    self._offsets.append(self._pos)
    self._pos += len(text)
    self._offsets.append(self._pos)
    self._ids.write(docid + b"\n")
    self._id_pos += len(docid) + 1
    self._id_offsets.append(self._id_pos)
    self._lines.append(lineno if lineno is not None else len(self._lines) + 1)
    return len(self) - 1

  def close(self) -> None:
    """Writes the offset and order arrays; raises InputError on a duplicate."""
    if self._closed:
      return
    self._closed = True
    self._text.close()
    self._ids.close()
    id_offsets = np.frombuffer(self._id_offsets, dtype=np.int64)
    order, duplicate = _sort_ids(self.directory / "ids.txt", id_offsets)
    if duplicate is not None:
      first, second = duplicate
      with open(self.directory / "ids.txt", "rb") as f:
        f.seek(int(id_offsets[second]))
        docid = f.readline()[:-1].decode("utf-8", _ENCODING_ERRORS)
      raise InputError(self.source, f"duplicate id {docid!r} (first seen on "
                       f"line {self._lines[first]})",
                       where=int(self._lines[second]))
    np.save(self.directory / "offsets.npy",
            np.frombuffer(self._offsets, dtype=np.int64))
    np.save(self.directory / "id_offsets.npy", id_offsets)
    np.save(self.directory / "id_order.npy",
            order.astype(np.int32 if len(order) < 2**31 else np.int64))

  def __enter__(self) -> "PassageStoreWriter":
    return self

  def __exit__(self, exc_type, *_) -> None:
    if exc_type is None:
      self.close()
    else:
      self._text.close()
      self._ids.close()


def write_passage_store(directory: str | os.PathLike,
                        passages: Iterable[Passage],
                        source: str | os.PathLike | None = None) -> int:
  """Writes all ``passages`` to a store in ``directory``; returns the count."""
  with PassageStoreWriter(directory, source) as writer:
    for p in passages:
      writer.add(p)
  return len(writer)
