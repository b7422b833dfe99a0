"""ReFusion's fusion formulas and modules on a tiny T5.

The reranker and the ordered mask are checked against the paper's formulas
written out in numpy; zero neighbours and the 'original' choice must leave
the plain T5's logits exactly unchanged; gradients must reach beta.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxfid.core.errors import InputError
from jaxfid.t5 import layers
from jaxfid.t5.config import preset
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.refusion import fusion as F
from jaxfid.refusion.model import ReFusionModel

K, R = 5, 6
CFG = dataclasses.replace(preset("tiny"), dropout_rate=0.0, vocab_size=64,
                          d_model=16, d_kv=4, d_ff=32, num_heads=2)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def test_reranker_is_weighted_mean_of_neighbours():
  rng = np.random.default_rng(0)
  h = rng.normal(size=(3, 2, K, R)).astype(np.float32)
  r = rng.normal(size=(K,)).astype(np.float32)
  w = np.exp(r) / np.exp(r).sum()
  expected = np.einsum("k,bskr->bsr", w, h) / K
  np.testing.assert_allclose(F.reranker_fuse(jnp.asarray(h), jnp.asarray(r)),
                             expected, rtol=1e-5, atol=1e-6)


def test_ordered_mask_distribution_and_expectation():
  rng = np.random.default_rng(1)
  beta = rng.normal(size=(K, R)).astype(np.float32) * 3
  b = _sigmoid(np.clip(beta, -5, 5))
  # q_i = (1 - b_i) prod_{j<i} b_j, the last rank takes the rest.
  q = np.empty_like(b)
  for i in range(K):
    q[i] = np.prod(b[:i], axis=0) * (1 - b[i] if i < K - 1 else 1.0)
  np.testing.assert_allclose(q.sum(0), 1.0, rtol=1e-5)
  np.testing.assert_allclose(np.exp(F.stop_log_probs(jnp.asarray(beta), 5.0)),
                             q, rtol=1e-5, atol=1e-7)
  # E[v_i] = sum_{j>=i} q_j = prod_{j<i} b_j.
  expected = np.stack([q[i:].sum(0) for i in range(K)])
  mask = np.asarray(F.expected_ordered_mask(jnp.asarray(beta), 5.0))
  np.testing.assert_allclose(mask, expected, rtol=1e-5, atol=1e-7)
  assert np.all(mask[0] == 1.0)


def test_sampled_mask_is_nested_and_its_mean_is_the_expectation():
  beta = jnp.asarray(np.random.default_rng(2).normal(size=(K, R)), jnp.float32)
  v = np.asarray(F.sample_ordered_mask(beta, jax.random.key(0), 4000, 5.0, 0.1))
  assert v.shape == (4000, K, R)
  assert np.all(np.diff(v, axis=1) <= 0)            # non-increasing in rank
  assert np.all((v >= 0) & (v <= 1 + 1e-6))
  np.testing.assert_allclose(v[:, 0], 1.0, atol=1e-5)
  # Low temperature: nearly hard masks whose mean approaches E[v].
  np.testing.assert_allclose(v.mean(0), F.expected_ordered_mask(beta, 5.0),
                             atol=0.05)


def _module(fusion: F.FusionConfig, out_features: int) -> F.FusedProjection:
  base = layers.Dense(4, out_features, ("embed", "kv"), dtype=jnp.float32,
                      stddev=0.5, rngs=nnx.Rngs(0))
  return F.FusedProjection(base, out_features=out_features, config=fusion,
                           slot=0, choice="ordered_mask", rngs=nnx.Rngs(1))


@pytest.mark.parametrize("sampler", ("soft", "straight_through"))
def test_evaluation_mask_weighs_what_training_masks_weigh(sampler):
  """Issue #17 item 1: at several beta, the total weight of the mask a
  module applies at evaluation is within 5% of its training average."""
  k, r = 16, 8
  module = _module(F.FusionConfig(modules="encoder.key", top_k=k,
                                  db_dim=r, mask_sampler=sampler), r)
  ones = jnp.ones((4000, 1, k, r), jnp.float32)    # fused = total weight / K
  rng = np.random.default_rng(4)
  for beta in (-5.0, -2.0, 0.0, 1.0, 5.0, "random"):
    module.fusion_beta[...] = jnp.asarray(
        rng.normal(size=(k, r)) * 3 if beta == "random"
        else np.full((k, r), beta), jnp.float32)
    train = float(jnp.mean(module._delta("ordered_mask", ones,
                                         jax.random.key(7)))) * k
    evaluation = float(jnp.mean(module._delta("ordered_mask", ones[:1],
                                              None))) * k
    assert abs(evaluation / train - 1) < 0.05, (beta, train, evaluation)
  # What item 1 was about: the relaxed sampler at tau = 5 keeps far more
  # than the Bernoulli chain's expectation (at beta = 0: ~5.8 vs 2.0).
  beta = jnp.zeros((k, r), jnp.float32)
  relaxed = F.sample_ordered_mask(beta, jax.random.key(3), 4000, 5.0, 5.0)
  assert float(relaxed.sum(1).mean()) > 2.5 * float(
      F.expected_ordered_mask(beta, 5.0).sum(0).mean())


def test_straight_through_masks_are_exact_samples_with_relaxed_gradients():
  beta = jnp.asarray(np.random.default_rng(5).normal(size=(K, R)), jnp.float32)
  v = np.asarray(F.sample_ordered_mask(beta, jax.random.key(0), 4000, 5.0,
                                       5.0, hard=True))
  assert set(np.unique(v)) <= {0.0, 1.0}
  assert np.all(np.diff(v, axis=1) <= 0) and np.all(v[:, 0] == 1.0)
  # Gumbel-max draws the stop rank from q exactly, at any temperature.
  np.testing.assert_allclose(v.mean(0), F.expected_ordered_mask(beta, 5.0),
                             atol=0.04)
  g = jax.grad(lambda b: jnp.sum(F.sample_ordered_mask(
      b, jax.random.key(1), 8, 5.0, 5.0, hard=True) * jnp.arange(K)[:, None]))(
          beta)
  assert np.all(np.isfinite(g)) and float(jnp.abs(g).sum()) > 0


def test_original_sampler_is_the_original_codes_mask_one_per_call():
  """Issue #27 item 6: ``MASK_SAMPLER='original'`` is ``_get_ordered_mask``
  of the original's layers.py written out in numpy (inclusive cumprod,
  Gumbel-softmax over the dimensions, flipped cumsum): rank i's row sums to
  K - i whatever beta, and one mask serves the whole batch of a call (the
  other samplers draw one per example)."""
  rng = np.random.default_rng(8)
  beta = rng.normal(size=(K, R)).astype(np.float32) * 3
  key = jax.random.key(2)
  got = np.asarray(jax.jit(F.original_ordered_mask, static_argnums=(2, 3, 4))(
      jnp.asarray(beta), key, 5.0, 5.0, 2))                        # [2, K, R]
  b = _sigmoid(np.clip(beta, -5, 5))
  qz = np.cumprod(b, axis=0) * (1 - b)
  g = np.asarray(jax.random.gumbel(key, (2, K, R), jnp.float32))
  z = (qz[None] + g) / 5.0
  c = np.exp(z - z.max(-1, keepdims=True))
  c /= c.sum(-1, keepdims=True)                                    # over R
  np.testing.assert_allclose(got, np.flip(np.cumsum(c, axis=1), axis=1),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got.sum(-1), np.broadcast_to(
      K - np.arange(K), (2, K)), rtol=1e-5)
  h = jnp.asarray(np.broadcast_to(rng.normal(size=(1, 1, K, R)), (3, 1, K, R)),
                  jnp.float32)                                     # 3 equal examples
  for sampler, shared in (("original", True), ("soft", False)):
    module = _module(F.FusionConfig(modules="encoder.key", top_k=K, db_dim=R,
                                    mask_sampler=sampler), R)
    module.fusion_beta[...] = jnp.asarray(beta)
    delta, ones = jax.jit(lambda h, key: (
        module._delta("ordered_mask", h, key),
        module._delta("ordered_mask", jnp.ones_like(h), None)))(
            h, jax.random.key(4))                                # [3, R] each
    assert np.allclose(delta[0], delta[1:]) == shared, sampler
    if sampler == "original":  # evaluation: (1/K) sum_i (K - i) / R per dim
      assert float(jnp.mean(ones)) == pytest.approx((K + 1) / (2 * R),
                                                    rel=1e-5)


def test_layer_retrieval_searches_with_each_modules_input():
  """Issue #27 item 5: in 'layer' retrieval a module searches the database
  with the first position of its own input (the original's
  ``_get_neighbors``: ``x[:, 0]``) by the index's metric, then fuses those
  rows' stored vectors exactly as given neighbours; zeros past N rows."""
  rng = np.random.default_rng(9)
  n, b = 7, 3
  vectors = rng.normal(size=(n, R)).astype(np.float32)
  x = rng.normal(size=(b, 4, R)).astype(np.float32)
  base = layers.Dense(R, R, ("embed", "kv"), dtype=jnp.float32, stddev=0.5,
                      rngs=nnx.Rngs(0))
  module = F.FusedProjection(
      base, out_features=R, slot=0, choice="reranker", rngs=nnx.Rngs(1),
      config=F.FusionConfig(modules="encoder.key", top_k=K, db_dim=R,
                            fused_norm="none"))
  module.fusion_rerank[...] = jnp.asarray(rng.normal(size=(K,)), jnp.float32)
  q = x[:, 0]
  for metric, bias, order in (
      ("ip", np.zeros(n, np.float32), -(q @ vectors.T)),
      ("l2", -0.5 * (vectors ** 2).sum(1),
       ((q[:, None] - vectors[None]) ** 2).sum(-1))):
    best = np.argsort(order, axis=1, kind="stable")[:, :K]         # [B, K]
    given = jnp.asarray(vectors[best][:, None])                   # [B, 1, K, R]
    searched, direct = jax.jit(lambda x, v, c, h: (
        module(x, {"database": v, "database_bias": c}),
        module(x, {"neighbours": h})))(jnp.asarray(x), jnp.asarray(vectors),
                                        jnp.asarray(bias), given)
    np.testing.assert_allclose(searched, direct, rtol=1e-5, atol=1e-6,
                               err_msg=metric)
  padded = F.layer_neighbours(jnp.asarray(q), jnp.asarray(vectors),
                              jnp.zeros(n), n + 2)                # [B, 1, N+2, R]
  assert padded.shape == (b, 1, n + 2, R)
  assert not np.any(padded[:, :, n:]) and np.all(np.any(padded[:, :, :n], -1))


