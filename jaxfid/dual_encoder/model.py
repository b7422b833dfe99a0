"""A T5 dual encoder (GTR / Sentence-T5): mean-pooled encoder outputs.

A text's vector is the mean of the T5 encoder's final states over its
non-padding tokens, EOS included (``pooling="first"``: the first token),
optionally projected (``projection``: ``{"kernel": [D, P]}``, maybe
``bias``) and L2-normalised. Parameters are those of an
:class:`~jaxfid.t5.model.EncoderDecoderModel` with no decoder layers
(:func:`encoder_config`), so a MODEL_DIR also loads as a T5, plus the
optional ``projection`` and ``query_tower`` (separate question encoder).
Passages are ``title + " " + text`` (``"title_text"``) or ``"title: T
context: P"`` (``"fid"``); both end with EOS and are truncated.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxfid.core import sharding as shd
from jaxfid.core.config import Config, option
from jaxfid.core.tokenization import pad_ids
from jaxfid.runtime import multihost
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

Array = jax.Array
POOLINGS = ("mean", "first")
PASSAGE_FORMATS = ("title_text", "fid")
ACTIVATIONS = ("identity", "tanh")
TOWERS = ("passage", "query")
T5_KEYS = ("token_embedder", "encoder", "decoder")
QUERY_TOWER = "query_tower"


@dataclasses.dataclass(frozen=True)
class DualEncoderConfig(Config):
  """How texts become vectors (everything but the T5 architecture).

  Attributes:
    pooling: 'mean' over non-padding tokens (GTR, Sentence-T5) or 'first'.
    normalize: L2-normalise the vectors (GTR, Sentence-T5 do).
    projection_dim: width of the dense projection after pooling, or None.
    projection_bias: whether the projection has a bias.
    projection_activation: 'identity' (GTR) or 'tanh'.
    shared: one encoder for questions and passages (GTR); False gives the
      questions their own tower (DPR).
    query_maxlength: tokens per question, EOS included.
    passage_maxlength: tokens per passage, EOS included.
    passage_format: 'title_text' or 'fid' (see the module docstring).
  """
  pooling: str = option("mean", choices=POOLINGS)
  normalize: bool = option(False)
  projection_dim: int | None = option(None, low=1)
  projection_bias: bool = option(False)
  projection_activation: str = option("identity", choices=ACTIVATIONS)
  shared: bool = option(True)
  query_maxlength: int = option(64, low=2)
  passage_maxlength: int = option(256, low=2)
  passage_format: str = option("title_text", choices=PASSAGE_FORMATS)


def encoder_config(config: T5Config) -> T5Config:
  """The config of a dual encoder's network: no decoder layers, tied output."""
  return config.replace(num_decoder_layers=0, tie_word_embeddings=True)


def passage_text(title: str, text: str, passage_format: str = "title_text"
                 ) -> str:
  """The string a passage is embedded as."""
  if passage_format == "fid":
    return f"title: {title} context: {text}"
  return f"{title} {text}" if title else text


