"""Compile once, start without compiling: ``bench compile --save-executable``
for this host's CPU (``--topology cpu-1``) and ``jaxfid train
--gin.COMPILED_STEP``, which loads the step where versions, target, mesh,
signature and program match, and otherwise says one line and compiles.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

import tiny_fid
from jaxfid.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ("BATCH_SIZE=8", "N_CONTEXT=2", "TEXT_MAXLENGTH=24",
         "ANSWER_MAXLENGTH=4", "LEARNING_RATE=1e-3", "LOG_EVERY=1",
         "CHECKPOINT_EVERY=2", "MESH='data=1'", "loop.train.progress=False")
STEPS = 3


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """The training data and the tiny FiD step compiled for one CPU device."""
  directory = tmp_path_factory.mktemp("compiled_step")
  train = tiny_fid.write_json(directory / "train.json",
                              tiny_fid.examples(24, passages=3))
  path = str(directory / "step.jaxfid")
  # compiled in a process of its own (this one's jax.config differs:
  # tests/conftest.py), as the runs that load it
  assert main(["bench", "compile", "--topology", "cpu-1",
               "--gin_file=gin/fid/tiny.gin", f"--gin.TRAIN_DATA='{train}'",
               *(f"--gin.{b}" for b in SIZES),
               "--save-executable", path]) == 0
  return train, path


def _argv(model_dir, train, *extra):
  return tiny_fid.train_argv(model_dir, train, STEPS, None, SIZES, extra)


def _train(*argv) -> str:
  """``jaxfid train`` in a fresh process; its stderr."""
  done = subprocess.run([sys.executable, "-m", "jaxfid", *argv], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert done.returncode == 0, done.stderr
  return done.stderr


def _said(err: str) -> list[str]:
  return [l for l in err.splitlines() if "COMPILED_STEP" in l]


def test_a_saved_step_trains_as_the_compiled_one(saved, tmp_path):
  """A fresh process loads the step (no compile) and its losses are those
  of a run that compiles it."""
  train, path = saved
  loaded, compiled = tmp_path / "loaded", tmp_path / "compiled"
  err = _train(*_argv(loaded, train, f"--gin.COMPILED_STEP='{path}'"))
  assert _said(err) == [
      f"jaxfid train: COMPILED_STEP {path}: phase 'train' loaded, not "
      "compiled"]
  assert _said(_train(*_argv(compiled, train))) == []
  want, got = tiny_fid.losses(compiled), tiny_fid.losses(loaded)
  assert sorted(got) == list(range(1, STEPS + 1))
  assert got == pytest.approx(want, rel=1e-6, abs=0)


def test_a_file_that_does_not_match_is_one_line_and_compiles(saved, tmp_path,
                                                            capsys):
  train, path = saved
  run = tmp_path / "other_lr"
  assert _said(_train(*_argv(run, train, "--gin.LEARNING_RATE=2e-3",
                             f"--gin.COMPILED_STEP='{path}'"))) == [
      f"jaxfid train: COMPILED_STEP {path}: the program differs (a setting "
      "the step depends on: learning rate, dropout, remat, shardings, ...); "
      "compiling the step"]
  assert sorted(tiny_fid.losses(run)) == list(range(1, STEPS + 1))
  # a header of another target (as a GPU's file read on this CPU host);
  # the target is checked before the program (this process's differs)
  other = tmp_path / "other_target.jaxfid"
  with zipfile.ZipFile(path) as z, zipfile.ZipFile(other, "w") as out:
    header = json.loads(z.read("header.json"))
    header["target"]["device_kind"] = "NVIDIA H100 80GB HBM3"
    out.writestr("header.json", json.dumps(header))
    out.writestr("train.bin", z.read("train.bin"))
  assert main(_argv(tmp_path / "gpu_file", train,
                    f"--gin.COMPILED_STEP='{other}'")) == 0
  assert _said(capsys.readouterr().err) == [
      f"jaxfid train: COMPILED_STEP {other}: the target's device_kind "
      "differs (file: NVIDIA H100 80GB HBM3, this run: cpu); compiling the "
      "step"]


def test_an_unreadable_or_missing_file(saved, tmp_path, capsys):
  train, _ = saved
  junk = tmp_path / "junk.jaxfid"
  junk.write_text("not a zip")
  assert main(_argv(tmp_path / "junk", train,
                    f"--gin.COMPILED_STEP='{junk}'")) == 0
  assert _said(capsys.readouterr().err) == [
      f"jaxfid train: COMPILED_STEP {junk}: cannot be read (BadZipFile: "
      "File is not a zip file); compiling the step"]
  missing = tmp_path / "missing.jaxfid"
  assert main(_argv(tmp_path / "missing", train,
                    f"--gin.COMPILED_STEP='{missing}'")) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "COMPILED_STEP" in err[0], err
  assert f"no such file: {missing}" in err[0], err


def test_save_executable_is_one_configurations_train_step(capsys):
  for extra in (["--search"], ["--program", "decode"]):
    assert main(["bench", "compile", "--topology", "cpu-1",
                 "--gin_file=gin/fid/tiny.gin", "--save-executable", "x",
                 *extra]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "jaxfid bench: error: --save-executable: saves the train step of "
        "one configuration: --program train, without --search"]
