"""The gin entry point of ``jaxfid train``: ``gin/training.gin`` binds
``launch.run.train_fn = @loop.train`` (the one trainer) and every method's
gin file includes it, so one command serves every method.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import jax

# t5x's ``use_hardware_rng``: XLA's RngBitGenerator for every random bit.
HARDWARE_RNG_IMPL = "unsafe_rbg"


def prng_context(use_hardware_rng: bool):
  """The PRNG implementation a run's keys are made with (see ``run``)."""
  if not use_hardware_rng:
    return contextlib.nullcontext()
  return jax.default_prng_impl(HARDWARE_RNG_IMPL)


def run(train_fn: Callable[[], dict], use_hardware_rng: bool = False) -> dict:
  """Run a trainer.

  Args:
    use_hardware_rng: as t5x's ``USE_HARDWARE_RNG``: every key the run makes
      is an ``unsafe_rbg`` key (XLA's RngBitGenerator), much cheaper for
      dropout masks on GPUs and TPUs; deterministic on one mesh and backend,
      but not threefry's stream.
  """
  with prng_context(use_hardware_rng):
    return train_fn()
