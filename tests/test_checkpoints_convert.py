"""`jaxfid convert` round trips and its one-line errors."""
import numpy as np
import pytest

from hf_reference import (load_reference_model, make_fid_wrapper_checkpoint,
                          make_tiny_hf_checkpoint, random_inputs,
                          reference_logits, torch)
from jaxfid import cli
from jaxfid.checkpoints import (detect_format, load_flat, read_hf,
                                register_loader)
from jaxfid.checkpoints.t5x import read_t5x


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  directory = make_tiny_hf_checkpoint(tmp_path_factory.mktemp("src") / "hf",
                                      version="1.1", num_heads=3)
  (directory / "spiece.model").write_bytes(b"sentencepiece stand-in")
  return directory


def _same(a, b):
  assert set(a) == set(b)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_hf_to_t5x_to_hf(hf_dir, tmp_path, capsys):
  fields, flat = read_hf(hf_dir)
  assert cli.main(["convert", "--from", str(hf_dir), "--to",
                   str(tmp_path / "t5x"), "--to-format", "t5x",
                   "--step", "42"]) == 0
  line = capsys.readouterr().out.strip()
  assert "\n" not in line
  assert line.startswith(f"converted hf checkpoint {hf_dir} -> t5x ")
  assert "checkpoint_42" in line and "gated-gelu" in line
  t5x_fields, t5x_flat = read_t5x(tmp_path / "t5x")
  assert t5x_fields == fields
  _same(flat, t5x_flat)
  assert cli.main(["convert", "--from", str(tmp_path / "t5x"), "--to",
                   str(tmp_path / "back"), "--spiece",
                   str(hf_dir / "spiece.model")]) == 0
  assert "converted t5x checkpoint" in capsys.readouterr().out
  back_fields, back = read_hf(tmp_path / "back")
  assert back_fields == fields
  _same(flat, back)
  assert (tmp_path / "back" / "spiece.model").read_bytes() == (
      b"sentencepiece stand-in")
  if torch is not None:  # and the PyTorch reference computes the same
    inputs = random_inputs(fields["vocab_size"])
    np.testing.assert_array_equal(
        reference_logits(load_reference_model(tmp_path / "back"), *inputs),
        reference_logits(load_reference_model(hf_dir), *inputs))


def test_fid_to_hf(hf_dir, tmp_path, capsys):
  fid = make_fid_wrapper_checkpoint(hf_dir, tmp_path / "fid",
                                    use_checkpoint=True)
  assert detect_format(fid) == "fid"
  assert cli.main(["convert", "--from", str(fid), "--to",
                   str(tmp_path / "hf")]) == 0
  assert capsys.readouterr().out.startswith("converted fid checkpoint")
  _same(read_hf(hf_dir)[1], read_hf(tmp_path / "hf")[1])
  assert not (tmp_path / "hf" / "spiece.model").exists()


def test_hf_copy_keeps_spiece(hf_dir, tmp_path):
  assert cli.main(["convert", "--from", str(hf_dir), "--to",
                   str(tmp_path / "out")]) == 0
  assert (tmp_path / "out" / "spiece.model").is_file()
  assert load_flat(tmp_path / "out")[2] == tmp_path / "out" / "spiece.model"


@pytest.mark.parametrize("case", ["exists", "no-config", "nothing", "unknown"])
def test_errors_are_one_line_exit_2(case, hf_dir, tmp_path, capsys):
  source, dest = hf_dir, tmp_path / "out"
  if case == "exists":
    dest.mkdir()
    (dest / "keep.txt").write_text("x")
    expect = f"{dest}: already exists and is not empty"
  elif case == "no-config":
    source = tmp_path / "src"
    source.mkdir()
    (source / "model.safetensors").write_bytes(
        (hf_dir / "model.safetensors").read_bytes())
    expect = f"{source / 'config.json'}: missing"
  elif case == "nothing":
    source = tmp_path / "missing"
    expect = f"{source}: does not exist"
  else:
    source = tmp_path / "src"
    source.mkdir()
    (source / "notes.txt").write_text("x")
    expect = f"{source}: not a recognised checkpoint"
  assert cli.main(["convert", "--from", str(source), "--to", str(dest)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1
  assert err.startswith(f"jaxfid convert: error: {expect}"), err
  if case == "exists":
    assert sorted(p.name for p in dest.iterdir()) == ["keep.txt"]
  else:
    assert not dest.exists()


def test_jaxfid_dirs_use_the_registered_loader(hf_dir, tmp_path, capsys):
  model_dir = tmp_path / "jaxfid_model"
  model_dir.mkdir()
  (model_dir / "jaxfid_config.json").write_text("{}")
  assert detect_format(model_dir) == "jaxfid"
  from jaxfid.checkpoints import detect
  loaders = detect._LOADERS  # pylint: disable=protected-access
  saved = loaders.pop("jaxfid", None)
  try:
    assert cli.main(["convert", "--from", str(model_dir), "--to",
                     str(tmp_path / "out")]) == 2
    assert "no loader is registered" in capsys.readouterr().err
    fields, flat = read_hf(hf_dir)
    register_loader("jaxfid", lambda path: (fields, flat, None))
    assert cli.main(["convert", "--from", str(model_dir), "--to",
                     str(tmp_path / "out")]) == 0
    _same(flat, read_hf(tmp_path / "out")[1])
  finally:
    if saved is None:
      loaders.pop("jaxfid", None)
    else:
      register_loader("jaxfid", saved)
  with pytest.raises(ValueError, match="unknown checkpoint format"):
    register_loader("gguf", lambda path: None)
