"""The hooks later methods use: layer ranges, per-layer outputs, swappable projections."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxfid.t5.config import T5Config
from jaxfid.t5.network import T5

CONFIG = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=24, num_heads=4,
                  num_layers=4, num_decoder_layers=2, dropout_rate=0.0,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def _tokens():
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 64, size=(2, 9)).astype(np.int32)
  tokens[1, 6:] = 0
  return jnp.asarray(tokens)


def test_layer_ranges_compose_to_the_full_encoder():
  net = T5(CONFIG, rngs=nnx.Rngs(0))
  tokens = _tokens()
  full = net.encode(tokens)
  x = net.embed(tokens)
  lower = net.encoder(x, tokens != 0, start=0, end=2)   # no final norm
  upper = net.encoder(lower.hidden, tokens != 0, start=2)
  np.testing.assert_allclose(np.asarray(upper.hidden), np.asarray(full.hidden),
                             rtol=1e-6, atol=1e-6)


def test_hidden_states_and_attention_logits_on_request():
  net = T5(CONFIG, rngs=nnx.Rngs(0))
  tokens = _tokens()
  out = net.encode(tokens, output_hidden_states=True,
                   output_attention_logits=True)
  assert len(out.hidden_states) == CONFIG.num_layers + 1
  assert len(out.attention_logits) == CONFIG.num_layers
  assert out.attention_logits[0].shape == (2, 4, 9, 9)
  assert out.attention_logits[0].dtype == jnp.float32
  # The first layer's logits are q.k + position bias, recomputed by hand.
  layer = net.encoder.layer(0)
  h = layer.pre_attention_layer_norm(out.hidden_states[0])
  q = layer.attention.project_q(h)
  k, _ = layer.attention.project_kv(h)
  want = jnp.einsum("blhe,bshe->bhls", q, k) + net.encoder.relpos_bias(9, 9)
  mask = np.asarray(tokens != 0)[:, None, None, :]
  got = np.asarray(out.attention_logits[0])
  np.testing.assert_allclose(np.where(mask, got, 0), np.where(mask, want, 0),
                             rtol=1e-5, atol=1e-5)
  plain = net.encode(tokens)
  assert plain.hidden_states is None and plain.attention_logits is None
  _, dec = net.decode(out.hidden, out.mask, jnp.zeros((2, 3), jnp.int32),
                      output_attention_logits=True)
  assert len(dec.cross_attention_logits) == CONFIG.num_decoder_layers
  assert dec.cross_attention_logits[0].shape == (2, 4, 3, 9)


class AddToFirstPosition(nnx.Module):
  """A projection wrapper (as ReFusion's): original output + extras at position 0."""

  def __init__(self, inner):
    self.inner = inner

  def __call__(self, x, extras=None):
    y = self.inner(x, extras)
    if extras is None:
      return y
    return y.at[:, 0].add(extras["fused"])


def test_projection_can_be_replaced_per_layer():
  net = T5(CONFIG, rngs=nnx.Rngs(0))
  tokens = _tokens()
  dec = jnp.zeros((2, 3), jnp.int32)
  base = np.asarray(net(tokens, dec))
  layer = net.encoder.layer(2)
  layer.attention.key = AddToFirstPosition(layer.attention.key)
  # Parameters keep their names; the wrapper adds none.
  state = nnx.state(net, nnx.Param)
  assert "inner" in state["encoder"]["layers_2"]["attention"]["key"]
  # With nothing to add the output is unchanged...
  np.testing.assert_array_equal(np.asarray(net(tokens, dec)), base)
  # ...and extras reach the wrapped projection.
  fused = {"fused": jnp.ones((2, CONFIG.inner_dim))}
  changed = np.asarray(net(tokens, dec, extras=fused))
  assert np.abs(changed - base).max() > 1e-4
