"""FiD's two passage encoders (``T5Config.passage_encoding``): 'flatten'
(``[B, P, L]`` -> ``[B*P, L]``, one encoder call) and 'vmap' (``jax.vmap``
over the passage axis, a dropout key per passage).

Without dropout they are one function: equal encodings (hidden states and
attention logits included) and equal gradients of a loss on the encoding
(the decoder after it is the same code either way). With dropout the vmapped
encoder gives passage ``i`` the key ``split(rng, P)[i]``: its encoding is the
plain encoder's on that passage alone with that key. The TPU compile of the
two is compared in ``tests/test_bench_compile.py``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.core.errors import InputError
from jaxfid.t5 import passages as fid
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

FLAT = T5Config(vocab_size=96, d_model=16, d_kv=4, d_ff=24, num_heads=2,
                num_layers=1, num_decoder_layers=1,
                feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                dropout_rate=0.0)
VMAP = FLAT.replace(passage_encoding="vmap")
B, P, L = 2, 3, 8


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, FLAT.vocab_size, size=(B, P, L)).astype(np.int32)
  tokens[0, 1, 5:] = 0  # a shorter passage
  passage_mask = np.array([[True, True, True], [True, True, False]])
  return {"encoder_input_tokens": tokens, "passage_mask": passage_mask}


def _encode(config, params, batch, **kwargs):
  model = EncoderDecoderModel(config)
  return jax.jit(lambda p, t, m: fid.encode_passages(
      model.network(p), t, passage_mask=m, **kwargs))(
          params, batch["encoder_input_tokens"], batch["passage_mask"])


def test_flatten_is_the_default_and_the_choices_are_checked():
  assert T5Config().passage_encoding == "flatten"
  assert "passage_encoding" not in FLAT.architecture_differences(VMAP)
  with pytest.raises(InputError, match="PASSAGE_ENCODING"):
    T5Config(passage_encoding="scan")


def test_vmap_encodes_as_flatten():
  params = EncoderDecoderModel(FLAT).init_params(1)
  batch = _batch()
  kwargs = {"output_hidden_states": True, "output_attention_logits": True}
  flat = _encode(FLAT, params, batch, **kwargs)
  vmap = _encode(VMAP, params, batch, **kwargs)
  assert flat.hidden.shape == vmap.hidden.shape == (B, P * L, FLAT.d_model)
  np.testing.assert_array_equal(np.asarray(vmap.mask), np.asarray(flat.mask))
  # hidden, every layer's input and its attention logits ([B*P, ...] rows)
  for got, want in zip(jax.tree.leaves(vmap), jax.tree.leaves(flat)):
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.slow
def test_vmap_loss_and_gradients_equal_flatten():
  params = EncoderDecoderModel(FLAT).init_params(2)
  batch = _batch(1)
  rng = jax.random.PRNGKey(5)  # split per passage; no dropout at rate 0

  def grads(config):
    """The encoder's loss gradient: a fixed cotangent on the encoding."""
    model = EncoderDecoderModel(config)
    weight = jax.random.normal(jax.random.PRNGKey(6), (B, P * L, FLAT.d_model))

    def loss(p):
      enc = fid.encode_passages(
          model.network(p), batch["encoder_input_tokens"],
          passage_mask=batch["passage_mask"], dropout_rng=rng)
      return jnp.sum(jnp.where(enc.mask[..., None], enc.hidden * weight, 0.0))

    return jax.jit(jax.value_and_grad(loss))(params)

  loss_f, grad_f = grads(FLAT)
  loss_v, grad_v = grads(VMAP)
  np.testing.assert_allclose(float(loss_v), float(loss_f), rtol=1e-6)
  flat_leaves, tree = jax.tree.flatten(grad_f)
  assert jax.tree.structure(grad_v) == tree
  for got, want in zip(jax.tree.leaves(grad_v), flat_leaves):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                               atol=1e-6)
  # the encoder's parameters receive gradient through the vmap
  assert float(jnp.abs(grad_v["encoder"]["layers_0"]["mlp"]["wo"]["kernel"]).max()) > 0


@pytest.mark.slow
def test_vmap_dropout_key_per_passage():
  config = VMAP.replace(dropout_rate=0.3)
  model = EncoderDecoderModel(config)
  params = model.init_params(3)
  one = np.random.default_rng(4).integers(2, 96, size=(B, 1, L)).astype(np.int32)
  tokens = jnp.asarray(np.repeat(one, P, axis=1))  # P identical passages
  net = model.network(params)
  key = jax.random.PRNGKey(7)
  encode = jax.jit(lambda t, k: fid.encode_passages(net, t, dropout_rng=k).hidden)
  hidden = np.asarray(encode(tokens, key)).reshape(B, P, L, -1)  # [B, P, L, D]
  # deterministic in the key; another key, other masks
  np.testing.assert_array_equal(np.asarray(encode(tokens, key)).reshape(B, P, L, -1),
                                hidden)
  assert not np.allclose(np.asarray(encode(tokens, jax.random.PRNGKey(8))),
                         hidden.reshape(B, P * L, -1))
  # identical passages, different masks: each passage has its own key ...
  for i in range(1, P):
    assert not np.allclose(hidden[:, i], hidden[:, 0])
  # ... split(key, P)[i], the plain encoder's on that passage alone
  keys = jax.random.split(key, P)
  alone_fn = jax.jit(lambda t, k: net.encode(t, dropout_rng=k).hidden)
  for i in range(P):
    alone = alone_fn(tokens[:, i], keys[i])
    np.testing.assert_allclose(hidden[:, i], np.asarray(alone), rtol=1e-6,
                               atol=1e-6)
  # without a key: no dropout, identical passages encode identically
  plain = np.asarray(encode(tokens, None)).reshape(B, P, L, -1)
  np.testing.assert_allclose(plain[:, 1], plain[:, 0], rtol=1e-6, atol=1e-6)
