"""`jaxfid refusion seeds` with a fake trainer.

The real ``jaxfid.cli train`` command line is built, then handed to a tiny
script instead (:func:`jaxfid.refusion.seeds.train_argv` is wrapped): it
records its arguments, reads its seed from ``--gin.SEED`` and writes a
``metrics.jsonl`` whose test accuracy depends on the seed, or fails when the
seed is in the ``--gin.FAIL_SEEDS`` binding. The task table is a stand-in
too, so these tests do not depend on :mod:`jaxfid.refusion.lmbff`; the
gin files are stand-ins as well, so the command's check of the real gin run
is switched off here (it is tested in ``test_gin_validation.py``).
"""
import json
import subprocess
import sys
import types

import numpy as np
import pytest

from jaxfid.cli import main
from jaxfid.refusion import commands as refusion_commands
from jaxfid.refusion import seeds

ACCURACY = {13: 0.9, 21: 0.8, 42: 0.85, 87: 0.95, 100: 0.7}
FAKE_TRAIN = r'''
import ast, json, os, sys
args = sys.argv[1:]
gin = {}
for a in args:
  if a.startswith("--gin."):
    name, _, value = a[len("--gin."):].partition("=")
    gin[name] = ast.literal_eval(value)
accuracy = {13: 0.9, 21: 0.8, 42: 0.85, 87: 0.95, 100: 0.7}[gin["SEED"]]
os.makedirs(gin["MODEL_DIR"], exist_ok=True)
with open(os.path.join(gin["MODEL_DIR"], "calls.jsonl"), "a") as f:
  f.write(json.dumps(args) + "\n")
print("training seed", gin["SEED"])
if gin["SEED"] in gin.get("FAIL_SEEDS", []):
  print("Traceback (most recent call last):", file=sys.stderr)
  print(f"ValueError: boom {gin['SEED']}", file=sys.stderr)
  sys.exit(1)
with open(os.path.join(gin["MODEL_DIR"], "metrics.jsonl"), "a") as f:
  f.write(json.dumps({"step": 10, "loss": 0.5}) + "\n")
  if gin["SEED"] not in gin.get("NO_TEST", []):
    f.write(json.dumps({"step": 20, "test_accuracy": accuracy,
                        "test_f1": accuracy - 0.1}) + "\n")
'''


@pytest.fixture
def world(tmp_path, monkeypatch):
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  real = seeds.train_argv
  monkeypatch.setattr(seeds, "train_argv", lambda *a, **k: [
      sys.executable, str(fake)] + real(*a, **k)[3:])
  specs = {"sst-2": types.SimpleNamespace(name="sst-2", lmbff_dir="SST-2",
                                          metric="accuracy"),
           "mrpc": types.SimpleNamespace(name="mrpc", lmbff_dir="MRPC",
                                         metric="f1")}

  def get_task(name):
    if name not in specs:
      raise KeyError(f"no task {name}; known: {sorted(specs)}")
    return specs[name]

  monkeypatch.setattr(seeds, "get_task", get_task)
  monkeypatch.setattr(refusion_commands, "check_gin", lambda *a: None)
  data = tmp_path / "k-shot"
  for task in ("SST-2", "MRPC"):
    for seed in ACCURACY:
      (data / task / f"16-{seed}").mkdir(parents=True)
  return {"data": data, "runs": tmp_path / "runs"}


def _command(world, *extra, task="sst-2", seeds_arg="13,21,42"):
  return ["refusion", "seeds", "--data-root", str(world["data"]), "--task",
          task, "--model-dir-root", str(world["runs"]), "--seeds", seeds_arg,
          "--gin_file=base.gin", "--gin_file", "tiny.gin", *extra]


