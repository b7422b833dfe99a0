"""ReFusion's retrieval: every input's top-k neighbours, found once.

Each segment (one per sentence) retrieves its top-k rows of a dense index
offline; the model fuses their *stored* vectors. Rows and scores are cached
in ``CACHE_DIR/neighbours-<key16>.npz`` (written atomically), keyed by a
SHA-256 of the database's identity, the search options, ``top_k`` and the
query texts; vectors are gathered from the memory-mapped embeddings on each
call. Identical texts are embedded and searched once.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Literal, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.index import open_dense_index
from jaxfid.retrieval.dense.embedding_store import shard_name
from jaxfid.retrieval.dense.index import store_fingerprint
from jaxfid.retrieval.index_dir import read_meta
from jaxfid.retrieval.store.passage_store import PassageStore
from jaxfid.runtime.files import atomic_write

CACHE_SUBDIR = "neighbour_cache"
CACHE_VERSION = 1
# search options naming files whose content (not only name) matters
_FILE_OPTIONS = ("query_vectors",)


@dataclasses.dataclass
class Neighbours:
  """The neighbours of N examples, S segments, K each, best first:
  ``vectors`` float32 [N, S, K, d] and ``scores`` float32 (0 where none),
  ``mask`` bool and ``rows`` int64 (-1 where none), each [N, S, K]."""
  vectors: np.ndarray | None
  mask: np.ndarray
  rows: np.ndarray
  scores: np.ndarray

  def __len__(self) -> int:
    return len(self.rows)


def _check_queries(queries: Sequence[Sequence[str]]) -> list[list[str]]:
  out = []
  width = None
  for i, example in enumerate(queries):
    if isinstance(example, str):
      raise InputError("queries", "each example must be a list of segment "
                       "texts, got a string", where=f"example {i}")
    segments = list(example)
    if not segments:
      raise InputError("queries", "an example has no segments",
                       where=f"example {i}")
    if width is None:
      width = len(segments)
    elif len(segments) != width:
      raise InputError("queries", f"{len(segments)} segments, but the first "
                       f"example has {width}", where=f"example {i}")
    for text in segments:
      if not isinstance(text, str):
        raise InputError("queries", f"a segment is {type(text).__name__}, "
                         "not text", where=f"example {i}")
    out.append(segments)
  return out


def _database_identity(searcher) -> dict:
  """What makes a database's search results what they are."""
  manifest = searcher.embeddings.manifest
  source = manifest.get("source") or {}
  identity = {"meta": searcher.meta, "embeddings": manifest,
              "store": source.get("passages")
              or store_fingerprint(searcher.directory)}
  if "passages" not in source:  # imported vectors: identify the files too
    stats = []
    for i in range(searcher.embeddings.num_shards):
      path = searcher.directory / shard_name(i)
      st = path.stat() if path.exists() else None
      stats.append(None if st is None else [st.st_size, st.st_mtime_ns])
    identity["shards"] = stats
  return identity


def _options_identity(options: Mapping[str, object]) -> dict:
  out = {}
  for name, value in sorted(options.items()):
    out[name] = str(value)
    if name in _FILE_OPTIONS:
      with contextlib.suppress(OSError):
        st = os.stat(str(value))
        out[name] = [os.path.abspath(str(value)), st.st_size, st.st_mtime_ns]
  return out


def cache_key(searcher, queries: Sequence[Sequence[str]], top_k: int,
              options: Mapping[str, object] | None = None) -> str:
  """The hex SHA-256 naming the cached neighbours of these inputs."""
  h = hashlib.sha256()
  head = {"version": CACHE_VERSION, "top_k": int(top_k),
          "database": _database_identity(searcher),
          "options": _options_identity(options or {})}
  h.update(json.dumps(head, sort_keys=True, ensure_ascii=False).encode())
  h.update(b"\0")
  h.update(json.dumps([list(q) for q in queries],
                      ensure_ascii=False).encode("utf-8", "surrogatepass"))
  return h.hexdigest()


