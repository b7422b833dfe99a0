"""HF and original-FiD checkpoints against transformers' own T5.

Every layout of one random model (safetensors, sharded safetensors,
pytorch_model.bin, sharded .bin, the FiD wrapper with and without its
checkpoint wrapper) must load to the same jaxfid parameters, and those must be
the torch model's weights; ``write_hf`` output must load in transformers to
the identical state dict and identical logits.
"""
import json
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

# torch, transformers: None without PyTorch; the tests that compare with the
# reference skip then (require_torch, or the helpers themselves).
from hf_reference import (load_reference_model, make_fid_wrapper_checkpoint,
                          make_tiny_hf_checkpoint, random_inputs,
                          reference_logits, require_torch, torch,
                          transformers, write_torch_bin)
from jaxfid.checkpoints import detect_format, names, read_hf, write_hf
from jaxfid.checkpoints.load import inference_config
from jaxfid.core.errors import InputError
from jaxfid.t5.config import T5Config


@pytest.fixture(scope="module")
def v11(tmp_path_factory):
  # num_heads * d_kv (24) != d_model (32); untied with its own lm_head.
  return make_tiny_hf_checkpoint(tmp_path_factory.mktemp("v11") / "hf",
                                 version="1.1", num_heads=3)


@pytest.fixture(scope="module")
def v10(tmp_path_factory):
  return make_tiny_hf_checkpoint(tmp_path_factory.mktemp("v10") / "hf",
                                 version="1.0", seed=1)


def _assert_same_params(a, b):
  assert set(a) == set(b)
  for name in a:
    assert a[name].dtype == np.float32 and b[name].dtype == np.float32
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_untied_reference_has_its_own_lm_head(v11, v10):
  model = load_reference_model(v11)
  assert not torch.equal(model.lm_head.weight, model.shared.weight)
  assert not model.config.scale_decoder_outputs
  tied = load_reference_model(v10)
  assert tied.lm_head.weight.data_ptr() == tied.shared.weight.data_ptr()
  assert tied.config.scale_decoder_outputs


@pytest.mark.parametrize("which", ["v11", "v10"])
def test_read_hf_gives_the_torch_weights(which, request):
  directory = request.getfixturevalue(which)
  fields, flat = read_hf(directory)
  model = load_reference_model(directory)
  state = {n: t.numpy() for n, t in model.state_dict().items()}
  cfg = model.config
  assert fields["d_model"] == cfg.d_model and fields["d_kv"] == cfg.d_kv
  assert fields["num_heads"] == cfg.num_heads
  assert fields["num_decoder_layers"] == cfg.num_decoder_layers == 3
  assert fields["tie_word_embeddings"] == (which == "v10")
  assert fields["feed_forward_proj"] == (
      "relu" if which == "v10" else "gated-gelu")
  assert set(flat) == set(names.param_shapes(fields))
  for rename in names.renames(fields):
    np.testing.assert_array_equal(flat[rename.path], state[rename.hf].T
                                  if rename.transpose else state[rename.hf])
  rel = flat["encoder/relpos_bias/rel_embedding"]
  assert rel.shape == (cfg.num_heads, 32)
  assert flat["encoder/layers_0/attention/query/kernel"].shape == (
      32, 24 if which == "v11" else 32)
  assert detect_format(directory) == "hf"


def test_all_layouts_load_to_the_same_parameters(v11, v10, tmp_path, caplog):
  for name, directory in (("v11", v11), ("v10", v10)):
    fields, flat = read_hf(directory)
    model_dir = tmp_path / name
    layouts = {
        "sharded": make_tiny_hf_checkpoint(
            model_dir / "sharded", version="1.1" if name == "v11" else "1.0",
            seed=0 if name == "v11" else 1, max_shard_size="20KB",
            **({"num_heads": 3} if name == "v11" else {})),
        "bin": write_torch_bin(directory, model_dir / "bin"),
        "bin-sharded": write_torch_bin(directory, model_dir / "bin3",
                                       shards=3),
        "fid": make_fid_wrapper_checkpoint(directory, model_dir / "fid"),
        "fid-checkpoint": make_fid_wrapper_checkpoint(
            directory, model_dir / "fidc", use_checkpoint=True),
    }
    assert (layouts["sharded"] / "model.safetensors.index.json").is_file()
    assert (layouts["bin-sharded"] / "pytorch_model.bin.index.json").is_file()
    for layout, path in layouts.items():
      caplog.clear()
      other_fields, other = read_hf(path)
      assert other_fields == fields, layout
      # the FiD readers' cross-attention position table is dropped, loudly
      assert ("EncDecAttention.relative_attention_bias" in caplog.text) == (
          layout.startswith("fid")), layout
      _assert_same_params(flat, other)
      assert detect_format(path) == ("fid" if layout.startswith("fid")
                                     else "hf")