class DualEncoder:
  """Embedding as a pure function of ``params`` (see the module docstring)."""

  def __init__(self, config: T5Config, settings: DualEncoderConfig):
    self.config = encoder_config(config)
    self.settings = settings
    self.model = EncoderDecoderModel(self.config)

  @property
  def dim(self) -> int:
    return self.settings.projection_dim or self.config.d_model

  # ---- parameters ------------------------------------------------------

  def _projection(self, init: bool, rng: np.random.Generator | None):
    s = self.settings
    if s.projection_dim is None:
      return None
    shape = (self.config.d_model, s.projection_dim)
    if init:
      kernel = rng.standard_normal(shape).astype(np.float32)
      out = {"kernel": jnp.asarray(kernel * shape[0] ** -0.5)}
      if s.projection_bias:
        out["bias"] = jnp.zeros((shape[1],), jnp.float32)
      return out
    out = {"kernel": jax.ShapeDtypeStruct(shape, jnp.float32)}
    if s.projection_bias:
      out["bias"] = jax.ShapeDtypeStruct((shape[1],), jnp.float32)
    return out

  def _tower(self, t5: dict, projection) -> dict:
    tower = dict(t5)
    if projection is not None:
      tower["projection"] = projection
    return tower

  def abstract_params(self) -> dict:
    """Shape-only parameters (``jax.ShapeDtypeStruct`` leaves)."""
    t5 = self.model.abstract_params()
    params = self._tower(t5, self._projection(False, None))
    if not self.settings.shared:
      params[QUERY_TOWER] = self._tower(t5, self._projection(False, None))
    return params

  def init_params(self, seed: int = 0) -> dict:
    """Random parameters (T5 initialisers; projection ~ N(0, 1/D))."""
    rng = np.random.default_rng(seed)
    params = self._tower(self.model.init_params(seed),
                         self._projection(True, rng))
    if not self.settings.shared:
      params[QUERY_TOWER] = self._tower(self.model.init_params(seed + 1),
                                        self._projection(True, rng))
    return params

  def from_encoder_params(self, t5_encoder: dict,
                          projection: dict | None = None) -> dict:
    """Full parameters from an encoder's ``token_embedder`` and ``encoder``
    (decoder stub of ones and zeros; a query tower copies the passages')."""
    stub = jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype),
        self.model.abstract_params()["decoder"])
    stub["decoder_norm"]["scale"] = jnp.ones_like(stub["decoder_norm"]["scale"])
    t5 = {"token_embedder": t5_encoder["token_embedder"],
          "encoder": t5_encoder["encoder"], "decoder": stub}
    if projection is None and self.settings.projection_dim is not None:
      projection = self._projection(True, np.random.default_rng(0))
    params = self._tower(t5, projection)
    if not self.settings.shared:
      params[QUERY_TOWER] = jax.tree.map(lambda x: x, self._tower(t5,
                                                                  projection))
    return params

  def param_axes(self) -> dict:
    """Logical axis names of every parameter, same tree as the params.

    The T5 parts carry the T5 axes; the projection is replicated.
    """
    t5 = self.model.param_axes()
    projection = self._projection(False, None)
    tower = self._tower(t5, None if projection is None else jax.tree.map(
        lambda s: (None,) * len(s.shape), projection))
    if not self.settings.shared:
      tower[QUERY_TOWER] = dict(tower)
    return tower

  def param_shardings(self, mesh) -> dict:
    """NamedShardings of the parameters (:meth:`param_axes` on ``mesh``)."""
    is_axes = lambda x: isinstance(x, tuple) and all(
        isinstance(a, (str, type(None))) for a in x)
    return jax.tree.map(
        lambda axes: NamedSharding(mesh, shd.logical_to_mesh(axes, mesh=mesh)),
        self.param_axes(), is_leaf=is_axes)

  # ---- embedding -------------------------------------------------------

  def tower_params(self, params: dict, tower: str) -> dict:
    if tower not in TOWERS:
      raise ValueError(f"tower must be one of {TOWERS}, got {tower!r}")
    if tower == "query" and not self.settings.shared:
      return params[QUERY_TOWER]
    return params

  def pool(self, hidden: Array, mask: Array) -> Array:
    """float32 [B, D] from hidden [B, L, D] and bool mask [B, L]."""
    hidden = hidden.astype(jnp.float32)
    if self.settings.pooling == "first":
      return hidden[:, 0]
    weights = mask.astype(jnp.float32)[..., None]
    total = jnp.sum(hidden * weights, axis=1)
    return total / jnp.maximum(jnp.sum(weights, axis=1), 1.0)

  def embed(self, params: dict, tokens: Array, *, tower: str = "passage",
            dropout_rng: Array | None = None) -> Array:
    """float32 [B, dim] vectors of int32 tokens [B, L] (0 = padding)."""
    p = self.tower_params(params, tower)
    net = self.model.network({k: p[k] for k in T5_KEYS})
    out = net.encode(tokens, dropout_rng=dropout_rng)
    x = self.pool(out.hidden, out.mask)
    proj = p.get("projection")
    if proj is not None:
      x = x @ proj["kernel"]
      if "bias" in proj:
        x = x + proj["bias"]
      if self.settings.projection_activation == "tanh":
        x = jnp.tanh(x)
    if self.settings.normalize:
      # x / max(|x|, 1e-12), with a finite gradient at x = 0 (an empty,
      # masked-out passage row): the norm's own gradient there is NaN.
      x = x / jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True),
                                   1e-24))
    return x


