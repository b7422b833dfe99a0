"""ReFusion's command, `jaxfid refusion seeds`: one task over the LM-BFF seeds.

  jaxfid refusion seeds --data-root k-shot --task sst-2 \
      --model-dir-root runs/sst2 [--seeds 13,21,42,87,100] \
      --gin_file=gin/refusion/tiny.gin [--gin.NAME=VALUE ...]

prints the test metric per seed and ``mean (std)`` in percent, then one JSON
line (also ``<model-dir-root>/summary.json``); see :mod:`jaxfid.refusion.seeds`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from jaxfid.commands import gin_flags, gin_specs
from jaxfid.commands.gin_flags import GinRun
from jaxfid.commands.registry import Command
from jaxfid.refusion import seeds as seeds_lib
from jaxfid.refusion.seeds import DEFAULT_SEEDS
from jaxfid.runtime.files import atomic_write


SEEDS_READS = gin_specs.TRAIN_READS  # each seed is a `jaxfid train`


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("refusion", help="ReFusion utilities (5-seed "
                            "few-shot runs)")
  sub = p.add_subparsers(dest="refusion_command", required=True)
  s = sub.add_parser(
      "seeds", help="train and test a task over the LM-BFF seeds",
      description="Train and test one LM-BFF task once per seed (each in a "
      "fresh `jaxfid train` process) and report mean (std) in percent. "
      "Rerunning resumes: seeds with test results are not run again.")
  s.add_argument("--data-root", required=True,
                 help="LM-BFF k-shot directory (holds <TASK>/16-<seed>/)")
  s.add_argument("--task", required=True, help="task name, e.g. sst-2")
  s.add_argument("--model-dir-root", required=True,
                 help="each seed trains in <model-dir-root>/16-<seed>")
  s.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)),
                 help="comma-separated seeds (default: LM-BFF's five)")
  gin_flags.add_gin_arguments(s)
  s.set_defaults(func=run_seeds, accepts_gin_bindings=True)


def check_gin(args: argparse.Namespace, seeds: list[int]) -> None:
  """Validates the seeds' `jaxfid train` run before any seed runs (with the
  first seed's TASK, DATA_DIR, SEED and MODEL_DIR; a caller's binding of
  those is refused by :func:`jaxfid.refusion.seeds.run_seeds`)."""
  spec = seeds_lib.lookup_task(args.task)
  if not args.gin_file or not seeds:
    return  # run_seeds says what is missing
  seed = seeds[0]
  name = seeds_lib.seed_dir_name(seed)
  run = GinRun(tuple(args.gin_file), tuple(getattr(args, "gin_bindings", [])),
               tuple(args.gin_search_path))
  run.check("refusion seeds", SEEDS_READS, macros={
      "TASK": spec.name, "SEED": seed,
      "DATA_DIR": os.path.join(args.data_root, spec.lmbff_dir, name),
      "MODEL_DIR": os.path.join(args.model_dir_root, name)})


def run_seeds(args: argparse.Namespace) -> int:
  seeds = seeds_lib.parse_seeds(args.seeds)
  check_gin(args, seeds)
  runs = seeds_lib.run_seeds(
      args.task, args.data_root, args.model_dir_root, seeds, args.gin_file,
      getattr(args, "gin_bindings", []), args.gin_search_path)
  spec = seeds_lib.lookup_task(args.task)
  summary = seeds_lib.summarize(spec.name, spec.metric, runs)
  print(seeds_lib.format_table(summary, runs))
  failed = [r for r in runs if r.error is not None]
  for run in failed:
    print(f"jaxfid refusion seeds: seed {run.seed} failed: {run.error}",
          file=sys.stderr)
  if failed:
    return 1
  print(json.dumps(summary))
  with atomic_write(os.path.join(args.model_dir_root, "summary.json")) as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
  return 0


COMMAND = Command("refusion", add_parser, order=130, model=True,
                  gin={"refusion seeds": SEEDS_READS})
