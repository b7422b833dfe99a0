"""ReFusion's fusion modules: reranker, ordered mask and the adaptive integrator.

Einsum letters: B batch, S query segments (1 per sentence), K neighbours,
R retrieval-database width, O the wrapped projection's output width,
L sequence length.

Each wrapped projection computes ``y = x @ kernel`` and adds, at position 0
only, a fused neighbour representation:

* reranker: ``f = (1/K) sum_i softmax(r)_i h_i``;
* ordered mask (nested dropout over ranks): ``b = sigmoid(clip(beta))``
  [K, R], stop probabilities ``q_i = (1 - b_i) prod_{j<i} b_j``, mask
  ``v_i = sum_{j>=i} c_j`` for a Gumbel-sampled stop ``c``;
  ``f = (1/K) sum_i v_i h_i``. ``mask_sampler``: ``'soft'`` (relaxed
  Gumbel-softmax; evaluation: the mean of ``mask_eval_samples`` draws of a
  fixed key), ``'straight_through'`` (hard forward, relaxed gradient;
  evaluation: ``E[v_i] = prod_{j<i} b_j``) or ``'original'`` (the original
  code's ``_get_ordered_mask`` formula, one mask per call);
* adaptive integrator: ``y + sum_c softmax(alpha)_c delta_c`` over
  {original (delta 0), reranker, ordered mask}, exactly ``y`` without
  neighbours.

Pairs average their two segments' fused vectors. When R != O a learned
``fusion_proj`` [R, O] maps the fused vector, divided first by its root mean
square (``fused_norm='auto'``) so it starts at the projection outputs' scale.
Parameters beside ``kernel`` (so plain T5 checkpoints load by name):
``fusion_rerank`` [K], ``fusion_beta`` [K, R], ``fusion_alpha`` [3] (the
architecture weights) and, if R != O, ``fusion_proj`` [R, O].
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxfid.core import sharding as ax
from jaxfid.core.config import Config, option
from jaxfid.core.errors import InputError
from jaxfid.t5 import layers

Array = jax.Array

SCHEMES = ("original", "reranker", "ordered_mask")
INITS = ("zeros", "xavier")
SAMPLERS = ("soft", "straight_through", "original")
FUSED_NORMS = ("auto", "rms", "none")
MODULES = ("query", "key", "value", "output", "ffn")
STACKS = ("encoder", "decoder")
# Where each module name lives inside a T5 layer.
_ENCODER_PATHS = {"query": ("attention", "query"), "key": ("attention", "key"),
                  "value": ("attention", "value"), "output": ("attention", "out"),
                  "ffn": ("mlp", "wo")}
_DECODER_PATHS = {"query": ("self_attention", "query"),
                  "key": ("self_attention", "key"),
                  "value": ("self_attention", "value"),
                  "output": ("self_attention", "out"), "ffn": ("mlp", "wo")}


def _modules_problem(spec: str) -> str | None:
  """Why FUSION_MODULES cannot be parsed (:func:`parse_targets`), or None."""
  try:
    parse_targets(spec)
  except ValueError as e:
    return str(e)
  return None


@dataclasses.dataclass(frozen=True)
class FusionConfig(Config):
  """What is fused where, and how; passed whole to the model.

  ``top_k``, ``db_dim`` and ``search`` are filled in by the task from the run.

  Attributes:
    modules: ``FUSION_MODULES``, the wrapped projections (:func:`
      parse_targets`: ``'key,value'``, ``'decoder.ffn'``, ``'none'``).
    top_k: neighbours per segment (K).
    db_dim: width of the retrieval database's vectors (R).
    search: the adaptive integrator (mixture over the schemes); otherwise
      every module uses ``structure`` or, without one, ``scheme``.
    scheme: the scheme of every module when not searching.
    structure: per wrapped module (in :func:`wrapped_paths` order) the chosen
      scheme — the discretised result of a search.
    mask_temperature: tau of the ordered mask's Gumbel-softmax.
    mask_clip: beta is clipped to [-clip, clip] before the sigmoid.
    init: ``'zeros'`` (reranker, beta and architecture weights start at 0)
      or ``'xavier'`` (the original's ``xavier_uniform_``).
    mask_sampler: ``'soft'``, ``'straight_through'`` or ``'original'``
      (module docstring).
    mask_eval_samples: draws averaged for the ``'soft'`` evaluation mask.
    fused_norm: ``'auto'`` (divide the fused vector by its root mean square
      before a projection), ``'rms'`` (always) or ``'none'`` (never).
  """
  modules: str = option("key,value", test=_modules_problem,
                        macro="FUSION_MODULES")
  top_k: int = option(64, low=1, macro="TOP_K")
  db_dim: int = option(768, low=1)
  search: bool = False
  scheme: str = option("reranker", choices=SCHEMES[1:],
                       macro="FUSION_SCHEME")
  structure: tuple[str, ...] | None = None
  mask_temperature: float = option(5.0, above=0)
  mask_clip: float = option(5.0, above=0)
  init: str = option("zeros", choices=INITS, macro="FUSION_INIT")
  mask_sampler: str = option("soft", choices=SAMPLERS)
  mask_eval_samples: int = option(64, low=1)
  fused_norm: str = option("auto", choices=FUSED_NORMS)

  def __post_init__(self):
    super().__post_init__()
    for s in self.structure or ():
      if s not in SCHEMES:
        raise InputError("structure", f"entry {s!r}: one of {SCHEMES}")

  @property
  def targets(self) -> tuple[str, ...]:
    """``'stack.module'`` names (``encoder.key``...); every layer of that
    stack gets the module wrapped. Empty: the plain backbone."""
    return parse_targets(self.modules)

  @property
  def enabled(self) -> bool:
    return bool(self.targets)

  def to_dict(self) -> dict:
    fields = super().to_dict()
    del fields["modules"]
    return {"targets": list(self.targets), **fields}

  @classmethod
  def from_dict(cls, fields: dict) -> "FusionConfig":
    fields = dict(fields)
    # A run config without ``fused_norm`` loads unnormalised.
    fields.setdefault("fused_norm", "none")
    if "modules" not in fields and "targets" in fields:
      fields["modules"] = ",".join(fields["targets"]) or "none"
    return super().from_dict(fields)


def parse_targets(spec: str) -> tuple[str, ...]:
  """``'key,value'`` -> ``('encoder.key', 'encoder.value')``; ``'none'`` -> ().

  Items: ``[encoder.|decoder.]module``, module one of query, key, value,
  output, ffn. Raises ValueError on anything else.
  """
  spec = (spec or "").strip().lower()
  if spec in ("", "none"):
    return ()
  out = []
  for item in spec.split(","):
    item = item.strip()
    stack, dot, module = item.partition(".")
    if not dot:
      stack, module = "encoder", item
    if stack not in STACKS or module not in MODULES:
      raise ValueError(f"{item!r} is not a fusion module: use any of "
                       f"{', '.join(MODULES)}, optionally prefixed by "
                       f"'encoder.' or 'decoder.', or 'none'")
    if f"{stack}.{module}" not in out:
      out.append(f"{stack}.{module}")
  return tuple(out)


def wrapped_paths(num_layers: int, num_decoder_layers: int,
                  targets: tuple[str, ...]) -> list[tuple[str, ...]]:
  """Parameter-tree paths of the wrapped projections, in a fixed order."""
  paths = []
  for stack, n, table in (("encoder", num_layers, _ENCODER_PATHS),
                          ("decoder", num_decoder_layers, _DECODER_PATHS)):
    for i in range(n):
      for module in MODULES:
        if f"{stack}.{module}" in targets:
          paths.append((stack, f"layers_{i}", *table[module]))
  return paths


# ---- formulas ---------------------------------------------------------------


def reranker_fuse(neighbours: Array, rerank: Array) -> Array:
  """(1/K) sum_i softmax(r)_i h_i: [B, S, K, R], [K] -> float32 [B, S, R]."""
  k = neighbours.shape[2]
  w = jax.nn.softmax(rerank.astype(jnp.float32))  # [K]
  return jnp.einsum("k,bskr->bsr", w, neighbours.astype(jnp.float32)) / k  # [B, S, R]


def keep_log_probs(beta: Array, clip: float) -> tuple[Array, Array]:
  """(log b, log(1 - b)) of the keep probabilities b = sigmoid(clip(beta))."""
  z = jnp.clip(beta.astype(jnp.float32), -clip, clip)
  return jax.nn.log_sigmoid(z), jax.nn.log_sigmoid(-z)  # [K, R] each


def stop_log_probs(beta: Array, clip: float) -> Array:
  """log q [K, R]: the chain of dimension r keeps ranks < i and stops at i."""
  log_b, log_not_b = keep_log_probs(beta, clip)
  before = jnp.cumsum(log_b, axis=0) - log_b           # sum_{j<i} log b_j [K, R]
  stop_here = log_not_b.at[-1].set(0.0)                # the last rank ends it
  return before + stop_here                            # [K, R]


def expected_ordered_mask(beta: Array, clip: float) -> Array:
  """E[v_i] = prod_{j<i} b_j, float32 [K, R]: 1 at rank 0, non-increasing."""
  log_b, _ = keep_log_probs(beta, clip)
  mask = jnp.exp(jnp.cumsum(log_b, axis=0) - log_b)    # [K, R]
  return jax.lax.cummin(mask, axis=0)


def sample_ordered_mask(beta: Array, rng: Array, batch: int, clip: float,
                        temperature: float, hard: bool = False) -> Array:
  """Nested-dropout masks float32 [B, K, R], one draw per example.

  ``v_i = sum_{j>=i} c_j`` for ``c = softmax((log q + g) / tau)`` over ranks;
  with ``hard``, ``c`` is the one-hot Gumbel-max sample in the forward pass and
  the relaxed one in the backward pass.
  """
  log_q = stop_log_probs(beta, clip)                               # [K, R]
  g = jax.random.gumbel(rng, (batch, *log_q.shape), jnp.float32)   # [B, K, R]
  c = jax.nn.softmax((log_q[None] + g) / temperature, axis=1)      # [B, K, R]
  suffix_sum = lambda x: jnp.flip(jnp.cumsum(jnp.flip(x, axis=1), axis=1),
                                  axis=1)                          # [B, K, R]
  v = jax.lax.cummin(suffix_sum(c), axis=1)                        # [B, K, R]
  if not hard:
    return v
  stop = jax.nn.one_hot(jnp.argmax(log_q[None] + g, axis=1), log_q.shape[0],
                        axis=1)                                    # [B, K, R]
  # Forward: the exact 0/1 mask (the difference is exactly zero); backward:
  # the relaxed mask's gradient.
  return suffix_sum(stop) + (v - jax.lax.stop_gradient(v))


def mean_ordered_mask(beta: Array, clip: float, temperature: float,
                      samples: int, key: Array | None = None) -> Array:
  """The relaxed sampler's mean mask float32 [K, R], over ``samples`` draws
  of a fixed key: deterministic, and on average what training sees (the
  relaxed masks' mean is not ``prod_{j<i} b_j``: at tau = 5 they are close
  to uniform over the ranks)."""
  key = jax.random.key(0) if key is None else key
  return jnp.mean(sample_ordered_mask(beta, key, samples, clip, temperature),
                  axis=0)                                          # [K, R]


def original_ordered_mask(beta: Array, rng: Array, clip: float,
                          temperature: float, samples: int = 1) -> Array:
  """The original code's ordered masks float32 [samples, K, R] (module
  docstring, ``'original'``): ``c = softmax((qz + g) / tau)`` over the R
  dimensions with ``qz = cumprod(b, ranks) * (1 - b)``, then ``v_i = sum_{j
  <= K-1-i} c_j`` (``flip(cumsum(c, ranks))``)."""
  b = jax.nn.sigmoid(jnp.clip(beta.astype(jnp.float32), -clip, clip))  # [K, R]
  qz = jnp.cumprod(b, axis=0) * (1.0 - b)                              # [K, R]
  g = jax.random.gumbel(rng, (samples, *qz.shape), jnp.float32)        # [N, K, R]
  c = jax.nn.softmax((qz[None] + g) / temperature, axis=-1)            # [N, K, R]
  return jnp.flip(jnp.cumsum(c, axis=1), axis=1)                       # [N, K, R]


def layer_neighbours(queries: Array, vectors: Array, bias: Array,
                     top_k: int) -> Array:
  """Per-module retrieval ('layer' mode) float32 [B, 1, K, R]: the stored
  vectors of the ``top_k`` database rows best for each query [B, R] by
  ``q . v + bias`` (bias 0: inner product; ``-|v|^2 / 2``: L2), searched
  in the program over the whole database ``vectors`` [N, R]; zeros past N.
  The queries are detached, as the original's ``x[:, 0].detach()``."""
  q = jax.lax.stop_gradient(queries.astype(jnp.float32))          # [B, R]
  scores = jnp.einsum("br,nr->bn", q, vectors) + bias[None]       # [B, N]
  k = min(top_k, vectors.shape[0])
  _, rows = jax.lax.top_k(scores, k)                              # [B, k]
  found = vectors[rows]                                           # [B, k, R]
  found = jnp.pad(found, ((0, 0), (0, top_k - k), (0, 0)))        # [B, K, R]
  return found[:, None]                                           # [B, 1, K, R]


