"""FiDO's decoder (layer-sparse + multi-query cross-attention): params, decoding, gin, uptraining.

FiDO (de Jong et al. 2022) keeps cross-attention in every K-th decoder layer
only (``T5Config.cross_attention_period``) and shares one key/value head
among the query heads there (``multi_query_cross_attention``). Checked: the
parameter tree and counts, cached greedy decoding against the teacher-forced
argmax, the gin files (``gin/fid/fido_*.gin``), and the dense -> FiDO
parameter conversion (``jaxfid.models.fido_uptrain``).
"""
from __future__ import annotations

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid import decoding
from jaxfid.commands import gin_flags
from jaxfid.models import config as config_lib
from jaxfid.models import fid
from jaxfid.models.config import T5Config
from jaxfid.models.fido_uptrain import fido_params_from_dense
from jaxfid.models.loading import load_checkpoint
from jaxfid.models.model import FiDModel, shift_right
from jaxfid.models.t5 import abstract_t5, count_params
from jaxfid.training import launch

DENSE = T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_heads=4,
                 num_layers=2, num_decoder_layers=4,
                 feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                 dropout_rate=0.0)
FIDO = DENSE.replace(cross_attention_period=2, multi_query_cross_attention=True)


def _tokens(b=2, p=3, l=7, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, DENSE.vocab_size, size=(b, p, l)).astype(np.int32)
  tokens[:, :, -1] = 1
  tokens[1, 2, 4:] = 0  # a shorter passage
  return tokens


def _decoder_layers(params):
  return {k: v for k, v in params["decoder"].items() if k.startswith("layers_")}


def test_param_tree_has_cross_attention_only_every_kth_layer():
  layers = _decoder_layers(FiDModel(FIDO).abstract_params())
  assert sorted(layers) == [f"layers_{i}" for i in range(4)]
  for i in (0, 2):
    assert "encoder_decoder_attention" not in layers[f"layers_{i}"]
    assert "pre_cross_attention_layer_norm" not in layers[f"layers_{i}"]
  for i in (1, 3):
    cross = layers[f"layers_{i}"]["encoder_decoder_attention"]
    assert cross["key"]["kernel"].shape == (32, 8)     # [D, E]: one head
    assert cross["value"]["kernel"].shape == (32, 8)
    assert cross["query"]["kernel"].shape == (32, 32)  # [D, H*E]
    assert cross["out"]["kernel"].shape == (32, 32)
    # Self-attention keeps its H key/value heads.
    assert layers[f"layers_{i}"]["self_attention"]["key"]["kernel"].shape == (32, 32)


def _expected_saving(cfg: T5Config, period: int, mq: bool) -> int:
  d, inner, e = cfg.d_model, cfg.inner_dim, cfg.d_kv
  kept = sum((i + 1) % period == 0 for i in range(cfg.num_decoder_layers))
  skipped = cfg.num_decoder_layers - kept
  saving = skipped * (d + 4 * d * inner)     # layer norm + q, k, v, o
  if mq:
    saving += kept * 2 * d * (inner - e)     # k, v: [D, H*E] -> [D, E]
  return saving


@pytest.mark.parametrize("name,period,mq", [
    ("t5_base", 6, True), ("t5_base", 4, False), ("t5_small", 3, True),
    ("t5_1_1_base", 1, True)])
def test_param_count_drops_by_the_expected_amount(name, period, mq):
  dense = config_lib.preset(name)
  fido = dense.replace(cross_attention_period=period,
                       multi_query_cross_attention=mq)
  n_dense, n_fido = count_params(abstract_t5(dense)), count_params(abstract_t5(fido))
  assert n_dense - n_fido == _expected_saving(dense, period, mq)


def test_eval_shape_of_the_initialiser_agrees():
  fido = config_lib.preset("t5_small", cross_attention_period=3,
                           multi_query_cross_attention=True)
  shapes = jax.eval_shape(FiDModel(fido).init_params)
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert n == count_params(abstract_t5(fido.replace(
      cross_attention_period=1, multi_query_cross_attention=False))) - (
          _expected_saving(fido, 3, True))


