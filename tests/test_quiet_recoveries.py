"""Recoveries are quiet: the whole output of each fault case is a few lines.

Each case runs ``python -m jaxfid.cli train`` (the tiny FiD of
test_faults_training.py) and reads everything it prints, stdout and stderr
together, as a user's terminal shows it (no ``TF_CPP_MIN_LOG_LEVEL``): no
traceback of orbax, tensorstore or asyncio background work, at most
:data:`MAX_LINES` lines, the one warning or error line naming the path, and
the exit status of the case. The cases: a rerun after the latest
checkpoint was truncated (falls back, 0), a disk that fills during a save
(1), a save interrupted by a second Ctrl-C (130), and
(slow) a multi-host run one of whose processes is killed (the other stops
at once with one line, SIGABRT as JAX ends it).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

import fault_tools
import multihost
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.cli import main
from jaxfid.runtime import peer_watch
from test_faults_training import (_args, _largest_file, _steps,  # noqa: F401
                                  data)

MAX_LINES = 20
TRACEBACKS = ("Traceback (most recent call last)", "Exception in thread",
              "Task exception was never retrieved", "Exception ignored in",
              "RuntimeError: Event loop is closed")


def assert_quiet(output: str) -> list[str]:
  """The output's lines, checked: no traceback, at most MAX_LINES."""
  lines = output.strip().splitlines()
  noisy = [line for line in lines if line.startswith("Traceback")
           or any(mark in line for mark in TRACEBACKS)]
  assert not noisy and len(lines) <= MAX_LINES, (
      f"{len(lines)} lines, {len(noisy)} of tracebacks:\n{output[-6000:]}")
  return lines


def _env(**extra) -> dict:
  env = {**os.environ, "PYTHONPATH": str(fault_tools.ROOT), **extra}
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # what a user's terminal shows
  return env


# `jaxfid ARGS` whose files may not grow beyond LIMIT bytes (EFBIG, where a
# tmpfs cannot be mounted: tensorstore's writes fail as on a full disk)
_FILE_SIZE_LIMITED = (
    "import resource, runpy, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2)\n"
    "sys.argv = ['jaxfid'] + sys.argv[2:]\n"
    "runpy.run_module('jaxfid.cli', run_name='__main__')\n")


def _cli(argv, file_size_limit: int | None = None) -> tuple[int, str]:
  """(exit status, stdout and stderr together) of ``jaxfid argv``."""
  if file_size_limit is None:
    command = [sys.executable, "-m", "jaxfid.cli"]
    env = _env()
  else:  # the persistent compilation cache would write big files too
    command = [sys.executable, "-c", _FILE_SIZE_LIMITED, str(file_size_limit)]
    env = _env(JAXFID_COMPILATION_CACHE="off")
  done = subprocess.run([*command, *map(str, argv)], cwd=fault_tools.ROOT,
                        env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=600,
                        check=False)
  return done.returncode, done.stdout


