"""Searching any index directory: a registry of index types.

:func:`open_index` looks up ``meta.json``'s type and returns a searcher with
``store``, ``search(texts, top_k, **options)`` (per query up to ``top_k``
(row, score) pairs, best first; unknown options are an InputError) and
optionally ``search_batches(batches, top_k, threads, **options)``. Types
register with :func:`register_index_type` on import (bm25, dense, reatt,
atlas; :mod:`jaxfid.methods` imports them); ``device=True`` types also
search on accelerators. An unregistered type is an InputError.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Protocol, Sequence

from tqdm.auto import tqdm

from jaxfid.core.errors import InputError
from jaxfid.core.registry import Registry
from jaxfid.retrieval.index_dir import read_meta
from jaxfid.retrieval.runs import run_format, write_fid_json, write_trec
from jaxfid.retrieval.store.passage_store import PassageStore
from jaxfid.retrieval.store.queries import Query, read_queries

BATCH_SIZE = 256  # queries per searcher call (progress granularity)


class Searcher(Protocol):
  store: PassageStore

  def search(self, texts: Sequence[str], top_k: int,
             **options) -> list[Sequence[tuple[int, float]]]:
    ...


Loader = Callable[[Path, dict], Searcher]
INDEX_TYPES: Registry[Loader] = Registry(
    "index type", "import jaxfid.methods, which registers every index type")


DEVICE_SEARCH: set[str] = set()  # the types whose loader takes ``device``


def register_index_type(name: str, loader: Loader, *,
                        device: bool = False) -> None:
  """Makes ``open_index`` use ``loader(directory, meta)`` for type ``name``
  (``device=True``: ``loader(directory, meta, device=...)``, a type with a
  device search)."""
  INDEX_TYPES.register(name, loader)
  if device:
    DEVICE_SEARCH.add(name)


def open_index(directory: str | os.PathLike, device: bool = False
               ) -> Searcher:
  """The searcher for an index directory, chosen by its meta.json type;
  ``device``: one that searches on the accelerators."""
  directory = Path(directory)
  meta = read_meta(directory)
  loader = INDEX_TYPES.get(meta["type"], where=str(directory))
  if meta["type"] in DEVICE_SEARCH:
    return loader(directory, meta, device=device)
  if device:
    raise InputError(directory, f"a {meta['type']!r} index has no device "
                     "search (--device); index types with one: "
                     f"{', '.join(sorted(DEVICE_SEARCH)) or 'none'}")
  return loader(directory, meta)


def search_all(searcher: Searcher, texts: Sequence[str], top_k: int,
               progress: bool | None = None, threads: int | None = None,
               **options) -> list[Sequence[tuple[int, float]]]:
  """Runs all queries in batches, with a progress bar (None: on a tty).

  ``threads``: CPUs where the searcher can use them (None: all).
  """
  if top_k < 1:
    raise ValueError(f"top_k must be positive, got {top_k}")
  results: list[Sequence[tuple[int, float]]] = []
  batches = [texts[i:i + BATCH_SIZE] for i in range(0, len(texts),
                                                      BATCH_SIZE)]
  parallel = getattr(searcher, "search_batches", None)
  if parallel is not None:
    outputs = parallel(batches, top_k, threads, **options)
  else:
    outputs = (searcher.search(batch, top_k, **options) for batch in batches)
  disable = None if progress is None else not progress
  with tqdm(total=len(texts), desc="retrieving", unit=" queries",
            disable=disable, smoothing=0.05) as bar:
    for batch, found in zip(batches, outputs):
      results.extend(found)
      bar.update(len(batch))
  return results


def retrieve(index_dir: str | os.PathLike, queries: Sequence[Query | str],
             top_k: int, progress: bool | None = False,
             **options) -> list[list[tuple[str, float]]]:
  """Top ``top_k`` (docid, score) pairs per query, best first."""
  searcher = open_index(index_dir)
  texts = [q if isinstance(q, str) else q.text for q in queries]
  rows = search_all(searcher, texts, top_k, progress, **options)
  return [_with_ids(searcher.store, hits) for hits in rows]


def _with_ids(store: PassageStore,
              hits: Sequence[tuple[int, float]]) -> list[tuple[str, float]]:
  return list(zip(store.ids([r for r, _ in hits]), [s for _, s in hits]))


def retrieve_to_file(index_dir: str | os.PathLike,
                     queries_path: str | os.PathLike, top_k: int,
                     output: str | os.PathLike, tag: str = "jaxfid",
                     progress: bool | None = None, threads: int | None = None,
                     device: bool = False, **options) -> dict:
  """``jaxfid retrieve``: searches all queries and writes a run file.

  ``output`` ending in ``.json``/``.jsonl`` gets FiD JSON, anything else a
  TREC run; ``device``: search on the accelerators (:func:`open_index`).
  Returns a summary (counts) for the command to print.
  """
  queries = read_queries(queries_path)
  searcher = open_index(index_dir, device=device)
  rows = search_all(searcher, [q.text for q in queries], top_k, progress,
                    threads, **options)
  if run_format(output) == "fid":
    write_fid_json(output, queries, rows, searcher.store)
  else:
    write_trec(output, [q.id for q in queries],
               [_with_ids(searcher.store, hits) for hits in rows], tag)
  return {"queries": len(queries), "output": str(output),
          "format": run_format(output),
          "empty_results": sum(1 for hits in rows if not hits)}
