"""One few-shot task over the five LM-BFF seeds: mean and standard deviation.

:func:`run_seeds` runs ``python -m jaxfid.cli train`` once per seed with the
caller's gin plus ``TASK``, ``SEED``, ``DATA_DIR`` and ``MODEL_DIR`` (a seed
with a ``test_accuracy`` line is not rerun; output to stderr, prefixed, and
``<model_dir_root>/16-<seed>.log``); :func:`summarize` gives the metric in
percent per seed, mean and population std (ddof 0, as LM-BFF).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from typing import Sequence, TextIO

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.refusion.lmbff import get_task
from jaxfid.training.metrics_log import read_records

DEFAULT_SEEDS = (13, 21, 42, 87, 100)
K_SHOT = 16
METRICS_FILE = "metrics.jsonl"
DONE_KEY = "test_accuracy"
# gin macros set per seed; the caller may not bind them
SEED_MACROS = ("TASK", "DATA_DIR", "SEED", "MODEL_DIR")


@dataclasses.dataclass
class SeedRun:
  """What happened to one seed: its ``model_dir``, its last ``metrics``
  record with ``test_accuracy`` (None if it failed), ``skipped`` (finished
  before) and ``error`` (the child's last stderr line)."""
  seed: int
  model_dir: str
  metrics: dict | None = None
  skipped: bool = False
  error: str | None = None


def parse_seeds(text: str) -> list[int]:
  """``"13,21,42"`` -> [13, 21, 42] (InputError on junk or repeats)."""
  seeds = []
  for part in text.split(","):
    try:
      seeds.append(int(part.strip()))
    except ValueError:
      raise InputError("--seeds", f"expected comma-separated integers, got "
                       f"{text!r}") from None
  if len(set(seeds)) != len(seeds):
    raise InputError("--seeds", f"a seed is repeated in {text!r}")
  return seeds


def lookup_task(name: str):
  """The task's :class:`jaxfid.refusion.lmbff.TaskSpec` (``name``,
  ``lmbff_dir``, ``metric``); InputError for an unknown task."""
  try:
    return get_task(name)
  except (KeyError, ValueError) as e:
    detail = e.args[0] if e.args else ""
    raise InputError("--task", f"unknown task {name!r}: {detail}") from None


def seed_dir_name(seed: int) -> str:
  return f"{K_SHOT}-{seed}"


def seed_bindings(task: str, data_dir: str, model_dir: str,
                  seed: int) -> list[str]:
  """The gin bindings (``NAME=VALUE``) that make a train run one seed's."""
  return [f"TASK={task!r}", f"DATA_DIR={data_dir!r}", f"SEED={int(seed)}",
          f"MODEL_DIR={model_dir!r}"]


def train_argv(gin_files: Sequence[str], bindings: Sequence[str],
               search_paths: Sequence[str] = ()) -> list[str]:
  """The ``jaxfid train`` command line, run by the current interpreter."""
  return ([sys.executable, "-m", "jaxfid.cli", "train"]
          + [f"--gin_file={f}" for f in gin_files]
          + [f"--gin_search_path={p}" for p in search_paths]
          + [f"--gin.{b}" for b in bindings])


def read_test_metrics(model_dir: str | os.PathLike) -> dict | None:
  """The last record of ``MODEL_DIR/metrics.jsonl`` with ``test_accuracy``."""
  found = [r for r in read_records(os.fspath(model_dir)) if DONE_KEY in r]
  return found[-1] if found else None


def _child_env() -> dict:
  """The environment with this jaxfid importable by the child."""
  # the directory holding the jaxfid package (jaxfid/refusion/seeds.py)
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  env = dict(os.environ)
  paths = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                    if p and p != root]
  env["PYTHONPATH"] = os.pathsep.join(paths)
  return env


def run_logged(argv: Sequence[str], log_path: str, prefix: str,
               stream: TextIO) -> tuple[int, str]:
  """Runs ``argv``; streams and logs its output; (exit status, last stderr
  line)."""
  lock = threading.Lock()
  last = [""]
  with open(log_path, "a", encoding="utf-8") as log:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            errors="replace", env=_child_env())

    def pump(pipe, is_stderr: bool) -> None:
      for line in pipe:
        text = line.rstrip("\n")
        with lock:
          log.write(line if line.endswith("\n") else line + "\n")
          log.flush()
          stream.write(f"{prefix}{text}\n")
          stream.flush()
          if is_stderr and text.strip():
            last[0] = text.strip()
      pipe.close()

    threads = [threading.Thread(target=pump, args=(proc.stdout, False)),
               threading.Thread(target=pump, args=(proc.stderr, True))]
    for t in threads:
      t.start()
    try:
      status = proc.wait()
    except BaseException:
      proc.kill()
      proc.wait()
      raise
    finally:
      for t in threads:
        t.join()
  return status, last[0]


