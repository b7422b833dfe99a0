"""benchmarks/gpu_step.py (what benchmarks/gpu.sh times on a GPU) runs on
the CPU: the train step as the loop jits it and the evaluation's decoding,
one JSON row each, on gin/fid/tiny.gin shrunk."""
from __future__ import annotations

import importlib.util
import json
import os

import gin
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--gin_file=gin/fid/tiny.gin", "--gin.config.T5Config.vocab_size=1024",
        "--gin.config.T5Config.num_layers=1",
        "--gin.config.T5Config.num_decoder_layers=1", "--gin.BATCH_SIZE=4",
        "--gin.N_CONTEXT=2", "--gin.TEXT_MAXLENGTH=16",
        "--gin.ANSWER_MAXLENGTH=4", "--gin.MESH='data=1'"]


def _script():
  spec = importlib.util.spec_from_file_location(
      "gpu_step", os.path.join(ROOT, "benchmarks", "gpu_step.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.slow
def test_train_and_decode_rows(tmp_path, capsys):
  script = _script()
  out = tmp_path / "rows.jsonl"
  assert script.main(["train", *TINY, "--steps", "2",
                      "--json-out", str(out)]) == 0
  gin.clear_config()
  train, = [json.loads(l) for l in out.read_text().splitlines()]
  assert train["program"] == "train" and train["batch_size"] == 4
  assert train["examples_per_sec"] == pytest.approx(
      4 / train["step_time_s"])
  assert train["model_tflops"] > 0 and train["loss"] > 0
  assert train["mfu"] is None  # a CPU has no card peak
  assert script.main(["decode", *TINY, "--steps", "1", "--batch-sizes",
                      "1,2"]) == 0
  gin.clear_config()
  rows = [json.loads(l) for l in capsys.readouterr().out.splitlines()
          if l.startswith("{")]
  assert [r["batch_size"] for r in rows if r["program"] == "decode"] == [1,
                                                                         2]
  for r in rows[-2:]:
    assert 1 <= r["tokens_decoded"] <= r["decode_maxlength"] == 4
