"""ReAtt training: the gin contract end to end, iterative refresh, resume, predict, configs."""
from __future__ import annotations

import json
import os

import gin
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.cli import main
from jaxfid.commands import gin_flags
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader import examples as fid_format
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader import predict as predict_lib
from jaxfid.reatt import model as reatt
from jaxfid.reatt import task as reatt_task
from jaxfid.reatt import token_index
from jaxfid.reatt.batches import ReAttBatcher
from jaxfid.reatt.checkpoint import load_reatt
from jaxfid.reatt.refresh import phase_boundaries, refresh_close_documents
from jaxfid.training import optim
from reatt_world import make_world, tiny_model, write_corpus, write_examples


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("reatt_train")
  docs, examples = make_world(num_keys=24, n_context=3)
  write_corpus(d / "corpus.jsonl", docs)
  write_examples(d / "train.json", examples)
  write_examples(d / "dev.json", examples[:4])
  return d


def _args(model_dir, data, steps):
  return ["train", "--gin_file=gin/reatt/tiny.gin",
          f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.TRAIN_DATA='{data / 'train.json'}'",
          f"--gin.EVAL_DATA='{data / 'dev.json'}'", f"--gin.TRAIN_STEPS={steps}",
          "--gin.BATCH_SIZE=4", "--gin.N_CONTEXT=3", "--gin.TEXT_MAXLENGTH=16",
          "--gin.ANSWER_MAXLENGTH=4", "--gin.EVAL_EVERY=100",
          "--gin.CHECKPOINT_EVERY=2", "--gin.LOG_EVERY=1", "--gin.MESH='data=2'",
          "--gin.RETRIEVAL_WARMUP_STEPS=1", "--gin.ITERATION_STEPS=1",
          f"--gin.RETRIEVAL_CORPUS='{data / 'corpus.jsonl'}'",
          "--gin.config.T5Config.num_decoder_layers=1",
          "--gin.config.T5Config.d_model=32", "--gin.config.T5Config.d_ff=64",
          "--gin.loop.train.progress=False"]


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("reatt_run") / "out"
  assert main(_args(model_dir, data, 3)) == 0
  return model_dir


