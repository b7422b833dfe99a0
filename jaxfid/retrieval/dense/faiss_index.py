"""FAISS indexes over embedding shards, from factory strings, searched as one.

``"Flat"`` (default) is exact and stores nothing: it is filled from the
embedding shards on open. Other factory strings are trained on
``train_size`` random rows and written to ``faiss_00000.index``. With
``index_shards > 1``, :class:`ShardedIndex` searches contiguous row ranges
and merges the top-k. Scores are higher-is-better (negated squared L2 for
``metric="l2"``); ties go to the lower row. Search options: ``nprobe``,
``ef_search`` or any FAISS ``ParameterSpace`` name.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import faiss
import numpy as np
from tqdm.auto import tqdm

from jaxfid.core.errors import InputError
from jaxfid.retrieval.dense.embedding_store import EmbeddingStore
from jaxfid.retrieval.index_files import check_file_size, file_size
from jaxfid.runtime.files import atomic_path

DEFAULT_FACTORY = "Flat"
METRICS = ("ip", "l2")
DEFAULT_TRAIN_SIZE = 262_144
ADD_CHUNK = 65_536
_OPTION_NAMES = {"ef_search": "efSearch"}


def faiss_metric(metric: str) -> int:
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
  return faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2


def is_flat(factory: str) -> bool:
  return factory.replace(" ", "") == "Flat"


def make_index(dim: int, factory: str = DEFAULT_FACTORY, metric: str = "ip"):
  """An empty FAISS index; a bad factory string is an InputError."""
  try:
    return faiss.index_factory(int(dim), factory, faiss_metric(metric))
  except RuntimeError as e:
    reason = str(e).strip().splitlines()[-1] if str(e).strip() else "invalid"
    raise InputError("--faiss-factory", f"FAISS cannot build {factory!r} "
                     f"for dimension {dim}: {reason}") from None


def split_rows(num_rows: int, parts: int) -> list[tuple[int, int]]:
  """``parts`` contiguous, near-equal (start, end) ranges covering the rows."""
  if parts < 1:
    raise ValueError(f"index_shards must be positive, got {parts}")
  bounds = np.linspace(0, num_rows, parts + 1).round().astype(np.int64)
  return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def index_file(k: int) -> str:
  return f"faiss_{k:05d}.index"


def _add_rows(index, store: EmbeddingStore, start: int, end: int,
              bar=None) -> None:
  for block in store.blocks(start, end, ADD_CHUNK):
    index.add(block)
    if bar is not None:
      bar.update(len(block))


def build_faiss_index(store: EmbeddingStore, directory: str | os.PathLike, *,
                      factory: str = DEFAULT_FACTORY, metric: str = "ip",
                      index_shards: int = 1,
                      train_size: int = DEFAULT_TRAIN_SIZE, seed: int = 0,
                      progress: bool | None = None) -> dict:
  """Builds (and unless flat writes) the FAISS index of ``store``'s rows;
  returns meta.json's ``faiss`` entry (factory, metric, parts)."""
  directory = Path(directory)
  ranges = split_rows(len(store), index_shards)
  template = make_index(store.dim, factory, metric)
  info = {"factory": factory, "metric": metric, "dim": store.dim,
          "num_rows": len(store), "parts": []}
  if is_flat(factory):
    info["parts"] = [{"start": a, "end": b, "file": None} for a, b in ranges]
    return info
  if not template.is_trained:
    sample = store.sample(min(train_size, len(store)), seed)
    try:
      template.train(sample)
    except RuntimeError as e:
      raise InputError("--faiss-factory", f"training {factory!r} on "
                       f"{len(sample)} vectors failed: "
                       f"{str(e).strip().splitlines()[-1]}") from None
    info["train_size"] = int(len(sample))
  disable = None if progress is None else not progress
  with tqdm(total=len(store), desc="adding to faiss", unit=" vectors",
            disable=disable) as bar:
    for k, (a, b) in enumerate(ranges):
      index = faiss.clone_index(template)
      _add_rows(index, store, a, b, bar)
      with atomic_path(directory / index_file(k)) as tmp:
        faiss.write_index(index, str(tmp))
        size = os.path.getsize(tmp)
      info["parts"].append({"start": a, "end": b, "file": index_file(k),
                            "bytes": size})
      del index
  return info


def _order(s: np.ndarray, r: np.ndarray, k: int
           ) -> tuple[np.ndarray, np.ndarray]:
  """The best k of each row of (scores, rows): score desc, then row asc."""
  missing = r < 0
  s = np.where(missing, -np.inf, s)
  r = np.where(missing, np.iinfo(np.int64).max, r)
  order = np.lexsort((r, -s), axis=1)[:, :k]
  s = np.take_along_axis(s, order, axis=1)
  r = np.take_along_axis(r, order, axis=1)
  return s, np.where(r == np.iinfo(np.int64).max, -1, r)


