"""The host every benchmark reports beside its numbers, and CPU threads.

``describe()`` is the one description of the machine the scripts in this
folder print (CPU model, cores, memory, load, versions, JAX's devices);
``limit_threads`` restricts a run to N CPUs before JAX starts.

Imports nothing that starts JAX: ``limit_threads`` must run before JAX does,
and ``describe`` reports JAX only if the script has imported it.
"""
from __future__ import annotations

import datetime
import os
import platform
import sys


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


def memory_gb() -> float:
  """The host's physical memory in GiB."""
  return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
               / 2**30, 1)


def describe() -> dict:
  """The machine a benchmark ran on: date, CPU, cores, memory, load and,
  where the script imported JAX, its version, backend and devices."""
  model, bf16 = cpu_model()
  info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec="seconds"),
          "platform": platform.platform(),
          "python": platform.python_version(),
          "cpu": model, "avx512_bf16": bf16,
          "cpus": os.cpu_count(),
          "cpus_allowed": len(os.sched_getaffinity(0)),
          "memory_gb": memory_gb(),
          "load_average": load_average()}
  jax = sys.modules.get("jax")
  if jax is not None:
    devices = jax.devices()
    info.update(jax=jax.__version__, jax_backend=jax.default_backend(),
                jax_devices=len(devices),
                jax_device_kind=devices[0].device_kind)
  return info


def summary(info: dict | None = None) -> str:
  """:func:`describe` as one line: ``CPU, N CPUs, load ..., jax V (backend,
  D devices)``."""
  info = info or describe()
  line = (f"{info['cpu']}, {info['cpus']} CPUs ({info['cpus_allowed']} "
          f"allowed), {info['memory_gb']} GiB, load {info['load_average']}")
  if "jax" in info:
    line += (f", jax {info['jax']} ({info['jax_backend']}, "
             f"{info['jax_devices']} devices)")
  return line
