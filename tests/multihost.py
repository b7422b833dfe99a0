"""Runs a jaxfid command as N CPU processes on 127.0.0.1 (a multi-host test).

Each process gets ``devices`` simulated CPU devices and the flags
``--distributed --coordinator-address 127.0.0.1:PORT --num-processes N
--process-id I``; collectives go over gloo. The persistent compilation cache
is off (on CPU only process 0 would write it, and the others fall behind
until gloo times out).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def env(devices: int) -> dict:
  out = dict(os.environ)
  out.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
             JAXFID_COMPILATION_CACHE="off", PYTHONUNBUFFERED="1")
  out.pop("JAX_COORDINATOR_ADDRESS", None)
  return out


def start(argv: list[str], processes: int, devices: int
          ) -> list[subprocess.Popen]:
  """Starts the processes (one process: no distributed flags)."""
  port = free_port()
  procs = []
  for i in range(processes):
    extra = ([] if processes == 1 else
             ["--distributed", "--coordinator-address", f"127.0.0.1:{port}",
              "--num-processes", str(processes), "--process-id", str(i)])
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "jaxfid.cli", *argv, *extra], cwd=ROOT,
        env=env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True))
  return procs


def finish(procs, timeout: float = 600) -> list[tuple[int, str, str]]:
  """(exit code, stdout, stderr) of each process; kills all on a timeout."""
  deadline = time.time() + timeout
  out = []
  try:
    for p in procs:
      stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.time()))
      out.append((p.returncode, stdout, stderr))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return out


def run(argv: list[str], processes: int, devices: int,
        timeout: float = 600) -> list[tuple[int, str, str]]:
  return finish(start(argv, processes, devices), timeout)


def terminate_when(procs, ready, which: int, timeout: float = 600) -> None:
  """SIGTERM to process ``which`` once ``ready()`` is true."""
  deadline = time.time() + timeout
  while not ready():
    if time.time() > deadline or any(p.poll() is not None for p in procs):
      return
    time.sleep(0.2)
  procs[which].send_signal(signal.SIGTERM)
