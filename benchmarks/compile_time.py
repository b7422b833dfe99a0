"""Compile time of the train step and of decoding, layers unrolled vs scanned.

One process, for each of ``scan_layers`` off (before: every layer compiled)
and on (after: ``jaxfid.t5.stack``, one ``lax.scan`` per stack):

* the FiD train step (forward, backward, Adam; ``jaxfid.fid.bench``'s):
  seconds to trace and lower it, seconds for XLA to compile it, the size of
  the optimised program (fused kernels), then its speed: the two compiled
  steps are timed in alternation, the order reversed every other round, and
  each row reports the median wall-clock and process CPU seconds per step;
* greedy decoding (passage encoding + the cached decoding loop): the same
  compile figures and speed (only the encoder is scanned; the decoding
  step's layers stay unrolled, each with its own cache entry).

No persistent compilation cache is used (each program compiles in full).
The process gets the malloc settings that ``jaxfid``'s commands get on a CPU
(``jaxfid.runtime.host_memory``). ``--threads N`` limits XLA to N CPUs, as in
``fid_vs_pytorch.py``.

Usage (from the repository root; issue #16's CPU shapes):
  python benchmarks/compile_time.py --size t5_small --batch-size 2 \\
      --n-context 8 --text-maxlength 128 --answer-maxlength 16 \\
      --decode-batch-size 4 --steps 5 --threads 1
  # compile only (abstract shapes: no memory for parameters), t5-large:
  python benchmarks/compile_time.py --size t5_large --steps 0 --threads 1

Prints the hardware, a markdown table and, last, one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_host import cpu_model, limit_threads, load_average  # noqa: E402

from jaxfid.runtime import host_memory  # noqa: E402

MALLOC = {"cpu_malloc": False, "reason": "imported, not run as a script"}
if __name__ == "__main__":  # before JAX starts, as the CLI does
  limit_threads(sys.argv[1:])
  MALLOC = host_memory.tune_cpu_malloc()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxfid.fid import bench  # noqa: E402
from jaxfid.t5 import config as config_lib  # noqa: E402
from jaxfid.t5.model import EncoderDecoderModel  # noqa: E402


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="t5_small")
  p.add_argument("--batch-size", type=int, default=2)
  p.add_argument("--n-context", type=int, default=8)
  p.add_argument("--text-maxlength", type=int, default=128)
  p.add_argument("--answer-maxlength", type=int, default=16)
  p.add_argument("--decode-batch-size", type=int, default=4)
  p.add_argument("--steps", type=int, default=5,
                 help="alternated timed steps; 0: compile only, from "
                      "abstract shapes (nothing allocated: any size)")
  p.add_argument("--remat", default="none", choices=("none", "full", "dots"))
  p.add_argument("--dropout", type=float, default=0.1)
  p.add_argument("--threads", type=int, default=None,
                 help="CPUs for XLA (sched_setaffinity; see cpu_host.py)")
  return p.parse_args(argv)


def train_program(cfg, shape, abstract=False):
  """(lower seconds, compile seconds, fused kernels, step closure).

  ``abstract``: lowered from shapes only (no parameters allocated; the
  closure is None), for models too large to step here.
  """
  step, state, batch = bench.train_program(cfg, shape, abstract=abstract)
  box = {"state": state}
  t0 = time.perf_counter()
  lowered = step.lower(box["state"], batch)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()

  def run():
    box["state"], metrics = compiled(box["state"], batch)
    return jax.block_until_ready(metrics)
  return (t1 - t0, t2 - t1, compiled.as_text().count(" fusion("),
          None if abstract else run)


def decode_program(cfg, shape, abstract=False):
  model = EncoderDecoderModel(cfg)
  init = lambda: model.init_params(0)  # noqa: E731
  params = jax.eval_shape(init) if abstract else jax.jit(init)()
  tokens = jnp.asarray(bench.synthetic_batch(cfg, shape)["encoder_input_tokens"])
  t0 = time.perf_counter()
  lowered = jax.jit(bench.greedy_generate(model, shape.answer_maxlength)
                    ).lower(params, tokens)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  return (t1 - t0, t2 - t1, compiled.as_text().count(" fusion("),
          None if abstract else
          lambda: jax.block_until_ready(compiled(params, tokens)))


def main(argv=None) -> int:
  args = parse_args(argv)
  model, bf16 = cpu_model()
  hardware = {"processor": model, "avx512_bf16": bf16,
              "cpus_allowed": len(os.sched_getaffinity(0)),
              "load_average_at_start": load_average(), "jax": jax.__version__,
              "backend": jax.default_backend(),
              "device": jax.devices()[0].device_kind,
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "cpu_malloc": MALLOC["reason"]}
  print("hardware: " + json.dumps(hardware), file=sys.stderr, flush=True)
  base = config_lib.preset(args.size, dtype="float32", remat=args.remat,
                           dropout_rate=args.dropout)
  train_shape = bench.Shape(args.batch_size, args.n_context,
                            args.text_maxlength, args.answer_maxlength)
  decode_shape = bench.Shape(args.decode_batch_size, args.n_context,
                             args.text_maxlength, args.answer_maxlength)
  rows = []
  for mode, build, shape in (("train", train_program, train_shape),
                             ("decode", decode_program, decode_shape)):
    runs = {}
    for scan in (False, True):
      name = "scanned" if scan else "unrolled"
      print(f"{mode} {name}: compiling ...", file=sys.stderr, flush=True)
      lower_s, compile_s, fusions, run = build(
          base.replace(scan_layers=scan), shape, abstract=args.steps == 0)
      runs[name] = run
      rows.append({"mode": mode, "layers": name, "lower_s": lower_s,
                   "compile_s": compile_s, "fused_kernels": fusions})
    speed = bench.alternate(runs, args.steps) if args.steps else {}
    for row in rows[-2:]:
      timing = speed.get(row["layers"], {})
      row["step_time_s"] = timing.get("step_time_s")
      row["cpu_time_s"] = timing.get("cpu_time_s")
  hardware["load_average_at_end"] = load_average()
  print(f"\n{args.size}, train batch {args.batch_size} x {args.n_context} "
        f"passages x {args.text_maxlength} tokens, {args.answer_maxlength} "
        f"target tokens; decode batch {args.decode_batch_size}; remat "
        f"{args.remat}; {args.steps} alternated steps\n")
  print("| program | layers | lower s | XLA compile s | fused kernels "
        "| s/step | CPU s/step |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    speed = ("| not timed | not timed |" if r["step_time_s"] is None else
             f"| {r['step_time_s']:.3f} | {r['cpu_time_s']:.3f} |")
    print(f"| {r['mode']} | {r['layers']} | {r['lower_s']:.1f} | "
          f"{r['compile_s']:.1f} | {r['fused_kernels']} " + speed)
  print(json.dumps({"hardware": hardware, "args": vars(args), "rows": rows}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