def test_xavier_initialisation_is_the_originals():
  k, r = 8, 24
  fusion = F.FusionConfig(modules="encoder.key", top_k=k, db_dim=r,
                          init="xavier")
  module = _module(fusion, 6)
  for param, fans in ((module.fusion_rerank, k + 1),
                      (module.fusion_beta, k + r),
                      (module.fusion_alpha, len(F.SCHEMES) + 1)):
    x, bound = np.asarray(param[...]), (6.0 / fans) ** 0.5
    assert np.all(np.abs(x) <= bound) and np.abs(x).max() > bound / 2
    assert len(np.unique(x)) == x.size
  zeros = _module(dataclasses.replace(fusion, init="zeros"), 6)
  assert not np.any(np.asarray(zeros.fusion_alpha[...]))
  # The projection is drawn first, so it does not depend on the choice.
  np.testing.assert_array_equal(np.asarray(zeros.fusion_proj[...]),
                                np.asarray(module.fusion_proj[...]))
  with pytest.raises(InputError, match="FUSION_INIT: must be one of"):
    dataclasses.replace(fusion, init="normal")


def test_ordered_mask_fuse_formula_and_gradient_reaches_beta():
  rng = np.random.default_rng(3)
  h = jnp.asarray(rng.normal(size=(2, 1, K, R)), jnp.float32)
  beta = jnp.asarray(rng.normal(size=(K, R)), jnp.float32)
  v = F.expected_ordered_mask(beta, 5.0)
  np.testing.assert_allclose(F.ordered_mask_fuse(h, v),
                             np.einsum("kr,bskr->bsr", v, h) / K, rtol=1e-5)
  for sample in (False, True):
    def f(beta):
      mask = (F.sample_ordered_mask(beta, jax.random.key(1), 2, 5.0, 5.0)
              if sample else F.expected_ordered_mask(beta, 5.0))
      return jnp.sum(F.ordered_mask_fuse(h, mask) ** 2)
    g = jax.grad(f)(beta)
    assert np.all(np.isfinite(g)) and float(jnp.abs(g).sum()) > 0