def merge_topk(scores: Sequence[np.ndarray], rows: Sequence[np.ndarray],
               k: int) -> tuple[np.ndarray, np.ndarray]:
  """Merges per-part results ([Q, k_i], row -1 none) into the top k: higher
  scores first, ties by ascending row, missing as row -1, -inf, last."""
  s = np.concatenate([np.asarray(x, np.float32) for x in scores], axis=1)
  r = np.concatenate([np.asarray(x, np.int64) for x in rows], axis=1)
  return _order(s, r, k)


def order_ties(s: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """One part's (FAISS-sorted) results with equal scores ordered by row and
  missing results (row -1) scored -inf; only queries with ties are sorted,
  so the usual case costs one comparison per result."""
  s = np.asarray(s, np.float32)
  r = np.asarray(r, np.int64)
  missing = r < 0
  if missing.any():
    s = np.where(missing, -np.inf, s)
  tied = np.flatnonzero(((s[:, 1:] == s[:, :-1]) & ~missing[:, 1:]).any(1))
  if len(tied):
    s, r = s.copy(), r.copy()
    s[tied], r[tied] = _order(s[tied], r[tied], s.shape[1])
  return s, r


def check_faiss_files(directory: str | os.PathLike, info: dict,
                      num_rows: int) -> None:
  """Checks a ``faiss`` meta.json entry's parts cover rows [0, num_rows) in
  order with their recorded sizes, without reading them (InputError)."""
  directory = Path(directory)
  position = 0
  for part in info.get("parts", []):
    start, end = int(part["start"]), int(part["end"])
    if start != position or end < start:
      raise InputError(directory / "meta.json", f"FAISS part rows "
                       f"[{start}, {end}) do not follow row {position}")
    position = end
    if part.get("file") is None:
      continue
    path = directory / part["file"]
    if part.get("bytes") is None:
      file_size(path)  # at least present
    else:
      check_file_size(path, int(part["bytes"]))
  if position != num_rows:
    raise InputError(directory / "meta.json", f"FAISS parts cover {position} "
                     f"rows, the index has {num_rows} passages")


class ShardedIndex:
  """One or more FAISS indexes over contiguous row ranges, searched as one."""

  def __init__(self, parts: Sequence[tuple[object, int]], metric: str = "ip"):
    self.parts = list(parts)
    self.metric = metric

  @classmethod
  def load(cls, directory: str | os.PathLike, info: dict,
           store: EmbeddingStore | None = None,
           mmap: bool = False) -> "ShardedIndex":
    """Opens the index ``info`` describes; flat parts are filled from ``store``.

    ``mmap`` maps written indexes instead of reading them.
    """
    directory = Path(directory)
    parts = []
    for part in info["parts"]:
      if part.get("file") is None:
        if store is None:
          raise ValueError("a flat index needs the embedding store")
        index = make_index(int(info["dim"]), DEFAULT_FACTORY, info["metric"])
        _add_rows(index, store, int(part["start"]), int(part["end"]))
      else:
        path = directory / part["file"]
        if part.get("bytes") is None:
          file_size(path)
        else:
          check_file_size(path, int(part["bytes"]))
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        try:
          index = faiss.read_index(str(path), flags)
        except RuntimeError as e:
          raise InputError(path, f"cannot read FAISS index: "
                           f"{str(e).strip().splitlines()[-1]}") from None
        expected = int(part["end"]) - int(part["start"])
        if index.ntotal != expected:
          raise InputError(path, f"holds {index.ntotal} vectors, expected "
                           f"{expected}")
      parts.append((index, int(part["start"])))
    return cls(parts, info["metric"])

  @property
  def ntotal(self) -> int:
    return sum(index.ntotal for index, _ in self.parts)

  def set_options(self, source, **options) -> None:
    """Sets search parameters (nprobe, ef_search, ...) on every part."""
    space = faiss.ParameterSpace()
    for name, value in options.items():
      faiss_name = _OPTION_NAMES.get(name, name)
      try:
        number = float(value)
      except (TypeError, ValueError):
        raise InputError(source, f"search option {name} needs a number, got "
                         f"{value!r}") from None
      for index, _ in self.parts:
        try:
          space.set_index_parameter(index, faiss_name, number)
        except RuntimeError:
          raise InputError(source, f"search option {name} does not apply to "
                           "this FAISS index") from None

  def search(self, queries: np.ndarray, k: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32 [Q, k], rows int64 [Q, k]); row -1 where none."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    all_scores, all_rows = [], []
    for index, start in self.parts:
      kk = min(k, index.ntotal)
      if kk == 0:
        continue
      d, i = index.search(queries, kk)
      if self.metric == "l2":
        d = -d
      all_scores.append(d)
      all_rows.append(i if start == 0 else np.where(i >= 0, i + start, -1))
    if not all_scores:
      return (np.full((len(queries), 0), -np.inf, np.float32),
              np.full((len(queries), 0), -1, np.int64))
    if len(all_scores) == 1:
      return order_ties(all_scores[0], all_rows[0])
    return merge_topk(all_scores, all_rows, k)
