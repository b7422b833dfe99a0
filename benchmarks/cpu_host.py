"""The host side of ``fid_vs_pytorch.py``: CPU threads, model, load average.

Imports nothing that starts JAX: ``limit_threads`` must run before JAX does.
"""
from __future__ import annotations

import os
import platform


def limit_threads(argv) -> int | None:
  """``--threads N`` before JAX starts: N CPUs for both runtimes (see --help).

  XLA:CPU sizes its thread pools from the CPUs the process may run on, so
  the process is restricted to N of them (``sched_setaffinity``), with
  ``--xla_cpu_multi_thread_eigen=false`` for N = 1; torch gets
  ``set_num_threads(N)`` in ``main``.
  """
  n = None
  for i, arg in enumerate(argv):
    if arg == "--threads" and i + 1 < len(argv):
      n = argv[i + 1]
    elif arg.startswith("--threads="):
      n = arg.split("=", 1)[1]
  if n is None or not n.isdigit() or int(n) < 1:
    return None  # parse_args reports a bad value
  n = int(n)
  cpus = sorted(os.sched_getaffinity(0))
  if n < len(cpus):
    os.sched_setaffinity(0, cpus[:n])
  if n == 1:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
      os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false"
                                 ).strip()
  return n


def cpu_model() -> tuple[str, bool]:
  """(the CPU's model name, whether it has AVX-512 bf16) from /proc/cpuinfo."""
  name, bf16 = platform.processor() or platform.machine(), False
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
          name = value.strip()
        elif key.strip() == "flags":
          bf16 = "avx512_bf16" in value.split()
          break
  except OSError:
    pass
  return name, bf16


def load_average() -> str:
  try:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
  except OSError:
    return "n/a"
