"""``jaxfid plot``: EM against number of passages from several predict runs.

  jaxfid plot --runs LABEL:N:PRED.jsonl [DIR | LABEL_nN.jsonl ...]
      [--runs-json RUNS.json] --output fig.png [--title T]

Prints one JSON line: the output path and, per label, the points
(``n_context``, ``em`` as a fraction, ``examples``, ``path``). See
:mod:`jaxfid.fid.plot` for the accepted run forms.
"""
from __future__ import annotations

import json

from jaxfid.commands.registry import Command
from jaxfid.core.errors import InputError
from jaxfid.fid import plot as plotting


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "plot", help="plot EM against number of passages (FiD Figure 3)")
  p.add_argument("--runs", nargs="+", default=[], metavar="RUN",
                 help="LABEL:N_CONTEXT:PRED.jsonl, a LABEL_n{N}.jsonl file, "
                 "or a directory of them")
  p.add_argument("--runs-json", default=None,
                 help="JSON list of {label, n_context, path}")
  p.add_argument("--output", required=True,
                 help="image file (.png, .pdf, .svg, ...)")
  p.add_argument("--title", default=None)
  p.set_defaults(func=run)


def run(args) -> int:
  plotting.output_format(args.output)  # before reading any run
  runs = []
  for spec in args.runs:
    runs.extend(plotting.parse_run_spec(spec))
  if args.runs_json:
    runs.extend(plotting.read_runs_json(args.runs_json))
  if not runs:
    raise InputError("--runs", "give at least one run (--runs or --runs-json)")
  series = plotting.collect_points(runs)
  plotting.plot_em_vs_passages(series, args.output, title=args.title)
  print(json.dumps(plotting.points_json(series, args.output)))
  return 0


COMMAND = Command("plot", add_parser, order=90)
