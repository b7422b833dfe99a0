"""tests/hf_reference.py without PyTorch: its numpy checkpoints are what
``save_pretrained`` writes (tensor names, shapes, config.json), so the tests
that only need a checkpoint run on the stack without torch too."""
import json

import pytest
from safetensors.numpy import load_file

import hf_reference as ref
from jaxfid.checkpoints import read_hf

CASES = [("1.0", True), ("1.1", False), ("1.1", True), ("1.0", False)]
ODD = dict(num_heads=3, d_kv=10)  # num_heads * d_kv != d_model


@pytest.mark.parametrize("version, tied", CASES)
def test_numpy_checkpoint_reads_as_its_config(version, tied, tmp_path):
  directory = ref._numpy_checkpoint(  # pylint: disable=protected-access
      tmp_path / "np", version=version, tied=tied, seed=0,
      sizes={**ref.TINY, **ODD})
  fields, flat = read_hf(directory)
  assert fields["tie_word_embeddings"] == tied
  assert fields["feed_forward_proj"] == (
      "gated-gelu" if version == "1.1" else "relu")
  assert (fields["num_heads"], fields["d_kv"]) == (3, 10)
  assert flat["encoder/layers_0/attention/query/kernel"].shape == (32, 30)


@pytest.mark.parametrize("version, tied", CASES)
def test_numpy_checkpoint_is_save_pretrained_layout(version, tied, tmp_path):
  ref.require_torch()
  numpy_dir = ref._numpy_checkpoint(  # pylint: disable=protected-access
      tmp_path / "np", version=version, tied=tied, seed=0,
      sizes={**ref.TINY, **ODD})
  torch_dir = ref.make_tiny_hf_checkpoint(tmp_path / "pt", version=version,
                                          tied=tied, **ODD)
  ours = load_file(str(numpy_dir / "model.safetensors"))
  theirs = load_file(str(torch_dir / "model.safetensors"))
  assert {n: t.shape for n, t in ours.items()} == {
      n: t.shape for n, t in theirs.items()}
  assert {t.dtype for t in ours.values()} == {t.dtype for t in theirs.values()}
  config = json.loads((torch_dir / "config.json").read_text())
  config.pop("transformers_version")
  assert json.loads((numpy_dir / "config.json").read_text()) == config
  ref.load_reference_model(numpy_dir)  # no missing or unexpected keys
