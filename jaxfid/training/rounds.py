"""Bookkeeping shared by the commands that train in explicit rounds.

A round is finished when its record (written last, atomically) exists. Here:
claiming a work directory for one run's settings, reading and writing round
records, and a MODEL_DIR's latest step.
"""
from __future__ import annotations

import json
import os

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.core.errors import InputError
from jaxfid.runtime.files import atomic_write


def claim_work_dir(work_dir: str, state_file: str, identity: dict,
                   command: str) -> None:
  """Writes ``work_dir/state_file`` (the run's ``identity``), or checks that
  the directory belongs to this run; a directory with other files and no
  state file is refused (it is not ``jaxfid <command>``'s)."""
  path = os.path.join(work_dir, state_file)
  if os.path.exists(path):
    try:
      with open(path) as f:
        old = json.load(f)
    except json.JSONDecodeError as e:
      raise InputError(path, f"bad JSON: {e.msg}", where=e.lineno) from None
    for key, value in identity.items():
      if old.get(key) != value:
        raise InputError(path, f"this work directory belongs to another run "
                         f"({key} was {old.get(key)!r}, now {value!r}); "
                         "choose another --work-dir")
    return
  if os.path.exists(work_dir) and os.listdir(work_dir):
    raise InputError(work_dir, f"exists and has no {state_file}: not a "
                     f"`{command}` work directory; choose another "
                     "--work-dir")
  with atomic_write(path) as f:
    json.dump(identity, f, indent=2, sort_keys=True)


def read_record(path: str) -> dict | None:
  """A round's record (None when the round is not finished)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_record(path: str, record: dict) -> dict:
  """Writes a round's record atomically (the round is then finished)."""
  with atomic_write(path) as f:
    json.dump(record, f)
  return record


def write_jsonl(path: str, records: list[dict]) -> None:
  """``records`` one JSON object a line, atomically (a log of the finished
  rounds, rewritten whole after each one so it never holds half a line)."""
  with atomic_write(path) as f:
    for record in records:
      f.write(json.dumps(record) + "\n")


def latest_step(model_dir: str) -> int:
  """MODEL_DIR's latest train-state step (0 without checkpoints)."""
  if not os.path.isdir(os.path.join(model_dir, "checkpoints")):
    return 0
  ckpts = checkpointing.RunCheckpoints(model_dir)
  try:
    return ckpts.latest_step() or 0
  finally:
    ckpts.close()
