"""jaxfid: retrieval-augmented T5 (Fusion-in-Decoder, ReAtt, ReFusion) in JAX.

The package is organised in layers (arrows point down): ``jaxfid.cli`` and its
commands -> training / prediction / retrieval -> data / checkpoints -> models
-> sharding. Importing ``jaxfid`` itself is cheap: it pulls in neither JAX nor
TensorFlow. The one convenience exported here, :func:`load_t5`, is resolved
lazily on first access (``jaxfid.load_t5``), which then imports the model code
from :mod:`jaxfid.checkpoints.load`.
"""

__version__ = "0.1.0"

_LAZY = {"load_t5": "jaxfid.checkpoints.load"}

__all__ = ["__version__", "load_t5"]


def __getattr__(name: str):
  """Resolves the lazily imported attributes (PEP 562)."""
  if name in _LAZY:
    import importlib  # pylint: disable=g-import-not-at-top
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value
  raise AttributeError(f"module 'jaxfid' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_LAZY))
