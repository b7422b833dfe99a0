"""pytorch_model.bin without torch: both torch.save formats, against torch."""
import io
import os
import pickle
import zipfile

import numpy as np
import pytest

from jaxfid.checkpoints.torch_bin import read_torch_bin
from jaxfid.core.errors import InputError

torch = pytest.importorskip("torch")


def _state():
  torch.manual_seed(0)
  base = torch.randn(4, 6)
  return {
      "kernel": torch.randn(3, 5),
      "transposed": base.t(),                      # strides (1, 6)
      "slice": base[1:3, 2:5],                     # offset 8, shares base
      "base": base,
      "half": torch.randn(7).half(),
      "bfloat": torch.randn(2, 3).bfloat16(),
      "double": torch.randn(2).double(),
      "ids": torch.arange(5),
      "mask": torch.tensor([True, False, True]),
      "bytes": torch.arange(4, dtype=torch.uint8),
      "scalar": torch.tensor(2.5),
      "empty": torch.zeros(0, 3),
  }


def _expected(tensor) -> np.ndarray:
  if tensor.dtype in (torch.float16, torch.bfloat16):
    tensor = tensor.float()
  return tensor.numpy()


@pytest.mark.parametrize("zip_format", [True, False])
def test_equals_torch_load(tmp_path, zip_format):
  state = _state()
  path = tmp_path / "pytorch_model.bin"
  torch.save(state, path, _use_new_zipfile_serialization=zip_format)
  assert zipfile.is_zipfile(path) == zip_format
  got = read_torch_bin(path)
  assert list(got) == list(state)
  for name, tensor in torch.load(path, weights_only=True).items():
    want = _expected(tensor)
    assert got[name].dtype == want.dtype, name
    assert got[name].shape == want.shape, name
    np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_tensors_saved_on_a_gpu_load_on_the_cpu(tmp_path):
  path = tmp_path / "gpu.bin"
  torch.save({"w": torch.arange(6.0)}, path,
             _use_new_zipfile_serialization=False)
  # what a legacy file saved from CUDA tensors names its storage class
  data = path.read_bytes()
  assert data.count(b"ctorch\nFloatStorage\n") == 1
  path.write_bytes(data.replace(b"ctorch\nFloatStorage\n",
                                b"ctorch.cuda\nFloatStorage\n"))
  np.testing.assert_array_equal(read_torch_bin(path)["w"], np.arange(6.0))


def test_refuses_code_and_non_state_dicts(tmp_path):
  class Evil:
    def __reduce__(self):
      return (os.system, ("echo pwned",))

  path = tmp_path / "evil.bin"
  torch.save({"w": torch.ones(2), "x": Evil()}, path)
  with pytest.raises(InputError, match="refusing to load posix.system"):
    read_torch_bin(path)
  torch.save([torch.ones(2)], tmp_path / "list.bin")
  with pytest.raises(InputError, match="expected a state dict"):
    read_torch_bin(tmp_path / "list.bin")
  torch.save({"n": 3}, tmp_path / "int.bin")
  with pytest.raises(InputError, match="entry n is not a tensor"):
    read_torch_bin(tmp_path / "int.bin")


def test_damaged_files_are_input_errors(tmp_path):
  path = tmp_path / "legacy.bin"
  torch.save({"w": torch.ones(1000)}, path, _use_new_zipfile_serialization=False)
  data = path.read_bytes()
  path.write_bytes(data[:-100])
  with pytest.raises(InputError, match="truncated"):
    read_torch_bin(path)
  (tmp_path / "junk.bin").write_bytes(pickle.dumps("hello"))
  # the legacy format's header pickles cannot run code either
  (tmp_path / "header.bin").write_bytes(pickle.dumps(os.getcwd))
  with pytest.raises(InputError, match="refusing to load posix.getcwd"):
    read_torch_bin(tmp_path / "header.bin")
  with pytest.raises(InputError, match="not a torch.save file"):
    read_torch_bin(tmp_path / "junk.bin")
  with pytest.raises(InputError, match="file not found"):
    read_torch_bin(tmp_path / "missing.bin")
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w") as archive:
    archive.writestr("x/other.txt", "no pickle here")
  (tmp_path / "zip.bin").write_bytes(buffer.getvalue())
  with pytest.raises(InputError, match="no single data.pkl"):
    read_torch_bin(tmp_path / "zip.bin")
