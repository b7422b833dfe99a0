"""``jaxfid retrieve`` over a saved Atlas index: index type ``"atlas"``.

``jaxfid retrieve --index MODEL_DIR/atlas_index/STEP --device --queries Q
--top-k K --output RUN`` searches the index an Atlas run saved at the
refresh of step STEP (:func:`jaxfid.atlas.index.save_index`, ``"type":
"atlas"`` in its ``meta.json``) with the query tower of the run's
checkpoint, and writes the TREC or FiD JSON run every index type writes.

* Devices: ``--device`` places the index on all local devices (the
  accelerators where there are some), its rows sharded over a 1-D mesh of
  them, and searches there (:class:`~jaxfid.atlas.index.PassageIndex`,
  exact top k); without it, the same search on the host's CPU devices. The
  saved rows re-shard to whatever device count that is.
* The query encoder: the Atlas MODEL_DIR two levels up (the index's
  ``MODEL_DIR/atlas_index/STEP``), its latest checkpoint, so the hits are
  those the run's in-loop search gives at that checkpoint (the same
  tokenisation, ``QUERY_MAXLENGTH``, query batches, index and ``RERANK_K``
  re-ranking with that checkpoint's passage tower); search options
  ``checkpoint=MODEL_DIR`` (an index copied elsewhere),
  ``which=latest|best|auto`` and ``rerank_k=N`` (0: off) choose another.
* Passages: the corpus the run indexed (``meta.json``'s ``corpus``, an
  absolute path), read once; its size must be the index's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from jaxfid.atlas.checkpoint import is_atlas_dir, load_atlas
from jaxfid.atlas.index import INDEX_TYPE, load_index
from jaxfid.atlas.retrieval import InLoopRetriever, read_passages
from jaxfid.checkpoints.load import model_dir_vocabulary
from jaxfid.core import paths
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer
from jaxfid.retrieval.search import register_index_type
from jaxfid.retrieval.store.corpus import Passage

WHICH = ("latest", "best", "auto")
REQUIRED = ("num_passages", "dim", "dtype", "corpus")


class AtlasPassages:
  """The corpus in memory, as the run files' writers read a passage store:
  ``store[row]`` a Passage, ``store.ids(rows)`` their ids."""

  def __init__(self, passages: Sequence[Passage]):
    self.passages = list(passages)

  def __len__(self) -> int:
    return len(self.passages)

  def __getitem__(self, row: int) -> Passage:
    return self.passages[int(row)]

  def ids(self, rows: Sequence[int]) -> list[str]:
    return [self.passages[int(r)].id for r in rows]


class AtlasSearcher:
  """A saved Atlas index searched with a run's query tower (module
  docstring).

  Args:
    directory: ``MODEL_DIR/atlas_index/STEP``.
    meta: its ``meta.json``.
    device: search on all local devices (else the host's CPU devices).
  """

  options = ("checkpoint", "which", "rerank_k")

  def __init__(self, directory: str | os.PathLike, meta: dict, *,
               device: bool = False):
    self.directory = Path(directory)
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
      raise InputError(self.directory / "meta.json", "not an Atlas index "
                       f"(missing {', '.join(missing)})")
    self.meta = meta
    try:
      devices = jax.local_devices() if device else jax.local_devices(
          backend="cpu")
    except RuntimeError:  # JAX_PLATFORMS leaves the CPU out
      raise InputError(self.directory, "no CPU devices to search on "
                       "(JAX_PLATFORMS leaves them out): pass --device"
                       ) from None
    self.mesh = Mesh(np.array(devices), ("rows",))  # 1-D: rows over all
    corpus = meta["corpus"]
    if not paths.is_url(corpus) and not os.path.isfile(corpus):
      raise InputError(corpus, "missing: the corpus this Atlas index was "
                       f"built from ({self.directory / 'meta.json'})")
    self.store = AtlasPassages(read_passages(corpus))
    if len(self.store) != meta["num_passages"]:
      raise InputError(corpus, f"{len(self.store)} passages, the index "
                       f"{meta['num_passages']}: not the corpus it was "
                       "built from")
    self._loaded: tuple | None = None  # (key, retriever, params)

  def _retriever(self, checkpoint: str | None, which: str
                 ) -> tuple[InLoopRetriever, dict]:
    """The run's retriever over this index, and its parameters on the
    mesh; loaded once per (checkpoint, which)."""
    if which not in WHICH:
      raise InputError("--search-option which", f"{which!r}: one of "
                       f"{', '.join(WHICH)}")
    path = checkpoint or str(self.directory.parent.parent)
    key = (path, which)
    if self._loaded is None or self._loaded[0] != key:
      if not is_atlas_dir(path):
        raise InputError(path, "not an Atlas MODEL_DIR (the index is not in "
                         "its MODEL_DIR/atlas_index/STEP): name the run with "
                         "--search-option checkpoint=MODEL_DIR")
      model, params = load_atlas(path, which=which)
      if model.retriever.dim != self.meta["dim"]:
        raise InputError(path, f"its retriever gives {model.retriever.dim}-d "
                         f"vectors, the index holds {self.meta['dim']}-d")
      atlas = model.atlas
      retriever = InLoopRetriever(
          model, self.store.passages, Tokenizer(model_dir_vocabulary(path)),
          self.mesh, passage_maxlength=atlas.passage_maxlength,
          query_maxlength=atlas.query_maxlength,
          batch_size=atlas.index_batch_size, dtype=self.meta["dtype"])
      retriever.index = load_index(str(self.directory), self.mesh,
                                   atlas.index_batch_size)
      self._loaded = (key, retriever,
                      jax.device_put(params, retriever.replicated))
    return self._loaded[1], self._loaded[2]

  def _rerank_k(self, value: str | None) -> int:
    """The run's RERANK_K, or the ``rerank_k=N`` search option's N."""
    if value is None:
      return self._loaded[1].model.atlas.rerank_k
    try:
      n = int(value)
    except ValueError:
      n = -1
    if n < 0:
      raise InputError("--search-option rerank_k", f"{value!r}: a count of "
                       "candidates (0: no re-ranking)")
    return n

  def search(self, texts: Sequence[str], top_k: int, **options
             ) -> list[list[tuple[int, float]]]:
    """The best ``top_k`` (row, score) per text (all rows when fewer)."""
    unknown = sorted(set(options) - set(self.options))
    if unknown:
      raise InputError("--search-option", f"{', '.join(unknown)}: an Atlas "
                       f"index takes {', '.join(self.options)}")
    retriever, params = self._retriever(options.get("checkpoint"),
                                        options.get("which", "latest"))
    retriever.rerank_k = self._rerank_k(options.get("rerank_k"))
    if not texts:
      return []
    k = min(top_k, len(self.store))
    ids, scores = retriever.search(params, retriever.query_tokens(texts), k)
    return [[(int(i), float(s)) for i, s in zip(row, srow)]
            for row, srow in zip(ids, scores)]


register_index_type(INDEX_TYPE, AtlasSearcher, device=True)
