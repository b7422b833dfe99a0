"""jaxfid: retrieval-augmented T5 (Fusion-in-Decoder, ReAtt, ReFusion) in JAX.

The package is organised in layers; a module imports only its own layer and
lower ones (tests/test_imports.py holds the table): the command line
(``jaxfid.cli``, :mod:`jaxfid.methods`) -> the methods' plug-ins and
commands (``jaxfid.<method>.plugin``, ``jaxfid.<method>.commands``) -> the
shared commands (``jaxfid.commands``) -> seqio ``tasks`` -> the methods
(``reatt``, ``refusion`` -> ``fid`` -> ``dual_encoder``) -> ``training`` ->
``retrieval`` -> ``checkpoints`` and ``evaluation`` -> ``t5`` -> ``core``.
Outside the methods only :mod:`jaxfid.methods` imports a method (the
methods' plug-ins register what they offer). Importing
``jaxfid`` itself is cheap: it pulls in neither JAX nor TensorFlow. The
one convenience exported here, :func:`load_t5`, is resolved lazily on first
access (``jaxfid.load_t5``), which imports :mod:`jaxfid.methods` (so that a
MODEL_DIR of any method loads).

Importing ``jaxfid`` also settles which platforms JAX will start, before
it starts any: on a host without a TPU where libtpu is installed (the
``tpu`` extra, for ``jaxfid bench compile``), the TPU platform is left out
so that JAX neither probes for a TPU nor prints libtpu's errors
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
