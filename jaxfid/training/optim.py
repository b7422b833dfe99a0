"""Optimizers and learning-rate schedules (optax): FiD's Adam or AdamW,
'fixed' or 'linear' with warmup, clipping by global norm; Atlas's 'cosine'
(``src/util.py:84-95``: warm-up, then ``lr * (0.1 + 0.9 cos(pi/2 s))``, ``s``
the share of the steps after warm-up done); ReAtt's runs as one schedule
restarted at phase boundaries.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import optax

from jaxfid.core.errors import InputError

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "linear", "cosine")
COSINE_FLOOR = 0.1  # Atlas's CosineScheduler ratio


def _one_schedule(learning_rate: float, schedule: str, warmup_steps: int,
                  total_steps: int, final_ratio: float) -> optax.Schedule:
  if schedule == "constant":
    after = optax.constant_schedule(learning_rate)
  elif schedule == "cosine":
    length = max(total_steps - warmup_steps, 1)

    def after(count):
      done = jnp.minimum(count, length) / length
      return learning_rate * (COSINE_FLOOR + (1 - COSINE_FLOOR)
                              * jnp.cos(0.5 * jnp.pi * done))
  else:
    after = optax.linear_schedule(learning_rate, learning_rate * final_ratio,
                                  max(total_steps - warmup_steps, 1))
  if warmup_steps <= 0:
    return after
  warm = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warm, after], [warmup_steps])


def learning_rate_schedule(learning_rate: float, *, schedule: str = "constant",
                           warmup_steps: int = 0, total_steps: int = 1,
                           final_ratio: float = 0.0,
                           restarts: Sequence[int] = (),
                           warmup_fraction: float | None = None
                           ) -> optax.Schedule:
  """Linear warmup from 0, then constant, linear decay to ``final_ratio`` or
  Atlas's cosine decay to a tenth. The step counts optimizer updates from 0,
  as FiD's ``WarmupLinearScheduler``; ``restarts``: steps where it starts
  over; ``warmup_fraction``: each part's warm-up as a share of its length.
  """
  if schedule not in SCHEDULES:
    raise InputError("SCHEDULE", f"must be one of {SCHEDULES}, got "
                     f"{schedule!r}")
  edges = [0, *restarts, total_steps]
  parts = []
  for a, b in zip(edges[:-1], edges[1:]):
    length = max(b - a, 1)
    warm = (int(round(warmup_fraction * length)) if warmup_fraction is not None
            else warmup_steps)
    parts.append(_one_schedule(learning_rate, schedule, warm, length,
                               final_ratio))
  if len(parts) == 1:
    return parts[0]
  return optax.join_schedules(parts, list(edges[1:-1]))


def make_optimizer(schedule: optax.Schedule, *, optimizer: str = "adam",
                   weight_decay: float = 0.0, clip_norm: float | None = 1.0,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   decay_mask: Any = None) -> optax.GradientTransformation:
  """Adam or AdamW over ``schedule``, after clipping by global norm;
  ``decay_mask`` (AdamW): optax's ``mask``, None: every parameter (FiD's)."""
  if optimizer == "adam":
    opt = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
  elif optimizer == "adamw":
    opt = optax.adamw(schedule, b1=b1, b2=b2, eps=eps,
                      weight_decay=weight_decay, mask=decay_mask)
  else:
    raise InputError("OPTIMIZER", f"must be one of {OPTIMIZERS}, got "
                     f"{optimizer!r}")
  if clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(clip_norm), opt)
  return opt
