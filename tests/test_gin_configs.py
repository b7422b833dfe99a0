"""Every gin file parses, builds its model and trains one step on a tiny model.

Run files (gin/fid/*.gin) are parsed with tiny-model bindings and train one
step through ``launch.run``; model files (gin/models/*.gin), listed after a
run file, must switch the model to the named preset (checked on abstract
shapes) and also train one step once shrunk.
"""
from __future__ import annotations

import glob
import json
import os

import gin
import pytest

from jaxfid.commands import gin_flags
from jaxfid.t5 import config as config_lib
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.t5.network import abstract_t5, count_params
from jaxfid.training import launch

ROOT = gin_flags.SOURCE_ROOT
RUN_FILES = sorted(os.path.relpath(p, ROOT)
                   for p in glob.glob(os.path.join(ROOT, "gin", "fid", "*.gin")))
MODEL_FILES = sorted(os.path.relpath(p, ROOT)
                     for p in glob.glob(os.path.join(ROOT, "gin", "models", "*.gin")))
# 24-layer presets: tracing them takes tens of seconds each, so their
# gin-file and parameter-count checks run in the slow tier (the 6- to
# 12-layer presets check the same code in the fast tier).
LARGE = ("large", "xl", "xxl", "3b", "11b")


def _tiered(names):
  return [pytest.param(n, marks=pytest.mark.slow)
          if os.path.basename(n).removesuffix(".gin").split("_")[-1] in LARGE
          else n for n in names]


TINY = ["config.T5Config.d_model = 16", "config.T5Config.d_kv = 4",
        "config.T5Config.d_ff = 32", "config.T5Config.num_heads = 2",
        "config.T5Config.num_layers = 1", "config.T5Config.num_decoder_layers = 1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("gin_data")
  examples = [{"question": f"what is {i}?", "answers": [str(i)],
               "ctxs": [{"title": "t", "text": f"it is {i}", "score": 1.0}]}
              for i in range(4)]
  (d / "train.json").write_text(json.dumps(examples))
  return d


def _run_bindings(data, model_dir):
  return [f"MODEL_DIR = '{model_dir}'", f"TRAIN_DATA = '{data / 'train.json'}'",
          f"EVAL_DATA = '{data / 'train.json'}'", "TRAIN_STEPS = 1",
          "BATCH_SIZE = 2", "N_CONTEXT = 2", "TEXT_MAXLENGTH = 12",
          "ANSWER_MAXLENGTH = 3", "EVAL_EVERY = 1", "CHECKPOINT_EVERY = 1",
          "DTYPE = 'float32'", "INIT_CHECKPOINT = None", "MESH = 'data=2'",
          "loop.train.progress = False"]


def _train_one_step(files, bindings):
  gin_flags.parse_gin(files, bindings)
  try:
    result = gin.get_configurable(launch.run)()
  finally:
    gin.clear_config()
  assert result["step"] == 1 and result["loss"] > 0
  return result


def test_found_the_gin_files():
  assert {"gin/fid/base.gin", "gin/fid/large.gin", "gin/fid/tiny.gin",
          "gin/fid/two_phase.gin"} <= set(RUN_FILES)
  assert len(MODEL_FILES) >= 10


@pytest.mark.parametrize("run_file", RUN_FILES)
def test_run_file_trains_one_step(run_file, data, tmp_path):
  extra = ["FIRST_PHASE_N_CONTEXT = 1"] if "two_phase" in run_file else []
  _train_one_step([run_file], TINY + _run_bindings(data, tmp_path) + extra)


@pytest.mark.parametrize("model_file", _tiered(MODEL_FILES))
def test_model_file_switches_the_model(model_file):
  gin_flags.parse_gin(["gin/fid/base.gin", model_file],
                      ["MODEL_DIR = 'x'", "TRAIN_DATA = 'x'"])
  try:
    cfg = gin.query_parameter("%METHOD").scoped_configurable_fn().model_config
  finally:
    gin.clear_config()
  name = os.path.basename(model_file)[:-len(".gin")]
  want = config_lib.preset(name)
  arch = ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads", "num_layers",
          "num_decoder_layers", "feed_forward_proj", "tie_word_embeddings")
  assert {k: getattr(cfg, k) for k in arch} == {k: getattr(want, k) for k in arch}
  assert count_params(abstract_t5(cfg)) == count_params(abstract_t5(want))
  # It builds: abstract parameters with a logical axis name per dimension.
  model = EncoderDecoderModel(cfg)
  axes = model.param_axes()
  import jax
  for shape, names in zip(jax.tree.leaves(model.abstract_params()),
                          jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))):
    assert len(names) == len(shape.shape)


def test_model_file_trains_one_step_when_shrunk(data, tmp_path):
  _train_one_step(["gin/fid/tiny.gin", "gin/models/t5_small.gin"],
                  TINY + _run_bindings(data, tmp_path))


DUAL_ENCODER_FILES = sorted(
    os.path.relpath(p, ROOT) for pattern in ("dual_encoder_*.gin",
                                             "distill_*.gin")
    for p in glob.glob(os.path.join(ROOT, "gin", "retrieval", pattern)))


