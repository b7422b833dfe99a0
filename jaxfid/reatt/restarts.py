"""A fresh Adam at every phase of ReAtt's training, as the original's runs.

:func:`restart_adam_at` makes the jitted step reset every
``optax.ScaleByAdamState`` (moments and count) at the steps where a phase
starts, keyed on the state's step so a resumed run resets where an
uninterrupted one does; the learning-rate schedule's count runs on.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import optax

from jaxfid.training.task import Phase


def _is_adam(node) -> bool:
  return isinstance(node, optax.ScaleByAdamState)


def reset_adam(opt_state, fresh, restart: jax.Array):
  """``opt_state`` with every Adam state replaced by ``fresh``'s (the same
  structure, e.g. ``tx.init(params)``) where ``restart`` is true; the rest
  (schedule counts) is kept."""
  def pick(new, old):
    if not _is_adam(new):
      return old
    return jax.tree.map(lambda n, o: jnp.where(restart, n, o), new, old)
  return jax.tree.map(pick, fresh, opt_state, is_leaf=_is_adam)


def restart_adam_at(phase: Phase, starts: Sequence[int]) -> Phase:
  """``phase`` whose step first resets Adam's state when the state's step
  (the number of steps done) is one of ``starts``; ``phase.make_state``
  gives the fresh state."""
  starts = sorted(set(int(s) for s in starts))
  if not starts:
    return phase
  inner, make_state = phase.step, phase.make_state

  def step(state, batch):
    at = jnp.asarray(starts, jnp.int32)
    restart = jnp.any(state["step"] == at)
    fresh = make_state(state["params"], state["step"])["opt_state"]
    opt_state = reset_adam(state["opt_state"], fresh, restart)
    return inner({**state, "opt_state": opt_state}, batch)

  return dataclasses.replace(phase, step=step)
