"""seqio as a first-class data path: `jaxfid train` from a task name, `jaxfid eval`.

A tiny trivia_qa_fid (and nq_open_fid) under a temporary $JAXFID_DATA_DIR:
a task trains on exactly the FiD-file path's batches, a mixture trains, and
`jaxfid eval` writes metrics.jsonl, predictions and TensorBoard summaries
with the exact match `jaxfid predict` gives on the same checkpoint and file.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from jaxfid.cli import main
from jaxfid.core.tokenization import EOS_ID, Tokenizer
from jaxfid.reader.batches import FidBatcher
from jaxfid.reader.checkpoint_eval import FidCheckpointEvaluator, checkpoint_step
from jaxfid.reader.config import DecodeConfig
from jaxfid.reader.examples import read_fid_examples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "red green blue paris london dog cat bread rice golf".split()
LENGTHS = ["--gin.N_CONTEXT=3", "--gin.TEXT_MAXLENGTH=56",
           "--gin.ANSWER_MAXLENGTH=6"]
MIXTURE = "test_nq_trivia_fid_mixture"


def _records(n, offset=0):
  out = []
  for i in range(offset, offset + n):
    answer = WORDS[i % len(WORDS)]
    ctxs = [{"title": f"doc {j}", "text": f"the thing {i} is "
             f"{answer if j == 0 else WORDS[(i + j) % len(WORDS)]}",
             "score": 1.0 - j / 10} for j in range(4)]
    out.append({"id": f"t{i}", "question": f"what is thing {i}?",
                "answers": [answer], "ctxs": ctxs})
  return out


def _write(path, records):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("seqio_data")
  _write(root / "trivia_qa" / "train.jsonl", _records(24))
  _write(root / "trivia_qa" / "validation.jsonl", _records(6, offset=24))
  _write(root / "nq" / "train.jsonl", _records(16, offset=40))
  _write(root / "nq" / "validation.jsonl", _records(4, offset=60))
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("JAXFID_DATA_DIR", str(root))
    yield root


def _train(model_dir, *flags, steps=40):
  return main(["train", "--gin_file=gin/fid/tiny.gin",
               f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}",
               "--gin.BATCH_SIZE=8", *LENGTHS, "--gin.EVAL_EVERY=40",
               "--gin.CHECKPOINT_EVERY=40", "--gin.LOG_EVERY=1",
               "--gin.MESH='data=1'", "--gin.EVAL_BATCH_SIZE=4", *flags])


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def task_run(data_dir, tmp_path_factory):
  """80 steps on the task: enough for a non-zero exact match."""
  out = tmp_path_factory.mktemp("seqio_task_run") / "out"
  assert _train(out, "--gin.MIXTURE_OR_TASK_NAME='trivia_qa_fid'",
                steps=80) == 0
  return out


def test_task_trains_on_the_batches_of_its_file(data_dir, task_run, tmp_path):
  out = tmp_path / "file_run"
  assert _train(out, f"--gin.TRAIN_DATA='{data_dir / 'trivia_qa/train.jsonl'}'",
                f"--gin.EVAL_DATA='{data_dir / 'trivia_qa/validation.jsonl'}'",
                "--gin.DATASET='trivia_qa'") == 0
  want, got = _lines(out / "metrics.jsonl"), _lines(task_run / "metrics.jsonl")
  losses = lambda lines: {l["step"]: l["loss"] for l in lines
                          if "loss" in l and l["step"] <= 40}
  assert sorted(losses(want)) == list(range(1, 41))
  assert losses(got) == losses(want)
  evals = lambda lines: [(l["step"], l["eval_em"], l["eval_examples"])
                         for l in lines if "eval_em" in l and l["step"] <= 40]
  assert evals(got) == evals(want) and evals(got)[0][::2] == (40, 6)
  config = json.loads((task_run / "jaxfid_config.json").read_text())
  assert config["method"] == "fid" and config["n_context"] == 3


def test_mixture_trains(data_dir, tmp_path):
  import tasks  # noqa: F401  (registers the tasks the mixture names)
  seqio.MixtureRegistry.remove(MIXTURE)
  seqio.MixtureRegistry.add(MIXTURE, [("nq_open_fid", 1.0),
                                      ("trivia_qa_fid", 3.0)])
  try:
    assert _train(tmp_path / "mix", f"--gin.MIXTURE_OR_TASK_NAME='{MIXTURE}'",
                  steps=2) == 0
  finally:
    seqio.MixtureRegistry.remove(MIXTURE)
  lines = _lines(tmp_path / "mix" / "metrics.jsonl")
  assert [l["step"] for l in lines if "loss" in l] == [1, 2]
  (ev,) = [l for l in lines if "eval_em" in l]
  assert ev["eval_examples"] == 4 + 6  # both validation splits


def _eval_args(checkpoint, output_dir, *flags):
  return ["eval", "--gin_file=gin/fid/tiny.gin",
          f"--gin.CHECKPOINT_PATH='{checkpoint}'",
          "--gin.MIXTURE_OR_TASK_NAME='trivia_qa_fid'",
          f"--gin.EVAL_OUTPUT_DIR='{output_dir}'", *LENGTHS, *flags]


def test_eval_writes_metrics_predictions_and_matches_predict(
    data_dir, task_run, tmp_path, capsys):
  ev = tmp_path / "ev"
  assert main(_eval_args(task_run, ev, "--gin.EVAL_SPLIT='validation'",
                         "--gin.EVAL_BATCH_SIZE=4")) == 0
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  best = json.loads((task_run / "best" / "best_metric.json").read_text())
  step = best["step"]
  assert step == checkpoint_step(str(task_run)) and step in (40, 80)
  assert checkpoint_step(str(task_run), "latest") == 80
  (record,) = _lines(ev / "metrics.jsonl")
  assert set(record) == {"task", "split", "step", "exact_match", "f1"}
  assert (record["task"], record["split"], record["step"]) == (
      "trivia_qa_fid", "validation", step)
  assert printed["metrics"]["trivia_qa_fid"]["exact_match"] == (
      record["exact_match"])
  preds = _lines(ev / f"trivia_qa_fid-{step}.jsonl")
  assert [p["id"] for p in preds] == [f"t{i}" for i in range(24, 30)]
  assert all({"question", "answers", "output", "prediction", "target"}
             <= set(p) for p in preds)
  assert any(f.startswith("events") for f in os.listdir(
      ev / "tb" / "trivia_qa_fid"))

  out = tmp_path / "pred.jsonl"
  assert main(["predict", "--checkpoint", str(task_run), "--data",
               str(data_dir / "trivia_qa" / "validation.jsonl"),
               "--n-context", "3", "--text-maxlength", "56",
               "--answer-maxlength", "6", "--output", str(out)]) == 0
  predicted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert record["exact_match"] == pytest.approx(predicted["em"], abs=1e-6)
  assert record["exact_match"] == pytest.approx(best["value"])
  assert record["exact_match"] > 0  # real answers, not a constant guess
  assert record["f1"] == pytest.approx(predicted["f1"], abs=1e-6)
  assert [p["prediction"] for p in preds] == [
      l["prediction"].strip() for l in _lines(out)]

  # a mixture's evaluation appends one line per task
  import tasks  # noqa: F401  (registers the tasks the mixture names)
  seqio.MixtureRegistry.remove(MIXTURE)
  seqio.MixtureRegistry.add(MIXTURE, [("nq_open_fid", 1.0),
                                      ("trivia_qa_fid", 3.0)])
  try:
    assert main(_eval_args(task_run, ev, "--gin.EVAL_MAX_EXAMPLES=2",
                           f"--gin.MIXTURE_OR_TASK_NAME='{MIXTURE}'")) == 0
  finally:
    seqio.MixtureRegistry.remove(MIXTURE)
  lines = _lines(ev / "metrics.jsonl")
  assert [(l["task"], l["step"]) for l in lines] == [
      ("trivia_qa_fid", step), ("nq_open_fid", step),
      ("trivia_qa_fid", step)]
  assert [p["id"] for p in _lines(ev / f"nq_open_fid-{step}.jsonl")] == [
      "t60", "t61"]
  assert _lines(ev / f"trivia_qa_fid-{step}.jsonl") == preds[:2]


def test_eval_gives_the_tasks_the_checkpoints_passage_format(
    data_dir, task_run, tmp_path, capsys, monkeypatch):
  """A checkpoint trained without passage EOS (as the original FiD readers)
  is evaluated on rows without EOS, exactly `jaxfid predict`'s."""
  run = tmp_path / "no_eos"
  shutil.copytree(task_run, run)
  config = json.loads((run / "jaxfid_config.json").read_text())
  assert config["passage_eos"] is True  # tiny.gin's
  (run / "jaxfid_config.json").write_text(json.dumps(
      {**config, "passage_eos": False}))
  seen = []
  predict = FidCheckpointEvaluator.predict

  def spy(self, indices, batch):
    seen.append(np.asarray(batch["encoder_input_tokens"]))
    return predict(self, indices, batch)
  monkeypatch.setattr(FidCheckpointEvaluator, "predict", spy)
  ev = tmp_path / "ev"
  assert main(_eval_args(run, ev)) == 0
  assert seen and not any(np.any(t == EOS_ID) for t in seen)
  (record,) = _lines(ev / "metrics.jsonl")
  preds = _lines(ev / f"trivia_qa_fid-{record['step']}.jsonl")
  out = tmp_path / "pred.jsonl"
  assert main(["predict", "--checkpoint", str(run), "--data",
               str(data_dir / "trivia_qa" / "validation.jsonl"),
               "--n-context", "3", "--text-maxlength", "56",
               "--answer-maxlength", "6", "--output", str(out)]) == 0
  predicted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert record["exact_match"] == pytest.approx(predicted["em"], abs=1e-6)
  assert [p["prediction"] for p in preds] == [
      l["prediction"].strip() for l in _lines(out)]


