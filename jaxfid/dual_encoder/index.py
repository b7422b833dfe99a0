"""Dense indexes embedded by a T5 dual encoder: index type ``"dense"``.

:func:`build_dense_index` embeds every passage on all devices and writes a
dense index (:mod:`jaxfid.retrieval.dense.index`), recording the encoder as
``encoder`` and ``query_encoder``; :func:`import_dpr_embeddings` imports DPR's
embeddings. Importing this module registers ``"dense"``: queries are
embedded by the recorded query encoder (checked against its fingerprint) or
the ``query_encoder=CKPT`` search option.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Sequence

import jax
import numpy as np

from jaxfid.core import sharding as shd
from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.checkpoint import LoadedEncoder, load_dual_encoder
from jaxfid.dual_encoder.model import Embedder, passage_text
from jaxfid.retrieval.dense import dpr_import
from jaxfid.retrieval.dense.embedding_store import DEFAULT_SHARD_SIZE
from jaxfid.retrieval.dense.faiss_index import (
    DEFAULT_FACTORY, DEFAULT_TRAIN_SIZE)
from jaxfid.retrieval.dense.index import (
    INDEX_TYPE, DenseSearcher, read_dense_meta, staging_dir, write_dense_index)
from jaxfid.retrieval.index_dir import check_output
from jaxfid.retrieval.search import register_index_type
from jaxfid.retrieval.store.passage_store import PassageStore
from jaxfid.runtime import multihost

# the settings that change passage vectors (embeddings are reused only when
# they, the weights and the corpus are unchanged)
_PASSAGE_SETTINGS = ("pooling", "normalize", "projection_dim",
                     "projection_bias", "projection_activation",
                     "passage_maxlength", "passage_format")
# the settings a query encoder is loaded with, as recorded at indexing
_QUERY_SETTINGS = ("pooling", "normalize", "query_maxlength",
                   "passage_maxlength", "passage_format")


def encoder_entry(loaded: LoadedEncoder) -> dict:
  """The ``meta.json`` description of a (query) encoder."""
  return {"checkpoint": os.path.abspath(loaded.source), "kind": loaded.kind,
          "fingerprint": loaded.fingerprint, "dim": loaded.encoder.dim,
          "dtype": loaded.encoder.config.dtype,
          "settings": loaded.encoder.settings.to_dict()}


class EncoderPassages:
  """A loaded dual encoder as a dense index's passage encoder (its device
  embedder made on first use); multi-host, process 0's ``channel`` tells the
  others which rows to embed."""

  def __init__(self, loaded: LoadedEncoder, *, batch_size: int = 128,
               mesh: str = "", channel: multihost.Channel | None = None):
    self.loaded = loaded
    self.dim = loaded.encoder.dim
    self.batch_size = batch_size
    self.mesh = mesh
    self.channel = channel
    self._embedder: Embedder | None = None

  def entry(self) -> dict:
    return encoder_entry(self.loaded)

  def source(self) -> dict:
    settings = self.loaded.encoder.settings.to_dict()
    return {"encoder": self.loaded.fingerprint,
            "dtype": self.loaded.encoder.config.dtype,
            "settings": {k: settings[k] for k in _PASSAGE_SETTINGS}}

  def _device_embedder(self) -> Embedder:
    if self._embedder is None:
      try:
        device_mesh = shd.parse_mesh(self.mesh)
      except ValueError as e:
        raise InputError("--mesh", str(e)) from None
      if (multihost.process_count() > 1
          and device_mesh.devices.size != jax.device_count()):
        raise InputError("--mesh", f"{self.mesh!r} uses "
                         f"{device_mesh.devices.size} of the "
                         f"{jax.device_count()} devices; a multi-host build "
                         "uses them all")
      loaded = self.loaded
      self._embedder = Embedder(loaded.encoder, loaded.params,
                                loaded.tokenizer, mesh=device_mesh,
                                batch_size=self.batch_size)
    return self._embedder

  def embed(self, store: PassageStore, start: int,
            end: int) -> Iterator[np.ndarray]:
    embedder = self._device_embedder()
    if self.channel is not None:  # the other processes embed these rows too
      self.channel.send({"rows": [start, end]})
      multihost.agree(None, "reading the passages")
    settings = self.loaded.encoder.settings
    step = embedder.batch_size
    batches = ([passage_text(store.title(i), store.text(i),
                             settings.passage_format)
                for i in range(a, min(a + step, end))]
               for a in range(start, end, step))
    return embedder.embed_batches(batches, "passage",
                                  settings.passage_maxlength)


def build_dense_index(checkpoint: str | os.PathLike | None,
                      corpus: str | os.PathLike,
                      output: str | os.PathLike, *,
                      factory: str = DEFAULT_FACTORY, metric: str = "ip",
                      index_shards: int = 1, batch_size: int = 128,
                      shard_size: int = DEFAULT_SHARD_SIZE,
                      embedding_dtype: str = "float32",
                      dtype: str | None = None, mesh: str = "",
                      train_size: int = DEFAULT_TRAIN_SIZE,
                      progress: bool | None = None,
                      encoder: LoadedEncoder | None = None,
                      encoding: str = "utf-8", **settings) -> dict:
  """Indexes ``corpus`` into the directory ``output`` (``encoder`` or
  ``checkpoint``; ``batch_size`` passages per call over all devices;
  ``settings``: DualEncoderConfig overrides; the rest as
  :func:`jaxfid.retrieval.dense.index.write_dense_index`). Multi-host: every
  process calls it alike and embeds, process 0 reads and writes (``output``
  shared), all raise if any failed. Returns a summary (``{"index",
  "process"}`` off process 0)."""
  leader = multihost.is_leader()

  def load() -> LoadedEncoder:
    if leader:
      check_output(output)  # before the (slow) load
    return encoder if encoder is not None else load_dual_encoder(
        checkpoint, dtype=dtype, **settings)
  loaded = multihost.run_agreed(load, "loading the encoder")
  channel = (multihost.Channel("building the dense index")
             if multihost.process_count() > 1 else None)
  passages = EncoderPassages(loaded, batch_size=batch_size, mesh=mesh,
                             channel=channel if leader else None)
  if not leader:
    follow_dense_build(passages, output, channel)
    return {"index": str(output), "process": multihost.process_index()}
  with (channel.leading() if channel else contextlib.nullcontext()):
    return write_dense_index(
        passages, corpus, output, factory=factory, metric=metric,
        index_shards=index_shards, shard_size=shard_size,
        embedding_dtype=embedding_dtype, train_size=train_size,
        progress=progress, encoding=encoding)


def follow_dense_build(passages: EncoderPassages, output: str | os.PathLike,
                       channel: multihost.Channel) -> None:
  """A process other than 0 in a multi-host :func:`build_dense_index`: makes
  the same device calls for each row range process 0 embeds, until it
  publishes the index."""
  store = None
  while "rows" in (message := channel.receive()):
    error = None
    if store is None:
      try:
        store = PassageStore(staging_dir(output))
      except (InputError, OSError) as e:
        error = InputError(staging_dir(output), "process 0's passages cannot "
                           f"be read here ({e}); the index output must be on "
                           "a file system every process shares")
    multihost.agree(error, "reading the passages")
    for _ in passages.embed(store, *message["rows"]):
      pass


def import_dpr_embeddings(embeddings: str | Sequence[str],
                          corpus: str | os.PathLike,
                          output: str | os.PathLike, *,
                          query_encoder: str | os.PathLike | None = None,
                          **options) -> dict:
  """:func:`jaxfid.retrieval.dense.dpr_import.import_embeddings`, recording
  the T5 checkpoint ``query_encoder`` (if given) as the query encoder."""
  entry = None
  if query_encoder is not None:
    entry = encoder_entry(load_dual_encoder(query_encoder))
  return dpr_import.import_embeddings(embeddings, corpus, output,
                                      query_encoder_entry=entry, **options)


class EncoderQueries:
  """Embeds a dense index's queries with its recorded query encoder (or the
  ``query_encoder=CKPT`` search option's, with the recorded fingerprint)."""

  options = ("query_encoder",)

  def __init__(self, directory: str | os.PathLike, meta: dict):
    self.directory = directory
    self.entry = meta.get("query_encoder")
    self.dim = int(meta["dim"])
    self._embedder: Embedder | None = None
    self._checkpoint: str | None = None

  def embedder(self, checkpoint: str | None = None) -> Embedder:
    """The query embedder (the recorded encoder, or ``checkpoint``)."""
    entry = self.entry
    if checkpoint is None:
      if not entry:
        raise InputError(self.directory, "this index has no query encoder "
                         "(imported embeddings): pass precomputed vectors "
                         "with --search-option query_vectors=FILE, or an "
                         "encoder with --search-option query_encoder=CKPT")
      checkpoint = entry["checkpoint"]
    if self._embedder is None or self._checkpoint != checkpoint:
      overrides = {}
      if entry:
        recorded = entry.get("settings", {})
        overrides = {k: recorded[k] for k in _QUERY_SETTINGS if k in recorded}
      loaded = load_dual_encoder(checkpoint, dtype=(entry or {}).get("dtype"),
                                 **overrides)
      if entry and entry.get("fingerprint") not in (None, loaded.fingerprint):
        raise InputError(checkpoint, "the query encoder's weights differ "
                         "from those recorded when the index was built "
                         f"({os.path.join(self.directory, 'meta.json')}); "
                         "rebuild the index or pass the right "
                         "--search-option query_encoder=CKPT")
      if loaded.encoder.dim != self.dim:
        raise InputError(checkpoint, f"encoder gives {loaded.encoder.dim}-d "
                         f"vectors, the index holds {self.dim}-d")
      # searching is one process's work: its own devices
      self._embedder = Embedder(loaded.encoder, loaded.params,
                                loaded.tokenizer,
                                mesh=shd.parse_mesh("", jax.local_devices()))
      self._checkpoint = checkpoint
    return self._embedder

  def __call__(self, texts: Sequence[str],
               query_encoder: str | None = None) -> np.ndarray:
    return self.embedder(query_encoder).embed(texts, "query")


def searcher(directory: str | os.PathLike, meta: dict) -> DenseSearcher:
  """The searcher of a dense index, its queries embedded by its encoder."""
  return DenseSearcher(directory, meta, EncoderQueries(directory, meta))


def open_dense_index(directory: str | os.PathLike) -> DenseSearcher:
  """The searcher of a dense index directory (InputError if it is not one)."""
  return searcher(directory, read_dense_meta(directory))


register_index_type(INDEX_TYPE, searcher)

__all__ = ["build_dense_index", "import_dpr_embeddings", "open_dense_index",
           "encoder_entry", "EncoderPassages", "EncoderQueries",
           "follow_dense_build", "searcher"]
