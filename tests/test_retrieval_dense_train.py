"""DPR-style dual-encoder training: data, the in-batch loss, learning, gin.

The learning test uses the demo's generated world (jaxfid.fid.demo_world):
each question asks for one relation of a made-up entity; its positive is the
gold document, its hard negatives the entity's other documents (what BM25
returns for the name). A tiny encoder trained from scratch must rank the gold
document first among all test documents far more often than at random
initialisation.
"""
import json
import os
import signal

import gin
import jax
import numpy as np
import optax
import pytest

import fault_tools
from hf_reference import make_tiny_hf_checkpoint
from jaxfid.cli import main
from jaxfid.commands import gin_flags
from jaxfid.core.errors import InputError
from jaxfid.fid.demo_world import make_demo_data
from jaxfid.t5.config import T5Config, preset
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.data import (
    PairBatcher, parse_example, read_pair_examples)
from jaxfid.dual_encoder.model import (
    DualEncoder, DualEncoderConfig, Embedder, passage_text)
from jaxfid.dual_encoder.step import contrastive_loss, make_contrastive_step
from jaxfid.dual_encoder.task import (
    DualEncoderTask, DualEncoderTrainConfig, initial_dual_encoder_params)
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.training import launch, loop
from jaxfid.training import state as state_lib
from jaxfid.training.task import OptimizerSettings, Settings, train_state

TINY = preset("tiny", dropout_rate=0.0)


def _fid_records(docs, questions):
  by_entity, by_id = {}, {}
  for doc in docs:
    by_entity.setdefault(doc.title, []).append(doc)
    by_id[doc.id] = doc
  records = []
  for q in questions:
    gold = by_id[q["gold_id"]]
    others = [d for d in by_entity[gold.title] if d.id != gold.id][:3]
    ctxs = [{"title": d.title, "text": d.text, "has_answer": False}
            for d in others[:1]]
    ctxs.append({"title": gold.title, "text": gold.text, "has_answer": True})
    ctxs += [{"title": d.title, "text": d.text, "has_answer": False}
             for d in others[1:]]
    records.append({"question": q["question"], "answers": q["answers"],
                    "ctxs": ctxs})
  return records


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  d = tmp_path_factory.mktemp("dual")
  data = make_demo_data(num_train_entities=40, num_test_entities=8, seed=0)
  train = d / "train.json"
  train.write_text(json.dumps(_fid_records(data["train_docs"],
                                           data["train_questions"])))
  test = d / "test.jsonl"
  test.write_text("".join(json.dumps(r) + "\n" for r in _fid_records(
      data["test_docs"], data["test_questions"])))
  return {"dir": d, "train": train, "test": test, "data": data}


def test_reading_fid_and_dpr_examples(tmp_path):
  fid = {"question": "who?", "answers": ["Ada"],
         "ctxs": [{"title": "a", "text": "nobody here"},
                  {"title": "b", "text": "it was Ada Lovelace"},
                  {"title": "c", "text": "someone else", "has_answer": False}]}
  ex = parse_example("f", 1, fid)
  assert ex.positive == ("b", "it was Ada Lovelace")
  assert ex.hard_negatives == (("a", "nobody here"), ("c", "someone else"))
  no_hit = parse_example("f", 1, dict(fid, answers=["Zed"]))
  assert no_hit.positive == ("a", "nobody here")
  assert len(no_hit.hard_negatives) == 2
  dpr = {"question": "q", "positive_ctxs": [{"title": "p", "text": "pos"}],
         "negative_ctxs": [{"title": "n", "text": "neg"}],
         "hard_negative_ctxs": []}
  assert parse_example("f", 1, dpr).hard_negatives == (("n", "neg"),)
  assert parse_example("f", 1, dict(dpr, positive_ctxs=[])) is None
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(fid) + "\n" + json.dumps({"ctxs": []}) + "\n")
  with pytest.raises(InputError, match=":2: missing 'question'"):
    read_pair_examples(path)


