"""The ReFusion model: T5 with fusion modules, a loss and rank classification.

Einsum letters: B examples, C classes (label words), L input length, T
label-word length (with EOS), S segments, K neighbours, R database width,
D d_model, V vocabulary.

The plain jaxfid T5 with chosen projections wrapped by
:class:`~jaxfid.refusion.fusion.FusedProjection`; batches add
``neighbours`` float32 [B, S, K, R] (absent in 'layer' retrieval). Rank
classification scores every label word [C, T] by its log-likelihood, the
encoder running once per example; :meth:`ReFusionModel.generate` decodes
instead.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxfid.refusion import fusion as fusion_lib
from jaxfid.refusion.fusion import FusionConfig
from jaxfid.t5.config import T5Config
from jaxfid.t5.layers import fold
from jaxfid.t5.model import (EncoderDecoderModel, sequence_log_likelihood,
                             shift_right)
from jaxfid.t5.network import T5

Array = jax.Array
ARCH_PARAM = "fusion_alpha"


def build_network(config: T5Config, fusion: FusionConfig,
                  rngs: nnx.Rngs) -> T5:
  """A T5 (initialised exactly as the plain one) with fusion modules."""
  net = T5(config, rngs=rngs)
  if fusion.enabled:
    fusion_lib.inject(net, fusion, rngs=rngs)
  return net


def is_arch_path(path: tuple) -> bool:
  """True for the architecture weights (the search's upper-level variables)."""
  return str(getattr(path[-1], "key", path[-1])) == ARCH_PARAM


class ReFusionModel(EncoderDecoderModel):
  """EncoderDecoderModel's loss and sharding over a T5 with fusion modules."""

  def __init__(self, config: T5Config, fusion: FusionConfig,
               database: tuple | None = None):
    """``database``: ('layer' retrieval) the database's stored vectors
    float32 [N, R] and score bias [N] (:func:`~jaxfid.refusion.neighbours.
    layer_database`), constants of every program, searched by each fusion
    module; None: the neighbours come with the batch."""
    self.config = config
    self.fusion = fusion
    self.database = database
    net = nnx.eval_shape(lambda: build_network(config, fusion, nnx.Rngs(0)))
    self.graphdef, self._abstract_state = nnx.split(net)
    self.paths = fusion_lib.wrapped_paths(
        config.num_layers, config.num_decoder_layers, fusion.targets)

  def init_params(self, seed: int = 0) -> dict:
    net = build_network(self.config, self.fusion, nnx.Rngs(seed))
    return nnx.to_pure_dict(nnx.state(net))

  def with_fusion(self, fusion: FusionConfig) -> "ReFusionModel":
    """The same backbone with another fusion setting (e.g. a fixed structure)."""
    return ReFusionModel(self.config, fusion, self.database)

  # ---- inputs ---------------------------------------------------------------

  def make_extras(self, batch: dict, rng: Array | None = None) -> Any:
    """The ``extras`` the fusion modules read (None: no fusion)."""
    if not self.fusion.enabled:
      return None
    if self.database is not None:
      vectors, bias = self.database
      extras = {"database": jnp.asarray(vectors, jnp.float32),
                "database_bias": jnp.asarray(bias, jnp.float32)}
    else:
      extras = {"neighbours": batch["neighbours"]}
    if rng is not None:
      extras["rng"] = rng
    return extras

  # ---- training -------------------------------------------------------------

  def loss(self, params, batch: dict, dropout_rng: Array | None = None,
           extras: Any = None, normalizer: Array | None = None
           ) -> tuple[Array, dict]:
    """Cross-entropy of the gold label word; the ordered mask is sampled
    (from ``dropout_rng``) in training, its evaluation mask otherwise."""
    if extras is None:
      extras = self.make_extras(batch, fold(dropout_rng, 7))
    core = {k: batch[k] for k in ("encoder_input_tokens",
                                  "decoder_target_tokens")}
    return super().loss(params, core, dropout_rng, extras, normalizer)

  def score(self, params, batch: dict, extras: Any = None) -> Array:
    """The target log-likelihood float32 [B] (``EncoderDecoderModel.score``)
    with the batch's neighbours fused under the evaluation mask."""
    if extras is None:
      extras = self.make_extras(batch)
    return super().score(params, batch, extras)

  def pooled_hidden(self, params, tokens: Array) -> Array:
    """float32 [B, D]: the backbone encoder's mean-pooled output (padding
    excluded), without fusion — the query of on-line ('Hidden') retrieval."""
    enc = self.network(params).encode(tokens)                     # [B, L, D]
    m = enc.mask.astype(jnp.float32)[..., None]                   # [B, L, 1]
    return jnp.sum(enc.hidden.astype(jnp.float32) * m, 1) / jnp.maximum(
        jnp.sum(m, 1), 1.0)                                       # [B, D]

  # ---- rank classification ---------------------------------------------------

  def label_scores(self, params, batch: dict, label_tokens: Array) -> Array:
    """Log-likelihood float32 [B, C] of every label word (tokens [C, T]).

    Deterministic: no dropout, the ordered mask's evaluation mask.
    """
    net = self.network(params)
    extras = self.make_extras(batch)
    tokens = batch["encoder_input_tokens"]                       # [B, L]
    enc = self.encode(net, tokens, extras=extras)                # hidden [B, L, D]
    b, c = tokens.shape[0], label_tokens.shape[0]
    hidden = jnp.repeat(enc.hidden, c, axis=0)                   # [B*C, L, D]
    mask = jnp.repeat(enc.mask, c, axis=0)                       # [B*C, L]
    targets = jnp.tile(label_tokens, (b, 1))                     # [B*C, T]
    rep = None if extras is None else {   # per example: the neighbours
        k: jnp.repeat(v, c, axis=0) if k == "neighbours" else v
        for k, v in extras.items()}
    logits, _ = net.decode(hidden, mask, shift_right(targets), extras=rep)  # [B*C, T, V]
    return sequence_log_likelihood(logits, targets).reshape(b, c)  # [B, C]

  def classify(self, params, batch: dict, label_tokens: Array) -> Array:
    """int32 [B]: the best-scoring class."""
    return jnp.argmax(self.label_scores(params, batch, label_tokens), axis=-1)

  def generate(self, params, batch: dict, max_decode_len: int) -> Array:
    """int32 [B, max_decode_len]: greedy decoding of at most that many new
    tokens (EOS kept, 0 after it), the neighbours fused as in
    :meth:`label_scores` — the original T5 script's evaluation."""
    return self.predict(params, batch["encoder_input_tokens"],
                        max_decode_len=max_decode_len,
                        extras=self.make_extras(batch))

  # ---- the search -----------------------------------------------------------

  def arch_weights(self, params) -> list[tuple[str, list[float]]]:
    """softmax(alpha) per fusion module: [(path, [p_original, p_reranker,
    p_ordered_mask])], in :func:`~jaxfid.refusion.fusion.wrapped_paths` order."""
    out = []
    for path in self.paths:
      node = params
      for name in path:
        node = node[name]
      p = jax.nn.softmax(jnp.asarray(node[ARCH_PARAM], jnp.float32))
      out.append(("/".join(path), [float(v) for v in p]))
    return out

  def discretize(self, params) -> tuple[str, ...]:
    """The argmax structure: one scheme name per fusion module."""
    return tuple(fusion_lib.SCHEMES[max(range(len(p)), key=p.__getitem__)]
                 for _, p in self.arch_weights(params))
