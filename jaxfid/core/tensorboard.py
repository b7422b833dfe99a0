"""tensorboardX's ``SummaryWriter``, imported without PyTorch.

tensorboardX's writer module runs ``import torch`` when it is imported (to
accept torch tensors as values), which costs 2-3 s at the start of every
jaxfid command on a machine where PyTorch is installed (the test extra, most
research machines) although jaxfid logs Python floats only. While
tensorboardX is imported, ``torch`` is hidden (an ImportError, which
tensorboardX expects where PyTorch is absent) unless something imported it
already; afterwards ``import torch`` works as ever.
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
