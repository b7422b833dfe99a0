"""ReAtt token-level index: retrieval-head keys of every corpus token in FAISS.

Layout of ``INDEX_DIR`` (``jaxfid index reatt``)::

  meta.json          {"type": "reatt", "num_passages", "num_tokens", "dim",
                      "head", "faiss": "flat" | "ivfpq", "doc_maxlength",
                      "query_maxlength", "model", "reatt", ...}
  passages.bin ...   the passage store
  keys.f32           float32 [num_tokens, dim]: every real token's key
  doc_offsets.npy    int64 [num_passages + 1]: passage i has rows [o[i], o[i+1])
  bi_encoder.npz     the query side of the model
  spiece.model       the vocabulary
  tokens.faiss       the IVF-PQ index (``ivfpq`` only)

Documents are ``title: T context: P`` + EOS (``doc_maxlength``), queries
``question: Q`` (``query_maxlength``); no position bias. Search: each query
token fetches its ``token_top_k`` nearest tokens; their passages are
rescored exactly with avg-max over all their tokens and the top K returned,
ties by passage id. ``rerank_top_k`` first keeps that many candidates by the
original's approximate score.
"""
from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path
from typing import Sequence

import faiss
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from jaxfid.checkpoints import names
from jaxfid.core import sharding as shd
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer, encode_padded, pad_ids
from jaxfid.reader.examples import PASSAGE_PREFIX, QUESTION_PREFIX, TITLE_PREFIX
from jaxfid.reatt import model as reatt
from jaxfid.retrieval.index_dir import building, check_output, write_meta
from jaxfid.retrieval.index_files import (
    check_file_size, file_size, load_array)
from jaxfid.retrieval.search import register_index_type
from jaxfid.retrieval.store.corpus import read_corpus
from jaxfid.retrieval.store.passage_store import (
    PassageStore, PassageStoreWriter)
from jaxfid.runtime import multihost
from jaxfid.runtime.files import atomic_directory
from jaxfid.t5 import layers
from jaxfid.t5.config import T5Config
from jaxfid.t5.network import EncoderLayer

Array = jax.Array
INDEX_TYPE = "reatt"
FAISS_TYPES = ("flat", "ivfpq")
SEARCH_OPTIONS = ("token_top_k", "nprobe", "rerank_top_k")
DEFAULT_TOKEN_TOP_K = 2048
_RESCORE_TOKENS = 1 << 20  # candidate tokens rescored per matrix product
QUERY_BATCH = 32


# ------------------------------------------------------------ the bi-encoder


class _RetrievalLayer(nnx.Module):
  """What the index needs of encoder layer B: its norm and attention."""

  def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
    self.pre_attention_layer_norm = layers.RMSNorm(config)
    self.attention = layers.Attention(config, rngs=rngs)


class _BiEncoderStack(nnx.Module):
  """Encoder layers [0, B) and layer B's projections, named as in T5."""

  def __init__(self, config: T5Config, num_layers: int, *, rngs: nnx.Rngs):
    self.config = config
    self.relpos_bias = layers.RelativePositionBias(config, bidirectional=True,
                                                   rngs=rngs)
    for i in range(num_layers):
      setattr(self, f"layers_{i}", EncoderLayer(config, rngs=rngs))
    setattr(self, f"layers_{num_layers}", _RetrievalLayer(config, rngs=rngs))

  def layer(self, i: int):
    return getattr(self, f"layers_{i}")


class BiEncoder(nnx.Module):
  """The bi-encoder half of a ReAtt model; its params are a T5 params subtree."""

  def __init__(self, config: T5Config, num_layers: int, *, rngs: nnx.Rngs):
    self.token_embedder = layers.Embed(config, rngs=rngs)
    self.encoder = _BiEncoderStack(config, num_layers, rngs=rngs)
    self.num_layers = num_layers

  def vectors(self, tokens: Array, *, queries: bool, head: int) -> Array:
    """float32 [N, L, E]: query (or key) vectors of ``head`` for token rows."""
    valid = tokens != 0
    # one block per row: all question (queries) or all document (keys)
    qlen = jnp.full(tokens.shape[:1], tokens.shape[1] if queries else 0,
                    jnp.int32)
    h = reatt.bi_encode(self.encoder, self.token_embedder(tokens), valid, qlen,
                        self.num_layers)
    project = reatt.retrieval_queries if queries else reatt.retrieval_keys
    return project(self.encoder, h, self.num_layers)[:, :, head].astype(
        jnp.float32)


