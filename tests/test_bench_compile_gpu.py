"""``jaxfid bench compile`` for NVIDIA GPUs, without a GPU.

The compiles use XLA's GPU compiler through JAX's CUDA plugin (the
``gpu-aot`` extra) on this CPU host, for one H100 described by the shipped
target config; they are marked ``gpu`` and skip where the plugin is not
installed. The names, the card table and the one-line errors need no
plugin.
"""
import json
import os
import subprocess
import sys

import gin
import pytest

from jaxfid import cli
from jaxfid.aot import gpus, topologies
from jaxfid.core.errors import InputError
from jaxfid.runtime import platforms
from test_bench_compile import TINY  # tiny.gin at 1+1 layers: seconds



@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


def _needs_plugin():
  if not gpus.plugin_available():
    pytest.skip("JAX's CUDA plugin is not installed (pip install -e "
                "'.[gpu-aot]')")


# ---- no plugin needed --------------------------------------------------------

def test_card_names_map_to_xla_topologies():
  expect = {"h100-8": ("1x1x8", 8, "h100"), "a100-8": ("1x1x8", 8, "a100"),
            "H200-8": ("1x1x8", 8, "h200"), "b200-4": ("1x1x4", 4, "b200"),
            "h100-1": ("1x1x1", 1, "h100")}
  for name, (xla, chips, card) in expect.items():
    t = topologies.parse(name)
    assert isinstance(t, gpus.GpuTopology), name
    assert (t.xla_topology, t.chips, t.chip.name) == (xla, chips, card), name
  two = topologies.parse("h100-8", slices=2)
  assert (two.xla_topology, two.chips) == ("2x1x8", 16)
  for bad in ("h100-0", "h100-9", "h100-16"):
    with pytest.raises(InputError, match="unknown GPU topology"):
      topologies.parse(bad)
  with pytest.raises(InputError, match="--slices: must be at least 1"):
    topologies.parse("h100-8", slices=0)
  assert topologies.parse("v5e-16").chips == 16  # TPU names are unchanged


def test_gpu_compiles_leave_triton_gemms_out_unless_the_user_says(
    monkeypatch):
  """Without the card XLA cannot autotune Triton's GEMM tiles (FiD-base's
  decoding failed to compile with them): GPU compiles use cuBLAS GEMMs,
  unless XLA_FLAGS names the option; other targets get no options."""
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  h100 = topologies.parse("h100-8")
  assert h100.compiler_options == {"xla_gpu_enable_triton_gemm": False}
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=true")
  assert h100.compiler_options is None
  assert getattr(topologies.parse("v5e-16"), "compiler_options", None) is None


def test_every_card_has_its_target_config():
  """Each card's target config names the card and its memory, the figure
  the report takes as the card's; the datasheets' peaks are dense bf16."""
  for card in gpus.CARDS.values():
    text = card.target_config()
    assert f'device_description_str: "{card.device_kind}"' in text
    assert f"device_memory_size: {card.memory_bytes}" in text
    assert "Apache License, Version 2.0" in text
    assert 1e14 < card.peak_bf16_flops < 3e15
    assert 1e12 < card.hbm_bytes_per_s < 1e13


def test_an_unknown_gpu_count_is_one_line(capsys):
  assert cli.main(["bench", "compile", "--topology", "h100-9", *TINY]) == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err.strip().splitlines() == [
      "jaxfid bench: error: --topology: unknown GPU topology 'h100-9': "
      f"expected {gpus.KNOWN_FORMS}"]
  assert cli.main(["bench", "compile", "--topology", "h900-8", *TINY]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and gpus.KNOWN_FORMS in err[0], err


def test_a_missing_cuda_plugin_is_one_line(capsys, monkeypatch):
  for module in gpus.PLUGIN_MODULES:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
  assert cli.main(["bench", "compile", "--topology", "h100-8", *TINY]) == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err.strip().splitlines() == [
      "jaxfid bench: error: --topology: compiling for a GPU needs JAX's CUDA "
      "plugin: pip install -e '.[gpu-aot]' (works on a CPU host)"]


# ---- compiled for H100s, without one ---------------------------------------

def _compile(capsys, *argv, topology="h100-1") -> dict:
  assert cli.main(["bench", "compile", "--in-process", "--topology",
                   topology, *TINY, *argv]) == 0
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.gpu
def test_a_tiny_fid_step_compiles_for_one_h100(capsys):
  """The report's fields for a GPU: memory from the compiler, FLOPs from
  the program (XLA:GPU without a device has no cost analysis), the
  roofline their compute time at the H100's dense bf16 peak."""
  _needs_plugin()
  r = _compile(capsys)
  card = gpus.CARDS["h100"]
  assert (r["topology"], r["chips"], r["device_kind"]) == (
      "h100-1", 1, "NVIDIA H100 80GB HBM3")
  assert r["hbm_gb_per_chip"] == pytest.approx(card.memory_bytes / 1e9)
  assert r["per_chip_gb"] == pytest.approx(
      r["argument_gb"] + r["output_gb"] - r["alias_gb"] + r["temp_gb"]
      + r["generated_code_gb"])
  assert 0 < r["per_chip_gb"] < 1 and r["fits"] and r["temp_gb"] > 0
  assert r["flops_source"] == "program"
  assert r["flops_per_chip"] == r["program_flops_per_chip"] > 0
  assert r["model_flops_per_chip"] > 0
  assert r["bytes_accessed_per_chip"] is None
  assert r["roofline_step_s"] == pytest.approx(
      r["program_flops_per_chip"] / card.peak_bf16_flops)
  assert r["examples_per_sec_at_roofline"] == pytest.approx(
      8 / r["roofline_step_s"])
  assert r["collectives"]["all-reduce"] == 0 and r["compile_s"] > 0


@pytest.mark.gpu
@pytest.mark.slow
def test_two_hosts_of_one_h100_all_reduce_the_gradients(capsys):
  _needs_plugin()
  r = _compile(capsys, "--slices", "2", "--gin.MESH='data=2'")
  assert (r["chips"], r["slices"], r["mesh"]["data"]) == (2, 2, 2)
  assert r["collectives"]["all-reduce"] > 0 and r["fits"]
  assert r["flops_per_chip"] == r["program_flops_per_chip"]


def test_this_cpu_host_stays_on_the_cpu_with_the_plugin():
  """With the CUDA plugin installed and no NVIDIA GPU, importing jaxfid
  leaves the plugin out of JAX's platforms (no cuInit traceback)."""
  _needs_plugin()
  if platforms.gpu_hints():
    pytest.skip("this host has an NVIDIA GPU")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  done = subprocess.run(
      [sys.executable, "-c", "import jaxfid, jax, os; "
       "print(os.environ['JAX_PLATFORMS'], jax.devices()[0].platform)"],
      env=env, capture_output=True, text=True, timeout=300, check=True)
  assert done.stdout.split() == ["cpu", "cpu"]
  assert done.stderr == "", done.stderr
