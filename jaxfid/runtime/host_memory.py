"""glibc malloc settings for programs that XLA runs on the CPU.

XLA's CPU runtime allocates each execution's temporary buffer (196 MB for the
demo's train step) from a worker thread, and glibc serves such requests over
64 MB with a fresh ``mmap``, zeroed page by page, every step.
:func:`tune_cpu_malloc` makes every thread use the main arena
(``M_ARENA_MAX=1``), the heap rather than ``mmap`` (``M_MMAP_MAX=0``) and
keeps up to 2 GiB freed at the heap's top (``M_TRIM_THRESHOLD``): the demo's
step takes 208 ms instead of 282 ms (7 instead of 182 ms of system time) on
the idle 2-core CPU host, its peak resident memory 1.24 GB instead of 0.80
(``benchmarks/cpu_malloc.py``). The CLI applies it to the commands that run
models only where: the C library is glibc; JAX's backend has not started;
JAX will run on the CPU (no accelerator plugin it would load, and
``JAX_PLATFORMS`` unset or naming ``cpu`` first); ``$JAXFID_CPU_MALLOC`` is
not ``0`` / ``off`` / ``false`` / ``no``; and none of glibc's own malloc
variables (``MALLOC_*``, ``GLIBC_TUNABLES`` with ``glibc.malloc``) is set.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

from jax._src import xla_bridge

from jaxfid.runtime import platforms

ENV_VAR = "JAXFID_CPU_MALLOC"
OFF_VALUES = ("0", "off", "false", "no")
# mallopt(3) parameters (malloc.h) and the values set.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0),
            (M_TRIM_THRESHOLD, 2**31 - 1))  # mallopt takes an int
GLIBC_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_",
                   "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                   "MALLOC_TOP_PAD_")
_applied = False


def accelerators_installed() -> list[str]:
  """The installed JAX accelerator plugins, then ``libtpu`` if installed."""
  return platforms.accelerator_plugins() + (
      [platforms.LIBTPU] if platforms.libtpu_installed() else [])


def _left_out(plugin: str, jax_platforms: str) -> bool:
  """Whether ``JAX_PLATFORMS`` leaves out the platform of ``plugin``
  (libtpu: ``tpu``; a CUDA plugin: ``cuda``; another kind: unknown, no)."""
  names = [p.strip().lower() for p in jax_platforms.split(",")]
  if plugin == platforms.LIBTPU:
    kind = "tpu"
  elif platforms.CUDA in plugin.lower():
    kind = platforms.CUDA
  else:
    return False
  return bool(jax_platforms) and kind not in names


def _backend_started() -> bool:
  started = getattr(xla_bridge, "backends_are_initialized", None)
  return bool(started() if started else getattr(xla_bridge, "_backends", None))


def why_not(environ=None) -> str | None:
  """Why the settings would not be applied now (None: they would be)."""
  environ = os.environ if environ is None else environ
  if environ.get(ENV_VAR, "").strip().lower() in OFF_VALUES:
    return f"{ENV_VAR} turns it off"
  if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
    return "not glibc"
  mine = [v for v in GLIBC_VARIABLES if v in environ]
  if "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
    mine.append("GLIBC_TUNABLES")
  if mine:
    return f"malloc set by the user ({', '.join(mine)})"
  platforms_value = environ.get("JAX_PLATFORMS", "").strip()
  if (platforms_value
      and platforms_value.split(",")[0].strip().lower() != "cpu"):
    return f"JAX_PLATFORMS={platforms_value}"
  # an accelerator JAX_PLATFORMS leaves out is none: JAX will not load it
  plugin = next((p for p in accelerators_installed()
                 if not _left_out(p, platforms_value)), None)
  if plugin:
    return f"accelerator plugin {plugin} installed"
  if _backend_started():
    return "JAX's backend has already started"
  return None


def tune_cpu_malloc(environ=None) -> dict:
  """Apply the settings (module doc) where they help; says what was done.

  Returns ``{'cpu_malloc': bool, 'reason': str}``. Idempotent: once applied
  in a process it stays applied.
  """
  global _applied
  if _applied:
    return {"cpu_malloc": True, "reason": "applied"}
  reason = why_not(environ)
  if reason is not None:
    return {"cpu_malloc": False, "reason": reason}
  mallopt = ctypes.CDLL(None).mallopt
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  for param, value in SETTINGS:
    if mallopt(param, value) != 1:
      return {"cpu_malloc": False, "reason": f"mallopt({param}) refused"}
  _applied = True
  return {"cpu_malloc": True, "reason": "applied"}
