"""benchmarks/compile_time.py, cpu_malloc.py and atlas_index_vs_faiss.py run
and report what they say."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--size", "tiny", "--batch-size", "2", "--n-context", "2",
        "--text-maxlength", "16", "--answer-maxlength", "4"]


def _load(name):
  path = os.path.join(ROOT, "benchmarks", f"{name}.py")
  sys.path.insert(0, os.path.dirname(path))
  spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _last_json(capsys) -> dict:
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow  # a benchmark script, not a package module: the long tier
def test_compile_time_times_both_layouts_and_compiles_only_at_zero_steps(
    capsys):
  script = _load("compile_time")
  assert script.main(TINY + ["--decode-batch-size", "2", "--steps", "1"]) == 0
  rows = _last_json(capsys)["rows"]
  assert [(r["mode"], r["layers"]) for r in rows] == [
      ("train", "unrolled"), ("train", "scanned"),
      ("decode", "unrolled"), ("decode", "scanned")]
  for r in rows:
    assert r["compile_s"] > 0 and r["step_time_s"] > 0 and r["fused_kernels"]
  assert rows[1]["fused_kernels"] < rows[0]["fused_kernels"]
  assert script.main(TINY + ["--steps", "0"]) == 0
  result = _last_json(capsys)
  assert all(r["step_time_s"] is None for r in result["rows"])
  assert result["hardware"]["cpu_malloc"] == "imported, not run as a script"


@pytest.mark.slow
def test_cpu_malloc_runs_each_setting_in_its_own_process(capsys):
  script = _load("cpu_malloc")
  assert script.main(TINY + ["--warmup", "1", "--steps", "2",
                             "--rounds", "1"]) == 0
  rows = {r["malloc"]: r for r in _last_json(capsys)["rows"]}
  assert set(rows) == {"tuned", "glibc defaults"}
  assert rows["glibc defaults"]["decided"] == "JAXFID_CPU_MALLOC turns it off"
  assert rows["tuned"]["decided"] in ("applied", "not glibc")  # not: conftest's 0
  for r in rows.values():
    assert r["wall_ms"] > 0 and r["max_rss_gb"] > 0


@pytest.mark.slow
def test_atlas_index_vs_faiss_shards_and_finds_faiss_hits(capsys):
  script = _load("atlas_index_vs_faiss")
  assert script.main(["--vectors", "1000", "--dim", "16", "--queries", "8",
                      "--clusters", "10", "--top-k", "5", "--query-batch",
                      "4", "--devices", "1,4", "--dtypes", "float32,int8",
                      "--faiss-threads", "1", "--passes", "1"]) == 0
  rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert [(r["system"], r["devices"], r["dtype"]) for r in rows] == [
      ("faiss", 1, "float32"), ("jaxfid", 1, "float32"),
      ("jaxfid", 4, "float32"), ("jaxfid", 1, "int8"), ("jaxfid", 4, "int8")]
  by = {(r["devices"], r["dtype"]): r for r in rows[1:]}
  assert rows[0]["bytes_per_device"] == 1000 * 16 * 4
  assert by[(1, "float32")]["same_as_faiss"] == 1.0  # the exact top k
  assert by[(4, "float32")]["bytes_per_device"] == 250 * 16 * 4
  assert by[(4, "int8")]["bytes_per_device"] == 250 * (16 + 4)
  assert by[(4, "int8")]["same_as_faiss"] > 0.8