def test_batches_and_in_batch_loss(world):
  examples = read_pair_examples(world["train"])
  tokenizer = load_tokenizer()
  batcher = PairBatcher(examples, tokenizer, batch_size=4, hard_negatives=2,
                        query_maxlength=12, passage_maxlength=16, seed=3)
  batch = batcher.batch(5)
  assert batch["query_tokens"].shape == (4, 12)
  assert batch["passage_tokens"].shape == (12, 16)
  assert batch["passage_mask"].all()
  np.testing.assert_array_equal(batcher.batch(5)["passage_tokens"],
                                batch["passage_tokens"])
  # a process builds only its rows: questions 1..2 and their 2*3 passages
  part = batcher.batch(5, slice(1, 3))
  np.testing.assert_array_equal(part["query_tokens"],
                                batch["query_tokens"][1:3])
  np.testing.assert_array_equal(part["passage_tokens"],
                                batch["passage_tokens"][3:9])
  np.testing.assert_array_equal(part["passage_mask"],
                                batch["passage_mask"][3:9])
  first = examples[int(batcher.indices(5)[0])]
  want = tokenizer.encode(passage_text(*first.positive))
  assert batch["passage_tokens"][0, :len(want)].tolist() == want
  lonely = PairBatcher([e.__class__(e.question, e.positive, ())
                        for e in examples], tokenizer, batch_size=4,
                       hard_negatives=1, query_maxlength=12,
                       passage_maxlength=16)
  lonely_batch = lonely.batch(0)
  assert lonely_batch["passage_mask"].tolist() == [True, False] * 4
  # the loss is the cross-entropy over every passage of the batch
  encoder = DualEncoder(TINY.replace(num_layers=1),
                        DualEncoderConfig(normalize=True))
  params = encoder.init_params(0)
  loss, metrics = jax.jit(lambda p, b: contrastive_loss(
      encoder, p, b, temperature=0.5))(params, batch)
  embed = jax.jit(encoder.embed, static_argnames="tower")
  q = embed(params, batch["query_tokens"], tower="query")
  p = embed(params, batch["passage_tokens"])
  logits = np.asarray(q @ p.T) / 0.5
  logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  np.testing.assert_allclose(loss, -logp[np.arange(4), [0, 3, 6, 9]].mean(),
                             rtol=1e-5)
  assert 0 <= metrics["accuracy"] <= 1 and metrics["mean_rank"] >= 1


def _top1(encoder, params, tokenizer, data) -> float:
  embedder = Embedder(encoder, params, tokenizer, batch_size=64)
  docs = data["test_docs"]
  p = embedder.embed([passage_text(d.title, d.text) for d in docs],
                     max_length=24)
  q = embedder.embed([x["question"] for x in data["test_questions"]], "query",
                     max_length=16)
  best = np.argmax(q @ p.T, axis=1)
  gold = {d.id: i for i, d in enumerate(docs)}
  return float(np.mean([best[k] == gold[x["gold_id"]]
                        for k, x in enumerate(data["test_questions"])]))


