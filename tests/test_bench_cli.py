"""``jaxfid bench train|decode|memory`` through the command line (tiny model)."""
import json

import gin
import jax
import pytest

from jaxfid.fid import bench
from jaxfid import cli
from jaxfid.t5 import config as config_lib

TINY = ["--gin_file", "gin/fid/tiny.gin", "--gin.BATCH_SIZE=2",
        "--gin.N_CONTEXT=2", "--gin.TEXT_MAXLENGTH=16",
        "--gin.ANSWER_MAXLENGTH=4"]


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


def _run(capsys, argv) -> dict:
  assert cli.main(argv) == 0
  out = capsys.readouterr().out.strip().splitlines()
  return json.loads(out[-1])


# (mode, extra flags, PRNG implementation): the train bench also follows
# USE_HARDWARE_RNG (one tiny train bench for both checks)
@pytest.mark.parametrize("mode, extra, prng", [
    ("train", ["--gin.USE_HARDWARE_RNG=True"], "unsafe_rbg"),
    ("decode", [], "threefry2x32")])
def test_speed_modes_print_the_contract_fields(capsys, mode, extra, prng):
  r = _run(capsys, ["bench", mode, "--steps", "1", "--peak-tflops", "2.0"]
           + extra + TINY)
  for key in ("examples_per_sec", "step_time_s", "model_tflops_per_sec", "mfu",
              "peak_memory_gb", "device"):
    assert key in r
  assert r["mode"] == mode and r["steps"] == 1
  assert r["shape"] == {"batch_size": 2, "n_context": 2, "text_maxlength": 16,
                        "answer_maxlength": 4}
  assert r["step_time_s"] > 0
  assert r["examples_per_sec"] == pytest.approx(2 / r["step_time_s"])
  assert r["mfu"] == pytest.approx(r["model_tflops_per_sec"] / 2.0)
  assert r["peak_tflops_source"] == "given"
  assert r["prng_impl"] == prng


def test_memory_mode_counts_parameters_and_remat(capsys):
  full = _run(capsys, ["bench", "memory", "--gin.REMAT='full'"] + TINY)
  gin.clear_config()
  none = _run(capsys, ["bench", "memory", "--gin.REMAT='none'"] + TINY)
  cfg = config_lib.preset("tiny")
  n_params = sum(x.size for x in jax.tree.leaves(
      bench.EncoderDecoderModel(cfg).abstract_params()))
  for r in (full, none):
    assert r["params_gb"] == pytest.approx(4 * n_params / 1e9)
    assert r["optimizer_gb"] == pytest.approx(2 * r["params_gb"])
    assert r["lower_bound_gb"] == pytest.approx(
        r["params_gb"] + r["optimizer_gb"] + r["gradients_gb"]
        + r["saved_activations_gb"])
  assert full["remat"] == "full" and none["remat"] == "none"
  assert 0 < full["saved_activations_gb"] < none["saved_activations_gb"] / 2


def test_remat_keeps_a_fraction_of_the_activations():
  shape = bench.Shape(2, 4, 32, 4)
  saved = {r: bench.memory_estimate(
      config_lib.preset("tiny", num_layers=6, num_decoder_layers=6, remat=r),
      shape)["saved_activations_gb"] for r in ("none", "dots", "full")}
  assert saved["full"] < saved["dots"] < saved["none"]
  assert saved["full"] < saved["none"] / 4


def test_memory_estimate_scales_with_microbatch():
  cfg = config_lib.preset("tiny", remat="full")
  shape = bench.Shape(8, 2, 16, 4)
  whole = bench.memory_estimate(cfg, shape)
  micro = bench.memory_estimate(cfg, shape, accumulation_steps=4)
  quarter = bench.memory_estimate(cfg, bench.Shape(2, 2, 16, 4))
  assert micro["saved_activations_gb"] == pytest.approx(
      quarter["saved_activations_gb"])
  assert micro["saved_activations_gb"] < whole["saved_activations_gb"]
  assert micro["gradients_gb"] == pytest.approx(2 * whole["gradients_gb"])
  with pytest.raises(ValueError, match="does not split into 3"):
    bench.memory_estimate(cfg, shape, accumulation_steps=3)


def test_memory_mode_rejects_an_uneven_accumulation(capsys):
  assert cli.main(["bench", "memory", "--gin.ACCUMULATION_STEPS=3"]
                  + TINY) == 2
  err = capsys.readouterr().err.strip()
  assert "\n" not in err
  assert err == ("jaxfid bench: error: gin: BATCH_SIZE / ACCUMULATION_STEPS: "
                 "batch of 2 does not split into 3 microbatches")
