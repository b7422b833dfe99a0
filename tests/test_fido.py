"""FiDO's decoder (layer-sparse + multi-query cross-attention): params, decoding, gin, uptraining.

FiDO (de Jong et al. 2022) keeps cross-attention in every K-th decoder layer
only (``T5Config.cross_attention_period``) and shares one key/value head
among the query heads there (``multi_query_cross_attention``). Checked: the
parameter tree and counts, cached greedy decoding against the teacher-forced
argmax, the gin files (``gin/fid/fido_*.gin``), the dense -> FiDO
parameter conversion (``jaxfid.checkpoints.fido_uptrain``), and uptraining through
INIT_CHECKPOINT (``reader.task.initial_reader_params`` and ``jaxfid train``).
"""
from __future__ import annotations

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest


from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.fido_uptrain import fido_params_from_dense
from jaxfid.checkpoints.load import load_checkpoint
from jaxfid.cli import main
from jaxfid.commands import gin_flags
from jaxfid.core import sharding as shd
from jaxfid.core.errors import InputError
from jaxfid.reader.task import initial_reader_params
from jaxfid.t5 import config as config_lib
from jaxfid.t5 import decoding
from jaxfid.t5 import passages as fid
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel, shift_right
from jaxfid.t5.network import abstract_t5, count_params
from jaxfid.training import launch
from jaxfid.training import state as state_lib

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
  layers = _decoder_layers(EncoderDecoderModel(FIDO).abstract_params())
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
  shapes = jax.eval_shape(EncoderDecoderModel(fido).init_params)
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
  model, params = EncoderDecoderModel.create(cfg, seed=4)
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
        "%METHOD").scoped_configurable_fn().model_config
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


@pytest.mark.slow  # fido_tiny.gin also trains a step in test_gin_configs
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
      "MESH = 'data=2'", "loop.train.progress = False"]
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
  _, dense = EncoderDecoderModel.create(DENSE, seed=1)
  fido = fido_params_from_dense(dense, DENSE, FIDO)
  want = EncoderDecoderModel(FIDO).abstract_params()
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
  model, dense = EncoderDecoderModel.create(DENSE, seed=2)
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
  got = EncoderDecoderModel(FIDO).logits(fido_params, tokens, dec)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_uptrain_refuses_mismatched_configs():
  _, dense = EncoderDecoderModel.create(DENSE, seed=1)
  with pytest.raises(ValueError, match="d_model"):
    fido_params_from_dense(dense, DENSE, FIDO.replace(d_model=64))
  with pytest.raises(ValueError, match="dense_config"):
    fido_params_from_dense(dense, FIDO, FIDO)
  _, other = EncoderDecoderModel.create(DENSE.replace(d_ff=64), seed=1)
  with pytest.raises(InputError, match="shape"):
    fido_params_from_dense(other, DENSE, FIDO)


def _model_dir(path, cfg: T5Config, params) -> str:
  """A jaxfid MODEL_DIR holding ``params`` as its best checkpoint."""
  checkpointing.write_run_config(str(path), {"method": "fid",
                                             "model": cfg.to_dict()})
  ckpts = checkpointing.RunCheckpoints(str(path))
  assert ckpts.maybe_save_best(1, params, 1.0)
  ckpts.close()
  return str(path)


def _load_for_run(path: str, cfg: T5Config):
  """What the trainer does with INIT_CHECKPOINT: (params, param shardings)."""
  model = EncoderDecoderModel(cfg)
  mesh = shd.parse_mesh("data=2,fsdp=2,model=2")
  place = state_lib.placement(mesh, model.param_axes())
  with jax.set_mesh(mesh):
    return (jax.device_put(initial_reader_params(path, cfg), place.params),
            place.params)


def _assert_trees_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_init_checkpoint_dense_model_dir_is_uptrained_for_a_fido_run(
    tmp_path, capsys):
  _, dense = EncoderDecoderModel.create(DENSE, seed=3)
  # Run-only fields (dropout, dtype) may differ without blocking anything.
  path = _model_dir(tmp_path / "dense", DENSE.replace(dropout_rate=0.1), dense)
  capsys.readouterr()
  got, shardings = _load_for_run(path, FIDO.replace(dropout_rate=0.1,
                                                    dtype="bfloat16"))
  _assert_trees_equal(got, fido_params_from_dense(dense, DENSE, FIDO))
  for leaf, sharding in zip(jax.tree.leaves(got), jax.tree.leaves(shardings)):
    assert leaf.sharding == sharding
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and path in err[0], err
  assert "dense T5 converted to FiDO" in err[0]
  assert "decoder layers 2, 4 of 4" in err[0] and "multi-query" in err[0]


