"""Multi-host runs for real: 2 processes x 2 CPU devices on 127.0.0.1 (gloo).

Each test compares a 2-process run with the 1-process 4-device run of the
same command: the same losses, evaluation on every process (process 0
writes), SIGTERM reaching one process saving the same step on both, a mesh
whose model axis spans the processes.
"""
from __future__ import annotations

import json
import os

import pytest

import multihost
import tiny_fid

# The sizes of every run here (the task: tests/tiny_fid.py).
SIZES = ("BATCH_SIZE=8", "N_CONTEXT=2", "TEXT_MAXLENGTH=16",
         "ANSWER_MAXLENGTH=3", "EVAL_EVERY=4", "CHECKPOINT_EVERY=2",
         "LOG_EVERY=1", "EVAL_BATCH_SIZE=4", "DROPOUT_RATE=0.1",
         "config.T5Config.d_model=32", "config.T5Config.d_ff=64")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("multihost_data")
  examples = tiny_fid.examples(16, passages=2)
  tiny_fid.write_json(d / "train.json", examples)
  tiny_fid.write_json(d / "dev.json", examples[:5])
  return d


def _train_argv(model_dir, data, steps, mesh="data=4", extra=()):
  return tiny_fid.train_argv(
      model_dir, data / "train.json", steps, data / "dev.json",
      SIZES + (f"MESH='{mesh}'", "loop.train.progress=False"), extra)


_records = tiny_fid.records
_losses = tiny_fid.losses


def _ok(results):
  for code, out, err in results:
    assert code == 0, err[-3000:]
  return results


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("mh_one") / "out"
  _ok(multihost.run(_train_argv(model_dir, data, 4), 1, 4))
  return model_dir


@pytest.mark.slow
def test_two_processes_train_and_evaluate_as_one(data, one_process, tmp_path):
  model_dir = tmp_path / "two"
  results = _ok(multihost.run(_train_argv(model_dir, data, 4), 2, 2))
  assert _losses(model_dir) == pytest.approx(_losses(one_process), rel=1e-5)
  evals = [r for r in _records(model_dir) if "eval_em" in r]
  want = [r for r in _records(one_process) if "eval_em" in r]
  assert [(r["step"], r["eval_em"]) for r in evals] == [
      (r["step"], r["eval_em"]) for r in want]
  assert (model_dir / "eval" / "predictions_4.jsonl").exists()
  # Process 0 prints the final record; the other process prints nothing.
  final = json.loads(results[0][1].strip().splitlines()[-1])
  assert final["step"] == 4 and "eval_em" in final
  assert not [line for line in results[1][1].splitlines()
              if line.startswith("{")]


@pytest.mark.slow
def test_sigterm_to_one_process_saves_the_same_step_on_both(
    data, one_process, tmp_path):
  model_dir = tmp_path / "term"
  argv = _train_argv(model_dir, data, 4)
  # process 1 takes SIGTERM once step 1 is done (held there until then)
  procs = multihost.start(argv, 2, 2, held=(
      1, "jaxfid.training.loop:StepLoop.finished_step", "after", 1))
  multihost.terminate_held(procs, which=1)
  results = _ok(multihost.finish(procs))
  final = json.loads(results[0][1].strip().splitlines()[-1])
  assert final.get("preempted") is True and final["step"] < 4
  saved = sorted(int(s) for s in os.listdir(model_dir / "checkpoints"))
  assert saved[-1] == final["step"]
  # The rerun resumes there and ends as the uninterrupted run.
  _ok(multihost.run(argv, 2, 2))
  assert _losses(model_dir) == pytest.approx(_losses(one_process), rel=1e-5)


@pytest.mark.slow
def test_a_model_axis_across_processes_trains(data, tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  _ok(multihost.run(_train_argv(one, data, 2, mesh="model=4"), 1, 4))
  _ok(multihost.run(_train_argv(two, data, 2, mesh="model=4"), 2, 2))
  assert _losses(two) == pytest.approx(_losses(one), rel=1e-5)
  _ok(multihost.run(_train_argv(tmp_path / "mixed", data, 2,
                                mesh="data=2,model=2"), 2, 2))


def test_bad_launch_settings_are_one_line_errors(data, tmp_path):
  argv = _train_argv(tmp_path / "bad", data, 1) + [
      "--distributed", "--coordinator-address", "127.0.0.1:1"]
  (code, _, err), = multihost.finish(multihost.start(argv, 1, 2))
  assert code == 2 and len(err.strip().splitlines()) == 1, err
  assert "--num-processes" in err
