"""jaxfid: retrieval-augmented T5 (FiD, ReAtt, ReFusion, Atlas) in JAX.

The layers and their import rule: docs/architecture.md and
tests/test_imports.py. Importing ``jaxfid`` pulls in neither JAX nor
TensorFlow; :func:`load_t5` is resolved lazily (it imports
:mod:`jaxfid.methods`, so a MODEL_DIR of any method loads). It also leaves
the TPU platform out on a host without a TPU where libtpu is installed
(:mod:`jaxfid.runtime.platforms`; a ``JAX_PLATFORMS`` the user set wins).
"""
import importlib

from jaxfid.runtime import platforms as _platforms

_platforms.exclude_absent_tpu()

__version__ = "0.1.0"

_LAZY = {"load_t5": "jaxfid.methods"}

__all__ = ["__version__", "load_t5"]


def __getattr__(name: str):
  """Resolves the lazily imported attributes (PEP 562)."""
  if name in _LAZY:
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value
  raise AttributeError(f"module 'jaxfid' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_LAZY))
