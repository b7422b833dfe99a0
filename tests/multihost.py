"""Runs a jaxfid command as N CPU processes on 127.0.0.1 (a multi-host test).

Each process gets ``devices`` simulated CPU devices and the flags
``--distributed --coordinator-address 127.0.0.1:PORT --num-processes N
--process-id I``; collectives go over gloo. The persistent compilation cache
is off (on CPU only process 0 would write it, and the others fall behind
until gloo times out).
"""
from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time

import fault_tools

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


def start(argv: list[str], processes: int, devices: int,
          held: tuple[int, str, str, int] | None = None
          ) -> list[subprocess.Popen]:
  """Starts the processes (one process: no distributed flags). ``held``:
  ``(process, target, when, count)``: that process is held at ``target``
  until a signal (``fault_tools.hold_at``'s ``until_signal``; it says
  ``HOLDING`` on stdout first)."""
  port = free_port()
  procs = []
  for i in range(processes):
    extra = ([] if processes == 1 else
             ["--distributed", "--coordinator-address", f"127.0.0.1:{port}",
              "--num-processes", str(processes), "--process-id", str(i)])
    program = ["-m", "jaxfid.cli"]
    if held is not None and held[0] == i:
      program = ["-c", fault_tools.HOLD, *map(str, held[1:]), "signal"]
    procs.append(subprocess.Popen(
        [sys.executable, *program, *argv, *extra], cwd=ROOT,
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


def terminate_held(procs, which: int, timeout: float = 600) -> None:
  """SIGTERM to process ``which`` (started ``held``) once it is held; if it
  never is, all are killed and the error shows what they printed."""
  deadline = time.time() + timeout
  stdout = procs[which].stdout
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if select.select([stdout], [], [], 1.0)[0]:
      line = stdout.readline()
      if line.strip() == "HOLDING":
        procs[which].send_signal(signal.SIGTERM)
        return
      if not line:
        break
  for p in procs:
    p.kill()
  printed = [err[-3000:] for _, _, err in finish(procs)]
  raise AssertionError(f"process {which} was never held: {printed}")
