"""Exact match against the number of passages (FiD paper, Figure 3).

The inputs are ``jaxfid predict`` outputs (an ``em`` per line: 1.0, 0.0 or
null), each with a label and its number of passages, given as:

* ``LABEL:N_CONTEXT:PATH`` strings;
* a file named ``LABEL_n{N}.jsonl``, or a directory of them;
* a JSON file listing ``{"label", "n_context", "path"}`` objects (paths
  relative to it).

A run's EM is its mean ``em``; each label is one line of EM (%) against
passages (log-scale x), drawn with matplotlib's Agg canvas and written
atomically in the output name's format.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from jaxfid.core.errors import InputError
from jaxfid.runtime.files import atomic_write

_TRIPLE = re.compile(r"^(?P<label>[^:]+):(?P<n>\d+):(?P<path>.+)$")
_NAMED = re.compile(r"^(?P<label>.+)_n(?P<n>\d+)\.jsonl$")


@dataclasses.dataclass(frozen=True)
class Run:
  """One prediction file: its label and number of passages."""
  label: str
  n_context: int
  path: str


@dataclasses.dataclass(frozen=True)
class Point:
  """The EM of one run."""
  n_context: int
  em: float
  examples: int
  path: str


def _positive(n: int, path, where=None) -> int:
  if n < 1:
    raise InputError(path, f"number of passages must be at least 1, got {n}",
                     where=where)
  return n


def _runs_in_directory(directory: str) -> list[Run]:
  runs = []
  for name in sorted(os.listdir(directory)):
    match = _NAMED.match(name)
    path = os.path.join(directory, name)
    if match and os.path.isfile(path):
      runs.append(Run(match["label"], _positive(int(match["n"]), path), path))
  if not runs:
    raise InputError(directory, "no prediction files named LABEL_n{N}.jsonl")
  return runs


def parse_run_spec(spec: str) -> list[Run]:
  """The runs of one ``--runs`` argument (module docstring); InputError for
  another form or a missing file."""
  match = _TRIPLE.match(spec)
  if match and not os.path.exists(spec):
    path = match["path"]
    if not os.path.isfile(path):
      raise InputError(path, "no such prediction file")
    return [Run(match["label"], _positive(int(match["n"]), spec), path)]
  if os.path.isdir(spec):
    return _runs_in_directory(spec)
  named = _NAMED.match(os.path.basename(spec))
  if named and os.path.isfile(spec):
    return [Run(named["label"], _positive(int(named["n"]), spec), spec)]
  if not os.path.exists(spec):
    raise InputError(spec, "no such file or directory (expected "
                     "LABEL:N_CONTEXT:PATH, a directory of LABEL_n{N}.jsonl "
                     "files, or a file named LABEL_n{N}.jsonl)")
  raise InputError(spec, "cannot tell the label and number of passages: name "
                   "the file LABEL_n{N}.jsonl or pass LABEL:N_CONTEXT:PATH")


def read_runs_json(path: str) -> list[Run]:
  """Runs listed in a JSON file, ``[{"label", "n_context", "path"}, ...]``
  (else InputError)."""
  try:
    with open(path, encoding="utf-8") as f:
      entries = json.load(f)
  except FileNotFoundError:
    raise InputError(path, "no such file") from None
  except UnicodeDecodeError:
    raise InputError(path, "not UTF-8 text") from None
  except json.JSONDecodeError as e:
    raise InputError(path, f"invalid JSON: {e.msg} (column {e.colno})",
                     where=e.lineno) from None
  if not isinstance(entries, list) or not entries:
    raise InputError(path, "expected a non-empty JSON list of {\"label\", "
                     "\"n_context\", \"path\"} objects")
  base = os.path.dirname(os.path.abspath(path))
  runs = []
  for k, entry in enumerate(entries, start=1):
    where = f"entry {k}"
    if not isinstance(entry, dict):
      raise InputError(path, "expected an object", where=where)
    missing = [key for key in ("label", "n_context", "path")
               if key not in entry]
    if missing:
      raise InputError(path, f"missing {', '.join(missing)}", where=where)
    label, n, run_path = entry["label"], entry["n_context"], entry["path"]
    if not isinstance(label, str) or not label:
      raise InputError(path, "\"label\" must be a non-empty string",
                       where=where)
    if isinstance(n, bool) or not isinstance(n, int):
      raise InputError(path, "\"n_context\" must be an integer", where=where)
    if not isinstance(run_path, str) or not run_path:
      raise InputError(path, "\"path\" must be a non-empty string",
                       where=where)
    run_path = os.path.join(base, run_path)
    if not os.path.isfile(run_path):
      raise InputError(run_path, "no such prediction file")
    runs.append(Run(label, _positive(n, path, where), run_path))
  return runs


def run_em(path: str) -> tuple[float, int]:
  """Mean ``em`` of a ``jaxfid predict`` output and the lines it averages;
  InputError for a line without a numeric or null ``em`` or no scored line."""
  total, count = 0.0, 0
  try:
    with open(path, encoding="utf-8") as f:
      for lineno, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise InputError(path, f"invalid JSON: {e.msg} (column {e.colno})",
                           where=lineno) from None
        if not isinstance(record, dict) or "em" not in record:
          raise InputError(path, "no \"em\" field: not a `jaxfid predict` "
                           "output", where=lineno)
        em = record["em"]
        if em is None:
          continue
        if isinstance(em, bool) or not isinstance(em, (int, float)):
          raise InputError(path, f"\"em\" must be a number or null, got "
                           f"{em!r}", where=lineno)
        total += float(em)
        count += 1
  except UnicodeDecodeError:
    raise InputError(path, "not UTF-8 text") from None
  except OSError as e:
    raise InputError(path, f"cannot read: {e.strerror or e}") from None
  if count == 0:
    raise InputError(path, "no scored predictions (every \"em\" is null)")
  return total / count, count


def collect_points(runs: Sequence[Run]) -> dict[str, list[Point]]:
  """EM per run, grouped by label (first-appearance order), sorted by
  passages; InputError for no runs, a duplicate (label, passages) or a bad
  prediction file."""
  if not runs:
    raise InputError("--runs", "no runs given")
  series: dict[str, list[Point]] = {}
  for run in runs:
    points = series.setdefault(run.label, [])
    for p in points:
      if p.n_context == run.n_context:
        raise InputError(run.path, f"label {run.label!r} already has a run "
                         f"with {run.n_context} passages ({p.path})")
    em, n = run_em(run.path)
    points.append(Point(run.n_context, em, n, run.path))
  for points in series.values():
    points.sort(key=lambda p: p.n_context)
  return series


def _atomic_savefig(figure, output: str, fmt: str) -> None:
  with atomic_write(output, "wb") as f:
    figure.savefig(f, format=fmt)


def output_format(output: str) -> str:
  """The image format of ``output`` (its suffix) if matplotlib's Agg canvas
  writes it, else InputError."""
  supported = FigureCanvasAgg.get_supported_filetypes()
  fmt = os.path.splitext(output)[1].lstrip(".").lower()
  if fmt not in supported:
    raise InputError(output, "unknown image format: end the name in one of "
                     + ", ".join("." + f for f in sorted(supported)))
  return fmt


def plot_em_vs_passages(series: dict[str, list[Point]], output: str,
                        title: str | None = None) -> None:
  """Draws EM (%) against passages, one line per label, into ``output``
  (InputError for a name with no image format matplotlib writes)."""
  fmt = output_format(output)
  figure = Figure(figsize=(5.0, 3.6), dpi=150)
  FigureCanvasAgg(figure)
  ax = figure.add_subplot(1, 1, 1)
  ticks = sorted({p.n_context for points in series.values() for p in points})
  for label, points in series.items():
    ax.plot([p.n_context for p in points], [100.0 * p.em for p in points],
            marker="o", label=label)
  ax.set_xscale("log")
  ax.xaxis.set_major_locator(FixedLocator(ticks))
  ax.xaxis.set_minor_locator(NullLocator())
  ax.set_xticklabels([str(t) for t in ticks])
  if len(ticks) == 1:
    ax.set_xlim(ticks[0] / 2, ticks[0] * 2)
  ax.set_xlabel("Number of passages")
  ax.set_ylabel("Exact match (%)")
  if title:
    ax.set_title(title)
  ax.grid(True, alpha=0.3)
  ax.legend()
  figure.tight_layout()
  _atomic_savefig(figure, output, fmt)


def points_json(series: dict[str, list[Point]], output: str) -> dict:
  """The summary ``jaxfid plot`` prints (EM as a fraction)."""
  return {"output": output, "series": [
      {"label": label, "points": [
          {"n_context": p.n_context, "em": round(p.em, 6),
           "examples": p.examples, "path": p.path} for p in points]}
      for label, points in series.items()]}
