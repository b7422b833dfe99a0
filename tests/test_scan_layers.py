"""scan_layers (jaxfid.t5.stack): one lax.scan over alike layers computes
what the unrolled loop does, with the same parameters and dropout keys."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxfid.reatt.retrieval_attention import bi_encode
from jaxfid.t5 import stack
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.t5.network import T5

CONFIG = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=24, num_heads=4,
                  num_layers=4, num_decoder_layers=3, dropout_rate=0.2,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def _batch(b=3):
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 64, size=(b, 2, 7)).astype(np.int32)  # [B, P, L]
  enc[1, 1, 4:] = 0
  targets = rng.integers(2, 64, size=(b, 5)).astype(np.int32)
  targets[0, 3:] = 0
  return {"encoder_input_tokens": jnp.asarray(enc),
          "decoder_target_tokens": jnp.asarray(targets)}


def _loss_and_grads(config, params, batch, rng):
  model = EncoderDecoderModel(config)
  return jax.jit(jax.value_and_grad(
      lambda p: model.loss(p, batch, rng)[0]))(params)


@pytest.mark.parametrize("remat", [pytest.param("none", marks=pytest.mark.slow), "full"])
def test_scan_equals_loop_with_dropout(remat):
  params = EncoderDecoderModel(CONFIG).init_params(0)
  batch, rng = _batch(), jax.random.key(3)
  loop = _loss_and_grads(CONFIG.replace(remat=remat), params, batch, rng)
  scan = _loss_and_grads(CONFIG.replace(remat=remat, scan_layers=True),
                         params, batch, rng)
  np.testing.assert_allclose(scan[0], loop[0], rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6),
               scan[1], loop[1])
  # Dropout is on: without a key the loss differs (the keys were used).
  no_dropout = _loss_and_grads(CONFIG, params, batch, None)[0]
  assert abs(float(no_dropout) - float(loop[0])) > 1e-4


def test_scan_is_one_compiled_layer():
  """XLA's optimised program holds one layer's kernels (forward and
  backward, in a loop) instead of every layer's: far fewer fused kernels
  (4 + 3 layers: 735 instead of 1,110)."""
  params = EncoderDecoderModel(CONFIG).init_params(0)
  batch = _batch()

  def compiled(config):
    model = EncoderDecoderModel(config)
    return jax.jit(jax.grad(lambda p: model.loss(p, batch, jax.random.key(0))[0])
                   ).lower(params).compile().as_text()

  unrolled, scanned = compiled(CONFIG), compiled(CONFIG.replace(scan_layers=True))
  assert scanned.count(" fusion(") < 0.75 * unrolled.count(" fusion(")


def test_per_layer_outputs_and_layer_ranges_under_scan():
  cfg = CONFIG.replace(dropout_rate=0.0)
  net = T5(cfg, rngs=nnx.Rngs(0))
  scan_net = T5(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0))
  tokens = _batch()["encoder_input_tokens"][:, 0]
  a = net.encode(tokens, output_hidden_states=True,
                 output_attention_logits=True)
  b = scan_net.encode(tokens, output_hidden_states=True,
                      output_attention_logits=True)
  assert len(b.hidden_states) == cfg.num_layers + 1
  assert len(b.attention_logits) == cfg.num_layers
  for x, y in zip(a.hidden_states + a.attention_logits,
                  b.hidden_states + b.attention_logits):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-5)
  x = scan_net.embed(tokens)
  lower = scan_net.encoder(x, tokens != 0, start=0, end=3)
  upper = scan_net.encoder(lower.hidden, tokens != 0, start=3)
  np.testing.assert_allclose(np.asarray(upper.hidden), np.asarray(a.hidden),
                             atol=1e-5)
  logits_a, out_a = net.decode(a.hidden, a.mask, tokens[:, :4],
                               output_attention_logits=True)
  logits_b, out_b = scan_net.decode(b.hidden, b.mask, tokens[:, :4],
                                    output_attention_logits=True)
  np.testing.assert_allclose(np.asarray(logits_b), np.asarray(logits_a),
                             atol=1e-5)
  assert len(out_b.cross_attention_logits) == cfg.num_decoder_layers


def test_unlike_layers_fall_back_to_the_loop():
  """FiDO's decoder (cross-attention every 2nd layer) is not alike: it runs
  the loop, with or without scan_layers, and gives the same logits."""
  cfg = CONFIG.replace(dropout_rate=0.0, cross_attention_period=2)
  net = T5(cfg, rngs=nnx.Rngs(0))
  decoder_layers = [net.decoder.layer(i) for i in range(cfg.num_decoder_layers)]
  assert not stack.alike(decoder_layers)
  assert stack.alike([net.encoder.layer(i) for i in range(cfg.num_layers)])
  scan_net = T5(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0))
  tokens = _batch()["encoder_input_tokens"][:, 0]
  np.testing.assert_allclose(np.asarray(scan_net(tokens, tokens[:, :4])),
                             np.asarray(net(tokens, tokens[:, :4])), atol=1e-5)


def test_reatt_bi_encoder_under_scan():
  cfg = CONFIG.replace(dropout_rate=0.0)
  net = T5(cfg, rngs=nnx.Rngs(0))
  scan_net = T5(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0))
  tokens = _batch()["encoder_input_tokens"][:, 0]
  valid = tokens != 0
  question_length = jnp.asarray([2, 3, 2])
  a = bi_encode(net.encoder, net.embed(tokens), valid, question_length, 3)
  b = bi_encode(scan_net.encoder, scan_net.embed(tokens), valid,
                question_length, 3)
  np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
