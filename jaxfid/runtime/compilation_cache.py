"""The persistent compilation cache of jaxfid's commands.

``apply_runtime_defaults()`` (the CLI calls it once) turns on JAX's cache for
single-process runs at ``$JAXFID_COMPILATION_CACHE`` (``0``, ``off``,
``false``, ``no`` or empty: none) else ``$XDG_CACHE_HOME/jaxfid/xla``,
leaving a cache set for JAX alone; called again after
``jax.distributed.initialize`` it turns it off. It starts no JAX backend.
"""
from __future__ import annotations

import os

import jax
from jax._src import distributed as _distributed

ENV_VAR = "JAXFID_COMPILATION_CACHE"
OFF_VALUES = ("", "0", "off", "false", "no")
# Programs that compile faster than this are not worth a disk entry.
MIN_COMPILE_SECONDS = 1.0
_applied_dir: str | None = None  # the directory this module set, if any


def default_cache_dir(environ=None) -> str:
  """``$XDG_CACHE_HOME/jaxfid/xla``, else ``~/.cache/jaxfid/xla``."""
  environ = os.environ if environ is None else environ
  base = environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "jaxfid", "xla")


def compilation_cache_dir(environ=None) -> str | None:
  """The cache directory ``$JAXFID_COMPILATION_CACHE`` asks for (None: off)."""
  environ = os.environ if environ is None else environ
  if ENV_VAR not in environ:
    return default_cache_dir(environ)
  value = environ[ENV_VAR].strip()
  if value.lower() in OFF_VALUES:
    return None
  return os.path.abspath(os.path.expanduser(value))


def process_count_without_backend() -> int:
  """The process count ``jax.distributed`` was initialised with (else 1;
  unreadable: several), starting no backend."""
  if not jax.distributed.is_initialized():
    return 1
  state = getattr(_distributed, "global_state", None)
  count = getattr(state, "num_processes", None)
  return 2 if count is None else int(count)  # unknown: assume several


def _set_cache_dir(path: str | None) -> None:
  global _applied_dir
  jax.config.update("jax_compilation_cache_dir", path)
  _applied_dir = path


def apply_runtime_defaults(environ=None) -> dict:
  """Turns on the persistent compilation cache where it is safe (module
  doc): ``{'compilation_cache': dir or None, 'reason': str}``."""
  environ = os.environ if environ is None else environ
  current = jax.config.jax_compilation_cache_dir
  if current and current != _applied_dir:
    return {"compilation_cache": current,
            "reason": "set by the user for JAX"}
  processes = process_count_without_backend()
  if processes > 1 or environ.get("JAX_COORDINATOR_ADDRESS"):
    _set_cache_dir(None)
    return {"compilation_cache": None,
            "reason": "multi-process run: no persistent cache"}
  path = compilation_cache_dir(environ)
  if path is None:
    _set_cache_dir(None)
    return {"compilation_cache": None, "reason": f"{ENV_VAR} turns it off"}
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:  # a read-only home: run without a cache
    _set_cache_dir(None)
    return {"compilation_cache": None, "reason": f"cannot create {path}: {e}"}
  _set_cache_dir(path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    MIN_COMPILE_SECONDS)
  return {"compilation_cache": path, "reason": "single process"}
