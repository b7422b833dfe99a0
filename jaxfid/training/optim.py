"""Optimizers and learning-rate schedules (optax), as the FiD code offers them.

FiD's options: Adam or AdamW, a 'fixed' (constant) or 'linear' schedule with
warmup, gradient clipping by global norm (1.0), weight decay for AdamW.
"""
from __future__ import annotations

import optax


def learning_rate_schedule(learning_rate: float, *, schedule: str = "constant",
                           warmup_steps: int = 0, total_steps: int = 1,
                           final_ratio: float = 0.0) -> optax.Schedule:
  """Linear warmup from 0, then constant or linear decay to ``final_ratio``.

  The step passed to the schedule counts optimizer updates from 0 (the first
  update uses ``schedule(0)``), as in FiD's ``WarmupLinearScheduler``.
  """
  if schedule not in ("constant", "linear"):
    raise ValueError(f"schedule must be 'constant' or 'linear', got {schedule!r}")
  if schedule == "constant":
    after = optax.constant_schedule(learning_rate)
  else:
    after = optax.linear_schedule(learning_rate, learning_rate * final_ratio,
                                  max(total_steps - warmup_steps, 1))
  if warmup_steps <= 0:
    return after
  warm = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warm, after], [warmup_steps])


def make_optimizer(learning_rate: float, *, optimizer: str = "adam",
                   schedule: str = "constant", warmup_steps: int = 0,
                   total_steps: int = 1, weight_decay: float = 0.0,
                   clip_norm: float | None = 1.0, b1: float = 0.9,
                   b2: float = 0.999, eps: float = 1e-8
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer and its schedule. ``optimizer``: 'adam' or 'adamw'."""
  lr = learning_rate_schedule(learning_rate, schedule=schedule,
                              warmup_steps=warmup_steps, total_steps=total_steps)
  if optimizer == "adam":
    opt = optax.adam(lr, b1=b1, b2=b2, eps=eps)
  elif optimizer == "adamw":
    opt = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  else:
    raise ValueError(f"optimizer must be 'adam' or 'adamw', got {optimizer!r}")
  if clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(clip_norm), opt)
  return opt, lr
