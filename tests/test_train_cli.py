"""The FiD command line end to end on tiny data: train, resume, SIGTERM, predict, bad input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import fault_tools
import tiny_fid
from jaxfid.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The sizes of every run here (the task: tests/tiny_fid.py).
SIZES = ("BATCH_SIZE=8", "N_CONTEXT=2", "TEXT_MAXLENGTH=24",
         "ANSWER_MAXLENGTH=4", "LEARNING_RATE=1e-3", "EVAL_EVERY=3",
         "CHECKPOINT_EVERY=2", "LOG_EVERY=1", "SEED=0", "DROPOUT_RATE=0.1",
         "MESH='data=1'")


def _write_data(directory):
  examples = tiny_fid.examples(24, passages=3)
  return (tiny_fid.write_json(directory / "train.json", examples),
          tiny_fid.write_jsonl(directory / "dev.jsonl", examples[:6]))


def _train_args(model_dir, train, dev, steps, extra=()):
  return tiny_fid.train_argv(model_dir, train, steps, dev, SIZES, extra)


_metrics = tiny_fid.records
_losses = tiny_fid.losses


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  return _write_data(tmp_path_factory.mktemp("cli_data"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
  """An uninterrupted 6-step run."""
  train, dev = data
  model_dir = tmp_path_factory.mktemp("run") / "out"
  assert main(_train_args(model_dir, train, dev, 6)) == 0
  return model_dir


def test_train_writes_metrics_checkpoints_and_predictions(trained):
  metrics = _metrics(trained)
  train_lines = [m for m in metrics if "loss" in m]
  assert [m["step"] for m in train_lines] == [1, 2, 3, 4, 5, 6]
  assert all(m["loss"] > 0 for m in train_lines)
  evals = [m for m in metrics if "eval_em" in m]
  assert [m["step"] for m in evals] == [3, 6]
  assert os.listdir(os.path.join(trained, "checkpoints"))
  assert os.path.isdir(os.path.join(trained, "best"))
  preds = open(os.path.join(trained, "eval", "predictions_6.jsonl")).readlines()
  assert len(preds) == 6


def test_rerun_resumes_and_matches_uninterrupted(data, trained, tmp_path):
  train, dev = data
  model_dir = tmp_path / "out"
  assert main(_train_args(model_dir, train, dev, 4)) == 0
  # "Crash" after step 4: the same command with more steps resumes from 4.
  assert main(_train_args(model_dir, train, dev, 6)) == 0
  want, got = _losses(trained), _losses(model_dir)
  assert sorted(got) == [1, 2, 3, 4, 5, 6]
  for step in want:
    assert abs(got[step] - want[step]) <= 1e-5 * abs(want[step]), step


def test_prng_context_is_scoped_to_the_run():
  import jax

  from jaxfid.training import launch
  impl = lambda: str(jax.random.key_impl(jax.random.key(0)))  # noqa: E731
  assert launch.run(impl, use_hardware_rng=True) == "unsafe_rbg"
  assert launch.run(impl) == impl() == "threefry2x32"


@pytest.mark.slow  # exact resume is test_faults_training's; the hardware RNG runs in test_bench_cli
def test_hardware_rng_run_resumes_identically(data, trained, tmp_path):
  train, dev = data
  hw = ["--gin.USE_HARDWARE_RNG=True", "--gin.EVAL_EVERY=100"]
  whole, cut = tmp_path / "whole", tmp_path / "cut"
  assert main(_train_args(whole, train, dev, 4, extra=hw)) == 0
  assert main(_train_args(cut, train, dev, 2, extra=hw)) == 0
  assert main(_train_args(cut, train, dev, 4, extra=hw)) == 0
  want, got = _losses(whole), _losses(cut)
  assert sorted(got) == [1, 2, 3, 4]
  for step in want:
    assert abs(got[step] - want[step]) <= 1e-5 * abs(want[step]), step
  # Other keys than the default threefry run's (initialisation, dropout):
  # other losses (one step's may come close by chance).
  threefry = _losses(trained)
  differ = [s for s in want if abs(want[s] - threefry[s]) > 1e-4]
  assert len(differ) >= len(want) - 1, (want, threefry)


@pytest.mark.slow
def test_sigterm_saves_and_resumes(data, trained, tmp_path):
  train, dev = data
  model_dir = tmp_path / "out"
  args = _train_args(model_dir, train, dev, 6,
                     extra=["--gin.CHECKPOINT_EVERY=100", "--gin.EVAL_EVERY=100"])
  # the signal lands once step 1 is done, whatever the host's speed
  proc = fault_tools.hold_at(
      "jaxfid.training.loop:StepLoop.finished_step", "after", 1, args,
      tmp_path / "stderr.log", until_signal=True)
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=300)
  err = (tmp_path / "stderr.log").read_text(errors="replace")
  assert proc.returncode == 0, err[-2000:]
  assert "SIGTERM" in err
  saved = [int(s) for s in os.listdir(os.path.join(model_dir, "checkpoints"))
           if s.isdigit()]
  assert saved and max(saved) < 6
  assert main(args) == 0
  want, got = _losses(trained), _losses(model_dir)
  assert sorted(got) == [1, 2, 3, 4, 5, 6]
  for step in want:
    assert abs(got[step] - want[step]) <= 1e-5 * abs(want[step]), step


def test_predict_from_model_dir(data, trained, tmp_path, capsys):
  _, dev = data
  out = tmp_path / "pred.jsonl"
  rc = main(["predict", "--checkpoint", str(trained), "--data", str(dev),
             "--n-context", "2", "--text-maxlength", "24",
             "--answer-maxlength", "4", "--output", str(out),
             "--batch-size", "4"])
  assert rc == 0
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  lines = [json.loads(l) for l in out.read_text().splitlines()]
  assert len(lines) == 6
  questions = [json.loads(l)["question"] for l in open(dev)]
  assert [l["question"] for l in lines] == questions
  for l in lines:
    assert {"question", "prediction", "answers", "em"} <= set(l)
  assert printed["em"] == pytest.approx(sum(l["em"] for l in lines) / 6)


BAD_FILES = {
    "invalid_json": ('[{"question": "q", "answers": ["a"]},\n{oops}]', "2"),
    "no_question": ('[{"answers": ["a"], "ctxs": []}]', "record 1"),
    "passage_without_text": ('{"question": "q", "answers": ["a"], "ctxs": [{"title": "t"}]}\n', ":1"),
    "empty": ("", "empty"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_data_fails_cleanly_for_predict_and_train(kind, trained, tmp_path,
                                                      capsys):
  content, needle = BAD_FILES[kind]
  bad = tmp_path / f"{kind}.json"
  bad.write_text(content)
  out = tmp_path / "pred.jsonl"
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  commands = [
      ["predict", "--checkpoint", str(trained), "--data", str(bad),
       "--n-context", "2", "--text-maxlength", "24", "--answer-maxlength", "4",
       "--output", str(out)],
      _train_args(tmp_path / "run", bad, bad, 2),
  ]
  for args in commands:
    # One kind runs as a user would (a process: exit status, nothing on
    # stderr but the line); the others through the same main() in-process.
    if kind == "invalid_json":
      proc = subprocess.run([sys.executable, "-m", "jaxfid.cli", *args],
                            cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
      code, err = proc.returncode, proc.stderr
    else:
      code, err = main(args), capsys.readouterr().err
    assert code != 0
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert str(bad) in lines[0] and needle in lines[0], lines[0]
    assert not out.exists()
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_undecodable_bytes_name_the_line(trained, tmp_path, capsys):
  bad = tmp_path / "bad.jsonl"
  bad.write_bytes(b'{"question": "q", "answers": ["a"]}\n{"question": "\xff\xfe"}\n')
  rc = main(["predict", "--checkpoint", str(trained), "--data", str(bad),
             "--n-context", "2", "--text-maxlength", "24",
             "--answer-maxlength", "4", "--output", str(tmp_path / "p.jsonl")])
  assert rc == 2
  err = capsys.readouterr().err.strip()
  assert f"{bad}:2:" in err and len(err.splitlines()) == 1
  assert not (tmp_path / "p.jsonl").exists()


def test_init_checkpoint_starts_from_pretrained_weights(data, tmp_path, capsys):
  import numpy as np

  import jaxfid
  from hf_reference import make_tiny_hf_checkpoint
  train, dev = data
  hf_dir = make_tiny_hf_checkpoint(
      tmp_path / "hf", version="1.1", vocab_size=32128, d_model=64, d_kv=16,
      num_heads=4, d_ff=128, num_layers=2, num_decoder_layers=2)
  model_dir = tmp_path / "out"
  args = _train_args(model_dir, train, dev, 1,
                     extra=[f"--gin.INIT_CHECKPOINT='{hf_dir}'",
                            "--gin.LEARNING_RATE=0.0", "--gin.EVAL_EVERY=100"])
  assert main(args) == 0
  enc = np.array([[5, 6, 7, 1, 0]], np.int32)
  dec = np.array([[0, 9, 10]], np.int32)
  want = np.asarray(jaxfid.load_t5(hf_dir)(encoder_input_tokens=enc,
                                           decoder_input_tokens=dec))
  got = np.asarray(jaxfid.load_t5(model_dir)(encoder_input_tokens=enc,
                                             decoder_input_tokens=dec))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # A checkpoint of another size is refused with one line naming it.
  other = make_tiny_hf_checkpoint(tmp_path / "hf_small", version="1.1",
                                  vocab_size=32128, d_model=32)
  capsys.readouterr()
  rc = main(_train_args(tmp_path / "out2", train, dev, 1,
                        extra=[f"--gin.INIT_CHECKPOINT='{other}'"]))
  err = capsys.readouterr().err.strip()
  assert rc == 2 and str(other) in err and "d_model" in err
  assert len(err.splitlines()) == 1


def _nan_at_step_4(monkeypatch):
  """Make the 4th step report a non-finite loss (the step function's own
  guard, tested in test_fid_model, then leaves the state untouched)."""
  import jax
  import jax.numpy as jnp

  from jaxfid.training import task as task_lib
  real_make = task_lib.make_train_step

  def make_train_step(*args, **kwargs):
    real = real_make(*args, **kwargs)

    def step(state, batch):
      new, metrics = real(state, batch)
      bad = state["step"] == 3
      nan = jnp.asarray(float("nan"))
      metrics = dict(metrics, loss=jnp.where(bad, nan, metrics["loss"]),
                     finite=jnp.where(bad, 0.0, metrics["finite"]))
      return jax.tree.map(lambda n, o: jnp.where(bad, o, n), new,
                          state), metrics
    return step

  monkeypatch.setattr(task_lib, "make_train_step", make_train_step)


def test_non_finite_loss_stops_naming_the_step_without_a_checkpoint(
    data, tmp_path, monkeypatch, capsys):
  train, dev = data
  _nan_at_step_4(monkeypatch)
  model_dir = tmp_path / "nan"
  assert main(_train_args(model_dir, train, dev, 6)) == 1
  err = [l for l in capsys.readouterr().err.splitlines()
         if "error" in l]
  assert len(err) == 1 and "non-finite loss nan at step 4" in err[0]
  steps = sorted(int(s) for s in os.listdir(model_dir / "checkpoints")
                 if s.isdigit())
  assert steps == [2]                        # nothing written at or after 4
  assert max(m["step"] for m in _metrics(model_dir)) == 3


def test_non_finite_loss_skip_goes_on(data, tmp_path, monkeypatch, capsys):
  train, dev = data
  _nan_at_step_4(monkeypatch)
  model_dir = tmp_path / "skip"
  assert main(_train_args(model_dir, train, dev, 6,
                          ["--gin.ON_NAN='skip'"])) == 0
  assert "warning: non-finite loss nan at step 4" in capsys.readouterr().err
  assert max(m["step"] for m in _metrics(model_dir)) == 6
