"""Dense index directories: embed a corpus with a dual encoder, search FAISS.

``jaxfid index dense --checkpoint CKPT --corpus CORPUS --output INDEX_DIR``
(:func:`build_dense_index`) writes::

  meta.json            {"type": "dense", "num_passages", "dim", "encoder",
                        "query_encoder", "faiss", "embeddings", "corpus", ...}
  passages.bin ...     the passage store (as every index type has)
  embeddings.json, embeddings_00000.npy ...   every passage's vector
                       (jaxfid.retrieval.dense.embedding_store), fetchable by row
  faiss_00000.index .. the FAISS index parts (none for the exact "Flat"
                       default, which is filled from the embeddings on open)

The corpus is any format of :mod:`jaxfid.retrieval.store.corpus`, or *sentences*
(ReFusion's key-value store): a ``.txt`` file with one sentence per line, or
JSONL whose records have ``text`` but no id; sentence ids are their 0-based
row (blank lines are skipped).

Building happens in ``.NAME.partial/`` beside the output and is renamed into
place when complete. An interrupted build leaves that directory behind and
the same command resumes from its completed embedding shards; rebuilding an
existing index with the same encoder and corpus (another ``--faiss-factory``,
say) reuses the index's embeddings instead of encoding again.

:class:`DenseSearcher` (index type ``"dense"`` of
:func:`jaxfid.retrieval.search.open_index`) embeds queries with the same
encoder (loaded once, checked against the fingerprint recorded at indexing)
and searches all FAISS parts. Search options: ``query_vectors=FILE``
(precomputed query vectors, see :func:`jaxfid.retrieval.dense.dpr_import
.read_query_vectors`), ``query_encoder=CKPT`` (another path for the encoder),
``mmap=1`` (memory-map written FAISS files) and FAISS parameters
(``nprobe``, ``ef_search``, ...).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.retrieval.store.corpus import (
    Passage, detect_format, iter_json_lines, iter_lines, read_corpus)
from jaxfid.retrieval.dense.embedding_store import (
    DEFAULT_SHARD_SIZE, EmbeddingStore, ShardWriter)
from jaxfid.retrieval.dense.faiss_index import (
    DEFAULT_FACTORY, DEFAULT_TRAIN_SIZE, ShardedIndex, build_faiss_index,
    make_index)
from jaxfid.core.files import replace_directory
from jaxfid.retrieval.index_dir import check_output, read_meta, write_meta
from jaxfid.retrieval.store.passage_store import (
    PassageStore, PassageStoreWriter)
from jaxfid.retrieval.search import register_index_type

INDEX_TYPE = "dense"
_PASSAGE_SETTINGS = ("pooling", "normalize", "projection_dim",
                     "projection_bias", "projection_activation",
                     "passage_maxlength", "passage_format")


# --------------------------------------------------------------------------
# corpora and sentence files


def _sentences_from_text(path) -> Iterator[tuple[int, Passage]]:
  row = 0
  for lineno, line in iter_lines(path):
    if line.strip():
      yield lineno, Passage(str(row), "", line)
      row += 1


def _sentences_from_jsonl(path) -> Iterator[tuple[int, Passage]]:
  row = 0
  for lineno, record in iter_json_lines(path):
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
      raise InputError(path, "expected a JSON object with a string 'text'",
                       where=lineno)
    title = record.get("title") or ""
    if not isinstance(title, str):
      raise InputError(path, "'title' must be a string", where=lineno)
    yield lineno, Passage(str(row), title, record["text"])
    row += 1


def _first_record(path) -> dict | None:
  for _, line in iter_lines(path):
    if line.strip():
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        return None  # read_corpus reports it
      return record if isinstance(record, dict) else None
  return None


def read_dense_corpus(path: str | os.PathLike
                      ) -> Iterator[tuple[int, Passage]]:
  """(line, Passage) of a corpus or sentence file (see the module docstring)."""
  name = os.path.basename(str(path)).lower()
  if name.endswith((".txt", ".txt.gz")):
    return _sentences_from_text(path)
  if detect_format(path) == "jsonl":
    first = _first_record(path)
    if first is not None and "_id" not in first and "id" not in first:
      return _sentences_from_jsonl(path)
  return read_corpus(path)


# --------------------------------------------------------------------------
# building


def store_fingerprint(directory: str | os.PathLike) -> str:
  """A hash of a passage store's ids and passage boundaries and sizes."""
  directory = Path(directory)
  h = hashlib.blake2b(digest_size=12)
  for name in ("ids.txt", "offsets.npy"):
    with open(directory / name, "rb") as f:
      for block in iter(lambda: f.read(1 << 24), b""):
        h.update(block)
  h.update(str((directory / "passages.bin").stat().st_size).encode())
  return h.hexdigest()