def test_t5_base_fido_numbers():
  """fido_base.gin's choice on T5-base: 2 of 12 layers cross-attend, MQ."""
  dense = config_lib.preset("t5_base")
  # 10 skipped layers x (768 + 4*768*768) + 2 kept x 2*768*(768-64).
  assert _expected_saving(dense, 6, True) == 10 * (768 + 4 * 768 * 768) + 2 * 2 * 768 * 704
  fido = dense.replace(cross_attention_period=6)
  assert [i for i in range(12) if fido.has_cross_attention(i)] == [5, 11]


@pytest.mark.parametrize("cfg", [FIDO, DENSE.replace(cross_attention_period=3),
                                 DENSE.replace(multi_query_cross_attention=True)],
                         ids=["lsa2_mq", "lsa3", "mq"])
def test_cached_decoding_equals_teacher_forced_argmax(cfg):
  model, params = FiDModel.create(cfg, seed=4)
  tokens = jnp.asarray(_tokens())
  steps = 6

  @jax.jit
  def generate(params, tokens):
    net = model.network(params)
    enc = fid.encode_passages(net, tokens)
    cache = net.init_cache(enc.hidden, enc.mask, steps)
    out, _ = decoding.greedy_decode(
        lambda s: net.decode_step(s.cur_token, s.cache, s.cur_index), cache,
        batch_size=tokens.shape[0], max_decode_len=steps, eos_id=-1)
    return out

  out = np.asarray(generate(params, tokens))
  logits = model.logits(params, tokens, shift_right(jnp.asarray(out)))
  np.testing.assert_array_equal(np.asarray(jnp.argmax(logits, -1)), out)
  # The encoder output matters: other passages give other answers.
  other = np.asarray(generate(params, jnp.asarray(_tokens(seed=9))))
  assert not np.array_equal(out, other)


def _cfg_from_gin(files, bindings=()):
  gin_flags.parse_gin(files, ["MODEL_DIR = 'x'", "TRAIN_DATA = 'x'", *bindings])
  try:
    return gin.query_parameter(
        "trainer.train.model_config").scoped_configurable_fn()
  finally:
    gin.clear_config()


def test_fido_gin_files_set_the_documented_options():
  base = _cfg_from_gin(["gin/fid/fido_base.gin"])
  assert (base.cross_attention_period, base.multi_query_cross_attention) == (6, True)
  assert (base.d_model, base.num_decoder_layers) == (768, 12)
  tiny = _cfg_from_gin(["gin/fid/fido_tiny.gin"])
  assert (tiny.cross_attention_period, tiny.multi_query_cross_attention) == (2, True)
  assert (tiny.d_model, tiny.num_decoder_layers) == (64, 2)
  assert [i for i in range(2) if tiny.has_cross_attention(i)] == [1]
  swapped = _cfg_from_gin(["gin/fid/fido_base.gin", "gin/models/t5_large.gin"],
                          ["CROSS_ATTENTION_PERIOD = 4"])
  assert (swapped.d_model, swapped.cross_attention_period) == (1024, 4)


