"""Checkpoints of a run (orbax): the latest N, and the best-EM one kept apart.

Layout of ``MODEL_DIR``::

  jaxfid_config.json        the model config and method (written at start)
  spiece.model              the vocabulary the run uses
  checkpoints/<step>/       latest N train states (params, optimizer, step)
  best/<step>/              the best evaluation checkpoint (params only)
  metrics.jsonl, tb/        metrics

Checkpoints appear complete or not at all (orbax renames a finished
temporary); restores take the current shardings, so any mesh restores any.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from jaxfid.core import paths
from jaxfid.core.errors import InputError, StorageError
from jaxfid.runtime.background_errors import held_logs, settled_on_failure
from jaxfid.runtime.files import atomic_write
from jaxfid.runtime.storage import remove_path, storage_fault

CONFIG_FILE = "jaxfid_config.json"
TMP_MARK = ".orbax-checkpoint-tmp"  # in the names of orbax's temporaries


# What orbax logs (absl WARNING) each time a read-only manager opens: a
# reader of a checkpoint was not asking to write it.
_READ_ONLY_NOTICE = "Given directory is read only=%s"


def _not_read_only_notice(record: logging.LogRecord) -> bool:
  return record.msg != _READ_ONLY_NOTICE


def _manager(directory: str, max_to_keep: int | None,
             read_only: bool = False) -> ocp.CheckpointManager:
  # cleanup_tmp_directories: a checkpoint a killed run left half-written
  # (orbax's temporary directory) is removed when the next run starts.
  # save_interval_steps=0 for reading: what orbax sets (and logs) itself.
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
      cleanup_tmp_directories=not read_only,
      save_interval_steps=0 if read_only else 1,
      enable_async_checkpointing=False)
  absl_log = logging.getLogger("absl")
  absl_log.addFilter(_not_read_only_notice)
  try:
    return ocp.CheckpointManager(paths.as_path(directory), options=options)
  finally:
    absl_log.removeFilter(_not_read_only_notice)


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs with the shardings of ``tree`` (for restores)."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                     sharding=getattr(x, "sharding", None)),
      tree)


def _save(manager: ocp.CheckpointManager, step: int, tree: Any, force: bool,
          directory: str) -> None:
  """``manager.save`` of ``step`` into ``directory``, waited for; a full disk
  is one :class:`StorageError` naming the checkpoint, its temporaries
  removed."""
  # orbax's writer threads log the fault with their tracebacks before the
  # save raises it, and its other parts go on until they fail too: the one
  # line is the StorageError's, raised once they have ended
  with held_logs(handled=(StorageError,)):
    try:
      with settled_on_failure():
        manager.save(step, args=ocp.args.StandardSave(tree), force=force)
        manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      fault = storage_fault(e, paths.join(directory, str(step)))
      if fault is None:
        raise
      _remove_temporaries(directory)
      raise fault from None


def _remove_temporaries(directory: str) -> None:
  """Orbax's temporary directories of a save that failed (process 0)."""
  if jax.process_index() != 0 or not paths.isdir(directory):
    return
  for entry in paths.as_path(directory).iterdir():
    if TMP_MARK in entry.name:
      remove_path(entry) if not paths.is_url(directory) else entry.rmtree()


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

  def steps(self) -> list[int]:
    """The steps of the saved train states, oldest first."""
    return sorted(self.latest.all_steps())

  def step_dir(self, step: int) -> str:
    return paths.join(self.model_dir, "checkpoints", str(step))

  def save(self, step: int, state: Any, *, force: bool = False) -> None:
    """Saves ``state`` as ``step`` (all processes); a full disk is one
    :class:`StorageError` naming the checkpoint, its temporaries removed."""
    if self.latest.latest_step() == step:
      return
    _save(self.latest, step, state, force,
          paths.join(self.model_dir, "checkpoints"))

  def set_aside(self, step: int) -> str:
    """Renames checkpoint ``step`` (unreadable) to ``<step>.unreadable``, so
    that it is kept for inspection but no longer a step; returns the name."""
    source = paths.as_path(self.step_dir(step))
    target = source.parent / f"{step}.unreadable"
    n = 1
    while target.exists():
      n += 1
      target = source.parent / f"{step}.unreadable{n}"
    if jax.process_index() == 0:
      source.rename(target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"jaxfid set aside {step}")
    self.latest.reload()
    return os.fspath(target)

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
    """Save params as the best checkpoint if ``value`` beats the best so far
    (a full disk: as :meth:`save`)."""
    if self._best is not None and value <= self._best:
      return False
    _save(self.best, step, params, True, paths.join(self.model_dir, "best"))
    self._best = value
    if jax.process_index() == 0:
      with atomic_write(self._best_file) as f:
        json.dump({"step": step, "name": name, "value": value}, f)
    return True

  def close(self) -> None:
    self.latest.close()
    self.best.close()