def test_parse_targets():
  assert F.parse_targets("key,value") == ("encoder.key", "encoder.value")
  assert F.parse_targets("none") == ()
  assert F.parse_targets("query, decoder.ffn") == ("encoder.query",
                                                   "decoder.ffn")
  with pytest.raises(ValueError, match="not a fusion module"):
    F.parse_targets("keys")


def _batch(neighbours):
  rng = np.random.default_rng(4)
  return {"encoder_input_tokens": jnp.asarray(rng.integers(2, 64, (3, 7)),
                                              jnp.int32),
          "decoder_target_tokens": jnp.asarray([[5, 1], [6, 1], [7, 1]],
                                               jnp.int32),
          "neighbours": neighbours}


ALL = "query,key,value,output,ffn,decoder.query,decoder.key,decoder.value,decoder.output,decoder.ffn"


@pytest.mark.parametrize("structure", [None, "original"])
def test_no_neighbours_or_original_choice_equals_plain_t5(structure):
  targets = F.parse_targets(ALL)
  n = len(F.wrapped_paths(CFG.num_layers, CFG.num_decoder_layers, targets))
  fusion = F.FusionConfig(modules=ALL, top_k=K, db_dim=R, search=True,
                          structure=None if structure is None else (structure,) * n)
  model = ReFusionModel(CFG, fusion)
  params = model.init_params(0)
  plain = EncoderDecoderModel(CFG)
  plain_params = plain.init_params(0)
  # The backbone is initialised exactly as the plain T5 (same seed).
  flat_plain = jax.tree_util.tree_leaves_with_path(plain_params)
  assert len(flat_plain) < len(jax.tree.leaves(params))
  tokens = _batch(None)
  want = plain.logits(plain_params, tokens["encoder_input_tokens"],
                      tokens["decoder_target_tokens"])
  neighbours = (jnp.zeros((3, 1, K, R)) if structure is None else
                jax.random.normal(jax.random.key(5), (3, 2, K, R)))
  for rng in (None, jax.random.key(9)):
    extras = model.make_extras({"neighbours": neighbours}, rng)
    got = model.logits(params, tokens["encoder_input_tokens"],
                       tokens["decoder_target_tokens"], extras=extras)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_fusion_changes_only_through_position_zero_and_label_scores():
  fusion = F.FusionConfig(modules="key,value", top_k=K,
                          db_dim=R, scheme="reranker")
  model = ReFusionModel(CFG, fusion)
  params = model.init_params(0)
  b = _batch(jax.random.normal(jax.random.key(6), (3, 1, K, R)))
  net = model.network(params)
  x = jnp.ones((3, 4, CFG.d_model))
  proj = net.encoder.layers_0.attention.key
  y0, y1 = proj(x), proj(x, model.make_extras(b))
  np.testing.assert_array_equal(np.asarray(y0[:, 1:]), np.asarray(y1[:, 1:]))
  assert not np.allclose(np.asarray(y0[:, 0]), np.asarray(y1[:, 0]))
  labels = jnp.asarray([[5, 1], [6, 1], [7, 1]], jnp.int32)
  scores = model.label_scores(params, b, labels)
  # Each row's gold-label score is minus the per-example summed NLL.
  logits = model.logits(params, b["encoder_input_tokens"],
                        jnp.pad(labels, ((0, 0), (1, 0)))[:, :-1],
                        extras=model.make_extras(b))
  logp = jax.nn.log_softmax(logits, -1)
  direct = jnp.take_along_axis(logp, labels[..., None], -1)[..., 0].sum(-1)
  np.testing.assert_allclose(np.diag(np.asarray(scores)), direct, rtol=1e-5)