def _calls(world, seed):
  path = world["runs"] / f"16-{seed}" / "calls.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_wiring_table_json_and_resume(world, capsys):
  assert main(_command(world, "--gin.LR=0.5")) == 0
  out, err = capsys.readouterr()
  summary = json.loads(out.strip().splitlines()[-1])
  values = [90.0, 80.0, 85.0]
  assert summary["task"] == "sst-2" and summary["metric"] == "accuracy"
  assert summary["seeds"] == [13, 21, 42]
  assert summary["per_seed"] == pytest.approx(
      {"13": 90.0, "21": 80.0, "42": 85.0})
  assert summary["mean"] == pytest.approx(85.0)
  assert summary["std"] == pytest.approx(np.std(values))  # ddof=0: 4.08
  assert "85.0 (4.1)" in out and "failed" not in out
  assert json.loads((world["runs"] / "summary.json").read_text()) == summary
  assert "[seed 21] training seed 21" in err
  assert "training seed 42" in (world["runs"] / "16-42.log").read_text()
  args = _calls(world, 42)[0]
  data_dir = str(world["data"] / "SST-2" / "16-42")
  model_dir = str(world["runs"] / "16-42")
  assert args == ["train", "--gin_file=base.gin", "--gin_file=tiny.gin",
                  "--gin.LR=0.5", "--gin.TASK='sst-2'",
                  f"--gin.DATA_DIR={data_dir!r}", "--gin.SEED=42",
                  f"--gin.MODEL_DIR={model_dir!r}"]
  # rerunning trains only the new seed
  assert main(_command(world, seeds_arg="13,21,42,87")) == 0
  out = capsys.readouterr().out
  assert [len(_calls(world, s)) for s in (13, 21, 42, 87)] == [1, 1, 1, 1]
  assert out.count("(earlier run)") == 3
  summary = json.loads(out.strip().splitlines()[-1])
  assert summary["mean"] == pytest.approx(np.mean(values + [95.0]))
  assert summary["std"] == pytest.approx(np.std(values + [95.0]))


def test_f1_task_reports_f1(world, capsys):
  assert main(_command(world, task="mrpc", seeds_arg="13,100")) == 0
  out = capsys.readouterr().out
  summary = json.loads(out.strip().splitlines()[-1])
  assert summary["metric"] == "f1"
  assert summary["per_seed"] == pytest.approx({"13": 80.0, "100": 60.0})
  assert (summary["mean"], summary["std"]) == pytest.approx((70.0, 10.0))
  header = out.splitlines()[1].split()
  assert header == ["seed", "f1", "accuracy"]
  assert out.splitlines()[2].split() == ["13", "80.0", "90.0"]
  assert "MRPC" in _calls(world, 100)[0][-3]


def test_failing_seed_reports_and_others_run(world, capsys):
  assert main(_command(world, "--gin.FAIL_SEEDS=[21]",
                       "--gin.NO_TEST=[42]")) == 1
  out, err = capsys.readouterr()
  assert "seed 21 failed: exit status 1: ValueError: boom 21" in err
  assert "seed 42 failed: finished without a test_accuracy line" in err
  assert not (world["runs"] / "summary.json").exists()
  assert not out.strip().splitlines()[-1].startswith("{")
  assert "90.0" in out and out.count("failed") == 2
  assert [len(_calls(world, s)) for s in (13, 21, 42)] == [1, 1, 1]
  # fixed: the rerun trains only the failed seeds
  assert main(_command(world)) == 0
  assert [len(_calls(world, s)) for s in (13, 21, 42)] == [1, 2, 2]
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary["mean"] == pytest.approx(85.0)


@pytest.mark.parametrize("extra, seeds_arg, task, message", [
    (("--gin.SEED=3",), "13", "sst-2", "--gin.SEED: is set per seed"),
    ((), "13,x", "sst-2", "--seeds: expected comma-separated integers"),
    ((), "13,13", "sst-2", "--seeds: a seed is repeated"),
    ((), "13", "qqp", "--task: unknown task 'qqp': no task qqp; known"),
    ((), "13,7", "sst-2", "16-7: no such directory"),
])
def test_bad_input_is_one_line_and_runs_nothing(world, capsys, extra,
                                                 seeds_arg, task, message):
  assert main(_command(world, *extra, task=task, seeds_arg=seeds_arg)) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and len(err.splitlines()) == 1
  assert not _calls(world, 13)


def test_read_test_metrics_takes_the_last_test_line(tmp_path):
  assert seeds.read_test_metrics(tmp_path) is None
  (tmp_path / "metrics.jsonl").write_text(
      '{"step": 1, "test_accuracy": 0.5}\n{"step": 2, "loss": 1}\n'
      '{"step": 3, "test_accuracy": 0.7, "test_mcc": 0.2}\n{"step": 4, "te')
  assert seeds.read_test_metrics(tmp_path) == {
      "step": 3, "test_accuracy": 0.7, "test_mcc": 0.2}


def test_real_train_command_line_starts_jaxfid_train(tmp_path):
  argv = seeds.train_argv(["a.gin"], ["SEED=1"], ["gin_dir"])
  assert argv == [sys.executable, "-m", "jaxfid.cli", "train",
                  "--gin_file=a.gin", "--gin_search_path=gin_dir",
                  "--gin.SEED=1"]
  done = subprocess.run(argv[:4] + ["--help"], capture_output=True, text=True,
                        env=seeds._child_env(), cwd=tmp_path, timeout=120)
  assert done.returncode == 0, done.stderr
  assert "--gin_file" in done.stdout and "resumes" in done.stdout