def ordered_mask_fuse(neighbours: Array, mask: Array) -> Array:
  """(1/K) sum_i v_i * h_i: [B, S, K, R] with v [K, R] or [B, K, R] -> [B, S, R]."""
  k = neighbours.shape[2]
  v = mask if mask.ndim == 3 else mask[None]                       # [B|1, K, R]
  return jnp.einsum("bkr,bskr->bsr", jnp.broadcast_to(
      v, (neighbours.shape[0], *v.shape[1:])),
      neighbours.astype(jnp.float32)) / k                          # [B, S, R]


# ---- the wrapping module -------------------------------------------------------


class FusedProjection(nnx.Module):
  """A projection ``y = x @ kernel`` plus fused neighbours at position 0.

  Replaces a :class:`jaxfid.t5.layers.Dense`, keeping its ``kernel``. ``extras``
  (:meth:`ReFusionModel.make_extras`): ``neighbours`` float [B, S, K, R], or
  ('layer' retrieval) ``database`` [N, R] and ``database_bias`` [N]; optional
  ``rng`` (absent: the evaluation mask). Without extras: the plain projection.
  """

  def __init__(self, base: layers.Dense, *, out_features: int,
               config: FusionConfig, slot: int, choice: str | None,
               rngs: nnx.Rngs):
    self.kernel = base.kernel
    self.axes = base.axes
    self.dtype = base.dtype
    k, r = config.top_k, config.db_dim
    self.has_proj = r != out_features
    if self.has_proj:
      self.fusion_proj = nnx.Param(
          jax.random.normal(rngs.params(), (r, out_features), jnp.float32)
          * r ** -0.5, logical_axes=(ax.DB_EMBED, ax.EMBED))
    if config.init == "xavier":
      # The original's nn.init.xavier_uniform_ of a torch [K, 1] reranker,
      # [K, R] beta and [3, 1] architecture weights: U(-a, a) with
      # a = sqrt(6 / (rows + columns)).
      uniform = lambda shape, fans: jax.random.uniform(
          rngs.params(), shape, jnp.float32, -1.0, 1.0) * (6.0 / fans) ** 0.5
      rerank = uniform((k,), k + 1)
      beta = uniform((k, r), k + r)
      alpha = uniform((len(SCHEMES),), len(SCHEMES) + 1)
    else:
      rerank = jnp.zeros((k,), jnp.float32)
      beta = jnp.zeros((k, r), jnp.float32)
      alpha = jnp.zeros((len(SCHEMES),), jnp.float32)
    self.fusion_rerank = nnx.Param(rerank, logical_axes=(ax.NEIGHBOURS,))
    self.fusion_beta = nnx.Param(beta,
                                 logical_axes=(ax.NEIGHBOURS, ax.DB_EMBED))
    self.fusion_alpha = nnx.Param(alpha, logical_axes=(ax.ARCH_CHOICES,))
    self.choice = choice            # None: the integrator's mixture
    self.slot = slot                # folds this module's own Gumbel noise
    self.clip = config.mask_clip
    self.temperature = config.mask_temperature
    self.hard = config.mask_sampler == "straight_through"
    self.original = config.mask_sampler == "original"
    self.eval_samples = config.mask_eval_samples
    self.top_k = k
    self.normalize = (config.fused_norm == "rms"
                      or (config.fused_norm == "auto" and self.has_proj))

  def _project(self, fused: Array) -> Array:
    if self.normalize:
      fused = fused * jax.lax.rsqrt(
          jnp.mean(jnp.square(fused), axis=-1, keepdims=True) + 1e-12)  # [B, R]
    if self.has_proj:
      return jnp.einsum("br,ro->bo", fused, self.fusion_proj[...])  # [B, O]
    return fused

  def _delta(self, scheme: str, neighbours: Array, rng: Array | None) -> Array:
    """The fused vector float32 [B, O] of one scheme (segments averaged)."""
    if scheme == "reranker":
      fused = reranker_fuse(neighbours, self.fusion_rerank[...])    # [B, S, R]
    else:
      beta = self.fusion_beta[...]
      if self.original:
        key = (jax.random.fold_in(jax.random.key(0), self.slot) if rng is None
               else jax.random.fold_in(rng, self.slot))
        draws = 1 if rng is not None else self.eval_samples
        mask = jnp.mean(original_ordered_mask(
            beta, key, self.clip, self.temperature, draws), axis=0)  # [K, R]
      elif rng is not None:
        mask = sample_ordered_mask(beta, jax.random.fold_in(rng, self.slot),
                                   neighbours.shape[0], self.clip,
                                   self.temperature, self.hard)       # [B, K, R]
      elif self.hard:
        mask = expected_ordered_mask(beta, self.clip)                # [K, R]
      else:
        mask = mean_ordered_mask(
            beta, self.clip, self.temperature, self.eval_samples,
            jax.random.fold_in(jax.random.key(0), self.slot))        # [K, R]
      fused = ordered_mask_fuse(neighbours, mask)                    # [B, S, R]
    return self._project(jnp.mean(fused, axis=1))                    # [B, O]

  def __call__(self, x: Array, extras: Any = None) -> Array:
    kernel = ax.gathered_for_use(self.kernel[...].astype(self.dtype),
                                 self.axes)
    y = jnp.einsum("...d,df->...f", x.astype(self.dtype), kernel)  # [B, L, O]
    if extras is None or self.choice == "original":
      return y
    rng = extras.get("rng")
    if "database" in extras:                         # 'layer' retrieval
      neighbours = layer_neighbours(x[:, 0], extras["database"],
                                    extras["database_bias"], self.top_k)
    else:
      neighbours = extras["neighbours"]                             # [B, S, K, R]
    if self.choice is not None:
      delta = self._delta(self.choice, neighbours, rng)             # [B, O]
    else:
      p = jax.nn.softmax(self.fusion_alpha[...])                    # [3]
      delta = (p[1] * self._delta("reranker", neighbours, rng)
               + p[2] * self._delta("ordered_mask", neighbours, rng))  # [B, O]
    return y.at[:, 0, :].add(delta.astype(y.dtype))


def inject(net: nnx.Module, config: FusionConfig, *, rngs: nnx.Rngs) -> list:
  """Wrap the target projections of a T5 network in place; returns the paths."""
  cfg = net.config
  paths = wrapped_paths(cfg.num_layers, cfg.num_decoder_layers, config.targets)
  if config.structure is not None and len(config.structure) != len(paths):
    raise ValueError(f"structure has {len(config.structure)} entries for "
                     f"{len(paths)} fusion modules")
  for slot, path in enumerate(paths):
    parent = net
    for name in path[:-1]:
      parent = getattr(parent, name)
    base = getattr(parent, path[-1])
    out_features = base.kernel.shape[1]
    if config.structure is not None:
      choice = config.structure[slot]
    else:
      choice = None if config.search else config.scheme
    setattr(parent, path[-1], FusedProjection(
        base, out_features=out_features, config=config, slot=slot,
        choice=choice, rngs=rngs))
  return paths
