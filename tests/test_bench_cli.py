"""``jaxfid bench train|decode`` through the command line (tiny model)."""
import json

import gin
import pytest

from jaxfid import cli

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
