"""jaxfid's TensorBoard writer is imported without PyTorch."""
import importlib
import sys


def test_tensorboard_is_imported_without_pytorch(monkeypatch):
  """tensorboardX imports torch when it can (2-3 s at every command's start
  where PyTorch is installed); jaxfid imports it with torch hidden, and
  torch stays importable."""
  for name in [n for n in sys.modules
               if n == "torch" or n.startswith(("torch.", "tensorboardX"))
               or n == "jaxfid.runtime.tensorboard"]:
    monkeypatch.delitem(sys.modules, name)
  module = importlib.import_module("jaxfid.runtime.tensorboard")
  assert module.SummaryWriter.__module__ == "tensorboardX.writer"
  assert "torch" not in sys.modules
