"""``jaxfid bench compile``: a run's programs compiled for a TPU slice or GPUs.

::

  jaxfid bench compile --topology v5e-16 --gin_file=gin/fid/base.gin \\
      [--gin.NAME=VALUE ...] [--program train|decode] [--search] [--slices N]
      [--breakdown]

Takes ``jaxfid train``'s gin files and bindings (any method: the task comes
from ``METHOD``) and compiles, with the TPU compiler and from shapes alone,
the train step the trainer would run (``--program train``, every phase) or
the task's prediction program at ``EVAL_BATCH_SIZE`` (``decode``); see
:mod:`jaxfid.aot.programs` for what is compiled and what each field means.
No data or checkpoint is read and nothing is written: ``MODEL_DIR`` may be
unset, and data paths may name files that do not exist here (a method's
task binds placeholders where its configs need a path:
``Compilable.compile_bindings``). The last line on stdout is one JSON object;
``--search`` (:mod:`jaxfid.aot.search`) tries remat, mesh
splits, accumulation and scanned layers and prints the best as flags;
``--breakdown`` (one compile, not a search) adds where the step's HBM
bytes and FLOPs go (:mod:`jaxfid.aot.breakdown`): a ``breakdown`` field and
a table on stderr.

Needs ``libtpu`` (``pip install -e '.[tpu]'``, on any host) for a TPU
slice, JAX's CUDA plugin (``pip install -e '.[gpu-aot]'``, on any host) for
GPUs (:mod:`jaxfid.aot.gpus`); a missing one, an unknown topology or a bad
configuration is one line, exit 2. A program
the compiler cannot fit is ``"fits": false`` with ``required_gb``, exit 0.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
from typing import Any

import gin
import jax

from jaxfid.aot import breakdown as breakdown_lib
from jaxfid.aot import executables, programs, search, search_log, topologies
from jaxfid.commands import gin_flags
from jaxfid.core.errors import InputError
from jaxfid.core.gin_checks import Reads
from jaxfid.training import launch
from jaxfid.training.settings import OptimizerSettings, Settings
from jaxfid.training.task import Prepared, compilable

HELP = ("compile a run's train step or decoding for a TPU slice or GPUs "
        "(none needed): memory per chip, fits, FLOPs, collectives, roofline")
# `jaxfid train`'s reads, and the evaluation batch of --program decode
READS = Reads(roots=(launch.run,),
              macros={"MIXTURE_OR_TASK_NAME": None, "EVAL_BATCH_SIZE": None})
PROGRAMS = ("train", "decode")
PLACEHOLDER_MODEL_DIR = "(not written by bench compile)"


def add_arguments(p) -> None:
  p.add_argument("--topology", required=True,
                 help="a Cloud TPU accelerator type (v4-32, v5p-64: "
                 "TensorCores; v5e-16, v6e-8: chips), a shape (v5e:4x4), or "
                 "GPUs of one host: <card>-<n> (h100-8, a100-8, h200-8, "
                 "b200-8, h100-1)")
  p.add_argument("--slices", type=int, default=1,
                 help="number of such slices (multi-slice; GPUs: hosts)")
  p.add_argument("--program", choices=PROGRAMS, default="train",
                 help="the train step (every phase) or the prediction "
                 "program at EVAL_BATCH_SIZE")
  p.add_argument("--search", action="store_true",
                 help="try remat, mesh splits, accumulation and scanned "
                 "layers; print what fits and the best as --gin. flags")
  p.add_argument("--search-log", default=None, metavar="FILE",
                 help="--search: append each finished compile's report to "
                 "FILE and take those already there, so that a stopped "
                 "search resumes where it was")
  p.add_argument("--jobs", type=int, default=1,
                 help="--search: compile up to N configurations at once "
                 "(each a process needing one compile's host memory)")
  p.add_argument("--save-executable", default=None, metavar="FILE",
                 help="--program train: write the compiled step of every "
                 "phase to FILE, which jaxfid train --gin.COMPILED_STEP="
                 "\"'FILE'\" loads instead of compiling (same versions, "
                 "target, mesh and program)")
  p.add_argument("--breakdown", action="store_true",
                 help="where the compiled step's HBM bytes and FLOPs go, "
                 "from its optimized HLO: grouped (attention scores, "
                 "matmuls, dropout, layout copies, collectives, optimizer) "
                 "and its top instructions; a 'breakdown' field and a table "
                 "on stderr (one compile, not --search)")
  # --search's child processes: the train step's FLOPs without remat, per
  # phase (the search traces them once)
  p.add_argument("--model-flops", type=json.loads, default=None,
                 help=argparse.SUPPRESS)
  # compile here, not in a child process (what the children are told)
  p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)


@dataclasses.dataclass(frozen=True)
class Run:
  """A user's gin run, to build with macros overridden (``--search``)."""
  files: tuple[str, ...]
  bindings: tuple[str, ...]
  search_paths: tuple[str, ...]
  _said: set = dataclasses.field(default_factory=set, compare=False)

  def _parse(self, macros: dict) -> None:
    extra = [f"{k} = {gin_flags.gin_literal(v)}" for k, v in macros.items()]
    gin_flags.parse_gin(list(self.files), [*self.bindings, *extra],
                        list(self.search_paths))

  def placeholders(self) -> dict:
    """Macros a compile binds so that the run builds without its data."""
    self._parse({})
    try:
      out = {}
      if not isinstance(gin_flags.macro_value("MODEL_DIR"), str):  # REQUIRED
        out["MODEL_DIR"] = PLACEHOLDER_MODEL_DIR
      method = gin_flags.macro_value("METHOD")
      if isinstance(method, type) and hasattr(method, "compile_bindings"):
        out.update(method.compile_bindings(gin_flags.macro_value))
      return out
    finally:
      gin.clear_config()

  def config_text(self, macros: dict) -> str:
    """The gin configuration as parsed, included files and all."""
    self._parse(macros)
    try:
      return gin.config_str()
    finally:
      gin.clear_config()

  def check(self, macros: dict) -> None:
    gin_flags.parse_checked(self.files, [*self.bindings, *(
        f"{k} = {gin_flags.gin_literal(v)}" for k, v in macros.items())],
        self.search_paths, "bench compile", READS)
    gin.clear_config()

  def build(self, macros: dict) -> "Built":
    """The run's task, what its ``prepare_shapes`` returned, settings,
    optimizer and the macros the command reads, with ``macros`` bound."""
    self._parse(macros)
    try:
      task = compilable(_reference("%METHOD"))
      settings = _reference("loop.train.settings")
      optimizer = _reference("loop.train.optimizer")
      hardware_rng = bool(gin_flags.macro_value("USE_HARDWARE_RNG"))
      eval_batch = gin_flags.macro_value("EVAL_BATCH_SIZE")
      remat = gin_flags.macro_value("REMAT")
      scan = bool(gin_flags.macro_value("SCAN_LAYERS"))
    finally:
      gin.clear_config()
    said = io.StringIO()
    with launch.prng_context(hardware_rng), contextlib.redirect_stderr(said):
      prepared = task.prepare_shapes(settings)
    for line in said.getvalue().splitlines():  # each note once, not per build
      if line not in self._said:
        self._said.add(line)
        print(line, file=sys.stderr)
    return Built(task, prepared, settings, optimizer, hardware_rng,
                 eval_batch or settings.batch_size, remat, scan)