def test_fido_tiny_gin_trains_and_restores(tmp_path):
  """One step of fido_tiny.gin (shrunk); its checkpoint reloads as FiDO."""
  examples = [{"question": f"what is {i}?", "answers": [str(i)],
               "ctxs": [{"title": "t", "text": f"it is {i}", "score": 1.0}]}
              for i in range(4)]
  data = tmp_path / "train.json"
  data.write_text(json.dumps(examples))
  model_dir = tmp_path / "model"
  bindings = [
      "config.T5Config.d_model = 16", "config.T5Config.d_kv = 4",
      "config.T5Config.d_ff = 32", "config.T5Config.num_heads = 2",
      "config.T5Config.num_layers = 1", f"MODEL_DIR = '{model_dir}'",
      f"TRAIN_DATA = '{data}'", "TRAIN_STEPS = 1",
      "BATCH_SIZE = 2", "N_CONTEXT = 2", "TEXT_MAXLENGTH = 12",
      "ANSWER_MAXLENGTH = 3", "CHECKPOINT_EVERY = 1",
      "MESH = 'data=2'", "trainer.train.progress = False"]
  gin_flags.parse_gin(["gin/fid/fido_tiny.gin"], bindings)
  try:
    result = gin.get_configurable(launch.run)()
  finally:
    gin.clear_config()
  assert result["step"] == 1 and result["loss"] > 0
  model, params, _ = load_checkpoint(str(model_dir))
  assert model.config.cross_attention_period == 2
  assert model.config.multi_query_cross_attention
  layers = _decoder_layers(params)
  assert sorted(layers) == ["layers_0", "layers_1"]
  assert [k for k, v in layers.items() if "encoder_decoder_attention" in v] == ["layers_1"]
  assert layers["layers_1"]["encoder_decoder_attention"]["key"]["kernel"].shape == (16, 4)


def test_uptrain_tree_matches_the_fido_model():
  _, dense = FiDModel.create(DENSE, seed=1)
  fido = fido_params_from_dense(dense, DENSE, FIDO)
  want = FiDModel(FIDO).abstract_params()
  assert (jax.tree.structure(fido) == jax.tree.structure(want))
  for a, b in zip(jax.tree.leaves(fido), jax.tree.leaves(want)):
    assert a.shape == b.shape and a.dtype == jnp.float32
  # Multi-query kernels are the mean of the dense heads.
  k = np.asarray(dense["decoder"]["layers_1"]["encoder_decoder_attention"]["key"]["kernel"])
  np.testing.assert_allclose(
      np.asarray(fido["decoder"]["layers_1"]["encoder_decoder_attention"]["key"]["kernel"]),
      k.reshape(32, 4, 8).mean(1), rtol=1e-6)
  # Everything else is copied.
  np.testing.assert_array_equal(np.asarray(fido["encoder"]["layers_0"]["mlp"]["wo"]["kernel"]),
                                np.asarray(dense["encoder"]["layers_0"]["mlp"]["wo"]["kernel"]))


def test_uptrain_is_exact_when_heads_agree_and_dropped_layers_are_silent():
  """Where the conversion loses nothing, the FiDO model computes the same logits."""
  model, dense = FiDModel.create(DENSE, seed=2)
  dense = jax.tree.map(np.array, dense)
  for i in range(4):
    cross = dense["decoder"][f"layers_{i}"]["encoder_decoder_attention"]
    if (i + 1) % 2:   # to be dropped: make it contribute nothing
      cross["out"]["kernel"][:] = 0.0
    else:             # to be pooled: every head gets the same K and V
      for name in ("key", "value"):
        kernel = cross[name]["kernel"].reshape(32, 4, 8)
        kernel[:] = kernel[:, :1]
  fido_params = fido_params_from_dense(dense, DENSE, FIDO)
  tokens = _tokens()
  dec = shift_right(jnp.asarray(np.array([[5, 9, 3, 1], [7, 2, 1, 0]], np.int32)))
  want = model.logits(dense, tokens, dec)
  got = FiDModel(FIDO).logits(fido_params, tokens, dec)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_uptrain_refuses_mismatched_configs():
  _, dense = FiDModel.create(DENSE, seed=1)
  with pytest.raises(ValueError, match="d_model"):
    fido_params_from_dense(dense, DENSE, FIDO.replace(d_model=64))
  with pytest.raises(ValueError, match="dense_config"):
    fido_params_from_dense(dense, FIDO, FIDO)
  from jaxfid.data.errors import InputError
  _, other = FiDModel.create(DENSE.replace(d_ff=64), seed=1)
  with pytest.raises(InputError, match="shape"):
    fido_params_from_dense(other, DENSE, FIDO)