def brief(error: BaseException, limit: int = 200) -> str:
  """One line of an error from orbax/tensorstore (their messages run long)."""
  text = " ".join(str(error).split()) or type(error).__name__
  for noise in (" See full TensorStore details", " <bound method"):
    text = text.split(noise)[0]
  return text if len(text) <= limit else text[:limit - 3] + "..."


def restore_checked(manager: ocp.CheckpointManager, step: int, args,
                    where: str):
  """``manager.restore`` whose failure is one InputError naming ``where``
  (the checkpoint's directory) and the step."""
  try:
    return manager.restore(step, args=args)
  except Exception as e:  # pylint: disable=broad-except
    raise InputError(where, f"unreadable checkpoint (step {step}): "
                     f"{brief(e)}") from None


WHICH = ("auto", "best", "latest")


def chosen_checkpoint(model_dir: str, which: str = "auto"
                      ) -> tuple[str, int] | None:
  """(``'best'`` or ``'latest'``, step) that :func:`restore_params` loads."""
  names = {"best": ["best"], "latest": ["checkpoints"],
           "auto": ["best", "checkpoints"]}[which]
  for name in names:
    directory = paths.join(model_dir, name)
    if not paths.isdir(directory):
      continue
    mgr = _manager(directory, None, read_only=True)
    try:
      step = mgr.latest_step()
    finally:
      mgr.close()
    if step is not None:
      return ("best" if name == "best" else "latest"), step
  return None


def restore_params(model_dir: str, target: Any, which: str = "auto") -> tuple[Any, int, str]:
  """Parameters from a MODEL_DIR: ``which`` 'best', 'latest' or 'auto' (the
  best-EM one if any, else the latest) into ``target`` (abstract params,
  with or without shardings; unsharded leaves go to this process's first
  device). Returns (params, step, which). InputError naming the MODEL_DIR
  (no checkpoint) or the checkpoint's directory and step (unreadable)."""
  if jax.process_count() > 1:
    local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(
        lambda leaf: leaf if getattr(leaf, "sharding", None) else
        jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=local), target)
  best_dir = paths.join(model_dir, "best")
  latest_dir = paths.join(model_dir, "checkpoints")
  choices = {"best": [best_dir], "latest": [latest_dir],
             "auto": [best_dir, latest_dir]}[which]
  for directory in choices:
    if not paths.isdir(directory):
      continue
    mgr = _manager(directory, None, read_only=True)
    try:
      step = mgr.latest_step()
      if step is None:
        continue
      where = paths.join(directory, str(step))
      if directory == best_dir:
        params = restore_checked(mgr, step, ocp.args.StandardRestore(target),
                                 where)
      else:
        meta_target = {"params": target}
        restored = restore_checked(mgr, step, ocp.args.PyTreeRestore(
            item=meta_target, partial_restore=True,
            restore_args=jax.tree.map(
                lambda leaf: ocp.ArrayRestoreArgs(
                    sharding=getattr(leaf, "sharding", None)), meta_target)),
            where)
        params = restored["params"]
    finally:
      mgr.close()
    return params, step, os.path.basename(directory)
  raise InputError(model_dir, "no checkpoint found")


def restore_model(model_dir: str, abstract_params: Any, which: str = "auto"
                  ) -> Any:
  """A model's parameters (``abstract_params``) from a MODEL_DIR on this
  process's first device; InputError naming the directory if none is read."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
      abstract_params)
  params, _, _ = restore_params(model_dir, target, which)
  return params


def write_run_config(model_dir: str, fields: dict) -> None:
  """Writes ``MODEL_DIR/jaxfid_config.json`` (all at once)."""
  with atomic_write(paths.join(model_dir, CONFIG_FILE)) as f:
    json.dump(fields, f, indent=2, sort_keys=True)


def read_run_config(model_dir: str) -> dict:
  """The parsed ``MODEL_DIR/jaxfid_config.json``."""
  return json.loads(paths.read_text(paths.join(model_dir, CONFIG_FILE)))


def read_method_config(model_dir: str, method: str | None = None) -> dict:
  """``MODEL_DIR/jaxfid_config.json``, checked: an InputError when the
  directory has none, when it is not JSON, or (given ``method``) when another
  method wrote it."""
  config_file = paths.join(model_dir, CONFIG_FILE)
  if not paths.exists(config_file):
    raise InputError(model_dir, f"not a jaxfid MODEL_DIR (no {CONFIG_FILE})")
  try:
    run = json.loads(paths.read_text(config_file))
  except json.JSONDecodeError as e:
    raise InputError(config_file, f"bad JSON: {e.msg}", where=e.lineno) from None
  if method is not None and run.get("method", "fid") != method:
    raise InputError(config_file, f"not a {method!r} MODEL_DIR (its method "
                     f"is {run.get('method', 'fid')!r})")
  return run