def params_fingerprint(params: Any, *extra: Any) -> str:
  """A short hash of parameter shapes and up to ~4096 sampled values per
  leaf (plus ``extra``): cheap, and changed by any training."""
  h = hashlib.blake2b(digest_size=12)
  for item in extra:
    h.update(repr(item).encode())
  leaves = jax.tree_util.tree_leaves_with_path(params)
  for path, leaf in leaves:
    arr = np.asarray(leaf)
    flat = arr.reshape(-1)
    sample = flat[::max(1, flat.size // 4096)]
    h.update(jax.tree_util.keystr(path).encode())
    h.update(repr((arr.shape, str(arr.dtype))).encode())
    h.update(np.ascontiguousarray(sample).tobytes())
    h.update(np.float64(flat.astype(np.float64).sum()).tobytes())
  return h.hexdigest()


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


class Embedder:
  """Embeds texts on all devices, the batch sharded over ``data`` (rounded
  up to its size; lengths padded to a multiple of ``length_bucket``); every
  process passes the same texts and gets every vector."""

  def __init__(self, encoder: DualEncoder, params: dict, tokenizer, *,
               mesh=None, batch_size: int = 128, length_bucket: int = 32):
    self.encoder = encoder
    self.tokenizer = tokenizer
    self.mesh = mesh if mesh is not None else shd.parse_mesh("")
    parallel = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    self.batch_size = _round_up(max(batch_size, 1), parallel)
    self.length_bucket = max(1, length_bucket)
    self.params = multihost.put(params, encoder.param_shardings(self.mesh))
    self.batch_sharding = NamedSharding(
        self.mesh, shd.logical_to_mesh((shd.BATCH,), mesh=self.mesh))
    self.parallel = parallel

  @functools.cached_property
  def _fns(self) -> dict:
    replicated = NamedSharding(self.mesh, PartitionSpec())
    return {tower: jax.jit(
        functools.partial(self.encoder.embed, tower=tower),
        out_shardings=replicated) for tower in TOWERS}

  def tokenize(self, texts: Sequence[str], max_length: int) -> np.ndarray:
    """int32 [len(texts), L]: EOS-terminated ids, L a bucket <= max_length."""
    ids = self.tokenizer.encode_batch(list(texts))
    longest = max((len(i) + 1 for i in ids), default=1)
    length = min(max_length, _round_up(longest, self.length_bucket))
    return pad_ids(ids, length)

  def _dispatch(self, tokens: np.ndarray, tower: str):
    n = len(tokens)
    # a short (last) batch is padded to the full batch: no recompilation
    size = _round_up(max(n, self.batch_size), self.parallel)
    if size > n:
      tokens = np.concatenate(
          [tokens, np.zeros((size - n, tokens.shape[1]), np.int32)])
    with jax.set_mesh(self.mesh):
      batch = multihost.put(tokens, self.batch_sharding)
      return self._fns[tower](self.params, batch), n

  def embed_batches(self, batches, tower: str, max_length: int):
    """Yields float32 [n, dim] for each list of texts of ``batches``.

    Tokenising batch i+1 overlaps the device computing batch i.
    """
    pending = None
    for texts in batches:
      out = self._dispatch(self.tokenize(texts, max_length), tower)
      if pending is not None:
        yield np.asarray(pending[0])[:pending[1]]
      pending = out
    if pending is not None:
      yield np.asarray(pending[0])[:pending[1]]

  def embed(self, texts: Sequence[str], tower: str = "passage",
            max_length: int | None = None) -> np.ndarray:
    """float32 [len(texts), dim]."""
    s = self.encoder.settings
    if max_length is None:
      max_length = (s.query_maxlength if tower == "query"
                    else s.passage_maxlength)
    texts = list(texts)
    batches = [texts[i:i + self.batch_size]
               for i in range(0, len(texts), self.batch_size)]
    out = list(self.embed_batches(batches, tower, max_length))
    if not out:
      return np.zeros((0, self.encoder.dim), np.float32)
    return np.concatenate(out)
