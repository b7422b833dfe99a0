"""``jaxfid eval --gin_file=F [--gin.NAME=VALUE ...]``: seqio evaluation.

  jaxfid eval --gin_file=gin/fid/tiny.gin --gin.CHECKPOINT_PATH="'out'" \
    --gin.MIXTURE_OR_TASK_NAME="'trivia_qa_fid'" --gin.EVAL_OUTPUT_DIR="'ev'" \
    [--gin.EVAL_SPLIT="'validation'"] --gin.N_CONTEXT=3 ...

``gin/evaluation.gin`` (included by every method's gin) configures
:func:`jaxfid.commands.seqio_eval.evaluate`.
"""
from __future__ import annotations

import json

import gin

from jaxfid.commands import distributed, gin_flags, gin_specs, seqio_eval
from jaxfid.commands.registry import Command


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "eval", help="evaluate a checkpoint on a seqio task or mixture",
      description="Run seqio.Evaluator on a task or mixture with a "
                  "checkpoint's predict and score functions; writes "
                  "EVAL_OUTPUT_DIR/metrics.jsonl, per-example predictions "
                  "and TensorBoard summaries.")
  gin_flags.add_gin_arguments(p)
  distributed.add_arguments(p)
  p.set_defaults(func=run, accepts_gin_bindings=True)


def run(args) -> int:
  distributed.initialize(args)
  gin_flags.parse_checked(args.gin_file, args.gin_bindings,
                          args.gin_search_path, "eval",
                          gin_specs.eval_reads())
  result = gin_flags.call_configurable(
      gin.get_configurable(seqio_eval.evaluate))
  print(json.dumps(result))
  return 0


COMMAND = Command("eval", add_parser, order=40, model=True,
                  gin={"eval": gin_specs.eval_reads})
