"""jaxfid/atlas: the retriever losses and the reader's gold scores against
the Atlas formulas written out in numpy (src/atlas.py, src/fid.py), on tiny
random models; the joint loss's gradients go where Atlas's go."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfid.atlas import gold
from jaxfid.atlas.config import AtlasConfig
from jaxfid.atlas.losses import emdr_loss, kl_loss, retriever_scores
from jaxfid.atlas.model import READER, RETRIEVER, AtlasModel, batch_normalizer
from jaxfid.atlas.step import frozen_passage_tower, make_atlas_step
from jaxfid.dual_encoder.distill_loss import distill_loss
from jaxfid.dual_encoder.model import QUERY_TOWER, DualEncoder, DualEncoderConfig
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel, shift_right
from jaxfid.training.task import train_state

B, K, L, T, P, Q = 2, 3, 6, 4, 5, 4


def _config(**overrides):
  fields = dict(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_heads=2,
                num_layers=1, num_decoder_layers=2, dropout_rate=0.0,
                feed_forward_proj="gated-gelu", tie_word_embeddings=False)
  fields.update(overrides)
  return T5Config(**fields)


def _log_softmax(x, axis=-1):
  x = x - x.max(axis, keepdims=True)
  return x - np.log(np.exp(x).sum(axis, keepdims=True))


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, 40, (B, K, L)).astype(np.int32)
  tokens[0, 1, 4:] = 0                                  # a shorter passage
  targets = rng.integers(2, 40, (B, T)).astype(np.int32)
  targets[1, 2:] = 0                                    # a shorter answer
  return {"encoder_input_tokens": tokens,
          "passage_mask": np.ones((B, K), bool),
          "decoder_target_tokens": targets,
          "query_tokens": rng.integers(2, 40, (B, Q)).astype(np.int32),
          "passage_tokens": rng.integers(2, 40, (B, K, P)).astype(np.int32)}


@pytest.fixture(scope="module")
def reader():
  model = EncoderDecoderModel(_config())
  return model, model.init_params(3)


def _numpy_mean_nll(logits, targets):
  logp = _log_softmax(np.asarray(logits, np.float64))
  nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  mask = targets > 0
  return (nll * mask).sum(-1) / mask.sum(-1)


def test_kl_loss_is_atlas_kldivloss_and_fid_kd_distill_loss():
  rng = np.random.default_rng(0)
  q = rng.standard_normal((B, 8)).astype(np.float32)
  p = rng.standard_normal((B, K, 8)).astype(np.float32)
  g = rng.standard_normal((B, K)).astype(np.float32)
  scores = jax.jit(retriever_scores)(q, p)
  np.testing.assert_allclose(scores, np.einsum("bd,bkd->bk", q, p) / np.sqrt(8),
                             rtol=1e-6)
  got = jax.jit(lambda s, g: kl_loss(s, g, temperature_gold=0.3,
                                     temperature_score=0.7, count=B * K))(
      scores, jnp.asarray(g))
  # torch.nn.KLDivLoss()(log_softmax(s / ts), softmax(g / tg)): 'mean'
  t = np.exp(_log_softmax(g / 0.3))
  want = np.sum(t * (np.log(t) - _log_softmax(np.asarray(scores) / 0.7))) / (B * K)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  fid_kd, _ = jax.jit(lambda q, p, g: distill_loss(
      q, p, jnp.ones(B * K, bool), g, temperature_gold=0.3,
      temperature_score=0.7))(q, p.reshape(B * K, 8), g.reshape(-1))
  np.testing.assert_allclose(got, fid_kd, rtol=1e-5)


def test_emdr_loss_is_atlas_logprob():
  rng = np.random.default_rng(1)
  scores = rng.standard_normal((B, K)).astype(np.float32)
  logprobs = _log_softmax(rng.standard_normal((B, K, T, 7))).astype(np.float32)
  targets = rng.integers(0, 7, (B, T))
  gathered = np.take_along_axis(logprobs, np.repeat(targets[:, None], K, 1)[..., None],
                                -1)[..., 0]                       # [B, K, T]
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
  got = jax.jit(lambda s, g, m: emdr_loss(s, g, m, temperature_score=0.5,
                                          count=m.sum()))(scores, gathered, mask)
  log_score = _log_softmax(scores / 0.5)
  joint = gathered + log_score[..., None]
  marginal = np.log(np.exp(joint).sum(1))                          # [B, T]
  np.testing.assert_allclose(got, -np.sum(marginal * mask) / mask.sum(),
                             rtol=1e-5)


@pytest.mark.slow
def test_pdist_gold_is_minus_the_mean_nll_with_each_passage_alone(reader):
  model, params = reader
  batch = _batch()
  got = jax.jit(gold.pdist_gold, static_argnums=0)(
      model, params, batch["encoder_input_tokens"], batch["passage_mask"],
      batch["decoder_target_tokens"])
  targets = batch["decoder_target_tokens"]
  for b in range(B):
    for k in range(K):
      logits = model.jit_logits(params,
                                batch["encoder_input_tokens"][b:b + 1, k],
                                shift_right(targets[b:b + 1]))
      np.testing.assert_allclose(got[b, k], -_numpy_mean_nll(
          logits, targets[b:b + 1])[0], rtol=1e-4)


@pytest.mark.slow
def test_loop_gold_is_the_loss_with_the_passage_left_out(reader):
  model, params = reader
  batch = _batch(1)
  tokens, targets = batch["encoder_input_tokens"], batch["decoder_target_tokens"]
  got = jax.jit(gold.loop_gold, static_argnums=0)(
      model, params, tokens, batch["passage_mask"], targets)
  for k in range(K):
    others = np.delete(tokens, k, axis=1)                  # the K-1 others
    logits = model.jit_logits(params, others, shift_right(targets))
    np.testing.assert_allclose(got[:, k], _numpy_mean_nll(logits, targets),
                               rtol=1e-4)


@pytest.mark.slow
def test_emdr_token_logprobs_are_each_passage_alone(reader):
  model, params = reader
  batch = _batch(2)
  tokens, targets = batch["encoder_input_tokens"], batch["decoder_target_tokens"]
  got = jax.jit(gold.emdr_token_logprobs, static_argnums=0,
                static_argnames="temperature_gold")(
      model, params, tokens, batch["passage_mask"], targets,
      temperature_gold=0.5)
  logits = model.jit_logits(params, tokens[1:2, 2], shift_right(targets[1:2]))
  logp = _log_softmax(np.asarray(logits, np.float64) / 0.5)[0]     # [T, V]
  want = logp[np.arange(T), targets[1]]
  np.testing.assert_allclose(got[1, 2], want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_adist_gold_is_atlas_evalnormsum(reader):
  model, params = reader
  batch = _batch(3)
  tokens, targets = batch["encoder_input_tokens"], batch["decoder_target_tokens"]
  got = np.asarray(gold.adist_gold(model, params, tokens, batch["passage_mask"],
                                   targets))
  # Atlas: per layer, (||v_s|| * softmax(scores)).mean(heads); summed over
  # layers; masked passage tokens and padding labels zeroed; summed over
  # targets and tokens; / (256 * n_layers * n_targets)
  net = model.network(params)
  enc = model.encode(net, tokens)
  _, dec = net.decode(enc.hidden, enc.mask, shift_right(targets),
                      output_attention_logits=True)
  hidden = np.asarray(enc.hidden, np.float64)                       # [B, S, D]
  total = 0.0
  for i, logits in enumerate(dec.cross_attention_logits):
    kernel = np.asarray(params["decoder"][f"layers_{i}"][
        "encoder_decoder_attention"]["value"]["kernel"], np.float64)
    v = (hidden @ kernel).reshape(B, K * L, 2, 4)                   # [B, S, H, E]
    norms = np.linalg.norm(v, axis=-1).transpose(0, 2, 1)          # [B, H, S]
    probs = np.exp(_log_softmax(np.asarray(logits, np.float64)))   # [B, H, T, S]
    total = total + (norms[:, :, None, :] * probs).mean(1)         # [B, T, S]
  mask = (tokens != 0).reshape(B, K * L)
  total = total * mask[:, None, :] * (targets > 0)[:, :, None]
  per = total.reshape(B, T, K, L).sum((1, 3))
  want = per / (256 * 2 * (targets > 0).sum(-1, keepdims=True))
  np.testing.assert_allclose(got, want, rtol=1e-4)


def _atlas(loss, query_side_only=False, mode="frozen"):
  config = _config()
  atlas = AtlasConfig(corpus="c", retriever_loss=loss,
                      query_side_only=query_side_only, query_side_mode=mode,
                      temperature_gold=0.5, temperature_score=0.5)
  retriever = DualEncoder(config, DualEncoderConfig(
      shared=not atlas.separate_towers))
  return AtlasModel(EncoderDecoderModel(config), retriever, atlas)


def _norm(tree):
  return float(sum(jnp.sum(x * x) for x in jax.tree.leaves(tree)))


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["adist", "emdr2", "pdist", "loop"])
def test_each_loss_trains_the_retriever_only_and_splits_exactly(loss):
  model = _atlas(loss)
  params = model.init_params(0)
  batch = jax.tree.map(jnp.asarray, _batch())
  retriever_grads = jax.jit(jax.grad(
      lambda p: model.retriever_loss(p, batch, batch_normalizer(batch))))(params)
  assert _norm(retriever_grads[READER]) == 0.0
  assert _norm(retriever_grads[RETRIEVER]) > 0.0
  # two microbatches over the whole batch's counts add up to the batch's loss
  loss = jax.jit(lambda p, b, n: model.loss(p, b, normalizer=n)[0])
  norm = batch_normalizer(batch)
  whole = loss(params, batch, norm)
  halves = sum(loss(params, jax.tree.map(lambda x: x[i:i + 1], batch), norm)
               for i in range(B))
  np.testing.assert_allclose(whole, halves, rtol=1e-5)


@pytest.mark.slow
def test_query_side_only_freezes_the_passage_tower():
  model = _atlas("pdist", query_side_only=True)
  params = model.init_params(0)
  batch = jax.tree.map(jnp.asarray, _batch())
  grads = jax.jit(jax.grad(lambda p: model.loss(p, batch)[0]))(params)[RETRIEVER]
  assert _norm({k: v for k, v in grads.items() if k != QUERY_TOWER}) == 0.0
  assert _norm(grads[QUERY_TOWER]) > 0.0
  moved = jax.tree.map(lambda x: x + 1.0, params)
  kept = frozen_passage_tower(params, moved)
  np.testing.assert_array_equal(kept[RETRIEVER]["encoder"]["encoder_norm"]["scale"],
                                params[RETRIEVER]["encoder"]["encoder_norm"]["scale"])
  np.testing.assert_array_equal(
      kept[RETRIEVER][QUERY_TOWER]["encoder"]["encoder_norm"]["scale"],
      moved[RETRIEVER][QUERY_TOWER]["encoder"]["encoder_norm"]["scale"])


@pytest.mark.slow  # ~20 s of CPU: the step's compile
def test_query_side_shared_is_one_tower_without_gradient_on_passages():
  """QUERY_SIDE_MODE 'shared' (Atlas's released code): one tower; the
  passage embeddings come from the weights being trained but carry no
  gradient; an update moves them, the index is not refreshed unless
  REFRESH_EVERY says so."""
  model = _atlas("pdist", query_side_only=True, mode="shared")
  params = model.init_params(0)
  assert QUERY_TOWER not in params[RETRIEVER]
  batch = jax.tree.map(jnp.asarray, _batch())
  norm = batch_normalizer(batch)
  gold_scores = model.gold(params, batch)
  b, k, p_len = batch["passage_tokens"].shape

  def kl(query_params, passage_params):  # the loss written out, two sides
    q = model.embed_queries(query_params, batch["query_tokens"])    # [B, D]
    p = model.embed_passages(passage_params,
                             batch["passage_tokens"].reshape(b * k, p_len))
    return kl_loss(retriever_scores(q, p.reshape(b, k, -1)), gold_scores,
                   temperature_gold=0.5, temperature_score=0.5,
                   count=norm["passages"])

  ret = params[RETRIEVER]
  got = jax.grad(lambda p: model.retriever_loss(
      {**params, RETRIEVER: p}, batch, norm))(ret)
  query_side = jax.grad(lambda p: kl(p, ret))(ret)
  passage_side = jax.grad(lambda p: kl(ret, p))(ret)
  assert _norm(passage_side) > 0.0  # the gradient the mode must drop
  for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(query_side)):
    np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-9)
  # one SGD step: the passage side's embeddings move with the query side's
  tx = optax.sgd(1.0)
  step = make_atlas_step(model, tx, seed=0, accumulation_steps=1)
  state, _ = jax.jit(step)(
      train_state(params, 0, opt_state=tx.init(params)), batch)
  new = state["params"][RETRIEVER]
  tokens = batch["passage_tokens"].reshape(b * k, p_len)
  assert not np.allclose(model.embed_passages(new, tokens),
                         model.embed_passages(ret, tokens))
  np.testing.assert_array_equal(model.embed_passages(new, tokens),
                                model.embed_queries(new, tokens))
  config = AtlasConfig(corpus="c", query_side_only=True, refresh_every=4)
  assert config.refresh_steps(10) == [0]
  assert config.replace(query_side_mode="shared").refresh_steps(10) == [0, 4, 8]