def test_training_learns_and_writes_a_model_dir(world, tmp_path):
  model_dir = tmp_path / "model"
  # two data-parallel devices, two microbatches (GradCache)
  task = DualEncoderTask(
      model_config=TINY,
      training=DualEncoderTrainConfig(train_data=str(world["train"]),
                                      eval_data=str(world["test"])),
      encoder=DualEncoderConfig(query_maxlength=16, passage_maxlength=24))
  result = loop.train(
      task=task,
      settings=Settings(model_dir=str(model_dir), train_steps=30,
                        batch_size=16, accumulation_steps=2, eval_every=30,
                        log_every=15, checkpoint_every=30, mesh="data=2",
                        progress=False),
      optimizer=OptimizerSettings(learning_rate=1e-3, optimizer="adamw",
                                  schedule="constant"))
  assert result["step"] == 30 and result["best"]
  lines = [json.loads(x) for x in
           (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert [x["step"] for x in lines if "loss" in x] == [15, 30]
  config = json.loads((model_dir / "jaxfid_config.json").read_text())
  assert config["method"] == "dual_encoder"
  assert config["model"]["num_decoder_layers"] == 0
  loaded = load_dual_encoder(model_dir)
  assert loaded.kind == "dual_encoder"
  tokenizer = loaded.tokenizer
  untrained = DualEncoder(TINY, DualEncoderConfig())
  before = _top1(untrained, untrained.init_params(0), tokenizer,
                 world["data"])
  after = _top1(loaded.encoder, loaded.params, tokenizer, world["data"])
  print(f"test top-1: {before:.3f} untrained, {after:.3f} trained")
  assert after > 0.6 and after > before + 0.3, (before, after)
  assert result["eval_top1"] > 0.6
  # the encoder also loads as a plain jaxfid model (ReFusion reads it so)
  from jaxfid.checkpoints.load import load_checkpoint
  model, params, _ = load_checkpoint(str(model_dir))
  np.testing.assert_allclose(params["encoder"]["encoder_norm"]["scale"],
                             loaded.params["encoder"]["encoder_norm"]["scale"])


def test_gin_file_trains_one_step_from_a_hf_encoder(world, tmp_path):
  # dual_encoder_tiny.gin includes dual_encoder_base.gin: both parse
  hf = make_tiny_hf_checkpoint(tmp_path / "hf", vocab_size=32128, d_model=16,
                               d_kv=4, d_ff=32, num_heads=2, num_layers=1,
                               num_decoder_layers=1)
  shrink = ["config.T5Config.d_model = 16", "config.T5Config.d_kv = 4",
            "config.T5Config.d_ff = 32", "config.T5Config.num_heads = 2",
            "config.T5Config.num_layers = 1"]
  bindings = shrink + [
      f"MODEL_DIR = '{tmp_path / 'm'}'", f"TRAIN_DATA = '{world['train']}'",
      "TRAIN_STEPS = 1", "BATCH_SIZE = 8", "QUERY_MAXLENGTH = 8",
      "PASSAGE_MAXLENGTH = 12", "DTYPE = 'float32'", "REMAT = 'none'",
      "MESH = 'data=2'", f"INIT_CHECKPOINT = '{hf}'",
      "loop.train.progress = False"]
  gin_flags.parse_gin(["gin/retrieval/dual_encoder_tiny.gin"], bindings)
  try:
    result = gin.get_configurable(launch.run)()
  finally:
    gin.clear_config()
  assert result["step"] == 1 and result["loss"] > 0
  assert (tmp_path / "m" / "checkpoints" / "1").is_dir()
  start = load_dual_encoder(hf).params["encoder"]["encoder_norm"]["scale"]
  trained = load_dual_encoder(tmp_path / "m").params
  np.testing.assert_allclose(trained["encoder"]["encoder_norm"]["scale"],
                             start, atol=2e-3)  # one step of lr 1e-3
  other = DualEncoder(TINY, DualEncoderConfig())
  with pytest.raises(InputError, match="differs from the run's in d_model"):
    initial_dual_encoder_params(str(hf), other)


SMALL = T5Config(vocab_size=96, d_model=16, d_kv=4, d_ff=32, num_heads=2,
                 num_layers=1, num_decoder_layers=1,
                 feed_forward_proj="gated-gelu", dropout_rate=0.0,
                 dtype="float32", remat="none")


def _pair_batch(b=8, h=1, lq=6, lp=9, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.integers(2, SMALL.vocab_size, size=(b, lq)).astype(np.int32)
  p = rng.integers(2, SMALL.vocab_size, size=(b * (1 + h), lp)).astype(np.int32)
  q[:, -2:] = 0        # some padding
  p[::3, -3:] = 0
  mask = np.ones(b * (1 + h), bool)
  mask[3] = False      # a missing hard negative
  p[3] = 0
  return {"query_tokens": q, "passage_tokens": p, "passage_mask": mask}


def _one_step(encoder, mesh_spec, accumulation_steps, batch):
  """(metrics, updated params) of one SGD(lr=1) step, placed as the loop does."""
  mesh = state_lib.checked_mesh(mesh_spec, 8, accumulation_steps)
  place = state_lib.placement(mesh, encoder.param_axes())
  tx = optax.sgd(1.0)
  make_state = lambda p, s: train_state(p, s, opt_state=tx.init(p))
  abstract = jax.eval_shape(make_state, encoder.abstract_params(), 0)
  shardings = place.state(abstract, encoder.abstract_params())
  step = make_contrastive_step(encoder, tx, seed=0, temperature=0.5,
                               accumulation_steps=accumulation_steps)
  with jax.set_mesh(mesh):
    params = jax.device_put(encoder.init_params(0), place.params)
    state = state_lib.fresh_state(make_state, params, 0, shardings)
    new, metrics = jax.jit(step, in_shardings=(shardings, place.batch),
                           out_shardings=(shardings, place.replicated))(
                               state, place.global_batch(batch, slice(0, 8), 8))
  return jax.device_get(metrics), jax.device_get(new["params"])


@pytest.mark.parametrize("mesh_spec", [
    pytest.param("data=1", marks=pytest.mark.slow),  # data=2 keeps it fast
    "data=2"])
def test_accumulation_keeps_whole_batch_negatives_and_exact_gradients(
    mesh_spec):
  # Separate towers and a projection: every parameter gets a gradient.
  encoder = DualEncoder(SMALL, DualEncoderConfig(
      shared=False, projection_dim=8, normalize=True))
  batch = _pair_batch()
  want_metrics, want = _one_step(encoder, "data=1", 1, batch)
  before = encoder.init_params(0)
  moved = jax.tree_util.tree_leaves_with_path(jax.tree.map(
      lambda a, b: float(np.abs(a - b).max()), want, before))
  # every used parameter (not the decoder stub) moved: the check has teeth
  used = [v for path, v in moved if "decoder" not in jax.tree_util.keystr(path)]
  assert len(used) > 10 and min(used) > 0
  for a in (2, 4):
    metrics, params = _one_step(encoder, mesh_spec, a, batch)
    for k in ("loss", "accuracy", "mean_rank", "grad_norm"):
      np.testing.assert_allclose(metrics[k], want_metrics[k], rtol=1e-5,
                                 atol=1e-6, err_msg=k)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5),
                 params, want)
  # Negatives drawn only from within each microbatch would give another loss.
  half = {k: v[:len(v) // 2] for k, v in batch.items()}
  local, _ = contrastive_loss(encoder, before, half, temperature=0.5)
  assert abs(float(local) - float(want_metrics["loss"])) > 1e-3


# ---- the command line: resume, SIGTERM, accumulation, a data=2 mesh --------

STEPS = 30


def _cli_args(model_dir, world, steps, *extra):
  return ["train", "--gin_file=gin/retrieval/dual_encoder_tiny.gin",
          f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.TRAIN_DATA='{world['train']}'",
          f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=8",
          "--gin.QUERY_MAXLENGTH=16", "--gin.PASSAGE_MAXLENGTH=24",
          "--gin.LOG_EVERY=1", "--gin.CHECKPOINT_EVERY=100",
          "--gin.EVAL_EVERY=100", "--gin.MESH='data=1'", *extra]


def _losses(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  return {m["step"]: m["loss"] for m in lines if "loss" in m}


@pytest.fixture(scope="module")
def uninterrupted(world, tmp_path_factory):
  """A CLI run with dropout, evaluated at its end."""
  model_dir = tmp_path_factory.mktemp("dual_cli") / "whole"
  assert main(_cli_args(model_dir, world, STEPS, "--gin.DROPOUT_RATE=0.1",
                        f"--gin.EVAL_DATA='{world['test']}'",
                        "--gin.EVAL_MAX_EXAMPLES=16")) == 0
  return model_dir


def test_cli_run_logs_the_metrics_and_keeps_the_best(uninterrupted):
  lines = [json.loads(x) for x in
           (uninterrupted / "metrics.jsonl").read_text().splitlines()]
  train = [x for x in lines if "loss" in x]
  assert [x["step"] for x in train] == list(range(1, STEPS + 1))
  assert {"loss", "accuracy", "mean_rank", "grad_norm", "learning_rate",
          "questions_per_sec"} <= set(train[0])
  evals = [x for x in lines if "eval_top1" in x]
  assert [x["step"] for x in evals] == [STEPS]
  assert evals[0]["eval_examples"] == 16 and "eval_top5" in evals[0]
  assert (uninterrupted / "best").is_dir()
  assert (uninterrupted / "spiece.model").is_file()
  config = json.loads((uninterrupted / "jaxfid_config.json").read_text())
  assert config["method"] == "dual_encoder"
  assert config["dual_encoder"]["passage_maxlength"] == 24
  assert config["hard_negatives"] == 1 and config["temperature"] == 1.0


@pytest.mark.slow
def test_sigterm_saves_and_a_rerun_resumes_step_for_step(world, uninterrupted,
                                                         tmp_path):
  model_dir = tmp_path / "cut"
  args = _cli_args(model_dir, world, STEPS, "--gin.DROPOUT_RATE=0.1",
                   f"--gin.EVAL_DATA='{world['test']}'",
                   "--gin.EVAL_MAX_EXAMPLES=16")
  # the signal lands once step 1 is done, whatever the host's speed
  proc = fault_tools.hold_at(
      "jaxfid.training.loop:StepLoop.finished_step", "after", 1, args,
      tmp_path / "stderr.log", until_signal=True)
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=300)
  err = (tmp_path / "stderr.log").read_text(errors="replace")
  assert proc.returncode == 0, err[-2000:]
  assert "SIGTERM" in err
  saved = [int(s) for s in os.listdir(model_dir / "checkpoints")
           if s.isdigit()]
  assert saved and max(saved) < STEPS
  assert main(args) == 0
  want, got = _losses(uninterrupted), _losses(model_dir)
  assert sorted(got) == list(range(1, STEPS + 1))
  for step in want:
    assert abs(got[step] - want[step]) <= 1e-5 * abs(want[step]), step


def test_accumulation_on_a_data_parallel_mesh_matches_one_device(world,
                                                                 tmp_path):
  # Without dropout: microbatches draw their own dropout masks.
  one, two = tmp_path / "one", tmp_path / "two"
  assert main(_cli_args(one, world, 2)) == 0
  assert main(_cli_args(two, world, 2, "--gin.ACCUMULATION_STEPS=2",
                        "--gin.MESH='data=2'")) == 0
  want, got = _losses(one), _losses(two)
  assert sorted(got) == [1, 2]
  for step in want:
    assert abs(got[step] - want[step]) <= 1e-4 * abs(want[step]), step
  # ... and on a mesh that does not split the batch: one line, exit 2
  rc = main(_cli_args(tmp_path / "bad", world, 2, "--gin.ACCUMULATION_STEPS=3"))
  assert rc == 2 and not (tmp_path / "bad").exists()
