"""``jaxfid eval``: a checkpoint on a seqio task or mixture, t5x style.

``gin/evaluation.gin`` binds :func:`evaluate`, which runs ``seqio.Evaluator``
with the model functions of the checkpoint's method (:data:`METHODS`; other
formats are FiD readers) and writes :mod:`jaxfid.commands.eval_outputs`'
files. An evaluator gets NumPy batches of ``EVAL_BATCH_SIZE`` rows (the last
padded with its first row) and provides ``kinds``, ``step``,
``sequence_length(task_spec)``, ``prepare(examples, task_spec)`` (once per
task), ``predict(indices, batch)`` (int32 ``[B, T]``) and ``score(indices,
batch)`` (float32 ``[B]``). seqio is imported inside :func:`evaluate` only.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterator

import gin
import numpy as np

from tqdm import tqdm

from jaxfid.checkpoints.model_dir import CONFIG_FILE, read_run_config
from jaxfid.commands import eval_outputs, seqio_tasks
from jaxfid.core.errors import InputError
from jaxfid.core.registry import Registry
from jaxfid.evaluation.task_kinds import TASK_KINDS, TaskKind, kind_of

# run config "method" -> the method's evaluator class (registered by the
# method's plug-in module)
METHODS: Registry = Registry(
    "evaluation method", hint="jaxfid eval evaluates the checkpoints of "
    "those methods")
DEFAULT_METHOD = "fid"  # checkpoints without a run config: HF, T5X, FiD


def run_config_of(path: str) -> dict:
  """A MODEL_DIR's ``jaxfid_config.json``; {} for other checkpoints."""
  if not os.path.exists(path):
    raise InputError(path, "no such checkpoint (CHECKPOINT_PATH)")
  if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
    return {}
  try:
    return read_run_config(path)
  except json.JSONDecodeError as e:
    raise InputError(os.path.join(path, CONFIG_FILE), f"bad JSON: {e.msg}",
                     where=e.lineno) from None


def configured(cls):
  """``cls`` with its gin bindings when a gin file configures it."""
  try:
    return gin.get_configurable(cls)
  except (KeyError, ValueError):
    return cls


def eval_tasks(name: str, split: str) -> list[tuple[str, TaskKind, Any]]:
  """``[(task name, kind, its spec), ...]`` of mixture or task ``name``;
  every task must be of a registered kind (:mod:`jaxfid.evaluation.
  task_kinds`) and have ``split``."""
  import seqio  # pylint: disable=g-import-not-at-top
  where = "MIXTURE_OR_TASK_NAME"
  try:
    provider = seqio.get_mixture_or_task(name)
  except ValueError:
    raise InputError(where, f"no seqio task or mixture {name!r} is "
                     "registered") from None
  out = []
  for task in seqio.get_subtasks(provider):
    found = kind_of(task.name)
    if found is None:
      raise InputError(where, f"task {task.name!r} is of no kind jaxfid eval "
                       f"evaluates ({', '.join(TASK_KINDS.names())})")
    kind, spec = found
    if split not in task.splits:
      raise InputError("EVAL_SPLIT", f"task {task.name!r} has no {split!r} "
                       f"split (it has {', '.join(task.splits)})")
    out.append((task.name, kind, spec))
  return out


def _merged_lengths(evaluator, specs: list) -> dict:
  """One ``sequence_length`` for all tasks (the longest of each feature)."""
  merged: dict = {}
  for spec in specs:
    for key, value in evaluator.sequence_length(spec).items():
      old = merged.get(key)
      merged[key] = value if old is None else (
          tuple(max(a, b) for a, b in zip(old, value))
          if isinstance(value, tuple) else max(old, value))
  return merged


def batches(dataset, batch_size: int
            ) -> Iterator[tuple[np.ndarray, dict, int]]:
  """``(indices, batch, real rows)`` of an enumerated seqio model dataset;
  every batch has ``batch_size`` rows (the last repeats its first row)."""
  rows: list = []

  def stack():
    real = len(rows)
    full = rows + [rows[0]] * (batch_size - real)
    indices = np.asarray([int(i) for i, _ in full], np.int64)
    batch = {k: np.stack([np.asarray(f[k]) for _, f in full])
             for k in full[0][1]}
    return indices, batch, real

  for index, features in dataset.as_numpy_iterator():
    rows.append((index, features))
    if len(rows) == batch_size:
      yield stack()
      rows = []
  if rows:
    yield stack()