def test_score_is_the_target_log_likelihood(data_dir, task_run):
  evaluator = FidCheckpointEvaluator(str(task_run), {}, decode=DecodeConfig(
      n_context=3, text_maxlength=56, decode_maxlength=6))
  examples = read_fid_examples(data_dir / "trivia_qa" / "validation.jsonl")
  batcher = FidBatcher(examples, Tokenizer(), batch_size=6, n_context=3,
                       text_maxlength=56, target_maxlength=6)
  try:
    batch = batcher.batch(0)
  finally:
    batcher.close()
  scores = evaluator.score(np.arange(6), batch)
  loss, aux = evaluator.model.loss(evaluator.params,
                                   {k: jnp.asarray(v) for k, v in
                                    batch.items()})
  assert scores.shape == (6,) and np.all(scores < 0)
  assert float(scores.sum()) == pytest.approx(
      -float(loss) * float(aux["num_target_tokens"]), rel=1e-5)
  tokens = evaluator.predict(np.arange(6), batch)
  assert tokens.shape == (6, 6) and tokens.dtype == np.int32


def test_eval_of_a_t5x_checkpoint_reports_its_step(data_dir, task_run,
                                                   tmp_path):
  from jaxfid.checkpoints import write_t5x
  from jaxfid.checkpoints.load import load_checkpoint
  from jaxfid.checkpoints.names import flatten
  model, params, _ = load_checkpoint(str(task_run))
  write_t5x(tmp_path / "t5x", model.config,
            {k: np.asarray(v) for k, v in flatten(params).items()},
            step=1200)
  assert checkpoint_step(str(tmp_path / "t5x" / "checkpoint_1200")) == 1200
  assert checkpoint_step(str(tmp_path / "t5x")) == 1200
  ev = tmp_path / "ev"
  assert main(_eval_args(tmp_path / "t5x", ev)) == 0
  (record,) = _lines(ev / "metrics.jsonl")
  assert record["step"] == 1200
  # the same parameters as the MODEL_DIR's best checkpoint: the same answers
  best = json.loads((task_run / "best" / "best_metric.json").read_text())
  assert record["exact_match"] == pytest.approx(best["value"])