@pytest.mark.parametrize("run_file", [  # the base file's T5 size: slow tier
    pytest.param(f, marks=pytest.mark.slow) if f.endswith("_base.gin") else f
    for f in DUAL_ENCODER_FILES])
def test_dual_encoder_file_trains_one_step(run_file, data, tmp_path):
  # The one trainer's macros (MESH, ACCUMULATION_STEPS) reach the dual encoder.
  train = data / "train.json"
  if "distill_" in run_file:  # reader scores that differ: a KL above 0
    train = tmp_path / "scored.json"
    train.write_text(json.dumps([
        {"question": f"what is {i}?", "answers": [str(i)],
         "ctxs": [{"title": "t", "text": f"it is {i + j}", "score": -j}
                  for j in range(3)]} for i in range(4)]))
  bindings = TINY + [
      f"MODEL_DIR = '{tmp_path}'", f"TRAIN_DATA = '{train}'",
      f"EVAL_DATA = '{data / 'train.json'}'", "TRAIN_STEPS = 1",
      "BATCH_SIZE = 4", "QUERY_MAXLENGTH = 8", "PASSAGE_MAXLENGTH = 12",
      "EVAL_EVERY = 1", "DTYPE = 'float32'", "REMAT = 'none'",
      "MESH = 'data=2'", "ACCUMULATION_STEPS = 2",
      "loop.train.progress = False"]
  result = _train_one_step([run_file], bindings)
  assert "eval_top1" in result and "accuracy" in result
  config = json.loads((tmp_path / "jaxfid_config.json").read_text())
  assert config["method"] == "dual_encoder"
  assert config["model"]["d_model"] == 16


PUBLISHED = {"t5_base": 223e6, "t5_large": 738e6, "t5_1_1_xl": 2.85e9,
             "t5_small": 60.5e6, "t5_3b": 2.85e9, "t5_11b": 11.3e9}


@pytest.mark.parametrize("name", _tiered(sorted(PUBLISHED)))
def test_full_size_presets_have_published_parameter_counts(name):
  n = count_params(abstract_t5(config_lib.preset(name)))
  assert abs(n - PUBLISHED[name]) / PUBLISHED[name] < 0.01, n


@pytest.mark.slow  # ReFusion training: test_refusion_train; this gin file is validated in the fast tier (test_gin_validation)
def test_refusion_base_has_the_papers_settings_and_trains_one_step(tmp_path):
  from jaxfid.refusion.fusion import FusionConfig
  from jaxfid.refusion.model import ReFusionModel
  sst2 = os.path.join(ROOT, "tests", "data", "lmbff", "SST-2", "16-13")
  required = ["MODEL_DIR = 'x'", "TASK = 'sst-2'", f"DATA_DIR = '{sst2}'"]
  gin_flags.parse_gin(["gin/refusion/t5_base.gin"], required)
  try:
    macros = {m: gin.query_parameter(f"%{m}") for m in (
        "LEARNING_RATE", "BATCH_SIZE", "MAX_LENGTH", "TRAIN_STEPS", "TOP_K",
        "FUSION_MODULES", "SEARCH", "OPTIMIZER", "ARCH_OPTIMIZER",
        "FUSION_INIT", "MASK_SAMPLER", "FUSED_NORM", "TEMPLATES")}
    cfg = gin.query_parameter(
        "refusion_task.ReFusionTask.model_config").scoped_configurable_fn()
  finally:
    gin.clear_config()
  assert macros == {"LEARNING_RATE": 1e-5, "BATCH_SIZE": 32, "MAX_LENGTH": 128,
                    "TRAIN_STEPS": 1000, "TOP_K": 64,
                    "FUSION_MODULES": "key,value", "SEARCH": True,
                    "OPTIMIZER": "adamw", "ARCH_OPTIMIZER": "adamw",
                    "FUSION_INIT": "zeros", "MASK_SAMPLER": "soft",
                    "FUSED_NORM": "rms", "TEMPLATES": "paper"}
  assert count_params(abstract_t5(cfg)) == count_params(
      abstract_t5(config_lib.preset("t5_base")))
  # Full size, abstractly: 12 layers x (key, value), each k + k*768 + 3.
  model = ReFusionModel(cfg, FusionConfig(modules="key,value",
                                          top_k=64, db_dim=768, search=True))
  import jax
  n = sum(x.size for x in jax.tree.leaves(model.abstract_params()))
  assert n - count_params(abstract_t5(cfg)) == 24 * (64 + 64 * 768 + 3)
  # And it trains (shrunk, without retrieval: the prompt-tuning baseline).
  gin_flags.parse_gin(["gin/refusion/t5_base.gin"], TINY + required[1:] + [
      f"MODEL_DIR = '{tmp_path}'", "FUSION_MODULES = 'none'",
      "TRAIN_STEPS = 1", "BATCH_SIZE = 2", "MAX_LENGTH = 16", "DTYPE = 'float32'",
      "loop.train.progress = False", "MESH = 'data=2'"])
  try:
    result = gin.get_configurable(launch.run)()
  finally:
    gin.clear_config()
  assert result["step"] == 1 and 0.0 <= result["test_accuracy"] <= 1.0