def _default_cache_dir(db_dir: Path) -> Path | None:
  cache = db_dir / CACHE_SUBDIR
  if cache.is_dir():
    return cache if os.access(cache, os.W_OK | os.X_OK) else None
  return cache if os.access(db_dir, os.W_OK | os.X_OK) else None


def cache_path(cache_dir: str | os.PathLike, key: str) -> Path:
  return Path(cache_dir) / f"neighbours-{key[:16]}.npz"


def _read_cache(path: Path, key: str, shape: tuple[int, int, int]
                ) -> tuple[np.ndarray, np.ndarray] | None:
  """(rows, scores) from a cache file, or None when absent or unusable."""
  try:
    with np.load(path, allow_pickle=False) as f:
      if str(f["key"]) != key:
        return None
      rows = np.asarray(f["rows"], np.int64)
      scores = np.asarray(f["scores"], np.float32)
  except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError):
    return None
  if rows.shape != shape or scores.shape != shape:
    return None
  return rows, scores


def _write_cache(path: Path, key: str, rows: np.ndarray,
                 scores: np.ndarray) -> None:
  with atomic_write(path, "wb") as f:
    np.savez(f, key=np.asarray(key), rows=rows, scores=scores)


def _search(searcher, texts: list[str], top_k: int, batch_size: int,
            options: Mapping[str, object], progress: bool
            ) -> tuple[np.ndarray, np.ndarray]:
  """rows int64 [len(texts), K] (-1 = none) and scores float32 [.., K]."""
  rows = np.full((len(texts), top_k), -1, np.int64)
  scores = np.zeros((len(texts), top_k), np.float32)
  starts = range(0, len(texts), batch_size)
  for start in tqdm(starts, desc="retrieving neighbours", unit=" batches",
                    disable=not progress):
    batch = texts[start:start + batch_size]
    for i, hits in enumerate(searcher.search(batch, top_k, **options)):
      for j, (row, score) in enumerate(hits[:top_k]):
        rows[start + i, j] = row
        scores[start + i, j] = score
  return rows, scores


def retrieve_neighbours(db_dir: str | os.PathLike,
                        queries: Sequence[Sequence[str]], top_k: int, *,
                        cache_dir: str | os.PathLike | None
                        | Literal[False] = None,
                        batch_size: int = 256, progress: bool = False,
                        search_options: Mapping[str, object] | None = None,
                        with_vectors: bool = True) -> Neighbours:
  """The top ``top_k`` neighbours of every segment (``queries[i]``: example
  i's segment texts). ``cache_dir``: None, ``DB_DIR/neighbour_cache`` if
  writable; False, none. Without ``with_vectors``, ``vectors`` is None
  (:func:`gather_vectors`). InputError for bad sizes, ragged segments or a
  ``db_dir`` that is no dense index."""
  if int(top_k) <= 0:
    raise InputError("top_k", f"must be positive, got {top_k}")
  if int(batch_size) <= 0:
    raise InputError("batch_size", f"must be positive, got {batch_size}")
  top_k, batch_size = int(top_k), int(batch_size)
  options = dict(search_options or {})
  searcher = open_dense_index(db_dir)
  examples = _check_queries(queries)
  n, s = len(examples), (len(examples[0]) if examples else 0)
  shape = (n, s, top_k)

  if cache_dir is None:
    cache = _default_cache_dir(Path(db_dir))
  elif cache_dir is False:
    cache = None
  else:
    cache = Path(cache_dir)
  key = cache_key(searcher, examples, top_k, options)
  cached = _read_cache(cache_path(cache, key), key, shape) if cache else None
  if cached is not None:
    rows, scores = cached
  else:
    flat = [text for example in examples for text in example]
    unique = list(dict.fromkeys(flat))
    found_rows, found_scores = _search(searcher, unique, top_k, batch_size,
                                       options, progress)
    where = {text: i for i, text in enumerate(unique)}
    pick = np.asarray([where[t] for t in flat], np.int64)
    rows = found_rows[pick].reshape(shape)
    scores = found_scores[pick].reshape(shape)
    if cache is not None:
      try:
        cache.mkdir(parents=True, exist_ok=True)
        _write_cache(cache_path(cache, key), key, rows, scores)
      except OSError as e:
        if cache_dir is not None:  # asked for explicitly: say it failed
          raise InputError(cache, "cannot write the neighbour cache: "
                           f"{e.strerror or e}") from None

  vectors = gather_vectors(searcher, rows) if with_vectors else None
  return Neighbours(vectors=vectors, mask=rows >= 0, rows=rows, scores=scores)