def staging_dir(output: str | os.PathLike) -> Path:
  """Where a build of ``output`` happens (and resumes from)."""
  output = Path(output)
  return output.parent / f".{output.name}.partial"


def write_store(corpus, staging: Path,
                progress: bool | None = None) -> PassageStore:
  """Reads the corpus into the staging directory's passage store.

  On a malformed corpus the staging directory is removed (its embeddings, if
  any, belong to another corpus) and the InputError propagates.
  """
  from tqdm.auto import tqdm
  try:
    with PassageStoreWriter(staging, source=corpus) as writer:
      for lineno, passage in tqdm(
          read_dense_corpus(corpus), desc="reading", unit=" passages",
          disable=None if progress is None else not progress):
        writer.add(passage, lineno)
  except InputError:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  if len(writer) == 0:
    shutil.rmtree(staging, ignore_errors=True)
    raise InputError(corpus, "no passages")
  return PassageStore(staging)


def _passage_texts(store: PassageStore, start: int, end: int,
                   passage_format: str) -> list[str]:
  from jaxfid.dual_encoder.model import passage_text
  return [passage_text(store.title(i), store.text(i), passage_format)
          for i in range(start, end)]


def embed_store(loaded, store: PassageStore, writer: ShardWriter, *,
                batch_size: int = 128, mesh: str = "",
                progress: bool | None = None) -> int:
  """Embeds the passages of every missing shard; returns how many."""
  from tqdm.auto import tqdm

  from jaxfid.core import sharding as shd
  from jaxfid.dual_encoder.model import Embedder
  missing = writer.missing()
  remaining = sum(writer.shard_rows(i)[1] - writer.shard_rows(i)[0]
             for i in missing)
  if not remaining:
    return 0
  try:
    device_mesh = shd.parse_mesh(mesh)
  except ValueError as e:
    raise InputError("--mesh", str(e)) from None
  settings = loaded.encoder.settings
  embedder = Embedder(loaded.encoder, loaded.params, loaded.tokenizer,
                      mesh=device_mesh, batch_size=batch_size)
  disable = None if progress is None else not progress
  with tqdm(total=len(store), initial=len(store) - remaining, desc="embedding",
            unit=" passages", disable=disable, smoothing=0.1) as bar:
    for i in missing:
      start, end = writer.shard_rows(i)
      batches = (_passage_texts(store, a, min(a + embedder.batch_size, end),
                                settings.passage_format)
                 for a in range(start, end, embedder.batch_size))
      parts = []
      for vectors in embedder.embed_batches(batches, "passage",
                                            settings.passage_maxlength):
        parts.append(vectors)
        bar.update(len(vectors))
      writer.write(i, np.concatenate(parts))
  return remaining


def encoder_entry(loaded) -> dict:
  """The ``meta.json`` description of a (query) encoder."""
  return {"checkpoint": os.path.abspath(loaded.source), "kind": loaded.kind,
          "fingerprint": loaded.fingerprint, "dim": loaded.encoder.dim,
          "dtype": loaded.encoder.config.dtype,
          "settings": loaded.encoder.settings.to_dict()}


