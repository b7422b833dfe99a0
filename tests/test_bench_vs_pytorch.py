"""benchmarks/fid_vs_pytorch.py: the PyTorch FiD reference computes jaxfid's function; the script runs.

The reference (``benchmarks/torch_fid_reference.py``) must be FiD, not just
some T5: its loss and its greedy tokens on [B, P, L] passages equal jaxfid's
on the same weights (saved by transformers, loaded by jaxfid). The script is
then run end to end on a tiny model, both sides and each side alone.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.fid import bench
from jaxfid.t5 import decoding
from jaxfid.t5 import passages as fid
from jaxfid.t5.config import T5Config
from jaxfid.checkpoints.load import load_checkpoint

torch = pytest.importorskip("torch")  # the PyTorch reference (`torch` extra)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
  path = os.path.join(ROOT, "benchmarks", f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
ref = _load("torch_fid_reference")
script = _load("fid_vs_pytorch")

CFG = T5Config(vocab_size=120, d_model=32, d_kv=8, d_ff=64, num_heads=4,
               num_layers=2, num_decoder_layers=2, feed_forward_proj="relu",
               tie_word_embeddings=True, dropout_rate=0.0)


def test_reference_is_fid_and_matches_jaxfid(tmp_path):
  shape = bench.Shape(batch_size=2, n_context=3, text_maxlength=6,
                      answer_maxlength=5)
  batch = bench.synthetic_batch(CFG, shape, seed=1)
  batch["encoder_input_tokens"][1, 2, 3:] = 0  # a shorter passage
  model = ref.build(CFG, seed=0).eval()
  model.t5.save_pretrained(tmp_path)
  jmodel, params, _ = load_checkpoint(str(tmp_path))
  inputs = ref._to_torch(batch)
  with torch.no_grad():
    torch_loss = float(model(**inputs))
  jax_loss, _ = jmodel.loss(params, jax.tree.map(jnp.asarray, batch))
  np.testing.assert_allclose(torch_loss, float(jax_loss), rtol=1e-4)
  # FiD, not T5 over the concatenation: passages are encoded alone, so a
  # passage's hidden states do not depend on the other passages.
  hidden, _ = model.encode(inputs["input_ids"], inputs["attention_mask"])
  alone, _ = model.encode(inputs["input_ids"][:, :1], inputs["attention_mask"][:, :1])
  torch.testing.assert_close(hidden[:, :6], alone, rtol=1e-5, atol=1e-5)

  torch_tokens = model.generate(inputs["input_ids"], inputs["attention_mask"],
                                shape.answer_maxlength)[:, 1:].numpy()
  net = jmodel.network(params)
  enc = fid.encode_passages(net, jnp.asarray(batch["encoder_input_tokens"]))
  cache = net.init_cache(enc.hidden, enc.mask, shape.answer_maxlength)
  jax_tokens, _ = decoding.greedy_decode(
      lambda s: net.decode_step(s.cur_token, s.cache, s.cur_index), cache,
      batch_size=2, max_decode_len=shape.answer_maxlength, eos_id=-1)
  assert torch_tokens.shape == (2, shape.answer_maxlength)
  np.testing.assert_array_equal(torch_tokens, np.asarray(jax_tokens))


def test_sdpa_is_what_the_reference_uses():
  model = ref.build(CFG)
  assert model.t5.config._attn_implementation == "sdpa"


TINY_ARGS = ["--size", "tiny", "--batch-size", "2", "--n-context", "2",
             "--text-maxlength", "8", "--answer-maxlength", "3",
             "--decode-batch-sizes", "2", "--steps", "1", "--dtype", "float32"]


def _last_json(capsys):
  out = capsys.readouterr().out
  assert "| row | batch |" in out
  return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # the script runs fast in test_script_logs_each_row_as_it_finishes; the reference's parity in test_reference_is_fid_and_matches_jaxfid
def test_script_both_sides_decode_with_fido(capsys, tmp_path):
  out_file = tmp_path / "r.json"
  assert script.main(TINY_ARGS + ["--skip-train", "--fido-period", "2",
                                  "--fido-mq", "--json-out", str(out_file)]) == 0
  result = _last_json(capsys)
  assert json.loads(out_file.read_text()) == result
  names = [r["name"] for r in result["rows"]]
  assert names == ["jaxfid FiDO LSA-2+MQ decode", "jaxfid decode", "torch decode"]
  rows = {r["name"]: r for r in result["rows"]}
  torch_eps = rows["torch decode"]["examples_per_sec"]
  for name in names:
    r = rows[name]
    assert r["step_time_s"] > 0 and r["batch_size"] == 2
    assert r["vs_torch"] == pytest.approx(r["examples_per_sec"] / torch_eps)
    assert r["model_tflops_per_sec"] == pytest.approx(
        r["mfu"] * result["peak_tflops"])
  # Each row uses its own model's FLOPs: FiDO's are fewer.
  assert (rows["jaxfid FiDO LSA-2+MQ decode"]["model_tflops_per_sec"]
          * rows["jaxfid FiDO LSA-2+MQ decode"]["step_time_s"]
          < rows["jaxfid decode"]["model_tflops_per_sec"]
          * rows["jaxfid decode"]["step_time_s"])
  assert result["ratios"]["jaxfid_decode_b2_vs_torch"] == rows["jaxfid decode"]["vs_torch"]


@pytest.mark.slow  # as above
def test_script_torch_only_trains(capsys):
  assert script.main(TINY_ARGS + ["--skip-jax"]) == 0
  result = _last_json(capsys)
  rows = {r["name"]: r for r in result["rows"]}
  assert set(rows) == {"torch train", "torch decode"}
  assert np.isfinite(rows["torch train"]["loss"])
  assert rows["torch train"]["vs_torch"] == 1.0
  assert rows["torch train"]["vs_torch_compile"] is None
  assert result["ratios"] == {}


@pytest.mark.slow
def test_script_times_each_remat_policy(capsys):
  assert script.main(TINY_ARGS + ["--skip-torch", "--remat", "full,dots,full",
                                  "--decode-batch-sizes", "1",
                                  "--hardware-rng", "--scan-layers"]) == 0
  out = capsys.readouterr().out
  result = json.loads(out.strip().splitlines()[-1])
  trains = {r["name"]: r for r in result["rows"] if r["mode"] == "train"}
  assert set(trains) == {"jaxfid train", "jaxfid remat-dots train",
                         "jaxfid remat-dots hardware-rng train"}
  assert trains["jaxfid train"]["remat"] == "full"
  assert trains["jaxfid remat-dots train"]["remat"] == "dots"
  assert {n: r["hardware_rng"] for n, r in trains.items()} == {
      "jaxfid train": False, "jaxfid remat-dots train": False,
      "jaxfid remat-dots hardware-rng train": True}
  assert trains["jaxfid remat-dots hardware-rng train"]["remat"] == "dots"
  assert result["args"]["remat"] == ["full", "dots"]
  assert all(r["scan_layers"] for r in trains.values())


def test_script_rejects_an_unknown_remat(capsys):
  with pytest.raises(SystemExit):
    script.main(TINY_ARGS + ["--remat", "full,some"])
  assert "--remat must list none, full or dots" in capsys.readouterr().err


def test_script_logs_each_row_as_it_finishes(capsys):
  assert script.main(TINY_ARGS + ["--skip-torch", "--skip-train"]) == 0
  err = capsys.readouterr().err
  assert "  -> jaxfid decode b=2: " in err and "examples/s" in err
