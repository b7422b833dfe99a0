"""``jaxfid bench train|decode``: the speed of a gin-configured FiD.

Takes ``jaxfid train``'s ``--gin_file`` / ``--gin.NAME=VALUE`` (the model,
BATCH_SIZE, N_CONTEXT, TEXT_MAXLENGTH, and DECODE_MAXLENGTH or
TARGET_MAXLENGTH, None meaning 49) plus ``--steps N``; the last line is one
JSON object with examples_per_sec, step_time_s, model_tflops_per_sec, mfu,
peak_memory_gb, device, model and shape. A TPU run's memory: ``jaxfid bench
compile``.
"""
from __future__ import annotations

import json
import sys

import gin

from jaxfid.commands import gin_flags
from jaxfid.commands.bench import Mode
from jaxfid.core.errors import InputError
from jaxfid.core.gin_checks import Reads, flag, integer
from jaxfid.fid import bench
from jaxfid.reader import config as fid_config
from jaxfid.t5 import config as config_lib
from jaxfid.training import launch

SIZE = integer(1)
OPTIONAL_SIZE = integer(1, optional=True)
# the model (T5Config) and the shape's macros; takes `jaxfid train`'s arguments
BENCH_READS = Reads(
    roots=(config_lib.T5Config,),
    macros={"BATCH_SIZE": SIZE, "N_CONTEXT": SIZE,
            "TEXT_MAXLENGTH": SIZE, "ANSWER_MAXLENGTH": OPTIONAL_SIZE,
            "TARGET_MAXLENGTH": OPTIONAL_SIZE,
            "DECODE_MAXLENGTH": OPTIONAL_SIZE, "USE_HARDWARE_RNG": flag()},
    needs=("BATCH_SIZE", "N_CONTEXT", "TEXT_MAXLENGTH"),
    accepts=(launch.run,))


def add_arguments(p) -> None:
  p.add_argument("--steps", type=int, default=10,
                 help="timed steps after the warm-up (compile) step")
  p.add_argument("--peak-tflops", type=float, default=None,
                 help="peak TFLOP/s for MFU (default: measured)")


def _macro(name):
  value = gin.query_parameter(f"%{name}")
  if (isinstance(value, gin.config.ConfigurableReference)
      and value.configurable.name == "macro"):  # NAME = %OTHER_NAME
    value = value.scoped_configurable_fn()
  return value


def _answer_length(mode: str) -> int:
  """The answer tokens of the benchmark's shape (see the module docstring)."""
  names = (("DECODE_MAXLENGTH", "TARGET_MAXLENGTH") if mode == "decode"
           else ("TARGET_MAXLENGTH", "DECODE_MAXLENGTH"))
  for name in (*names, "ANSWER_MAXLENGTH"):
    value = _macro_or(name, None)
    if value is not None:
      return value
  return fid_config.DEFAULT_DECODE_MAXLENGTH


def _macro_or(name, default):
  try:
    return _macro(name)
  except ValueError:  # not bound by these gin files
    return default


def run(args) -> int:
  gin_flags.parse_checked(args.gin_file, args.gin_bindings,
                          args.gin_search_path, "bench", BENCH_READS)
  try:
    cfg = gin.get_configurable(config_lib.T5Config)()
    shape = bench.Shape(batch_size=_macro("BATCH_SIZE"),
                        n_context=_macro("N_CONTEXT"),
                        text_maxlength=_macro("TEXT_MAXLENGTH"),
                        answer_maxlength=_answer_length(args.mode))
  except ValueError as e:
    raise InputError("gin", " ".join(str(e).split())) from None
  if args.steps < 1:
    raise InputError("--steps", "must be at least 1")
  header = (f"jaxfid bench {args.mode}: {shape} on {cfg.d_model=} "
            f"{cfg.num_layers=} {cfg.dtype=} {cfg.remat=}")
  print(header, file=sys.stderr)
  with launch.prng_context(_macro_or("USE_HARDWARE_RNG", False)):
    result = bench.run(args.mode, cfg, shape, steps=args.steps,
                       peak_tflops=args.peak_tflops)
  print(json.dumps(result))
  return 0


HELPS = {"train": "time FiD train steps on this host's devices",
         "decode": "time FiD greedy decoding on this host's devices"}
# `jaxfid bench train|decode`, registered by FiD's plug-in
MODES = tuple(Mode(name, HELPS[name], add_arguments, run, "bench", BENCH_READS,
                   order=order)
              for order, name in ((10, "train"), (20, "decode")))