def _metrics(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_train_logs_kl_and_retrieval_accuracy(trained):
  steps = [m for m in _metrics(trained) if "loss" in m]
  assert [m["step"] for m in steps] == [1, 2, 3]
  for m in steps:
    assert m["kl_loss"] > 0 and 0 <= m["retrieval_accuracy"] <= 1
    assert 0 <= m["retrieval_own_accuracy"] <= 1 and m["head_max_prob"] > 0
  assert [m["kl_weight"] for m in steps] == [0.0, 8.0, 8.0]  # warm-up: QA only
  assert steps[0]["loss"] == pytest.approx(steps[0]["qa_loss"])
  assert steps[1]["loss"] > steps[1]["qa_loss"]
  config = json.load(open(trained / "jaxfid_config.json"))
  assert config["method"] == "reatt" and config["reatt"]["bi_encoder_layers"] == 1
  assert any("eval_em" in m for m in _metrics(trained))


def test_iterative_refresh_replaces_close_documents(trained, data):
  original = {e.question: [p.id for p in e.ctxs]
              for e in fid_format.read_fid_examples(data / "train.json")}
  refreshed = fid_format.read_fid_examples(
      trained / "iterations" / "train_step2.jsonl")
  assert len(refreshed) == len(original)
  assert all(len(e.ctxs) == 3 for e in refreshed)
  assert any([p.id for p in e.ctxs] != original[e.question] for e in refreshed)
  assert (trained / "index" / "meta.json").exists()
  assert not (trained / "iterations" / "train_step3.jsonl").exists()
  model, _, _ = load_reatt(str(trained), which="latest")
  assert model.reatt.separator_ids == tuple(Tokenizer().encode("title:"))


def test_refresh_uses_the_current_model(data, tmp_path):
  docs, examples = make_world(num_keys=24, n_context=3)
  model = tiny_model(bi_encoder_layers=1)
  params = model.init_params(0)
  new = refresh_close_documents(
      model, params, Tokenizer(), examples[:5], str(data / "corpus.jsonl"),
      str(tmp_path / "index"), n_context=3, doc_maxlength=16,
      query_maxlength=16, token_top_k=10000)
  searcher = token_index.TokenSearcher(
      tmp_path / "index", json.load(open(tmp_path / "index" / "meta.json")))
  hits = searcher.search([e.question for e in examples[:5]], 3,
                         token_top_k=10000)
  for e, h in zip(new, hits):
    assert [p.id for p in e.ctxs] == searcher.store.ids([r for r, _ in h])
    assert [p.score for p in e.ctxs] == pytest.approx([s for _, s in h])
  # The batches are built from the refreshed documents.
  batcher = ReAttBatcher(
      new, Tokenizer(), batch_size=5, n_context=3, text_maxlength=16,
      target_maxlength=4, kl_weight=8.0, retrieval_warmup_steps=0)
  batch = batcher.batch(0)
  batcher.close()
  rows = batcher.fid.indices(0)
  want, _ = fid_inputs.encode_examples(Tokenizer(), [new[i] for i in rows], 3, 16)
  np.testing.assert_array_equal(batch["encoder_input_tokens"], want)
  np.testing.assert_allclose(batch["kl_weight"], 8.0 / 5)


def test_resume_continues_and_refreshes_where_uninterrupted_would(trained, data):
  assert main(_args(trained, data, 4)) == 0
  steps = [m["step"] for m in _metrics(trained) if "loss" in m]
  assert steps == [1, 2, 3, 4]
  assert (trained / "iterations" / "train_step3.jsonl").exists()


def test_predict_on_a_reatt_model_dir(trained, data):
  model, params, spiece = load_reatt(str(trained))
  examples = fid_format.read_fid_examples(data / "dev.json")
  preds = predict_lib.generate(model, params, Tokenizer(spiece), examples,
                               n_context=3, text_maxlength=16,
                               answer_maxlength=4, batch_size=2,
                               progress=False)
  assert len(preds) == 4 and all(isinstance(p, str) for p in preds)


def test_bad_bi_encoder_layers_is_one_line_error(data, tmp_path, capsys):
  args = _args(tmp_path / "bad", data, 1) + ["--gin.BI_ENCODER_LAYERS=2"]
  assert main(args) == 2
  assert "BI_ENCODER_LAYERS" in capsys.readouterr().err


def test_large_gin_has_the_paper_recipe():
  gin_flags.parse_gin(["gin/reatt/large.gin"],
                      ["MODEL_DIR = 'x'", "TRAIN_DATA = 'x'"])
  try:
    values = {n.lower(): gin_flags.macro_value(n) for n in (
        "BI_ENCODER_LAYERS", "KL_WEIGHT", "HEAD_TEMPERATURE", "N_CONTEXT",
        "BATCH_SIZE", "LEARNING_RATE", "OPTIMIZER", "SCHEDULE",
        "WARMUP_FRACTION", "RETRIEVAL_WARMUP_STEPS", "ITERATION_STEPS",
        "TRAIN_STEPS", "IN_BATCH_NEGATIVES", "RESTART_SCHEDULE",
        "ACCUMULATION_STEPS", "PASSAGE_EOS")}
    method = gin.query_parameter("%METHOD").scoped_configurable_fn()
    cfg = method.reader.model_config
    lengths = method.reader.lengths
  finally:
    gin.clear_config()
  # the original's answer_maxlength=50: targets cut at 50 tokens, and
  # generate(max_length=50) (transformers 4.15) counts the decoder start
  # token, so at most 49 new tokens
  assert (lengths.target_maxlength, lengths.decode_maxlength) == (50, 49)
  assert values == {
      "bi_encoder_layers": 12, "kl_weight": 8.0, "head_temperature": 0.001,
      "n_context": 100, "batch_size": 64, "learning_rate": 5e-5,
      "optimizer": "adamw", "schedule": "linear", "warmup_fraction": 0.1,
      "retrieval_warmup_steps": 3000, "iteration_steps": 8000,
      "train_steps": 35000, "in_batch_negatives": True,
      "restart_schedule": True, "accumulation_steps": 4, "passage_eos": True}
  assert (cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.feed_forward_proj) == (
      1024, 24, 16, "gated-gelu")
  assert phase_boundaries(35000, 3000, 8000) == [11000, 19000, 27000]
  lr = optim.learning_rate_schedule(
      5e-5, schedule="linear", warmup_steps=0, warmup_fraction=0.1,
      total_steps=35000, restarts=[3000, 11000, 19000, 27000])
  assert float(lr(0)) == 0.0 and float(lr(300)) == pytest.approx(5e-5)
  assert float(lr(3000)) == 0.0 and float(lr(3800)) == pytest.approx(5e-5)
  assert float(lr(10999)) < 1e-7


def _save(path, fields, params):
  checkpointing.write_run_config(path, fields)
  ckpts = checkpointing.RunCheckpoints(str(path))
  ckpts.save(1, {"step": jnp.ones((), jnp.int32), "params": params})
  ckpts.close()


def test_init_checkpoint_from_a_t5_or_a_reatt_model_dir(tmp_path):
  model = tiny_model(bi_encoder_layers=1)
  params = model.init_params(3)
  t5 = reatt.t5_part(params)
  _save(tmp_path / "fid", {"method": "fid", "model": model.config.to_dict()}, t5)
  got = reatt_task.initial_reatt_params(str(tmp_path / "fid"), model)
  np.testing.assert_array_equal(got["reatt"]["head_weights"], np.zeros(4))
  np.testing.assert_array_equal(got["encoder"]["layers_0"]["mlp"]["wo"]["kernel"],
                                t5["encoder"]["layers_0"]["mlp"]["wo"]["kernel"])
  params["reatt"]["head_weights"] = jnp.array([0.0, 1.0, 0.0, 0.0])
  _save(tmp_path / "reatt", {**reatt.run_config_fields(model.reatt),
                             "model": model.config.to_dict()}, params)
  got = reatt_task.initial_reatt_params(str(tmp_path / "reatt"), model)
  np.testing.assert_array_equal(got["reatt"]["head_weights"], [0, 1, 0, 0])
  other = reatt.ReAttModel(model.config.replace(d_ff=32), model.reatt)
  with pytest.raises(InputError, match="d_ff"):
    reatt_task.initial_reatt_params(str(tmp_path / "reatt"), other)