def test_eval_input_errors(task_run, tmp_path, capsys):
  assert main(["eval", "--gin_file=gin/fid/tiny.gin",
               f"--gin.CHECKPOINT_PATH='{task_run}'",
               f"--gin.EVAL_OUTPUT_DIR='{tmp_path}'"]) == 2
  assert "MIXTURE_OR_TASK_NAME: required" in capsys.readouterr().err
  assert main(["eval", "--gin_file=gin/fid/tiny.gin",
               "--gin.MIXTURE_OR_TASK_NAME='lmbff_sst_2_16_13'",
               f"--gin.CHECKPOINT_PATH='{task_run}'",
               f"--gin.EVAL_OUTPUT_DIR='{tmp_path}'"]) == 2
  assert "is a classification task" in capsys.readouterr().err
  assert main(_eval_args(task_run, tmp_path, "--gin.EVAL_SPLIT='test'")) == 2
  assert "no test file" in capsys.readouterr().err
  assert main(_eval_args(tmp_path / "nope", tmp_path)) == 2
  assert "no such checkpoint" in capsys.readouterr().err


def test_gin_files_and_commands_import_no_seqio():
  """Every run parses gin/evaluation.gin; only MIXTURE_OR_TASK_NAME or
  `jaxfid eval` may import seqio, TensorFlow and the tasks."""
  code = ("import sys\n"
          "from jaxfid.commands import gin_flags, seqio_tasks\n"
          "gin_flags.parse_gin(['gin/fid/tiny.gin'], [])\n"
          "assert seqio_tasks.gin_macro('MIXTURE_OR_TASK_NAME') is None\n"
          "import jaxfid.cli, jaxfid.commands.evaluate, "
          "jaxfid.commands.eval_outputs, jaxfid.refusion.checkpoint_eval\n"
          "jaxfid.cli.build_parser()\n"
          "print(' '.join(sys.modules))")
  env = dict(os.environ, PYTHONPATH=ROOT)
  modules = set(subprocess.run(
      [sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
      capture_output=True, text=True, timeout=300).stdout.split())
  assert "jaxfid.commands.seqio_eval" in modules
  for heavy in ("tensorflow", "seqio", "tasks"):
    assert heavy not in modules, heavy