@pytest.mark.parametrize("which", ["v11", "v10"])
def test_write_hf_loads_in_transformers_identically(which, request, tmp_path):
  directory = request.getfixturevalue(which)
  fields, flat = read_hf(directory)
  original = load_reference_model(directory)
  inputs = random_inputs(fields["vocab_size"])
  expected = reference_logits(original, *inputs)
  for shard_bytes in (5 * 1024**3, 30_000):
    out = tmp_path / f"out{shard_bytes}"
    write_hf(out, fields, flat, max_shard_bytes=shard_bytes)
    assert (out / "model.safetensors.index.json").is_file() == (
        shard_bytes < 1e6)
    loaded = load_reference_model(out)  # no missing / unexpected keys
    a, b = original.state_dict(), loaded.state_dict()
    assert set(a) == set(b)
    for key in a:
      assert torch.equal(a[key], b[key]), key
    assert loaded.config.scale_decoder_outputs == (which == "v10")
    np.testing.assert_array_equal(reference_logits(loaded, *inputs), expected)
    again_fields, again = read_hf(out)
    assert again_fields == fields
    _assert_same_params(flat, again)
  if which == "v10":
    assert not torch.equal(original.lm_head.weight,
                           torch.zeros_like(original.lm_head.weight))
    stored = load_file(str(tmp_path / f"out{5 * 1024**3}/model.safetensors"))
    assert "lm_head.weight" not in stored  # tied: transformers ties it


def test_write_hf_copies_spiece_and_is_atomic(v10, tmp_path):
  fields, flat = read_hf(v10)
  spiece = tmp_path / "vocab.model"
  spiece.write_bytes(b"not really sentencepiece")
  out = tmp_path / "out"
  write_hf(out, fields, flat, spiece)
  assert (out / "spiece.model").read_bytes() == spiece.read_bytes()
  with pytest.raises(InputError, match="already exists and is not empty"):
    write_hf(out, fields, flat)
  broken = dict(flat)
  del broken["decoder/decoder_norm/scale"]
  with pytest.raises(ValueError, match="decoder/decoder_norm/scale"):
    write_hf(tmp_path / "broken", fields, broken)
  assert not (tmp_path / "broken").exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "vocab.model"]
  write_hf(out, fields, flat, overwrite=True)
  assert not (out / "spiece.model").exists()


def test_unscaled_model_without_lm_head(tmp_path):
  """transformers 5 saves tie_word_embeddings=False models with shared only."""
  require_torch()
  config = transformers.T5Config(
      vocab_size=96, d_model=16, d_kv=4, num_heads=2, d_ff=24, num_layers=1,
      num_decoder_layers=1, feed_forward_proj="gated-gelu",
      tie_word_embeddings=False, decoder_start_token_id=0)
  torch.manual_seed(3)
  model = transformers.T5ForConditionalGeneration(config).eval()
  model.save_pretrained(tmp_path / "hf")
  assert "lm_head.weight" not in load_file(str(tmp_path / "hf" /
                                               "model.safetensors"))
  fields, flat = read_hf(tmp_path / "hf")
  assert fields["tie_word_embeddings"] is False
  np.testing.assert_array_equal(flat["decoder/logits_dense/kernel"],
                                flat["token_embedder/embedding"].T)
  write_hf(tmp_path / "out", fields, flat)
  inputs = random_inputs(96, seed=4)
  np.testing.assert_array_equal(
      reference_logits(load_reference_model(tmp_path / "out"), *inputs),
      reference_logits(model, *inputs))


def test_scaled_model_with_distinct_lm_head_folds_the_scale(v10, tmp_path):
  directory = tmp_path / "hf"
  shutil.copytree(v10, directory)
  tensors = load_file(str(directory / "model.safetensors"))
  rng = np.random.default_rng(0)
  tensors["lm_head.weight"] = rng.normal(
      size=tensors["shared.weight"].shape).astype(np.float32)
  save_file(tensors, str(directory / "model.safetensors"),
            metadata={"format": "pt"})
  fields, flat = read_hf(directory)
  assert fields["tie_word_embeddings"] is False
  np.testing.assert_allclose(flat["decoder/logits_dense/kernel"],
                             tensors["lm_head.weight"].T * 32**-0.5,
                             rtol=1e-6)
  write_hf(tmp_path / "out", fields, flat)
  inputs = random_inputs(fields["vocab_size"], seed=5)
  np.testing.assert_allclose(
      reference_logits(load_reference_model(tmp_path / "out"), *inputs),
      reference_logits(load_reference_model(directory), *inputs),
      rtol=1e-5, atol=1e-5)


