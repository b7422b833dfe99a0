"""Training survives faults, through the CLI (the loop every method shares).

Unreadable checkpoints (truncated files, junk metadata) fall back to the
newest readable one and resume exactly; loading one for predict or
INIT_CHECKPOINT is one line naming it; a full disk while saving is one line,
earlier checkpoints intact, no temporaries left, and a rerun with space
resumes exactly; a second run on a MODEL_DIR refuses while the first lives
and a killed run's lock does not block; kill -9 at several points, Ctrl-C
and SIGTERM lose nothing.
"""
from __future__ import annotations

import errno
import json
import os
import signal

import pytest

import fault_tools
import tiny_fid
from jaxfid.cli import main

# The sizes of every run here (the task: tests/tiny_fid.py).
SIZES = ("BATCH_SIZE=4", "N_CONTEXT=1", "TEXT_MAXLENGTH=12",
         "ANSWER_MAXLENGTH=3", "CHECKPOINT_EVERY=2", "LOG_EVERY=1",
         "MESH='data=1'", "config.T5Config.d_model=32",
         "config.T5Config.d_ff=64", "loop.train.progress=False")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("fault_data")
  return tiny_fid.write_json(d / "train.json",
                             tiny_fid.examples(16, passages=1))


def _args(model_dir, data, steps, extra=()):
  return tiny_fid.train_argv(model_dir, data, steps, gin=SIZES, extra=extra)


_losses = tiny_fid.losses
_steps = tiny_fid.checkpoint_steps


def _one_line_error(capsys) -> str:
  """The command's one error line (other lines are progress/info, never a
  traceback)."""
  err = capsys.readouterr().err
  assert "Traceback" not in err, err
  lines = [line for line in err.splitlines() if line.startswith("jaxfid ")]
  assert len(lines) == 1, err
  return lines[0]


@pytest.fixture(scope="module")
def whole(data, tmp_path_factory):
  """An uninterrupted 6-step run."""
  model_dir = tmp_path_factory.mktemp("fault_whole") / "run"
  assert main(_args(model_dir, data, 6)) == 0
  return model_dir


def _largest_file(directory):
  files = [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs]
  return max(files, key=os.path.getsize)


def _data_files(directory):
  """The checkpoint's tensor data files (OCDBT's ``d/``): which one holds
  the parameters, and which the optimizer state only, varies from save to
  save, so a test of a params-only load damages them all."""
  return [os.path.join(d, f) for d, _, fs in os.walk(directory)
          for f in fs if os.path.basename(d) == "d"]


# a truncated checkpoint's fall-back runs fast in test_quiet_recoveries (as a
# process, quiet); here the exact resume, fast with junk metadata
@pytest.mark.parametrize("damage", [
    pytest.param("truncate", marks=pytest.mark.slow), "junk_metadata"])
def test_an_unreadable_latest_checkpoint_falls_back_and_resumes_exactly(
    damage, data, whole, tmp_path, capsys):
  model_dir = tmp_path / "run"
  assert main(_args(model_dir, data, 4)) == 0
  assert _steps(model_dir) == [2, 4]
  four = model_dir / "checkpoints" / "4"
  if damage == "truncate":
    victim = _largest_file(four)
    with open(victim, "r+b") as f:
      f.truncate(os.path.getsize(victim) // 3)
  else:
    (four / "default" / "_METADATA").write_bytes(b"\x89junk\xff" * 10)
  capsys.readouterr()
  assert main(_args(model_dir, data, 6)) == 0
  err = capsys.readouterr().err
  warning = [line for line in err.splitlines()
             if line.startswith("warning:")]
  assert len(warning) == 1 and str(four) in warning[0], err
  assert "resumed from step 2" in err
  assert (model_dir / "checkpoints" / "4.unreadable").is_dir()
  assert _losses(model_dir) == pytest.approx(_losses(whole), rel=1e-6)


def test_predict_and_init_checkpoint_name_an_unreadable_checkpoint(
    data, whole, tmp_path, capsys):
  model_dir = tmp_path / "run"
  assert main(_args(model_dir, data, 2)) == 0
  victims = _data_files(model_dir / "checkpoints" / "2")
  assert victims
  for victim in victims:
    with open(victim, "r+b") as f:
      f.truncate(16)
  capsys.readouterr()
  assert main(["predict", "--checkpoint", str(model_dir), "--data", str(data),
               "--n-context", "1", "--text-maxlength", "12",
               "--answer-maxlength", "3", "--output",
               str(tmp_path / "p.jsonl")]) == 2
  line = _one_line_error(capsys)
  assert "unreadable checkpoint (step 2)" in line
  assert str(model_dir / "checkpoints" / "2") in line
  assert not (tmp_path / "p.jsonl").exists()
  assert main(_args(tmp_path / "other", data, 1, [
      f"--gin.INIT_CHECKPOINT='{model_dir}'"])) == 2
  assert "unreadable checkpoint (step 2)" in _one_line_error(capsys)
  assert main(["convert", "--from", str(model_dir), "--to",
               str(tmp_path / "hf")]) == 2
  assert "unreadable checkpoint (step 2)" in _one_line_error(capsys)
  assert not (tmp_path / "hf").exists()


def test_predict_says_which_checkpoint_it_loaded(data, whole, tmp_path,
                                                 capsys):
  for which in ("latest", "auto"):
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(whole), "--data", str(data),
                 "--n-context", "1", "--text-maxlength", "12",
                 "--answer-maxlength", "3", "--which", which, "--output",
                 str(tmp_path / f"{which}.jsonl")]) == 0
    err = capsys.readouterr().err
    assert f"loading the latest checkpoint (step 6) of {whole}" in err