class ModelFunctions:
  """seqio's ``predict_fn`` / ``score_fn`` over a method evaluator, the
  task recognised by its (cached) model dataset and the evaluator prepared
  with its examples before its first batch."""

  def __init__(self, evaluator, seqio_evaluator, specs: dict,
               batch_size: int, progress: bool):
    self.evaluator = evaluator
    self.seqio_evaluator = seqio_evaluator
    self.specs = specs
    self.batch_size = batch_size
    self.progress = progress
    self._names = {id(ds): name for name, ds in
                   seqio_evaluator.cached_model_datasets.items()}
    self._current = None

  def _run(self, dataset, fn, desc: str) -> list[tuple[int, Any]]:
    name = self._names[id(dataset)]
    if name != self._current:
      examples = list(
          self.seqio_evaluator.cached_task_datasets[name].as_numpy_iterator())
      self.evaluator.prepare(examples, self.specs[name])
      self._current = name
    out = []
    for indices, batch, real in tqdm(
        batches(dataset, self.batch_size), desc=f"{desc} {name}",
        disable=not self.progress, file=sys.stderr, leave=False):
      values = fn(indices, batch)
      out.extend((int(i), values[j]) for j, i in enumerate(indices[:real]))
    return out

  def predict(self, dataset) -> list[tuple[int, np.ndarray]]:
    return self._run(dataset, self.evaluator.predict, "predict")

  def score(self, dataset) -> list[tuple[int, float]]:
    return self._run(dataset, lambda i, b: [float(s) for s in
                                            self.evaluator.score(i, b)],
                     "score")


def evaluate(*, checkpoint_path: str, output_dir: str,
             mixture_or_task_name: str | None = None,
             split: str = "validation", batch_size: int = 8,
             max_examples: int | None = None, progress: bool = True) -> dict:
  """Evaluates a checkpoint on a seqio task or mixture (module docstring).

  Returns ``{"step", "split", "output_dir", "metrics": {task: {name: value}}}``.
  """
  if not mixture_or_task_name:
    raise InputError("MIXTURE_OR_TASK_NAME", "required: the seqio task or "
                     "mixture to evaluate")
  if int(batch_size) < 1:
    raise InputError("EVAL_BATCH_SIZE", f"must be at least 1, got "
                     f"{batch_size}")
  if max_examples is not None and int(max_examples) < 1:
    raise InputError("EVAL_MAX_EXAMPLES", f"must be at least 1, got "
                     f"{max_examples}")
  run = run_config_of(os.fspath(checkpoint_path))
  method = run.get("method", DEFAULT_METHOD)
  evaluator_cls = METHODS.get(method, "CHECKPOINT_PATH")

  seqio_tasks.import_tasks()
  import seqio  # pylint: disable=g-import-not-at-top

  found = eval_tasks(mixture_or_task_name, split)
  kinds = {kind.name: kind for _, kind, _ in found}
  for name, kind, _ in found:
    if kind.name not in evaluator_cls.kinds:
      raise InputError("MIXTURE_OR_TASK_NAME", f"a {method} checkpoint "
                       f"evaluates {' or '.join(evaluator_cls.kinds)} tasks; "
                       f"{name!r} is a {kind.name} task")
  if len(kinds) > 1:
    raise InputError("MIXTURE_OR_TASK_NAME", "a mixture of "
                     f"{' and '.join(sorted(kinds))} tasks: evaluate each kind "
                     "on its own")
  specs = {name: spec for name, _, spec in found}
  evaluator = configured(evaluator_cls)(os.fspath(checkpoint_path), run)
  converter = next(iter(kinds.values())).converter(evaluator)

  def logger(output_dir):
    return eval_outputs.EvalOutputs(output_dir, split=split)

  seqio_evaluator = seqio.Evaluator(
      mixture_or_task_name, converter, eval_split=split,
      sequence_length=_merged_lengths(evaluator, list(specs.values())),
      num_examples=max_examples, use_memory_cache=True,
      async_compute_metrics=False, logger_cls=[logger], log_dir=output_dir)
  try:
    fns = ModelFunctions(evaluator, seqio_evaluator, specs, int(batch_size),
                         progress)
    result, _ = seqio_evaluator.evaluate(
        compute_metrics=True, step=evaluator.step, predict_fn=fns.predict,
        score_fn=fns.score)
    metrics = result.result()
  finally:
    seqio_evaluator.close()
  return {"step": evaluator.step, "split": split, "output_dir": output_dir,
          "metrics": {task: eval_outputs.metric_values(values)
                      for task, values in metrics.items()}}


__all__ = ["METHODS", "ModelFunctions", "batches", "configured",
           "eval_tasks", "evaluate"]