def build_dense_index(checkpoint: str | os.PathLike | None,
                      corpus: str | os.PathLike,
                      output: str | os.PathLike, *,
                      factory: str = DEFAULT_FACTORY, metric: str = "ip",
                      index_shards: int = 1, batch_size: int = 128,
                      shard_size: int = DEFAULT_SHARD_SIZE,
                      embedding_dtype: str = "float32",
                      dtype: str | None = None, mesh: str = "",
                      train_size: int = DEFAULT_TRAIN_SIZE,
                      progress: bool | None = None, encoder=None,
                      **settings) -> dict:
  """Indexes ``corpus`` into the directory ``output``; returns a summary.

  Args:
    checkpoint: any checkpoint :func:`~jaxfid.dual_encoder.checkpoint
      .load_dual_encoder` reads (ignored when ``encoder`` is given).
    corpus: a corpus or sentence file (see :func:`read_dense_corpus`).
    output: the index directory (replaced if it already holds an index).
    factory: FAISS factory string; "Flat" is exact search.
    metric: 'ip' (inner product) or 'l2'.
    index_shards: FAISS sub-indexes over contiguous row ranges.
    batch_size: passages per device call (over all devices).
    shard_size: passages per embedding shard file.
    embedding_dtype: 'float32' or 'float16' storage of the embeddings.
    dtype: activation dtype of the encoder ('bfloat16' on accelerators).
    mesh: device mesh (default: every device on ``data``).
    train_size: vectors to train IVF/PQ indexes on.
    encoder: an already loaded encoder (a LoadedEncoder).
    **settings: DualEncoderConfig overrides (passage_maxlength, normalize,
      pooling, ...; None = the checkpoint's).

  Returns:
    ``{"index", "num_passages", "dim", "embedded", "reused", ...}``.
  """
  from jaxfid.dual_encoder.checkpoint import load_dual_encoder
  output = Path(output)
  check_output(output)
  loaded = encoder if encoder is not None else load_dual_encoder(
      checkpoint, dtype=dtype, **settings)
  dim = loaded.encoder.dim
  make_index(dim, factory, metric)  # fails fast on a bad factory string
  if index_shards < 1:
    raise InputError("--index-shards", f"must be positive, got {index_shards}")
  staging = staging_dir(output)
  staging.mkdir(parents=True, exist_ok=True)
  store = write_store(corpus, staging, progress)
  s = loaded.encoder.settings.to_dict()
  source = {"encoder": loaded.fingerprint,
            "dtype": loaded.encoder.config.dtype,
            "settings": {k: s[k] for k in _PASSAGE_SETTINGS},
            "passages": store_fingerprint(staging)}
  writer = ShardWriter(staging, len(store), dim, dtype=embedding_dtype,
                       shard_size=shard_size, source=source)
  if output.is_dir():
    writer.adopt(output)
  embedded = embed_store(loaded, store, writer, batch_size=batch_size,
                         mesh=mesh, progress=progress)
  embeddings = EmbeddingStore(staging)
  for stale in staging.glob("faiss_*.index"):  # from an earlier attempt
    stale.unlink()
  faiss_info = build_faiss_index(embeddings, staging, factory=factory,
                                 metric=metric, index_shards=index_shards,
                                 train_size=train_size, progress=progress)
  meta = write_meta(
      staging, INDEX_TYPE, num_passages=len(store), dim=dim,
      corpus=os.path.abspath(corpus), encoder=encoder_entry(loaded),
      query_encoder=encoder_entry(loaded), faiss=faiss_info,
      embeddings={"dtype": embedding_dtype, "shard_size": shard_size,
                  "num_shards": writer.num_shards})
  del store, embeddings
  replace_directory(staging, output)
  return {"index": str(output), "type": INDEX_TYPE,
          "num_passages": meta["num_passages"], "dim": dim,
          "factory": factory, "index_shards": index_shards,
          "embedded": embedded, "reused": meta["num_passages"] - embedded}


# --------------------------------------------------------------------------
# searching


