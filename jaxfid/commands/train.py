"""``jaxfid train --gin_file=F [--gin_file=G ...] [--gin.NAME=VALUE ...]``.

With the ``MIXTURE_OR_TASK_NAME`` macro set, the seqio tasks are imported
(they register the ``seqio`` example source the FiD task reads them with).
"""
from __future__ import annotations

import json

import gin
import jax

from jaxfid.commands import distributed, gin_flags, gin_specs, seqio_tasks
from jaxfid.commands.registry import Command
from jaxfid.training import launch


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "train", help="train a model from gin files (FiD, Atlas, ReAtt, "
      "ReFusion, dual encoders)",
      description="Train from gin files; rerunning the same command resumes "
                  "from the latest checkpoint in MODEL_DIR.")
  gin_flags.add_gin_arguments(p)
  distributed.add_arguments(p)
  p.set_defaults(func=run, accepts_gin_bindings=True)


def run(args) -> int:
  distributed.initialize(args)
  gin_flags.parse_checked(args.gin_file, args.gin_bindings,
                          args.gin_search_path, "train",
                          gin_specs.TRAIN_READS)
  if seqio_tasks.gin_macro(seqio_tasks.MIXTURE_OR_TASK_NAME) is not None:
    seqio_tasks.import_tasks()  # registers the tasks and the "seqio" source
  result = gin_flags.call_configurable(gin.get_configurable(launch.run))
  if jax.process_index() == 0:  # one summary for a multi-host run
    print(json.dumps({k: v for k, v in result.items()
                      if isinstance(v, (int, float, str, bool))}))
  # SIGTERM (preemption) is a clean stop; Ctrl-C stops as interrupted.
  return 130 if result.get("signal") == "SIGINT" else 0


COMMAND = Command("train", add_parser, order=30, model=True,
                  gin={"train": gin_specs.TRAIN_READS})
