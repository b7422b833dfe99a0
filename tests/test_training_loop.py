"""The shared step-loop bookkeeping: non-finite policy and throughput."""
from __future__ import annotations

import pytest

from jaxfid.core.errors import InputError
from jaxfid.training.loop import NonFiniteLoss, StepLoop
from jaxfid.training.settings import Settings


def test_stop_raises_naming_the_step_and_skip_warns(capsys):
  loop = StepLoop(total=5, start=0, desc="t", progress=False, on_nan="stop")
  assert loop.finished_step(1, {"loss": 1.0, "finite": 1.0})["loss"] == 1.0
  with pytest.raises(NonFiniteLoss, match="non-finite loss nan at step 2"):
    loop.finished_step(2, {"loss": float("nan"), "finite": 0.0})
  skip = StepLoop(total=5, start=0, desc="t", progress=False, on_nan="skip")
  skip.finished_step(3, {"loss": float("inf"), "finite": 0.0})
  assert "warning: non-finite loss inf at step 3" in capsys.readouterr().err
  with pytest.raises(InputError, match="ON_NAN: must be one of 'stop', "
                     "'skip', got 'ignore'"):  # checked once, in the settings
    Settings(model_dir="run", train_steps=1, batch_size=1, on_nan="ignore")


def test_rate_counts_steps_since_the_last_call():
  loop = StepLoop(total=10, start=0, desc="t", progress=False, on_nan="stop")
  for s in range(1, 4):
    loop.finished_step(s, {"loss": 0.0, "finite": 1.0})
  first = loop.rate(batch_size=8)
  assert first > 0
  assert loop.rate(batch_size=8) == 0.0      # no step since