class DenseSearcher:
  """Searches a dense index directory (the ``"dense"`` index type)."""

  def __init__(self, directory: str | os.PathLike, meta: dict | None = None):
    self.directory = Path(directory)
    self.meta = meta if meta is not None else read_meta(directory)
    self.store = PassageStore(self.directory)
    self.embeddings = EmbeddingStore(self.directory)
    if len(self.embeddings) != len(self.store):
      raise InputError(self.directory, f"{len(self.embeddings)} embeddings "
                       f"for {len(self.store)} passages")
    self._index: ShardedIndex | None = None
    self._index_mmap = False
    self._embedder = None
    self._encoder_path: str | None = None
    self._query_vectors: dict[str, dict] = {}
    self._faiss_options: dict = {}

  # ---- pieces, loaded on first use ---------------------------------------

  def index(self, mmap: bool = False) -> ShardedIndex:
    if self._index is None or self._index_mmap != mmap:
      self._index = ShardedIndex.load(self.directory, self.meta["faiss"],
                                      self.embeddings, mmap=mmap)
      self._index_mmap = mmap
      self._faiss_options = {}
    return self._index

  def embedder(self, checkpoint: str | None = None):
    """The query embedder (the recorded encoder, or ``checkpoint``)."""
    from jaxfid.dual_encoder.checkpoint import load_dual_encoder
    from jaxfid.dual_encoder.model import Embedder
    entry = self.meta.get("query_encoder")
    if checkpoint is None:
      if not entry:
        raise InputError(self.directory, "this index has no query encoder "
                         "(imported embeddings): pass precomputed vectors "
                         "with --search-option query_vectors=FILE, or an "
                         "encoder with --search-option query_encoder=CKPT")
      checkpoint = entry["checkpoint"]
    if self._embedder is None or self._encoder_path != checkpoint:
      overrides = {}
      if entry:
        overrides = {k: entry["settings"][k] for k in (
            "pooling", "normalize", "query_maxlength", "passage_maxlength",
            "passage_format") if k in entry.get("settings", {})}
      loaded = load_dual_encoder(checkpoint, dtype=(entry or {}).get("dtype"),
                                 **overrides)
      if entry and entry.get("fingerprint") not in (None, loaded.fingerprint):
        raise InputError(checkpoint, "the query encoder's weights differ "
                         "from those recorded when the index was built "
                         f"({self.directory / 'meta.json'}); rebuild the "
                         "index or pass the right --search-option "
                         "query_encoder=CKPT")
      if loaded.encoder.dim != self.embeddings.dim:
        raise InputError(checkpoint, f"encoder gives {loaded.encoder.dim}-d "
                         f"vectors, the index holds {self.embeddings.dim}-d")
      self._embedder = Embedder(loaded.encoder, loaded.params,
                                loaded.tokenizer)
      self._encoder_path = checkpoint
    return self._embedder

  def vectors(self, rows: Sequence[int]) -> np.ndarray:
    """float32 [len(rows), dim]: the stored embeddings of passages ``rows``."""
    return self.embeddings[rows]

  # ---- search ------------------------------------------------------------

  def embed_queries(self, texts: Sequence[str],
                    query_vectors: str | None = None,
                    query_encoder: str | None = None) -> np.ndarray:
    """float32 [len(texts), dim] query vectors."""
    if query_vectors is not None:
      from jaxfid.retrieval.dense.dpr_import import read_query_vectors
      if query_vectors not in self._query_vectors:
        self._query_vectors[query_vectors] = read_query_vectors(
            query_vectors, self.embeddings.dim)
      table = self._query_vectors[query_vectors]
      missing = [t for t in texts if t not in table]
      if missing:
        raise InputError(query_vectors, f"no vector for query "
                         f"{missing[0][:80]!r}")
      return np.stack([table[t] for t in texts]).astype(np.float32)
    return self.embedder(query_encoder).embed(texts, "query")

  def search_vectors(self, vectors: np.ndarray, top_k: int
                     ) -> list[list[tuple[int, float]]]:
    """Top ``top_k`` (row, score) per query vector, best first."""
    scores, rows = self.index(self._index_mmap).search(vectors, top_k)
    out = []
    for s, r in zip(scores.tolist(), rows.tolist()):
      out.append([(row, score) for row, score in zip(r, s) if row >= 0])
    return out

  def search(self, texts: Sequence[str], top_k: int,
             **options) -> list[list[tuple[int, float]]]:
    """Top ``top_k`` (store row, score) per query text, best first."""
    options = dict(options)
    query_vectors = options.pop("query_vectors", None)
    query_encoder = options.pop("query_encoder", None)
    mmap = str(options.pop("mmap", "0")).lower() in ("1", "true", "yes")
    if "token_top_k" in options:
      raise InputError(self.directory, "option --token-top-k does not apply "
                       "to a dense index")
    index = self.index(mmap)
    if options != self._faiss_options:
      index.set_options(self.directory, **options)
      self._faiss_options = options
    if not texts:
      return []
    vectors = self.embed_queries(texts, query_vectors, query_encoder)
    return self.search_vectors(vectors, top_k)


def open_dense_index(directory: str | os.PathLike) -> DenseSearcher:
  """The searcher of a dense index directory (InputError if it is not one)."""
  meta = read_meta(directory)
  if meta["type"] != INDEX_TYPE:
    raise InputError(directory, f"a {meta['type']!r} index, not a dense one")
  return DenseSearcher(directory, meta)


register_index_type(INDEX_TYPE, DenseSearcher)

__all__ = ["build_dense_index", "read_dense_corpus", "DenseSearcher",
           "open_dense_index", "store_fingerprint", "staging_dir"]
