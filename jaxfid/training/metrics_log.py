"""Metrics to ``MODEL_DIR/metrics.jsonl`` (one JSON object a line) and TensorBoard.

Only process 0 writes. On resume, lines of steps after the restored
checkpoint are dropped. On a bucket (``gs://...``) the file is re-uploaded
after each record and TensorBoard events are uploaded at each flush.
"""
from __future__ import annotations

import json
import math
import os
import tempfile

import jax
from jaxfid.runtime.tensorboard import SummaryWriter

from jaxfid.core import paths
from jaxfid.core.textio import json_records
from jaxfid.runtime.files import atomic_write
from jaxfid.runtime.storage import storage_errors

METRICS_FILE = "metrics.jsonl"


def _clean(value):
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def read_records(model_dir: str) -> list[dict]:
  """The records of ``MODEL_DIR/metrics.jsonl`` in order ([] if absent)."""
  path = paths.join(model_dir, METRICS_FILE)
  if not paths.exists(path):
    return []
  return json_records(paths.read_text(path).splitlines())


class MetricsLog:
  """Appends records to metrics.jsonl and TensorBoard (process 0)."""

  def __init__(self, model_dir: str, *, resume_step: int = 0,
               tensorboard: bool = True):
    self.enabled = jax.process_index() == 0
    self.path = paths.join(model_dir, METRICS_FILE)
    self.remote = paths.is_url(model_dir)
    self._writer = None
    self._tb_local = self._tb_remote = None
    if not self.enabled:
      return
    paths.makedirs(model_dir)
    # The lines of the steps up to the checkpoint resumed from, rewritten.
    self._lines = [json.dumps(r) for r in read_records(model_dir)
                   if r.get("step", 0) <= resume_step]
    self._rewrite()
    if tensorboard:
      tb = paths.join(model_dir, "tb")
      if self.remote:
        self._tb_local = tempfile.mkdtemp(prefix="jaxfid-tb-")
        self._tb_remote = tb
        tb = self._tb_local
      self._writer = SummaryWriter(tb)

  def _rewrite(self) -> None:
    with atomic_write(self.path) as f:
      f.write("".join(line + "\n" for line in self._lines))

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    record = {"step": int(step)}
    record.update({k: _clean(v) for k, v in metrics.items()})
    line = json.dumps(record)
    self._lines.append(line)
    if self.remote:
      self._rewrite()
    else:
      with storage_errors(self.path), open(self.path, "a",
                                           encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
    if self._writer is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, (int, float)):
          self._writer.add_scalar(k, v, step)
      self._writer.flush()
      self._upload_tensorboard()

  def _upload_tensorboard(self) -> None:
    if self._tb_local is None:
      return
    for name in os.listdir(self._tb_local):
      paths.copy(os.path.join(self._tb_local, name),
                 paths.join(self._tb_remote, name))

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._upload_tensorboard()
