"""tensorboardX's ``SummaryWriter``, imported without PyTorch.

``torch`` is hidden while tensorboardX is imported (unless already
imported), which saves its import time; jaxfid logs Python floats only.
"""
import sys

_HIDE_TORCH = "torch" not in sys.modules
if _HIDE_TORCH:
  sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile
try:
  from tensorboardX import SummaryWriter  # noqa: F401
finally:
  if _HIDE_TORCH and sys.modules.get("torch", 0) is None:
    del sys.modules["torch"]
