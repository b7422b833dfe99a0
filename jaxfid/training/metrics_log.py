"""Metrics to ``MODEL_DIR/metrics.jsonl`` (one JSON object a line) and TensorBoard.

Only process 0 writes. On resume the lines of steps after the restored
checkpoint (written by the run that crashed) are dropped, so the file reads as
one uninterrupted run.
"""
from __future__ import annotations

import json
import math
import os

import jax
from tensorboardX import SummaryWriter

from jaxfid.core.files import atomic_write


def _clean(value):
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def read_records(model_dir: str) -> list[dict]:
  """The records of ``MODEL_DIR/metrics.jsonl`` in order ([] if absent);
  a line cut by a crash is skipped."""
  path = os.path.join(model_dir, "metrics.jsonl")
  records = []
  if not os.path.exists(path):
    return records
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if isinstance(record, dict):
        records.append(record)
  return records


class MetricsLog:
  def __init__(self, model_dir: str, *, resume_step: int = 0,
               tensorboard: bool = True):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(model_dir, "metrics.jsonl")
    self._writer = None
    if not self.enabled:
      return
    os.makedirs(model_dir, exist_ok=True)
    self._truncate_after(resume_step)
    if tensorboard:
      self._writer = SummaryWriter(os.path.join(model_dir, "tb"))

  def _truncate_after(self, step: int) -> None:
    if not os.path.exists(self.path):
      return
    keep = []
    with open(self.path) as f:
      for line in f:
        try:
          record = json.loads(line)
        except json.JSONDecodeError:
          continue  # a line cut by a crash
        if record.get("step", 0) <= step:
          keep.append(json.dumps(record))
    with atomic_write(self.path) as f:
      f.write("".join(line + "\n" for line in keep))

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    record = {"step": int(step)}
    record.update({k: _clean(v) for k, v in metrics.items()})
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
      f.flush()
    if self._writer is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, (int, float)):
          self._writer.add_scalar(k, v, step)
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