def _reference(name: str):
  value = gin.query_parameter(name)
  if isinstance(value, gin.config.ConfigurableReference):
    return gin_flags.call_configurable(value.scoped_configurable_fn)
  return value


@dataclasses.dataclass(frozen=True)
class Built:
  task: Any                     # a Compilable Task
  prepared: Prepared
  settings: Settings
  optimizer: OptimizerSettings
  hardware_rng: bool
  eval_batch_size: int
  remat: str | None
  scan_layers: bool


def compile_once(run: Run, macros: dict, program: str, target: programs.Target,
                 model_flops: list[float] | None = None,
                 save_executable: str | None = None,
                 breakdown: bool = False) -> dict:
  """The report of one configuration (``macros`` over the run's gin).

  ``model_flops`` (train: per phase) may be given when known (the search
  computes it once); otherwise the train step is traced again without remat
  for it. ``save_executable``: the train step written there too
  (:mod:`jaxfid.aot.executables`); ``breakdown`` adds the report's
  ``breakdown`` field.
  """
  built = run.build(macros)
  with launch.prng_context(built.hardware_rng):
    if program == "decode":
      return programs.compile_decode(built.task, built.prepared,
                                     built.optimizer, target,
                                     built.eval_batch_size, breakdown)
    if model_flops is None:
      model_flops = train_model_flops(run, macros)
    if save_executable:
      return executables.compile_train_saving(
          built.task, built.prepared, built.optimizer, target,
          save_executable, model_flops)
    return programs.compile_train(built.task, built.prepared,
                                  built.optimizer, target, model_flops,
                                  breakdown)


