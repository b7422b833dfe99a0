"""The one loop's guarantees on a toy task (no T5): every method inherits them.

A linear model ``y = x @ w`` trained by the loop of
:mod:`jaxfid.training.loop`: resume is step-for-step, SIGTERM saves and
stops, a non-finite loss stops without a checkpoint, gradient accumulation is
exact, phases restore into their own state, a finished run is not redone.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.core import sharding as shd
from jaxfid.core.errors import InputError
from jaxfid.training import loop as loop_lib
from jaxfid.training.settings import OptimizerSettings, Settings
from jaxfid.training.step import make_train_step
from jaxfid.training.task import Phase, Prepared, Task, train_state

D = 4


class Linear:
  """The smallest model the loop accepts."""

  def init_params(self, seed: int = 0):
    return {"w": jax.random.normal(jax.random.key(seed), (D, 1)) * 0.1}

  def abstract_params(self):
    return jax.eval_shape(self.init_params)

  def param_axes(self):
    return {"w": (shd.EMBED, None)}

  def loss(self, params, batch, rng=None, normalizer=None):
    err = batch["x"] @ params["w"] - batch["y"]                 # [B, 1]
    loss = jnp.sum(err ** 2) / normalizer
    return loss, {"loss": loss}


class ToyTask(Task):
  name = "toy"

  def __init__(self, *, phases: int = 1, nan_at: int | None = None,
               sigterm_after: int | None = None, done: dict | None = None,
               fixed: bool = False):
    self.n_phases, self.nan_at, self.fixed = phases, nan_at, fixed
    self.sigterm_after, self.done = sigterm_after, done
    rng = np.random.default_rng(0)
    self.x = rng.normal(size=(64, D)).astype(np.float32)
    self.y = (self.x @ np.arange(1, D + 1, dtype=np.float32)[:, None])

  def prepare(self, settings):
    return Prepared(settings=settings, model=Linear())

  def run_config(self, p):
    return {"method": self.name}

  def phases(self, p, optimizer):
    settings, model = p.settings, p.model
    schedule = optimizer.schedule_fn(settings.train_steps)
    tx = optimizer.make(schedule)
    step = make_train_step(
        lambda params, b, rng, norm: model.loss(params, b, rng, norm), tx,
        seed=settings.seed, accumulation_steps=settings.accumulation_steps,
        normalizer=lambda b: jnp.float32(b["x"].shape[0]))
    make = lambda p, s: train_state(p, s, opt_state=tx.init(p))
    n = settings.train_steps
    if self.n_phases == 1:
      return [Phase("train", n, make, step, schedule)]
    return [Phase("one", n, make, step, schedule),
            Phase("two", 2 * n, make, step, schedule, fresh_params="initial")]

  def batch(self, p, step, rows, params):
    b = p.settings.batch_size
    idx = (np.arange(b) + (0 if self.fixed else step * b)) % len(self.x)
    x = self.x[idx][rows].copy()
    if self.nan_at is not None and step + 1 == self.nan_at:
      x[0, 0] = np.nan
    return {"x": x, "y": self.y[idx][rows]}

  def after_step(self, p, ctx, step, state):
    if self.sigterm_after == step:
      os.kill(os.getpid(), signal.SIGTERM)

  def completed(self, ctx, final_step):
    return self.done


def _train(model_dir, task=None, steps=6, **kw):
  """The loop on ``task``; ``kw`` are Settings or OptimizerSettings fields."""
  args = dict(model_dir=str(model_dir), train_steps=steps, batch_size=8,
              learning_rate=0.05, checkpoint_every=2, log_every=1,
              mesh="data=2", progress=False)
  args.update(kw)
  optimizer = {f.name: args.pop(f.name)
               for f in dataclasses.fields(OptimizerSettings) if f.name in args}
  return loop_lib.train(task=task or ToyTask(), settings=Settings(**args),
                        optimizer=OptimizerSettings(**optimizer))


def _losses(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  d = tmp_path_factory.mktemp("loop") / "whole"
  _train(d)
  return d


def test_resume_is_step_for_step(whole, tmp_path):
  _train(tmp_path / "cut", steps=3)
  result = _train(tmp_path / "cut")
  assert result["step"] == 6
  assert _losses(tmp_path / "cut") == pytest.approx(_losses(whole), rel=1e-6)
  assert sorted(_losses(tmp_path / "cut")) == [1, 2, 3, 4, 5, 6]


def test_sigterm_saves_the_step_and_stops(whole, tmp_path):
  # The signal arrives after step 3: step 4 finishes, is saved, the run stops.
  result = _train(tmp_path / "t", task=ToyTask(sigterm_after=3))
  assert result["preempted"] and result["step"] == 4
  assert sorted(os.listdir(tmp_path / "t" / "checkpoints"))[-1] == "4"
  _train(tmp_path / "t")
  assert _losses(tmp_path / "t") == pytest.approx(_losses(whole), rel=1e-6)


def test_non_finite_loss_stops_without_a_later_checkpoint(tmp_path):
  with pytest.raises(loop_lib.NonFiniteLoss, match="at step 3"):
    _train(tmp_path / "n", task=ToyTask(nan_at=3))
  assert sorted(int(s) for s in os.listdir(tmp_path / "n" / "checkpoints")) == [2]
  result = _train(tmp_path / "s", task=ToyTask(nan_at=3), on_nan="skip")
  assert result["step"] == 6


def test_accumulation_is_exact(whole, tmp_path):
  _train(tmp_path / "a", accumulation_steps=2)
  assert _losses(tmp_path / "a") == pytest.approx(_losses(whole), rel=1e-5)


def test_phases_restore_into_their_own_state(tmp_path):
  two = lambda: ToyTask(phases=2, fixed=True)
  _train(tmp_path / "w", task=two(), steps=3)
  # Resume inside the second phase (step 4 of 6) and at its start (step 3).
  for cut in (4, 3):
    d = tmp_path / f"c{cut}"
    _train(d, task=ToyTask(phases=2, fixed=True, sigterm_after=cut), steps=3,
           checkpoint_every=1)
    _train(d, task=two(), steps=3, checkpoint_every=1)
    assert _losses(d) == pytest.approx(_losses(tmp_path / "w"), rel=1e-6)
  # The second phase starts again from the initial parameters.
  losses = _losses(tmp_path / "w")
  assert losses[4] == pytest.approx(losses[1], rel=1e-6)


def test_a_completed_run_is_not_redone(whole):
  done = {"step": 6, "answer": 42}
  assert _train(whole, task=ToyTask(done=done)) == done


def test_a_task_without_the_compile_hooks_says_so_in_one_line(tmp_path):
  saved = tmp_path / "step.jaxexe"
  saved.write_bytes(b"")
  with pytest.raises(InputError, match="^METHOD: the toy task cannot be "
                     "compiled ahead of time$"):
    _train(tmp_path / "c", compiled_step=str(saved))