def run_seeds(task: str, data_root: str, model_dir_root: str,
              seeds: Sequence[int], gin_files: Sequence[str],
              bindings: Sequence[str] = (), search_paths: Sequence[str] = (),
              stream: TextIO | None = None) -> list[SeedRun]:
  """Trains and tests ``task`` once per seed (``bindings``: more gin
  ``NAME=VALUE``), skipping finished seeds; one :class:`SeedRun` each.
  InputError before anything runs for no gin file, a per-seed macro bound
  by the caller, an unknown task or a missing data directory."""
  stream = sys.stderr if stream is None else stream
  if not gin_files:
    raise InputError("--gin_file", "at least one gin file is required")
  for binding in bindings:
    name = binding.partition("=")[0].strip()
    if name in SEED_MACROS:
      raise InputError(f"--gin.{name}", "is set per seed by this command")
  spec = lookup_task(task)
  runs, todo = [], []
  for seed in seeds:
    model_dir = os.path.join(model_dir_root, seed_dir_name(seed))
    run = SeedRun(seed, model_dir, metrics=read_test_metrics(model_dir))
    run.skipped = run.metrics is not None
    runs.append(run)
    if not run.skipped:
      data_dir = os.path.join(data_root, spec.lmbff_dir, seed_dir_name(seed))
      if not os.path.isdir(data_dir):
        raise InputError(data_dir, "no such directory (LM-BFF k-shot data "
                         "is DATA_ROOT/<task>/16-<seed>)")
      todo.append((run, data_dir))
  if todo:
    os.makedirs(model_dir_root, exist_ok=True)
  for run, data_dir in todo:
    argv = train_argv(gin_files, [*bindings, *seed_bindings(
        spec.name, data_dir, run.model_dir, run.seed)], search_paths)
    log_path = os.path.join(model_dir_root, seed_dir_name(run.seed) + ".log")
    status, last = run_logged(argv, log_path, f"[seed {run.seed}] ", stream)
    run.metrics = read_test_metrics(run.model_dir)
    if status != 0:
      run.error = f"exit status {status}: {last or '(no error output)'}"
      run.metrics = None
    elif run.metrics is None:
      run.error = (f"finished without a {DONE_KEY} line in "
                   f"{os.path.join(run.model_dir, METRICS_FILE)}")
  for run in runs:
    key = f"test_{spec.metric}"
    if run.metrics is not None and key not in run.metrics:
      run.error = f"no {key} in {os.path.join(run.model_dir, METRICS_FILE)}"
      run.metrics = None
  return runs


def summarize(task: str, metric: str, runs: Sequence[SeedRun]) -> dict:
  """``{"task", "seeds", "metric", "mean", "std", "per_seed"}`` in percent,
  over the seeds that have results."""
  per_seed = {str(r.seed): 100.0 * float(r.metrics[f"test_{metric}"])
              for r in runs if r.metrics is not None}
  values = np.asarray(list(per_seed.values()), np.float64)
  return {"task": task, "seeds": [r.seed for r in runs], "metric": metric,
          "mean": float(values.mean()) if values.size else None,
          "std": float(values.std()) if values.size else None,
          "per_seed": per_seed}


def format_table(summary: dict, runs: Sequence[SeedRun]) -> str:
  """Per seed and ``mean (std)`` in percent, one decimal, as in the paper."""
  metric = summary["metric"]
  columns = [metric] + (["accuracy"] if metric != "accuracy" else [])
  lines = [f"{summary['task']}: test {metric} (%) over {len(runs)} seeds",
           f"{'seed':>8}  " + "  ".join(f"{c:>11}" for c in columns)]
  for run in runs:
    if run.metrics is None:
      cells = ["failed"] * len(columns)
    else:
      cells = [f"{100.0 * float(run.metrics[f'test_{c}']):.1f}"
               for c in columns]
    note = "  (earlier run)" if run.skipped else ""
    lines.append(f"{run.seed:>8}  " + "  ".join(f"{c:>11}" for c in cells)
                 + note)
  if summary["mean"] is not None:
    cell = f"{summary['mean']:.1f} ({summary['std']:.1f})"
    done = len(summary["per_seed"])
    note = f"  (over {done} of {len(runs)} seeds)" if done < len(runs) else ""
    lines.append(f"{'mean':>8}  {cell:>11}{note}")
  return "\n".join(lines)


__all__ = ["DEFAULT_SEEDS", "SeedRun", "lookup_task", "parse_seeds",
           "seed_bindings", "train_argv", "read_test_metrics", "run_seeds", "summarize",
           "format_table"]