def train_model_flops(run: Run, macros: dict) -> list[float]:
  """Per phase, the train step's matmul FLOPs without recomputation: the
  step traced with ``REMAT='none'`` (the model's own FLOPs)."""
  built = run.build({**macros, "REMAT": "none"})
  with launch.prng_context(built.hardware_rng):
    return programs.train_flops(built.task, built.prepared, built.optimizer)


@contextlib.contextmanager
def _compile_only():
  """Compiling for a TPU needs no local accelerator: JAX stays on the CPU
  (unless the user chose its platforms), and the persistent compilation
  cache is off meanwhile (``compile_s`` is the compiler's time, every
  time)."""
  if not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)


def summary(result: dict) -> str:
  """One line for stderr about a report."""
  mesh = ",".join(f"{k}={v}" for k, v in result["mesh"].items() if v > 1)
  head = (f"jaxfid bench compile: {result['program']} on "
          f"{result['topology']} ({result['chips']} chips, mesh "
          f"{mesh or 'data=1'}): ")
  if not result["fits"] and result.get("per_chip_gb") is None:
    need = result.get("required_gb")
    return head + (f"does not fit: the compiler needs {need:.2f} GB per chip"
                   if need is not None else "does not fit") + (
                       f" of {result['hbm_gb_per_chip']:.2f}")
  roofline = result["roofline_step_s"]
  return head + (f"{result['per_chip_gb']:.2f} GB per chip of "
                 f"{result['hbm_gb_per_chip']:.2f} "
                 f"({'fits' if result['fits'] else 'does not fit'})"
                 + (f", roofline {roofline * 1e3:.3g} ms/step"
                    if roofline is not None else ""))


