"""BM25 index directories: building one from a corpus, and searching it.

Layout of ``INDEX_DIR`` (``jaxfid index bm25``)::

  meta.json        {"type": "bm25", "k1", "b", "lucene_norms", "num_passages",
                    "corpus", "analyzer"}
  passages.bin ... the passage store (jaxfid.retrieval.store.passage_store)
  bm25/            the postings, in bm25s's file layout (jaxfid.retrieval.bm25.scoring)

Documents are indexed as Anserini indexes BEIR/DPR corpora: title and text
together ("contents"). Indexing reads the corpus once, streaming passages to
the store while tokenising them, and spills postings to disk as it goes
(:mod:`jaxfid.retrieval.bm25.builder`); the directory appears only when
complete. Importing this module registers the ``"bm25"`` index type of
:func:`jaxfid.retrieval.search.open_index`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from jaxfid.core.errors import InputError
from jaxfid.core.files import atomic_directory
from jaxfid.retrieval.bm25.builder import BM25Builder
from jaxfid.retrieval.bm25.scoring import BM25Params
from jaxfid.retrieval.bm25.check import open_bm25_index
from jaxfid.retrieval.index_dir import building, check_output, write_meta
from jaxfid.retrieval.search import register_index_type
from jaxfid.retrieval.store.corpus import passage_contents, read_corpus
from jaxfid.retrieval.store.passage_store import (
    PassageStore, PassageStoreWriter)

INDEX_TYPE = "bm25"


def build_bm25_index(corpus: str | os.PathLike, output: str | os.PathLike,
                     params: BM25Params = BM25Params(),
                     progress: bool | None = None) -> dict:
  """Indexes a corpus file into the directory ``output``; returns meta.json.

  Args:
    corpus: a corpus file in any format of :mod:`jaxfid.retrieval.store.corpus`.
    output: the index directory (replaced if it already holds an index).
    params: BM25 parameters.
    progress: show a progress bar (None: only on a terminal).

  Raises:
    InputError: on a malformed or empty corpus, or while another build of
      ``output`` runs (nothing is written then).
    StorageError: the disk is full (or another storage fault); the build's
      temporaries are removed and an earlier index is left as it was.
  """
  if params.k1 < 0 or not 0 <= params.b <= 1:
    raise InputError(corpus, f"invalid BM25 parameters k1={params.k1} "
                     f"b={params.b} (need k1 >= 0, 0 <= b <= 1)")
  with building(output), \
      atomic_directory(output, check=check_output) as tmp:
    builder = BM25Builder(spill_dir=tmp / "chunks")
    with PassageStoreWriter(tmp, source=corpus) as store:
      for lineno, passage in tqdm(read_corpus(corpus), desc="indexing",
                                  unit=" passages", disable=_quiet(progress)):
        store.add(passage, lineno)
        builder.add(passage_contents(passage))
    if len(builder) == 0:
      raise InputError(corpus, "no passages in the corpus")
    index = builder.finish(params, directory=tmp / "bm25")
    index.save(tmp / "bm25")
    meta = write_meta(tmp, INDEX_TYPE, k1=params.k1, b=params.b,
                      lucene_norms=params.lucene_norms,
                      num_passages=len(builder),
                      corpus=os.path.abspath(corpus),
                      analyzer=index.analyzer.config()["name"],
                      stats=index.stats)
  return meta


def _quiet(progress: bool | None) -> bool | None:
  return None if progress is None else not progress


class BM25Searcher:
  """Searches a BM25 index directory (the ``"bm25"`` index type)."""

  def __init__(self, directory: str | os.PathLike, meta: dict):
    self.directory = Path(directory)
    self.meta = meta
    self.store = PassageStore(directory, num_passages=meta.get(
        "num_passages"))
    self.index = open_bm25_index(self.directory / "bm25", len(self.store))

  def search(self, texts: Sequence[str], top_k: int,
             **options) -> list[list[tuple[int, float]]]:
    """Top ``top_k`` (store row, score) per query text, best first."""
    if options:
      names = ", ".join("--" + k.replace("_", "-") for k in sorted(options))
      raise InputError(self.directory, f"option {names} does not apply to a "
                       "bm25 index")
    rank = self.store.id_rank
    return [self.index.search(text, top_k, rank) for text in texts]


register_index_type(INDEX_TYPE, BM25Searcher)