def bi_encoder_params(params: dict, num_layers: int) -> dict:
  """The :class:`BiEncoder` subtree of ReAtt (or T5) params."""
  enc = params["encoder"]
  stack = {"relpos_bias": enc["relpos_bias"]}
  for i in range(num_layers):
    stack[f"layers_{i}"] = enc[f"layers_{i}"]
  last = enc[f"layers_{num_layers}"]
  stack[f"layers_{num_layers}"] = {
      "pre_attention_layer_norm": last["pre_attention_layer_norm"],
      "attention": last["attention"]}
  return {"token_embedder": params["token_embedder"], "encoder": stack}


def _flatten(tree: dict) -> dict[str, np.ndarray]:
  return {k: np.asarray(jax.device_get(v), np.float32)
          for k, v in names.flatten(tree).items()}


def _unflatten(flat) -> dict:
  return names.unflatten({k: jnp.asarray(flat[k]) for k in flat.keys()})


class TokenEncoder:
  """Jitted query and document encoders for one retrieval head.

  Token rows are split over ``devices`` (default: this process's), the
  parameters replicated. A multi-host index build passes every device: each
  process then passes the same tokens and gets every vector.
  """

  def __init__(self, config: T5Config, reatt_config: reatt.ReAttConfig,
               params: dict, head: int, devices=None):
    n = reatt_config.bi_encoder_layers
    config = config.replace(dropout_rate=0.0, remat="none")
    module = nnx.eval_shape(lambda: BiEncoder(config, n, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(module)
    nnx.replace_by_pure_dict(state, params)
    self.config, self.reatt_config, self.head = config, reatt_config, head
    self.params = params
    self.mesh = shd.parse_mesh(
        "", jax.local_devices() if devices is None else devices)
    replicated = NamedSharding(self.mesh, PartitionSpec())
    self._rows = NamedSharding(
        self.mesh, shd.logical_to_mesh((shd.BATCH,), mesh=self.mesh))
    fn = lambda st, tokens, queries: nnx.merge(graphdef, st).vectors(
        tokens, queries=queries, head=head)
    self._encode = jax.jit(fn, static_argnums=2, out_shardings=replicated)
    self._state = multihost.put(state, replicated)

  @classmethod
  def from_model(cls, model: reatt.ReAttModel, params: dict,
                 devices=None) -> "TokenEncoder":
    """The retrieval head (argmax of the head selector) of a trained model."""
    head = int(np.argmax(np.asarray(jax.device_get(
        model.head_probabilities(params)))))
    sub = jax.tree.map(lambda x: jnp.asarray(jax.device_get(x)),
                       bi_encoder_params(params, model.reatt.bi_encoder_layers))
    return cls(model.config, model.reatt, sub, head, devices)

  def encode(self, tokens: np.ndarray, queries: bool) -> np.ndarray:
    """float32 [N, L, E] of int32 tokens [N, L]."""
    n, parallel = len(tokens), self.mesh.size
    size = max(parallel, -(-n // parallel) * parallel)
    if size > n:  # rows split evenly over the devices
      tokens = np.concatenate(
          [tokens, np.zeros((size - n, tokens.shape[1]), np.int32)])
    with jax.set_mesh(self.mesh):
      out = self._encode(self._state, multihost.put(tokens, self._rows),
                         queries)
    return np.asarray(out)[:n]


def query_tokens(tokenizer: Tokenizer, texts: Sequence[str],
                 maxlength: int) -> np.ndarray:
  """``question: Q`` ids without EOS, as the question block of a training row."""
  ids = tokenizer.encode_batch([f"{QUESTION_PREFIX} {t}" for t in texts])
  return pad_ids(ids, maxlength, add_eos=False)


def document_tokens(tokenizer: Tokenizer, titles: Sequence[str],
                    texts: Sequence[str], maxlength: int) -> np.ndarray:
  """``title: T context: P`` + EOS, as the document block of a training row."""
  strings = [f"{TITLE_PREFIX} {t} {PASSAGE_PREFIX} {x}"
             for t, x in zip(titles, texts)]
  return encode_padded(tokenizer, strings, maxlength)


# ----------------------------------------------------------------- building


def _batches(items, size: int):
  batch = []
  for item in items:
    batch.append(item)
    if len(batch) == size:
      yield batch
      batch = []
  if batch:
    yield batch


def _faiss_flat(keys: np.ndarray):
  index = faiss.IndexFlatIP(keys.shape[1])
  for start in range(0, len(keys), 1 << 20):
    index.add(np.ascontiguousarray(keys[start:start + (1 << 20)], np.float32))
  return index


def _faiss_ivfpq(keys: np.ndarray, nlist: int, pq_m: int, pq_bits: int,
                 seed: int = 0):
  dim = keys.shape[1]
  if dim % pq_m:
    raise InputError("--pq-m", f"{pq_m} does not divide the key width {dim}")
  nlist = max(1, min(nlist, len(keys) // 39))  # FAISS wants 39 points a list
  quantizer = faiss.IndexFlatIP(dim)
  index = faiss.IndexIVFPQ(quantizer, dim, nlist, pq_m, pq_bits,
                           faiss.METRIC_INNER_PRODUCT)
  rng = np.random.default_rng(seed)
  sample_size = min(len(keys), max(256 * nlist, 2 ** pq_bits * 39))
  sample = np.sort(rng.choice(len(keys), sample_size, replace=False))
  index.train(np.ascontiguousarray(keys[sample], np.float32))
  for start in range(0, len(keys), 1 << 20):
    index.add(np.ascontiguousarray(keys[start:start + (1 << 20)], np.float32))
  return index


def document_batch(tokenizer: Tokenizer, chunk, doc_maxlength: int,
                   batch_size: int) -> np.ndarray:
  """int32 [batch_size, doc_maxlength]: the documents of (line, Passage)
  pairs ``chunk``, then rows of padding (one shape: one compilation)."""
  tokens = document_tokens(tokenizer, [p.title for _, p in chunk],
                           [p.text for _, p in chunk], doc_maxlength)
  return np.concatenate([tokens, np.zeros(
      (batch_size - len(chunk), doc_maxlength), np.int32)])


def build_token_index(encoder: TokenEncoder, tokenizer: Tokenizer,
                      corpus: str | os.PathLike, output: str | os.PathLike, *,
                      doc_maxlength: int, query_maxlength: int,
                      batch_size: int = 64, faiss_type: str = "flat",
                      nlist: int = 1024, pq_m: int = 16, pq_bits: int = 8,
                      progress: bool | None = None,
                      extra_meta: dict | None = None,
                      announce=None, encoding: str = "utf-8") -> dict:
  """Encodes every corpus passage's tokens and writes the index directory.

  One compiled encoder ([batch_size, doc_maxlength]); the directory appears
  only when complete, one build at a time, a full disk is a StorageError.
  ``announce`` (multi-host) sees process 0's passage batches first.
  """
  if faiss_type not in FAISS_TYPES:
    raise InputError("--faiss", f"must be one of {FAISS_TYPES}, got "
                     f"{faiss_type!r}")
  for name, value in (("--doc-maxlength", doc_maxlength),
                      ("--query-maxlength", query_maxlength),
                      ("--batch-size", batch_size)):
    if value < 1:
      raise InputError(name, "must be at least 1")
  dim = encoder.config.d_kv
  with building(output), \
      atomic_directory(output, check=check_output) as tmp:
    offsets = [0]
    with PassageStoreWriter(tmp, source=corpus) as store, \
        open(tmp / "keys.f32", "wb") as keys_file:
      passages = tqdm(read_corpus(corpus, encoding=encoding),
                      desc="indexing", unit=" passages",
                      disable=None if progress is None else not progress)
      chunks = _batches(passages, batch_size)
      for chunk in announce(chunks) if announce else chunks:
        for lineno, passage in chunk:
          store.add(passage, lineno)
        tokens = document_batch(tokenizer, chunk, doc_maxlength, batch_size)
        real = len(chunk)
        vectors = encoder.encode(tokens, queries=False)[:real]   # [b, L, E]
        valid = tokens[:real] != 0
        keys_file.write(np.ascontiguousarray(vectors[valid], np.float32)
                        .tobytes())
        for row in valid:
          offsets.append(offsets[-1] + int(row.sum()))
    if len(offsets) == 1:
      raise InputError(corpus, "no passages in the corpus")
    np.save(tmp / "doc_offsets.npy", np.asarray(offsets, np.int64))
    num_tokens = offsets[-1]
    if faiss_type == "ivfpq":
      keys = np.memmap(tmp / "keys.f32", np.float32, "r", shape=(num_tokens, dim))
      faiss.write_index(_faiss_ivfpq(keys, nlist, pq_m, pq_bits),
                        str(tmp / "tokens.faiss"))
      del keys
    np.savez(tmp / "bi_encoder.npz", **_flatten(encoder.params))
    shutil.copyfile(tokenizer.path, tmp / "spiece.model")
    meta = write_meta(
        tmp, INDEX_TYPE, num_passages=len(offsets) - 1, num_tokens=num_tokens,
        dim=dim, head=encoder.head, faiss=faiss_type,
        doc_maxlength=doc_maxlength, query_maxlength=query_maxlength,
        corpus=os.path.abspath(corpus), model=encoder.config.to_dict(),
        reatt=encoder.reatt_config.to_dict(),
        **({"nlist": nlist, "pq_m": pq_m, "pq_bits": pq_bits}
           if faiss_type == "ivfpq" else {}),
        **(extra_meta or {}))
  return meta


# ---------------------------------------------------------------- searching


def avg_max_scores(queries: np.ndarray, keys: np.ndarray,
                   starts: np.ndarray) -> np.ndarray:
  """Exact avg-max of one query [Q, E] against passages whose keys are
  ``keys[starts[i]:starts[i+1]]`` (every passage has at least one token)."""
  sims = queries @ keys.T                                        # [Q, tokens]
  best = np.maximum.reduceat(sims, starts[:-1], axis=1)          # [Q, docs]
  return best.mean(axis=0)


class TokenSearcher:
  """Searches a ReAtt token index (the ``"reatt"`` index type)."""

  def __init__(self, directory: str | os.PathLike, meta: dict):
    self.directory = Path(directory)
    self.meta = meta
    d = self.directory
    self.store = PassageStore(directory, num_passages=meta["num_passages"])
    num_tokens, dim = int(meta["num_tokens"]), int(meta["dim"])
    self.offsets = load_array(d / "doc_offsets.npy", (len(self.store) + 1,),
                              (np.int64,), mmap=False)
    if int(self.offsets[-1]) != num_tokens:
      raise InputError(d / "doc_offsets.npy", f"{int(self.offsets[-1])} "
                       f"tokens, meta.json says {num_tokens} (rebuild the "
                       "index)")
    check_file_size(d / "keys.f32", num_tokens * dim * 4)
    self.keys = np.memmap(d / "keys.f32", np.float32, "r",
                          shape=(num_tokens, dim))
    file_size(d / "spiece.model")
    self.tokenizer = Tokenizer(d / "spiece.model")
    file_size(d / "bi_encoder.npz")
    try:
      with np.load(d / "bi_encoder.npz") as flat:
        params = _unflatten(flat)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
      raise InputError(d / "bi_encoder.npz", f"unreadable ({e}; rebuild the "
                       "index)") from None
    self.encoder = TokenEncoder(T5Config.from_dict(meta["model"]),
                                reatt.ReAttConfig.from_dict(meta["reatt"]),
                                params, int(meta["head"]))
    if meta["faiss"] == "ivfpq":
      file_size(d / "tokens.faiss")
      try:
        self.index = faiss.read_index(str(d / "tokens.faiss"))
      except RuntimeError as e:
        raise InputError(d / "tokens.faiss", "cannot read FAISS index: "
                         f"{str(e).strip().splitlines()[-1]}") from None
      if self.index.ntotal != num_tokens:
        raise InputError(d / "tokens.faiss", f"holds {self.index.ntotal} "
                         f"vectors, meta.json says {num_tokens}")
    else:
      self.index = _faiss_flat(self.keys)

  def encode_queries(self, texts: Sequence[str]) -> list[np.ndarray]:
    """Each query's token vectors [Q_i, E] (real tokens only)."""
    tokens = query_tokens(self.tokenizer, texts, int(self.meta["query_maxlength"]))
    n = len(tokens)
    padded = np.zeros((-(-n // QUERY_BATCH) * QUERY_BATCH, tokens.shape[1]),
                      np.int32)  # fixed batch shapes: one compilation
    padded[:n] = tokens
    vectors = np.concatenate([
        self.encoder.encode(padded[i:i + QUERY_BATCH], queries=True)
        for i in range(0, len(padded), QUERY_BATCH)])[:n]
    return [v[t != 0] for v, t in zip(vectors, tokens)]

  def _options(self, options: dict) -> tuple[int, int | None, int | None]:
    unknown = sorted(set(options) - set(SEARCH_OPTIONS))
    if unknown:
      flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
      raise InputError(self.directory, f"option {flags} does not apply to a "
                       f"reatt index (known: {', '.join(SEARCH_OPTIONS)})")
    values = {}
    for name in SEARCH_OPTIONS:
      if options.get(name) is None:
        continue
      try:
        values[name] = int(options[name])
      except (TypeError, ValueError):
        raise InputError(self.directory, f"{name} must be an integer, got "
                         f"{options[name]!r}") from None
      if values[name] < 1:
        raise InputError(self.directory, f"{name} must be positive")
    return (values.get("token_top_k", DEFAULT_TOKEN_TOP_K),
            values.get("nprobe"), values.get("rerank_top_k"))

  def candidates(self, query: np.ndarray, token_top_k: int,
                 rerank_top_k: int | None = None) -> np.ndarray:
    """Passages owning any of each query token's top tokens (sorted rows);
    with ``rerank_top_k``, the best that many by the approximate score."""
    k = min(token_top_k, self.index.ntotal)
    sims, ids = self.index.search(np.ascontiguousarray(query, np.float32), k)
    found = ids >= 0                                              # [Q, k]
    owners = np.searchsorted(self.offsets, ids, side="right") - 1
    rows, column = np.unique(owners[found], return_inverse=True)
    if rerank_top_k is None or len(rows) <= rerank_top_k:
      return rows
    best = np.full((len(query), len(rows)), -np.inf, np.float32)  # [Q, docs]
    np.maximum.at(best, (np.nonzero(found)[0], column), sims[found])
    approx = np.where(np.isfinite(best), best, 0.0).sum(axis=0)   # [docs]
    keep = np.lexsort((self.store.id_rank[rows], -approx))[:rerank_top_k]
    return np.sort(rows[keep])

  def rescore(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Exact avg-max of ``query`` against passages ``rows`` (all their tokens).

    Candidates' keys are gathered with one fancy index per chunk of about
    ``_RESCORE_TOKENS`` tokens (rows sorted: reads are in file order).
    """
    out = np.empty(len(rows), np.float32)
    lengths = self.offsets[rows + 1] - self.offsets[rows]
    ends = np.cumsum(lengths)
    start = 0
    while start < len(rows):
      budget = ends[start] - lengths[start] + _RESCORE_TOKENS
      stop = max(start + 1, int(np.searchsorted(ends, budget, side="right")))
      sizes = lengths[start:stop]
      bounds = np.concatenate([[0], np.cumsum(sizes)])
      idx = (np.arange(bounds[-1]) - np.repeat(bounds[:-1], sizes)
             + np.repeat(self.offsets[rows[start:stop]], sizes))
      out[start:stop] = avg_max_scores(query, self.keys[idx], bounds)
      start = stop
    return out

  def search(self, texts: Sequence[str], top_k: int,
             **options) -> list[list[tuple[int, float]]]:
    """Top ``top_k`` (store row, score) per query text, best first."""
    token_top_k, nprobe, rerank_top_k = self._options(options)
    if nprobe is not None and hasattr(self.index, "nprobe"):
      self.index.nprobe = nprobe
    rank = self.store.id_rank
    results = []
    for query in self.encode_queries(texts):
      if len(query) == 0:
        results.append([])
        continue
      rows = self.candidates(query, token_top_k, rerank_top_k)
      scores = self.rescore(query, rows)
      order = np.lexsort((rank[rows], -scores))[:top_k]
      results.append([(int(rows[i]), float(scores[i])) for i in order])
    return results


def _load(directory: Path, meta: dict) -> TokenSearcher:
  return TokenSearcher(directory, meta)


register_index_type(INDEX_TYPE, _load)
