"""FiD on the T5 network: fusion, masking, order invariance, scores, loss, decoding."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfid.t5 import passages as fid
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel, shift_right
from jaxfid.training.step import make_train_step

CONFIG = T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=48, num_heads=4,
                  num_layers=2, num_decoder_layers=2,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                  dropout_rate=0.0)


@pytest.fixture(scope="module")
def model_params():
  return EncoderDecoderModel.create(CONFIG, seed=3)


def _passages(b=2, p=3, l=10, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, CONFIG.vocab_size, size=(b, p, l)).astype(np.int32)
  tokens[:, :, -1] = 1
  tokens[0, min(1, p - 1), 6:] = 0  # a shorter passage
  return tokens


def _targets(b=2, t=5, seed=1):
  rng = np.random.default_rng(seed)
  targets = rng.integers(2, CONFIG.vocab_size, size=(b, t)).astype(np.int32)
  targets[:, -1] = 1
  targets[1, 3:] = 0
  targets[1, 2] = 1
  return targets


def test_one_passage_equals_plain_t5(model_params):
  model, params = model_params
  tokens = _passages(p=1)
  dec = shift_right(_targets())
  net = model.network(params)
  plain = net(jnp.asarray(tokens[:, 0]), dec)
  fused = model.logits(params, tokens, dec)
  np.testing.assert_allclose(np.asarray(fused), np.asarray(plain), rtol=1e-6,
                             atol=1e-6)
  # [B, L] input is the P = 1 case too.
  np.testing.assert_array_equal(np.asarray(model.logits(params, tokens[:, 0], dec)),
                                np.asarray(fused))


def test_padding_passages_change_nothing(model_params):
  model, params = model_params
  tokens = _passages(p=2)
  dec = shift_right(_targets())
  base = model.logits(params, tokens, dec)
  padded = np.concatenate([tokens, np.zeros_like(tokens[:, :2])], axis=1)
  mask = np.array([[True, True, False, False]] * 2)
  with_pad = model.logits(params, padded, dec, passage_mask=jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(with_pad), np.asarray(base), rtol=1e-6,
                             atol=1e-6)
  # Masking a real passage is the same as leaving it out.
  extra = np.concatenate([tokens, _passages(p=2, seed=9)], axis=1)
  masked = model.logits(params, extra, dec, passage_mask=jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(masked), np.asarray(base), rtol=1e-6,
                             atol=1e-6)


def test_passage_order_does_not_matter(model_params):
  model, params = model_params
  tokens = _passages(p=4)
  dec = shift_right(_targets())
  base = model.logits(params, tokens, dec)
  perm = tokens[:, [2, 0, 3, 1]]
  np.testing.assert_allclose(np.asarray(model.logits(params, perm, dec)),
                             np.asarray(base), rtol=1e-5, atol=1e-5)
  scores = np.asarray(model.passage_scores(params, tokens))
  perm_scores = np.asarray(model.passage_scores(params, perm))
  np.testing.assert_allclose(perm_scores, scores[:, [2, 0, 3, 1]], atol=1e-6)
  np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)


def test_passage_scores_match_manual_computation(model_params):
  model, params = model_params
  tokens = _passages(p=3)
  net = model.network(params)
  enc = fid.encode_passages(net, tokens)
  _, out = net.decode(enc.hidden, enc.mask, jnp.zeros((2, 1), jnp.int32),
                      output_attention_logits=True)
  probs = [np.asarray(jax.nn.softmax(c[:, :, 0], -1)) for c in out.cross_attention_logits]
  mask = (tokens != 0).reshape(2, 1, 3, -1)
  want = np.mean([(p.reshape(2, 4, 3, -1) * mask).sum(-1).mean(1) for p in probs], 0)
  got = np.asarray(model.passage_scores(params, tokens))
  np.testing.assert_allclose(got, want, atol=1e-6)
  logit_scores = np.asarray(model.passage_scores(params, tokens, mode="logits"))
  assert logit_scores.shape == (2, 3) and np.isfinite(logit_scores).all()


def test_score_is_the_masked_sum_of_target_log_probabilities(model_params):
  model, params = model_params
  tokens, targets = _passages(p=3), _targets()
  passage_mask = np.array([[True, True, False], [True, True, True]])
  batch = {"encoder_input_tokens": tokens, "decoder_target_tokens": targets,
           "passage_mask": passage_mask}
  got = np.asarray(jax.jit(model.score)(params, batch))
  # Direct: log-softmax (float64) of the teacher-forced logits, the target
  # tokens' entries summed where the target is not padding.
  logits = np.asarray(model.logits(params, tokens, shift_right(targets),
                                   passage_mask=passage_mask), np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  token = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  want = np.where(targets > 0, token, 0.0).sum(-1)
  assert got.shape == (2,) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # The loss is the same quantity, negated and averaged over target tokens.
  loss, aux = model.loss(params, batch)
  np.testing.assert_allclose(-got.sum() / float(aux["num_target_tokens"]),
                             float(loss), rtol=1e-5)
  # Given decoder inputs are used as they are (t5x's decoder_input_tokens).
  other = dict(batch, decoder_input_tokens=np.ones_like(targets))
  assert not np.allclose(np.asarray(model.score(params, other)), got)


def test_cached_greedy_decoding_matches_teacher_forcing(model_params):
  model, params = model_params
  tokens = _passages(p=3)
  out = np.asarray(model.jit_predict(params, jnp.asarray(tokens),
                                     max_decode_len=6))
  # Feeding the generated prefix back teacher-forced gives the same argmaxes.
  logits = np.asarray(model.logits(params, tokens, shift_right(jnp.asarray(out))))
  for b in range(out.shape[0]):
    n = list(out[b]).index(1) + 1 if 1 in out[b] else out.shape[1]
    np.testing.assert_array_equal(logits[b, :n].argmax(-1), out[b, :n])


def test_remat_gives_same_loss_and_gradients():
  batch = {"encoder_input_tokens": jnp.asarray(_passages()),
           "decoder_target_tokens": jnp.asarray(_targets())}
  results = []
  for remat in ("none", "full", "dots"):
    model, params = EncoderDecoderModel.create(CONFIG.replace(remat=remat), seed=0)
    loss, grads = jax.jit(jax.value_and_grad(
        lambda p: model.loss(p, batch)[0]))(params)
    results.append((float(loss), grads))
  for loss, grads in results[1:]:
    assert abs(loss - results[0][0]) < 1e-6
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                 grads, results[0][1])


def test_gradient_accumulation_equals_full_batch():
  model, params = EncoderDecoderModel.create(CONFIG, seed=0)
  batch = {"encoder_input_tokens": jnp.asarray(_passages(b=4)),
           "decoder_target_tokens": jnp.asarray(_targets(b=4))}
  opt = optax.sgd(1.0)
  loss_fn = lambda p, b, rng, norm: model.loss(p, b, None, normalizer=norm)
  state = {"step": jnp.zeros((), jnp.int32), "params": params,
           "opt_state": opt.init(params)}
  full, m_full = jax.jit(make_train_step(loss_fn, opt, seed=0))(state, batch)
  acc, m_acc = jax.jit(make_train_step(loss_fn, opt, seed=0,
                                       accumulation_steps=2))(state, batch)
  assert abs(float(m_full["loss"]) - float(m_acc["loss"])) < 1e-6
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               full["params"], acc["params"])


def test_loss_goes_down_on_a_tiny_set():
  model, params = EncoderDecoderModel.create(CONFIG.replace(dropout_rate=0.1), seed=0)
  batch = {"encoder_input_tokens": jnp.asarray(_passages(b=4)),
           "decoder_target_tokens": jnp.asarray(_targets(b=4))}
  opt = optax.adam(3e-3)
  loss_fn = lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm)
  step = jax.jit(make_train_step(loss_fn, opt, seed=0))
  state = {"step": jnp.zeros((), jnp.int32), "params": params,
           "opt_state": opt.init(params)}
  losses = []
  for _ in range(30):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < 0.3 * losses[0], losses


def test_non_finite_loss_leaves_parameters_untouched():
  model, params = EncoderDecoderModel.create(CONFIG, seed=0)
  batch = {"encoder_input_tokens": jnp.asarray(_passages()),
           "decoder_target_tokens": jnp.asarray(_targets())}
  opt = optax.adam(1e-3)
  nan_loss = lambda p, b, rng, norm: (
      model.loss(p, b, None, normalizer=norm)[0] * jnp.nan, {})
  state = {"step": jnp.zeros((), jnp.int32), "params": params,
           "opt_state": opt.init(params)}
  new, metrics = jax.jit(make_train_step(nan_loss, opt, seed=0))(state, batch)
  assert float(metrics["finite"]) == 0.0
  assert int(new["step"]) == 1
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b),
               new["params"], params)