def test_a_rerun_after_a_truncated_checkpoint_falls_back_quietly(
    data, tmp_path):
  model_dir = tmp_path / "run"
  assert main(_args(model_dir, data, 4)) == 0
  four = model_dir / "checkpoints" / "4"
  victim = _largest_file(four)
  with open(victim, "r+b") as f:
    f.truncate(os.path.getsize(victim) // 3)
  code, out = _cli(_args(model_dir, data, 6))
  assert code == 0, out[-6000:]
  lines = assert_quiet(out)
  warning, = [line for line in lines if line.startswith("warning:")]
  assert str(four) in warning and f"kept as {four}.unreadable" in warning
  assert f"resumed from step 2 in {model_dir}" in lines
  assert json.loads(lines[-1])["step"] == 6


def test_a_disk_that_fills_during_a_save_is_one_line(data, tmp_path,
                                                     monkeypatch):
  disk = fault_tools.SmallDisk(tmp_path / "disk", monkeypatch, size="64m")
  try:
    model_dir = disk.path / "run"
    assert main(_args(model_dir, data, 2)) == 0
    if disk.mounted:
      disk.leave(64 * 1024)
    code, out = _cli(_args(model_dir, data, 4),
                     file_size_limit=None if disk.mounted else 1 << 20)
    assert code == 1, out[-6000:]
    lines = assert_quiet(out)
    error, = [line for line in lines if line.startswith("jaxfid train:")]
    reason = "no space left on device" if disk.mounted else "file too large"
    assert error == (f"jaxfid train: error: {model_dir / 'checkpoints' / '4'}"
                     f": {reason}")
    assert _steps(model_dir) == [2]
  finally:
    disk.close()


def _wait_for(path, text: str, timeout: float = 120) -> None:
  deadline = time.time() + timeout
  while text not in path.read_text(errors="replace"):
    assert time.time() < deadline, path.read_text(errors="replace")
    time.sleep(0.1)


def test_a_save_interrupted_by_a_second_ctrl_c_is_quiet(data, tmp_path):
  model_dir = tmp_path / "run"
  log = tmp_path / "held.log"
  # held in the save of step 4: every file written, not yet committed
  proc = fault_tools.hold_at(
      "orbax.checkpoint._src.path.atomicity:on_commit_callback", "before", 2,
      _args(model_dir, data, 6), log)
  proc.send_signal(signal.SIGINT)  # saves after this step
  _wait_for(log, "Ctrl-C: saving a checkpoint")
  proc.send_signal(signal.SIGINT)  # stops at once, inside the save
  out = proc.communicate(timeout=600)[0].decode()
  assert proc.returncode == 130
  lines = assert_quiet(out + log.read_text())
  assert lines[-1] == "jaxfid train: interrupted"
  # (a rerun resumes from step 2: test_faults_training's kill -9 there)
  assert _steps(model_dir) == [2]


@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_process_stops_the_other_at_once_in_one_line(
    killed, data, tmp_path):
  model_dir = tmp_path / "run"
  argv = _args(model_dir, data, 1000, ["--gin.MESH='data=4'",
                                       "--gin.CHECKPOINT_EVERY=1000"])
  procs = multihost.start(argv, 2, 2)
  metrics = model_dir / "metrics.jsonl"
  deadline = time.time() + 600
  while not (metrics.exists() and '"step": 3,' in metrics.read_text()):
    assert time.time() < deadline and all(p.poll() is None for p in procs)
    time.sleep(0.2)
  procs[killed].kill()
  results = multihost.finish(procs, timeout=300)
  # At once: the line below is the peer watch's, which sees the killed
  # process's connection close, or a collective's that lost it; JAX alone
  # would end it after 100 s without heartbeats, with a fatal log (naming
  # the heartbeats), a C++ stack trace and no such line.
  code, out, err = results[1 - killed]
  assert code == -signal.SIGABRT, err[-6000:]
  assert "heartbeat" not in (out + err).lower(), err[-6000:]
  lines = assert_quiet(out + err)
  error, = [line for line in lines if line.startswith("jaxfid train:")]
  assert error.startswith("jaxfid train: error: ")
  assert f"process {killed} of this multi-host run is gone" in error or (
      "another process of this multi-host run is gone" in error)
  assert "Rerun the command on every host" in error


def test_the_peer_watch_stops_only_for_a_peer_gone_without_bye(monkeypatch):
  stopped = []
  monkeypatch.setattr(peer_watch, "stop",
                      lambda command, what: stopped.append((command, what)))
  monkeypatch.setattr(peer_watch, "_sockets", [])

  def peer(*sends: bytes) -> None:  # process 0's end of one connection
    mine, theirs = socket.socketpair()
    watch = threading.Thread(target=peer_watch._introduced,
                             args=(mine, "token", "train"))
    watch.start()
    for data in sends:
      theirs.sendall(data)
    theirs.close()
    watch.join(timeout=30)
    assert not watch.is_alive()

  peer(b"token 1\n", b"bye")  # a deliberate end
  peer(b"token 2\nbye")
  peer(b"intruder 1\n")  # not one of the run's processes
  peer(b"token 1")  # gone before it said who it is
  assert not stopped
  peer(b"token 3\n", b"by")  # killed
  assert stopped == [("train", "process 3 of this multi-host run is gone "
                               "(killed, crashed or its host lost)")]


def test_loading_a_checkpoint_in_python_logs_no_orbax_warnings(tmp_path,
                                                               caplog):
  """orbax's two WARNING:absl lines of a read-only manager (read only,
  save_interval_steps) are not logged; the filter does not outlive it."""
  params = {"w": np.arange(4, dtype=np.float32)}
  ckpts = checkpointing.RunCheckpoints(str(tmp_path / "run"))
  ckpts.save(1, {"params": params}, force=True)
  ckpts.maybe_save_best(1, params, 0.5)
  ckpts.close()
  caplog.set_level(logging.WARNING, logger="absl")
  cpu = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cpu), params)
  for which in ("best", "latest"):
    got, step, _ = checkpointing.restore_params(str(tmp_path / "run"), target,
                                            which)
    assert step == 1 and np.array_equal(got["w"], params["w"])
  assert [r.getMessage() for r in caplog.records
          if r.levelno >= logging.WARNING] == []
  assert not logging.getLogger("absl").filters
  logging.getLogger("absl").warning("Given directory is read only=%s", "x")
  assert len(caplog.records) == 1  # only while a manager opens