def gather_vectors(searcher, rows: np.ndarray) -> np.ndarray:
  """float32 [..., d]: the stored vectors of database ``rows`` (int [...],
  -1 = none, which gives zeros). Lets a trainer keep only rows in memory
  and gather each batch's vectors when it needs them."""
  rows = np.asarray(rows)
  mask = rows >= 0
  vectors = np.zeros(rows.shape + (searcher.embeddings.dim,), np.float32)
  if mask.any():
    vectors[mask] = searcher.vectors(rows[mask])
  return vectors


def neighbour_texts(db_dir: str | os.PathLike,
                    rows: np.ndarray) -> list[list[str]]:
  """Per example, its neighbours' texts by segment, then rank (``rows`` int
  [N, S, K] or [N, K], -1 skipped)."""
  read_meta(db_dir)  # a clear error for a directory that is no index
  store = PassageStore(db_dir)
  rows = np.asarray(rows)
  if rows.ndim < 2:
    raise ValueError(f"rows must be [N, S, K] or [N, K], got {rows.shape}")
  flat = rows.reshape(len(rows), -1)
  return [[store.text(int(r)) for r in example if r >= 0] for example in flat]


def db_width(db_dir: str | os.PathLike) -> int:
  """The width d of the database's stored vectors (what fusion adds)."""
  return open_dense_index(db_dir).embeddings.dim


__all__ = ["Neighbours", "retrieve_neighbours", "neighbour_texts", "db_width",
           "gather_vectors", "open_database", "online_neighbours",
           "layer_database",
           "cache_key", "cache_path", "CACHE_SUBDIR"]


def open_database(db_dir: str | os.PathLike):
  """The searcher of a retrieval database (for on-line retrieval)."""
  return open_dense_index(db_dir)


def online_neighbours(searcher, queries: np.ndarray, top_k: int) -> np.ndarray:
  """float32 [B, 1, K, d]: stored vectors of the top ``top_k`` rows for each
  query vector (on-line, 'Hidden' mode); zeros where there are fewer."""
  found = searcher.search_vectors(np.asarray(queries, np.float32), top_k)
  out = np.zeros((len(found), 1, top_k, searcher.embeddings.dim), np.float32)
  for i, hits in enumerate(found):
    rows = [row for row, _ in hits][:top_k]
    if rows:
      out[i, 0, :len(rows)] = searcher.vectors(rows)
  return out


def layer_database(db_dir: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
  """('layer' retrieval) every stored vector float32 [N, d] and the score
  bias [N] that makes ``q . v + bias`` rank rows as the index's metric
  does: 0 for inner product, ``-|v|^2 / 2`` for L2 (``|q - v|^2 = |q|^2 -
  2 (q . v - |v|^2 / 2)``). The whole database goes into the program: meant
  for databases that fit on the device."""
  searcher = open_database(db_dir)
  vectors = np.asarray(searcher.vectors(np.arange(len(searcher.embeddings))),
                       np.float32)
  if searcher.index().metric == "l2":
    bias = -0.5 * np.sum(np.square(vectors), axis=1)
  else:
    bias = np.zeros((len(vectors),), np.float32)
  return vectors, bias.astype(np.float32)
