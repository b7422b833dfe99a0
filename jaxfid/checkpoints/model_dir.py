"""Checkpoints of a run (orbax): the latest N, and the best-EM one kept apart.

Layout of ``MODEL_DIR``::

  jaxfid_config.json        the model config and method (written at start)
  spiece.model              the vocabulary the run uses
  checkpoints/<step>/       latest N train states (params, optimizer, step)
  best/<step>/              the best evaluation checkpoint (params only)
  metrics.jsonl, tb/        metrics

Orbax writes each checkpoint to a temporary directory and renames it when it
is complete, so a crash never leaves a half-written checkpoint. Restores take
an abstract target whose leaves carry the *current* shardings, so a
checkpoint written under one mesh restores under another.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxfid.core import paths
from jaxfid.core.files import atomic_write

CONFIG_FILE = "jaxfid_config.json"


def _manager(directory: str, max_to_keep: int | None) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=False)
  return ocp.CheckpointManager(paths.as_path(directory), options=options)


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs with the shardings of ``tree`` (for restores)."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                     sharding=getattr(x, "sharding", None)),
      tree)


class RunCheckpoints:
  """The latest-N and best checkpoints of one ``MODEL_DIR``."""

  def __init__(self, model_dir: str, keep: int = 2):
    self.model_dir = model_dir
    self.latest = _manager(paths.join(model_dir, "checkpoints"), keep)
    self.best = _manager(paths.join(model_dir, "best"), 1)
    self._best_file = paths.join(model_dir, "best", "best_metric.json")
    # Every process decides alike whether an evaluation is the best so far
    # (the saves are collective); only process 0 writes the record.
    self._best = self.best_metric()

  def latest_step(self) -> int | None:
    return self.latest.latest_step()

  def save(self, step: int, state: Any, *, force: bool = False) -> None:
    if self.latest.latest_step() == step:
      return
    self.latest.save(step, args=ocp.args.StandardSave(state), force=force)
    self.latest.wait_until_finished()

  def restore(self, target: Any, step: int | None = None) -> Any:
    """Restore into the structure/shardings of ``target`` (arrays or abstract)."""
    step = self.latest.latest_step() if step is None else step
    return self.latest.restore(
        step, args=ocp.args.StandardRestore(abstract_like(target)))

  def best_metric(self) -> float | None:
    if not paths.exists(self._best_file):
      return None
    return json.loads(paths.read_text(self._best_file))["value"]

  def maybe_save_best(self, step: int, params: Any, value: float,
                      name: str = "eval_em") -> bool:
    """Save params as the best checkpoint if ``value`` beats the best so far."""
    if self._best is not None and value <= self._best:
      return False
    self.best.save(step, args=ocp.args.StandardSave(params), force=True)
    self.best.wait_until_finished()
    self._best = value
    if jax.process_index() == 0:
      with atomic_write(self._best_file) as f:
        json.dump({"step": step, "name": name, "value": value}, f)
    return True

  def close(self) -> None:
    self.latest.close()
    self.best.close()


def restore_params(model_dir: str, target: Any, which: str = "auto") -> tuple[Any, int, str]:
  """Parameters from a MODEL_DIR: ``which`` = 'best', 'latest' or 'auto'.

  'auto' takes the best-EM checkpoint when there is one, else the latest.
  ``target``: abstract params (``ShapeDtypeStruct`` leaves, with shardings or
  not). Returns (params, step, which one was used).
  """
  best_dir = paths.join(model_dir, "best")
  latest_dir = paths.join(model_dir, "checkpoints")
  choices = {"best": [best_dir], "latest": [latest_dir],
             "auto": [best_dir, latest_dir]}[which]
  for directory in choices:
    if not paths.isdir(directory):
      continue
    mgr = _manager(directory, None)
    step = mgr.latest_step()
    if step is None:
      mgr.close()
      continue
    if directory == best_dir:
      restored = mgr.restore(step, args=ocp.args.StandardRestore(target))
      params = restored
    else:
      meta_target = {"params": target}
      restored = mgr.restore(step, args=ocp.args.PyTreeRestore(
          item=meta_target, partial_restore=True,
          restore_args=jax.tree.map(
              lambda leaf: ocp.ArrayRestoreArgs(
                  sharding=getattr(leaf, "sharding", None)), meta_target)))
      params = restored["params"]
    mgr.close()
    return params, step, os.path.basename(directory)
  raise FileNotFoundError(f"{model_dir}: no checkpoint found")


def write_run_config(model_dir: str, fields: dict) -> None:
  """Writes ``MODEL_DIR/jaxfid_config.json`` (all at once)."""
  with atomic_write(paths.join(model_dir, CONFIG_FILE)) as f:
    json.dump(fields, f, indent=2, sort_keys=True)


def read_run_config(model_dir: str) -> dict:
  """The parsed ``MODEL_DIR/jaxfid_config.json``."""
  return json.loads(paths.read_text(paths.join(model_dir, CONFIG_FILE)))