def test_projected_vector_does_not_depend_on_the_database_scale():
  """Issue #17 item 0: through the projection, the fused vector is divided
  by its root mean square, so a database scaled by any factor (or with
  another k) fuses the same vector, starting at the projection outputs'
  scale; without a projection it is added as stored."""
  rng = np.random.default_rng(6)
  h = jnp.asarray(rng.normal(size=(3, 2, K, R)) * 0.05, jnp.float32)
  for norm, out, invariant in (("auto", 7, True), ("none", 7, False),
                               ("auto", R, False), ("rms", R, True)):
    module = _module(F.FusionConfig(modules="encoder.key", top_k=K,
                                    db_dim=R, fused_norm=norm), out)
    small = module._delta("reranker", h, None)                  # [3, out]
    large = module._delta("reranker", 30 * h, None)
    if invariant:
      np.testing.assert_allclose(large, small, rtol=1e-5, atol=1e-6)
      # unit mean square in, the projection's init keeps it near 1 out
      assert 0.3 < float(jnp.sqrt(jnp.mean(small ** 2))) < 3.0
    else:
      np.testing.assert_allclose(large, 30 * small, rtol=1e-5, atol=1e-6)
  assert F.FusionConfig.from_dict(
      {"targets": ["encoder.key"], "top_k": K, "db_dim": R}).fused_norm == "none"


