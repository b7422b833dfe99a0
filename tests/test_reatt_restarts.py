"""ReAtt's phases start a fresh Adam, as the original's --init_from runs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfid.fid.task import FidTask
from jaxfid.reader.config import FidReaderConfig
from jaxfid.reatt.restarts import reset_adam
from jaxfid.reatt.task import ReAttTask, ReAttTraining
from jaxfid.training.task import OptimizerSettings, Prepared, Settings
from reatt_world import tiny_config


class _Quadratic:
  """A stand-in model: the phases only need ``loss``."""

  def loss(self, params, batch, rng, normalizer=None):
    loss = jnp.sum((params["w"] - batch["x"]) ** 2)
    return loss, {"loss": loss}


def _adam(opt_state) -> optax.ScaleByAdamState:
  return next(s for s in jax.tree.leaves(
      opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
              if isinstance(s, optax.ScaleByAdamState))


def _schedule_count(opt_state):
  return next(s.count for s in jax.tree.leaves(
      opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState))
              if isinstance(s, optax.ScaleByScheduleState))


def _run(tmp_path, restart: bool):
  """Six steps of W = 2 QA-only steps then iterations of 2: phases start at
  steps 2 and 4. Returns the optimizer state after each step."""
  reader = FidReaderConfig(train_data="unread.json", n_context=1,
                           text_maxlength=8, answer_maxlength=4)
  task = ReAttTask(reader=FidTask(reader=reader, model_config=tiny_config()),
                   training=ReAttTraining(retrieval_warmup_steps=2,
                                          iteration_steps=2,
                                          restart_optimizer=restart))
  settings = Settings(model_dir=str(tmp_path / "run"), train_steps=6,
                      batch_size=2, progress=False)
  assert task.phase_starts(settings) == [2, 4]
  (phase,) = task.phases(Prepared(settings=settings, model=_Quadratic()),
                         OptimizerSettings(
      learning_rate=0.1, optimizer="adamw", schedule="linear",
      clip_norm=None))
  step = jax.jit(phase.step)
  state = phase.make_state({"w": jnp.zeros(3)}, 0)
  states = []
  for i in range(6):
    batch = {"x": jnp.full((3,), float(i + 1)),
             "decoder_target_tokens": jnp.ones((2, 2), jnp.int32)}
    state, _ = step(state, batch)
    states.append(state)
  return states


def test_adam_restarts_at_each_phase_and_the_schedule_runs_on(tmp_path):
  fresh = _run(tmp_path, True)
  counts = [int(_adam(s["opt_state"]).count) for s in fresh]
  assert counts == [1, 2, 1, 2, 1, 2]
  # the step after a restart sees zero moments: mu = (1 - b1) * its gradient
  w = fresh[1]["params"]["w"]
  grad = 2.0 * (w - 3.0)
  np.testing.assert_allclose(_adam(fresh[2]["opt_state"]).mu["w"],
                             0.1 * grad, rtol=1e-5)
  assert [int(_schedule_count(s["opt_state"])) for s in fresh] == list(
      range(1, 7))
  carried = _run(tmp_path, False)
  assert [int(_adam(s["opt_state"]).count) for s in carried] == list(
      range(1, 7))
  assert not np.allclose(carried[2]["params"]["w"], fresh[2]["params"]["w"])


def test_reset_keeps_everything_but_adam():
  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adam(optax.linear_schedule(1.0, 0.0, 10)))
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  update = jax.jit(lambda s: tx.update({"w": jnp.ones(2)}, s, params)[1])
  for _ in range(3):
    state = update(state)
  reset_of = jax.jit(lambda s, r: reset_adam(s, tx.init(params), r))
  kept = reset_of(state, jnp.asarray(False))
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), kept,
                                   state))
  reset = reset_of(state, jnp.asarray(True))
  assert int(_adam(reset).count) == 0 and not np.any(_adam(reset).nu["w"])
  assert int(jax.tree.leaves(reset)[-1]) == 3  # the schedule's count