def test_bfloat16_safetensors(v11, tmp_path):
  """A bfloat16 checkpoint (BF16 in the safetensors header, as torch writes
  it; written here from numpy, so the test needs no PyTorch) reads as the
  float32 of its bfloat16 values."""
  directory = tmp_path / "bf16"
  shutil.copytree(v11, directory)
  weights = directory / "model.safetensors"
  tensors = load_file(str(weights))
  save_file({n: t.astype(ml_dtypes.bfloat16) for n, t in tensors.items()},
            str(weights), metadata={"format": "pt"})
  with open(weights, "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
  assert {v["dtype"] for n, v in header.items() if n != "__metadata__"} == {
      "BF16"}
  _, flat = read_hf(directory)
  q = tensors["encoder.block.0.layer.0.SelfAttention.q.weight"]
  bf16 = q.astype(ml_dtypes.bfloat16).astype(np.float32)
  assert not np.array_equal(bf16, q)  # the values did lose precision
  np.testing.assert_array_equal(flat["encoder/layers_0/attention/query/kernel"],
                                bf16.T)
  assert flat["encoder/layers_0/attention/query/kernel"].dtype == np.float32


def _one_line(error: InputError) -> str:
  text = str(error)
  assert "\n" not in text
  return text


def _rewrite(directory, change):
  file = directory / "model.safetensors"
  tensors = load_file(str(file))
  change(tensors)
  save_file(tensors, str(file), metadata={"format": "pt"})


Q0 = "encoder.block.0.layer.0.SelfAttention.q.weight"


@pytest.mark.parametrize("case", ["missing", "shape", "unexpected", "copy",
                                  "no-config", "bad-json", "no-weights",
                                  "truncated", "bin-missing", "fid-missing",
                                  "shard-missing"])
def test_bad_checkpoints(case, v10, tmp_path):
  directory = tmp_path / "hf"
  shutil.copytree(v10, directory)
  weights = directory / "model.safetensors"
  expect = [str(weights)]
  if case == "missing":
    _rewrite(directory, lambda t: t.pop(Q0))
    expect += [f"missing tensor {Q0}"]
  elif case == "shape":
    _rewrite(directory, lambda t: t.update({Q0: t[Q0][:, :-1].copy()}))
    expect += [f"tensor {Q0} has shape [32, 31], expected [32, 32]"]
  elif case == "unexpected":
    _rewrite(directory, lambda t: t.update(
        {"encoder.block.0.layer.0.SelfAttention.q.bias": np.zeros(32,
                                                                  np.float32)}))
    expect += ["unexpected tensor encoder.block.0.layer.0.SelfAttention.q.bias"]
  elif case == "copy":
    _rewrite(directory, lambda t: t.update(
        {"decoder.embed_tokens.weight": t["shared.weight"] + 1}))
    expect += ["decoder.embed_tokens.weight differs from shared.weight"]
  elif case == "no-config":
    (directory / "config.json").unlink()
    expect = [str(directory / "config.json"), "missing"]
  elif case == "bad-json":
    (directory / "config.json").write_text('{\n  "d_model": 32,\n  oops\n}')
    expect = [f"{directory / 'config.json'}:3: invalid JSON"]
  elif case == "no-weights":
    weights.unlink()
    expect = [str(directory), "no weights"]
  elif case == "truncated":
    weights.write_bytes(weights.read_bytes()[:-100])
    expect += ["truncated"]
  elif case == "bin-missing":
    bin_dir = write_torch_bin(v10, tmp_path / "bin")
    state = torch.load(bin_dir / "pytorch_model.bin", weights_only=True)
    del state["decoder.final_layer_norm.weight"]
    torch.save(state, bin_dir / "pytorch_model.bin")
    directory = bin_dir
    expect = [str(bin_dir / "pytorch_model.bin"),
              "missing tensor decoder.final_layer_norm.weight"]
  elif case == "fid-missing":
    fid = make_fid_wrapper_checkpoint(v10, tmp_path / "fid",
                                      use_checkpoint=True)
    state = torch.load(fid / "pytorch_model.bin", weights_only=True)
    name = "encoder.encoder.block.1.module.layer.1.layer_norm.weight"
    del state[name]
    torch.save(state, fid / "pytorch_model.bin")
    directory = fid
    expect = [str(fid / "pytorch_model.bin"), "missing tensor "
              "encoder.encoder.block.1.layer.1.layer_norm.weight"]
  elif case == "shard-missing":
    sharded = make_tiny_hf_checkpoint(tmp_path / "sharded", version="1.0",
                                      max_shard_size="20KB")
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    shard.unlink()
    directory = sharded
    expect = [str(shard), "is missing"]
  with pytest.raises(InputError) as e:
    read_hf(directory)
  text = _one_line(e.value)
  for part in expect:
    assert part in text, (part, text)
  assert text.startswith(expect[0])


def test_not_a_directory(tmp_path):
  with pytest.raises(InputError, match="not a directory"):
    read_hf(tmp_path / "nothing")
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
  with pytest.raises(InputError, match="no weights"):
    read_hf(tmp_path)


def test_a_loaded_model_runs_the_attention_its_platform_takes():
  """A run trained with ATTENTION='pallas' (a TPU's kernel) is loaded for
  inference with 'auto', so predicting on another platform does not run the
  kernel in Pallas' interpreter; dropout is off and dtype is the caller's."""
  trained = T5Config(attention="pallas", dropout_rate=0.1).to_dict()
  config = inference_config(trained, "bfloat16")
  assert (config.attention, config.dropout_rate, config.dtype) == (
      "auto", 0.0, "bfloat16")
  assert inference_config(trained).dtype == trained["dtype"]