# The compile's interpreter starts as this small program, then execs the
# compile (``sys.argv[1]`` is the parent's pid, the rest its command line):
# * it raises its stack limit to the ceiling, for the compile alone (this
#   process's is untouched, and ``subprocess`` need not fork for a
#   ``preexec_fn``); where the ceiling is unlimited glibc gives each thread
#   32 MiB. The TPU compiler recurses over a program's fusions: on
#   2026-12-04, T5-large's 48 layers at d_model 64 (libtpu 0.0.42.1)
#   overflowed a thread's default 8 MiB (``SIGSEGV STACK OVERFLOW`` in
#   ``FusedSpatialMajorConvolution``) and compiled with ``ulimit -s
#   unlimited``;
# * on Linux it asks to be killed when its parent dies
#   (``PR_SET_PDEATHSIG``, kept across the exec): a search killed on its
#   own (``kill``, a scheduler) would otherwise leave its compile running,
#   with its host memory, for up to half an hour.
CHILD_START = """
import os, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_STACK)
resource.setrlimit(resource.RLIMIT_STACK, (hard, hard))
if sys.platform == "linux":
  import ctypes, signal
  ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the parent died before that
  sys.exit(1)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def compile_in_child(args, macros: dict, model_flops,
                     echo: bool = False) -> dict:
  """One configuration compiled by ``jaxfid bench compile --in-process`` in
  a process of its own: a compiler crash (libtpu can die of a signal) is
  one line, a ``--search`` row, not the end of the command, and the
  compile's host memory is freed when it ends; it runs with the largest
  stack the host allows, and dies with this process (``CHILD_START``).
  Its report, or
  :class:`~jaxfid.aot.search.CompileFailed`; ``echo`` passes its
  stderr on (its notes and summary line) when it succeeds."""
  argv = [sys.executable, "-c", CHILD_START, str(os.getpid()),
          "-m", "jaxfid", "bench", "compile", "--in-process",
          "--topology", args.topology, "--slices", str(args.slices),
          "--program", args.program,
          *(["--save-executable", args.save_executable]
            if args.save_executable else []),
          *(f"--gin_file={f}" for f in args.gin_file),
          *(f"--gin_search_path={p}" for p in args.gin_search_path),
          *(f"--gin.{b}" for b in args.gin_bindings),
          *(f"--gin.{k}={gin_flags.gin_literal(v)}" for k, v in macros.items())]
  if model_flops is not None:
    argv.append(f"--model-flops={json.dumps(model_flops)}")
  if args.breakdown:
    argv.append("--breakdown")
  child = subprocess.run(argv, capture_output=True, text=True, check=False)
  if child.returncode == 0:
    if echo:
      sys.stderr.write(child.stderr)
    return json.loads(child.stdout.strip().splitlines()[-1])
  if child.returncode < 0:
    raise search.CompileFailed(
        f"the compile was killed by {signal.Signals(-child.returncode).name}"
        " (a compiler crash, or the host's memory)")
  lines = child.stderr.strip().splitlines() or [f"exit {child.returncode}"]
  raise search.CompileFailed(
      lines[-1].removeprefix("jaxfid bench: error: "),
      exit_code=2 if child.returncode == 2 else 1)


@contextlib.contextmanager
def _sigterm_is_one_line(search_log_path: str | None):
  """Loading libtpu (for the topology) installs absl's failure-signal
  handler, which answers SIGTERM with a stack dump. Meanwhile SIGTERM says
  one line instead and then ends the process by SIGTERM, as the sender
  expects; the compile processes die with it (``CHILD_START``) and the
  reports already in ``--search-log`` stay there. The line goes to file
  descriptor 2 itself: ``sys.stderr`` may be a build's capture
  (``Run.build``)."""
  def stop(signum, frame):
    del signum, frame
    hint = (f"; rerun with --search-log {search_log_path} to go on"
            if search_log_path else "")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.write(2, f"jaxfid bench compile: stopped by SIGTERM{hint}\n".encode())
    os.kill(os.getpid(), signal.SIGTERM)
  previous = signal.signal(signal.SIGTERM, stop)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def run(args) -> int:
  if args.jobs < 1:
    raise InputError("--jobs", "must be at least 1")
  if args.search_log and not args.search:
    raise InputError("--search-log", "is the log of a --search; add --search")
  if args.save_executable and (args.search or args.program != "train"):
    raise InputError("--save-executable", "saves the train step of one "
                     "configuration: --program train, without --search")
  if args.breakdown and args.save_executable:
    raise InputError("--breakdown", "and --save-executable: give one at a "
                     "time")
  if args.breakdown and args.search:
    raise InputError("--breakdown", "breaks down one compile, not a "
                     "--search; rerun the search's best flags with "
                     "--breakdown")
  target = programs.Target.of(topologies.parse(args.topology, args.slices))
  with _sigterm_is_one_line(args.search_log):
    return _run(args, target)


def _run(args, target: programs.Target) -> int:
  gin_run = Run(tuple(args.gin_file), tuple(args.gin_bindings),
                tuple(args.gin_search_path))
  base = gin_run.placeholders()
  gin_run.check(base)
  with _compile_only():
    if args.search:
      def compile_fn(macros, flops=None):
        return compile_in_child(args, {**base, **macros}, flops)
      log = None
      if args.search_log:
        log = search_log.SearchLog(args.search_log, {
            "topology": args.topology, "slices": args.slices,
            "program": args.program, "gin": gin_run.config_text(base),
            **search_log.versions()})
        compile_fn = log.cached(compile_fn)
      result = search.search(
          compile_fn,
          lambda: (train_model_flops(gin_run, base)
                   if args.program == "train" else None),
          gin_run.build(base), target, args.program, jobs=args.jobs)
      if log:
        log.say_reused()
    elif args.in_process:
      try:
        result = compile_once(gin_run, base, args.program, target,
                              args.model_flops, args.save_executable,
                              args.breakdown)
      except jax.errors.JaxRuntimeError as e:  # the compiler's own error
        first = next((l.strip() for l in str(e).splitlines() if l.strip()),
                     type(e).__name__)
        print(f"jaxfid bench: error: the compiler failed: {first}",
              file=sys.stderr)
        return 1
      print(summary(result), file=sys.stderr)
      if result.get("breakdown"):
        print(breakdown_lib.table(result["breakdown"]), file=sys.stderr)
    else:
      try:
        result = compile_in_child(args, {}, args.model_flops, echo=True)
      except search.CompileFailed as e:
        print(f"jaxfid bench: error: {e.message}", file=sys.stderr)
        return e.exit_code
  print(json.dumps(result))
  return 0