@pytest.mark.parametrize("cfg", [FIDO, DENSE], ids=["fido", "dense"])
def test_init_checkpoint_of_the_runs_own_layout_loads_unchanged(
    cfg, tmp_path, capsys):
  _, params = EncoderDecoderModel.create(cfg, seed=5)
  path = _model_dir(tmp_path / "same", cfg, params)
  capsys.readouterr()
  got, _ = _load_for_run(path, cfg)
  _assert_trees_equal(got, params)
  assert capsys.readouterr().err == ""   # nothing was converted


@pytest.mark.parametrize("source,run,needles", [
    (DENSE.replace(d_model=48), FIDO,
     ["in d_model (checkpoint 48, run 32); list the matching gin/models"]),
    (FIDO, FIDO.replace(cross_attention_period=4),
     ["cross_attention_period (checkpoint 2, run 4)", "only a dense"]),
    (FIDO.replace(cross_attention_period=1), FIDO,
     ["cross_attention_period (checkpoint 1, run 2)", "only a dense"]),
    (FIDO, DENSE, ["multi_query_cross_attention (checkpoint True, run False)",
                   "cannot start a dense run"]),
], ids=["dense_d_model", "fido_period", "mq_only_into_lsa", "fido_into_dense"])
def test_init_checkpoint_mismatches_are_refused(source, run, needles, tmp_path,
                                                capsys):
  _, params = EncoderDecoderModel.create(source, seed=6)
  path = _model_dir(tmp_path / "other", source, params)
  with pytest.raises(InputError) as e:
    _load_for_run(path, run)
  message = str(e.value)
  assert message.startswith(f"{path}: INIT_CHECKPOINT's model differs")
  assert "\n" not in message
  for needle in needles:
    assert needle in message, message
  assert "converted" not in capsys.readouterr().err


@pytest.mark.slow  # uptraining from a MODEL_DIR runs in test_init_checkpoint_dense_model_dir_is_uptrained_for_a_fido_run
def test_jaxfid_train_uptrains_a_dense_hf_checkpoint(tmp_path, capsys):
  """``jaxfid train`` with fido_tiny.gin (shrunk) and a dense HF INIT_CHECKPOINT."""
  from hf_reference import make_tiny_hf_checkpoint
  sizes = dict(d_model=16, d_kv=4, d_ff=32, num_heads=2, num_layers=1,
               num_decoder_layers=2)
  hf_dir = str(make_tiny_hf_checkpoint(tmp_path / "hf", version="1.1",
                                       vocab_size=32128, **sizes))
  examples = [{"question": f"what is {i}?", "answers": [str(i)],
               "ctxs": [{"title": "t", "text": f"it is {i}", "score": 1.0}]}
              for i in range(4)]
  data = tmp_path / "train.json"
  data.write_text(json.dumps(examples))
  model_dir = tmp_path / "model"

  def train_args(init, run_dir):
    return ["train", "--gin_file=gin/fid/fido_tiny.gin",
            *[f"--gin.config.T5Config.{k}={v}" for k, v in sizes.items()],
            f"--gin.MODEL_DIR='{run_dir}'", f"--gin.TRAIN_DATA='{data}'",
            f"--gin.INIT_CHECKPOINT='{init}'", "--gin.TRAIN_STEPS=2",
            "--gin.BATCH_SIZE=2", "--gin.N_CONTEXT=1",
            "--gin.TEXT_MAXLENGTH=12", "--gin.ANSWER_MAXLENGTH=3",
            "--gin.LEARNING_RATE=0.0", "--gin.LOG_EVERY=1",
            "--gin.MESH='data=2'", "--gin.loop.train.progress=False"]

  capsys.readouterr()
  assert main(train_args(hf_dir, model_dir)) == 0
  err = capsys.readouterr().err
  assert f"INIT_CHECKPOINT {hf_dir}: dense T5 converted to FiDO" in err, err
  with open(model_dir / "metrics.jsonl") as f:
    losses = [m["loss"] for m in map(json.loads, f) if "loss" in m]
  assert len(losses) == 2 and all(np.isfinite(l) and l > 0 for l in losses)
  # Learning rate 0: the run's checkpoint is exactly the converted dense model.
  dense_model, dense, _ = load_checkpoint(hf_dir)
  model, params, _ = load_checkpoint(str(model_dir))
  assert model.config.cross_attention_period == 2
  assert model.config.multi_query_cross_attention
  want = fido_params_from_dense(dense, dense_model.config, model.config)
  _assert_trees_equal(params, want)
  # A dense checkpoint of another width is still refused, in one line.
  other = make_tiny_hf_checkpoint(tmp_path / "hf_wide", version="1.1",
                                  vocab_size=32128, **{**sizes, "d_model": 32})
  capsys.readouterr()
  rc = main(train_args(other, tmp_path / "model2"))
  err = capsys.readouterr().err.strip()
  assert rc == 2 and len(err.splitlines()) == 1, err
  assert str(other) in err and "d_model (checkpoint 32, run 16)" in err
  assert "cross_attention_period" not in err   # that part would convert
