"""What ``jaxfid eval`` writes for each task: predictions, metrics, TensorBoard.

:class:`EvalOutputs` is a seqio logger (no seqio import). Under
``EVAL_OUTPUT_DIR``:

* ``<task>-<step>.jsonl``: per example in dataset order, ``index``, its own
  ``id``/``question``/``answers``/``text_a``/``text_b``/``label``, then
  ``output`` (decoded), ``prediction`` (postprocessed) and ``target``;
  written atomically;
* ``metrics.jsonl``: one line appended per task, ``{"task", "split",
  "step", <metric>: value, ...}`` (non-finite values as strings);
* ``tb/<task>/``: TensorBoard scalars ``<split>/<metric>`` at ``step``.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jaxfid.runtime.tensorboard import SummaryWriter

from jaxfid.runtime.files import atomic_write

EXAMPLE_FIELDS = ("id", "question", "answers", "text_a", "text_b", "label")
METRICS_FILE = "metrics.jsonl"


def json_value(value: Any) -> Any:
  """A JSON-ready copy of a NumPy / bytes value."""
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  if isinstance(value, np.ndarray):
    return [json_value(v) for v in value.tolist()]
  if isinstance(value, (list, tuple)):
    return [json_value(v) for v in value]
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def metric_values(metrics: Mapping[str, Any]) -> dict[str, float]:
  """The numeric metrics (seqio wraps them in ``Scalar``s)."""
  out = {}
  for name, value in metrics.items():
    value = getattr(value, "value", value)
    if isinstance(value, np.generic):
      value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      out[name] = float(value)
  return out


def predictions_path(output_dir: str, task: str, step: int) -> str:
  return os.path.join(output_dir, f"{task}-{step}.jsonl")


class EvalOutputs:
  """A seqio logger writing the module docstring's files to ``output_dir``."""

  def __init__(self, output_dir: str, *, split: str):
    self.output_dir = output_dir
    self.split = split
    self.records: list[dict] = []  # the metrics.jsonl lines written

  def __call__(self, task_name: str, step: int | None,
               metrics: Mapping[str, Any], dataset,
               inferences: Mapping[str, Sequence[Any]] | None,
               targets: Sequence[Any] | None) -> None:
    step = 0 if step is None else int(step)
    values = metric_values(metrics)
    record = {"task": task_name, "split": self.split, "step": step,
              **{k: json_value(v) for k, v in values.items()}}
    self.records.append(record)
    if jax.process_index() != 0:  # every process evaluates; process 0 writes
      return
    os.makedirs(self.output_dir, exist_ok=True)
    self._write_predictions(task_name, step, dataset, inferences or {},
                            targets)
    with open(os.path.join(self.output_dir, METRICS_FILE), "a",
              encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
    self._write_tensorboard(task_name, step, values)

  def _write_predictions(self, task: str, step: int, dataset,
                         inferences: Mapping[str, Sequence[Any]],
                         targets: Sequence[Any] | None) -> None:
    with atomic_write(predictions_path(self.output_dir, task, step)) as f:
      for i, example in enumerate(dataset.as_numpy_iterator()):
        record = {"index": i}
        record.update({k: json_value(example[k]) for k in EXAMPLE_FIELDS
                       if k in example})
        for key in ("output", "prediction", "score"):
          if key in inferences:
            record[key] = json_value(inferences[key][i])
        if targets is not None:
          record["target"] = json_value(targets[i])
        f.write(json.dumps(record, ensure_ascii=False) + "\n")

  def _write_tensorboard(self, task: str, step: int,
                         values: Mapping[str, float]) -> None:
    writer = SummaryWriter(os.path.join(self.output_dir, "tb", task))
    try:
      for name, value in values.items():
        writer.add_scalar(f"{self.split}/{name}", value, step)
    finally:
      writer.close()