def test_a_full_disk_while_saving_is_one_line_and_a_rerun_resumes(
    data, whole, tmp_path, monkeypatch, capsys):
  disk = fault_tools.SmallDisk(tmp_path / "disk", monkeypatch, size="64m")
  try:
    model_dir = disk.path / "run"
    assert main(_args(model_dir, data, 2)) == 0
    if disk.mounted:
      disk.leave(64 * 1024)
    else:  # no tmpfs here: orbax's writes fail as on a full disk
      from jaxfid.checkpoints import model_dir as model_dir_lib
      real = model_dir_lib.ocp.CheckpointManager.save

      def full(self, step, *args, **kwargs):
        if step == 4:
          raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, step, *args, **kwargs)
      monkeypatch.setattr(model_dir_lib.ocp.CheckpointManager, "save", full)
    capsys.readouterr()
    assert main(_args(model_dir, data, 4)) == 1
    line = _one_line_error(capsys)
    assert "No space left on device" in line or "no space" in line.lower()
    assert str(model_dir / "checkpoints") in line
    assert _steps(model_dir) == [2]
    assert not [n for n in os.listdir(model_dir / "checkpoints")
                if "tmp" in n]
    disk.unlimited()
    monkeypatch.undo()
    assert main(_args(model_dir, data, 6)) == 0
    assert _losses(model_dir) == pytest.approx(_losses(whole), rel=1e-6)
  finally:
    disk.close()


def test_a_second_run_refuses_and_a_killed_runs_lock_does_not_block(
    data, whole, tmp_path, capsys):
  model_dir = tmp_path / "run"
  holder = fault_tools.hold_at(
      "jaxfid.checkpoints.model_dir:RunCheckpoints.save", "after", 1,
      _args(model_dir, data, 6), tmp_path / "holder.log")
  try:
    capsys.readouterr()
    assert main(_args(model_dir, data, 6)) == 2
    line = _one_line_error(capsys)
    assert f"MODEL_DIR {model_dir}" in line and "in use by process" in line
  finally:
    fault_tools.kill(holder)  # kill -9 after the checkpoint of step 2
  assert main(_args(model_dir, data, 6)) == 0
  assert _losses(model_dir) == pytest.approx(_losses(whole), rel=1e-6)


# kill -9 at step 4 before its checkpoint, and in the middle of that
# checkpoint (every file written, not yet committed by orbax's rename)
# (the fast tier keeps the kill in the middle of the checkpoint)
@pytest.mark.parametrize("target", [
    pytest.param("jaxfid.checkpoints.model_dir:RunCheckpoints.save",
                 marks=pytest.mark.slow),
    "orbax.checkpoint._src.path.atomicity:on_commit_callback"])
def test_kill_9_before_a_checkpoint_loses_only_the_steps_since(
    target, data, whole, tmp_path):
  model_dir = tmp_path / "run"
  proc = fault_tools.hold_at(target, "before", 2, _args(model_dir, data, 6),
                             tmp_path / "held.log")
  fault_tools.kill(proc)
  assert _steps(model_dir) == [2]
  assert main(_args(model_dir, data, 6)) == 0
  left = os.listdir(model_dir / "checkpoints")
  assert not [name for name in left if "tmp" in name], left
  assert _losses(model_dir) == pytest.approx(_losses(whole), rel=1e-6)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130),
                                       (signal.SIGTERM, 0)])
def test_ctrl_c_and_sigterm_save_and_report_the_saved_step(
    sig, code, data, whole, tmp_path):
  model_dir = tmp_path / "run"
  log = tmp_path / "held.log"
  # LOG_EVERY=4: the summary must still pair the saved step with its own loss.
  # The signal lands once the checkpoint of step 2 is written, before step 3.
  proc = fault_tools.hold_at(
      "jaxfid.checkpoints.model_dir:RunCheckpoints.save", "after", 1,
      _args(model_dir, data, 6, ["--gin.LOG_EVERY=4"]), log,
      until_signal=True)
  metrics = model_dir / "metrics.jsonl"
  proc.send_signal(sig)
  out = proc.communicate(timeout=600)[0].decode()
  err = log.read_text(errors="replace")
  assert proc.returncode == code, err[-2000:]
  summary = json.loads(out.strip().splitlines()[-1])
  assert summary["preempted"] and summary["signal"] == signal.Signals(sig).name
  step = summary["step"]
  assert step < 6 and _steps(model_dir)[-1] == step
  logged = _losses(model_dir)
  assert logged[step] == summary["loss"]
  assert metrics.exists()
  assert main(_args(model_dir, data, 6, ["--gin.LOG_EVERY=4"])) == 0
  got = _losses(model_dir)
  want = _losses(whole)
  assert {s: got[s] for s in (4, 6)} == pytest.approx(
      {s: want[s] for s in (4, 6)}, rel=1e-6)


def test_convert_reads_a_model_dir(whole, tmp_path):
  import numpy as np

  from jaxfid.checkpoints.load import load_t5
  assert main(["convert", "--from", str(whole), "--to",
               str(tmp_path / "hf")]) == 0
  ours, theirs = load_t5(str(whole)), load_t5(str(tmp_path / "hf"))
  enc = np.array([[5, 6, 7, 1]], np.int32)
  dec = np.array([[0, 5]], np.int32)
  np.testing.assert_allclose(np.asarray(ours(enc, dec)),
                             np.asarray(theirs(enc, dec)), rtol=1e-6)