def test_run_config_fusion_keeps_its_keys_and_round_trips():
  fusion = F.FusionConfig(modules="key,decoder.ffn", top_k=K, db_dim=R,
                          structure=("reranker", "original"))
  fields = fusion.to_dict()
  assert set(fields) == {
      "targets", "top_k", "db_dim", "search", "scheme", "structure",
      "mask_temperature", "mask_clip", "init", "mask_sampler",
      "mask_eval_samples", "fused_norm"}
  assert fields["targets"] == ["encoder.key", "decoder.ffn"]
  assert fields["structure"] == ["reranker", "original"]
  back = F.FusionConfig.from_dict(json.loads(json.dumps(fields)))
  assert back.targets == fusion.targets and back.to_dict() == fields
  assert F.FusionConfig.from_dict({**fields, "targets": []}).targets == ()
  with pytest.raises(InputError, match="structure: entry 'best'"):
    F.FusionConfig(structure=("best",))


def test_projection_when_database_width_differs():
  fusion = F.FusionConfig(modules="encoder.key", top_k=K, db_dim=R)
  params = ReFusionModel(CFG, fusion).init_params(0)
  key = params["encoder"]["layers_0"]["attention"]["key"]
  assert key["fusion_proj"].shape == (R, CFG.num_heads * CFG.d_kv)
  same = F.FusionConfig(modules="encoder.ffn", top_k=K, db_dim=CFG.d_model)
  wo = ReFusionModel(CFG, same).init_params(0)["encoder"]["layers_0"]["mlp"]["wo"]
  assert "fusion_proj" not in wo


def _gin_macro(path: str, name: str) -> str:
  """A string macro's value as a gin file sets it (``NAME = 'value'``)."""
  text = (pathlib.Path(__file__).resolve().parents[1] / path).read_text()
  return re.search(rf"^{name} = '([^']*)'", text, re.M).group(1)


def test_t5_base_recipe_fuses_a_gtr_database_at_the_projections_scale():
  """Issue #27 item 2: a GTR database (768-d, L2-normalised: entries of RMS
  1/sqrt(768)) has T5-base's key/value width, so there is no projection; the
  recipe's FUSED_NORM must still bring the reranker's fused vector (k = 64,
  a further 1/K) to the projection outputs' scale. Added as stored it has
  RMS ~3e-4 against outputs of RMS ~1."""
  width, k = 768, 64
  norm = _gin_macro("gin/refusion/t5_base.gin", "FUSED_NORM")
  rng = np.random.default_rng(7)
  db = rng.normal(size=(2, 2, k, width)).astype(np.float32)
  db /= np.linalg.norm(db, axis=-1, keepdims=True)             # [B, S, K, R]
  base = layers.Dense(width, width, ("embed", "kv"), dtype=jnp.float32,
                      stddev=width ** -0.5, rngs=nnx.Rngs(0))
  module = F.FusedProjection(
      base, out_features=width, slot=0, choice="reranker", rngs=nnx.Rngs(1),
      config=F.FusionConfig(modules="encoder.key", top_k=k, db_dim=width,
                            fused_norm=norm))
  assert not module.has_proj
  x = jnp.asarray(rng.normal(size=(2, 3, width)), jnp.float32)  # RMS-normed input
  plain = base(x)                                               # [B, L, O]
  fused = module(x, {"neighbours": jnp.asarray(db)})
  added = fused[:, 0] - plain[:, 0]                             # [B, O]
  ratio = float(jnp.sqrt(jnp.mean(added ** 2)) / jnp.sqrt(jnp.mean(plain ** 2)))
  assert 0.3 < ratio < 3.0, (norm, ratio)
  np.testing.assert_array_equal(fused[:, 1:], plain[:, 1:])
