"""The bookkeeping every trainer's step loop shares.

FiD, ReAtt, the dual encoder and ReFusion each run their own loop (their
batches, phases and evaluations differ); what they share lives here: the
progress bar, fetching the step's metrics, the non-finite-loss policy and
the throughput since the last log line.
"""
from __future__ import annotations

import sys
import time

import jax
from tqdm import tqdm


class NonFiniteLoss(FloatingPointError):
  """A step's loss or gradient was not finite (its update was not applied)."""


ON_NAN_CHOICES = ("stop", "skip")


class StepLoop:
  """Progress bar, non-finite check and throughput for ``[start, total)``.

  ``on_nan='stop'`` raises :class:`NonFiniteLoss` naming the step when a
  step reports ``finite == 0``; ``'skip'`` warns and goes on (the step
  function has already left parameters and optimizer state untouched).
  """

  def __init__(self, *, total: int, start: int, desc: str, progress: bool,
               on_nan: str):
    if on_nan not in ON_NAN_CHOICES:
      raise ValueError(f"on_nan must be 'stop' or 'skip', got {on_nan!r}")
    self.on_nan = on_nan
    self.bar = tqdm(total=total, initial=start, desc=desc,
                    disable=not progress, file=sys.stderr)
    self._since, self._t_last = 0, time.time()

  def finished_step(self, step: int, metrics) -> dict:
    """Host copies of the metrics of the step that made the count ``step``."""
    self._since += 1
    self.bar.update(1)
    metrics = jax.device_get(metrics)
    if not metrics["finite"]:
      message = (f"non-finite loss {metrics['loss']} at step {step}; "
                 "the update was not applied")
      if self.on_nan == "stop":
        raise NonFiniteLoss(message)
      print(f"warning: {message}", file=sys.stderr)
    return metrics

  def rate(self, batch_size: int) -> float:
    """Examples per second since the previous call (or the start)."""
    now = time.time()
    value = self._since * batch_size / max(now - self._t_last, 1e-9)
    self._since, self._t_last = 0, now
    return value

  def restart_clock(self) -> None:
    self._since, self._t_last = 0, time.time()

  def show(self, **values) -> None:
    self.bar.set_postfix(**values)

  def close(self) -> None:
    self.bar.close()
