"""jaxfid vs the PyTorch FiD reference: training step and greedy decoding speed.

One process times, on the same model sizes, batch shapes and device:

* jaxfid: the train step (forward, backward, Adam; ``jaxfid.fid.bench.bench_train``)
  and greedy decoding (``jaxfid.fid.bench.bench_decode``), optionally also with
  FiDO's decoder (``--fido-period K``: cross-attention in every K-th decoder
  layer only; ``--fido-mq``: multi-query cross-attention);
* the reference: HF ``transformers.T5ForConditionalGeneration`` with random
  weights and FiD reshaping, ``attn_implementation="sdpa"``, bf16 autocast
  (``torch_fid_reference.py``), eager and, with ``--compile``, under
  ``torch.compile``.

Both use the same synthetic batch (``jaxfid.fid.bench.synthetic_batch``) and the
same FLOP count (``jaxfid.fid.bench.forward_flops``; x3 for a train step), so
TFLOP/s and MFU are comparable; the peak is a measured large bf16/fp32 matmul
(the best of 3 timings, the larger of JAX's and torch's) unless
``--peak-tflops`` is given.

jaxfid and the eager reference, for the train step and each decode batch,
are prepared together and timed in alternation, step by step, the order
reversed every other round; each row reports the median wall-clock step time
and the median process CPU seconds per step (``CPU s/step``: on a shared
machine it moves less with the load). ``--threads N`` gives both runtimes N
CPU threads (see ``limit_threads``); the hardware lines include the CPU
model, whether it has AVX-512 bf16, and the load average at the start and
the end. The other rows (FiDO, more remat policies, ``torch.compile``) run
one after another as before. The process gets the glibc malloc settings that
``jaxfid``'s commands get on a CPU (``jaxfid.runtime.host_memory``; they apply
to torch's allocations too; ``JAXFID_CPU_MALLOC=0`` runs without them);
``--scan-layers`` runs jaxfid with ``T5Config.scan_layers``.

Memory: torch rows report ``torch.cuda.max_memory_allocated`` (exact per
row; for an alternated row, the peak since its pair was built). JAX cannot
reset its peak counter, so a jaxfid row reports the device's
``peak_bytes_in_use`` when the row raised it and "<= X" when it did not;
the other rows run in an order of (roughly) growing memory: all decodes by
batch size, then the train steps; the torch rows release their memory before
JAX's; JAX is told not to preallocate. On CPU the sequential rows report the
growth of the process's maximum RSS during the row (a lower bound; "n/a"
when it did not grow); alternated rows on CPU report none.

Usage (from the repository root):
  python benchmarks/fid_vs_pytorch.py --size t5_base --batch-size 4 \\
      --n-context 100 --text-maxlength 250 --answer-maxlength 20 \\
      --decode-batch-sizes 1,16 --compile --fido-period 6 --fido-mq
  # CPU, one thread per runtime (issue #16's shapes):
  python benchmarks/fid_vs_pytorch.py --size t5_small --batch-size 2 \\
      --n-context 8 --text-maxlength 128 --answer-maxlength 16 \\
      --decode-batch-sizes 4 --decode-n-context 10 --steps 5 --remat none \\
      --threads 1

Prints the hardware, a markdown table and, last, one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_report import brief, table, write_json  # noqa: E402
from cpu_host import describe, limit_threads, load_average  # noqa: E402

from jaxfid.runtime import host_memory  # noqa: E402

# Before JAX starts: the threads, and the malloc settings jaxfid's commands
# get on a CPU, which hold for the whole process, torch included
# (JAXFID_CPU_MALLOC=0: off). An import (the tests) changes neither.
MALLOC = {"cpu_malloc": False, "reason": "imported, not run as a script"}
if __name__ == "__main__":
  limit_threads(sys.argv[1:])
  MALLOC = host_memory.tune_cpu_malloc()

import jax  # noqa: E402

from jaxfid.fid import bench
from jaxfid.t5 import config as config_lib
from jaxfid.training import launch  # noqa: E402

PEAK_TRIES = 3  # the best of 3 matmul timings: noise only ever slows them


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="t5_small",
                 help=f"jaxfid preset: {', '.join(sorted(config_lib.PRESETS))}")
  p.add_argument("--batch-size", type=int, default=4, help="train batch")
  p.add_argument("--n-context", type=int, default=100)
  p.add_argument("--text-maxlength", type=int, default=250)
  p.add_argument("--answer-maxlength", type=int, default=20)
  p.add_argument("--decode-batch-sizes", default="1,16",
                 help="comma-separated batch sizes for greedy decoding")
  p.add_argument("--decode-n-context", type=int, default=None,
                 help="passages per question when decoding (default: "
                      "--n-context)")
  p.add_argument("--steps", type=int, default=5,
                 help="timed steps after the warm-up")
  p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                 help="activations (default: bfloat16 on GPU, float32 on CPU)")
  p.add_argument("--remat", default="full",
                 help="jaxfid gradient checkpointing, none|full|dots, or a "
                      "comma-separated list to time the dense train step "
                      "under each (gin/fid/base.gin: full)")
  p.add_argument("--dropout", type=float, default=0.1)
  p.add_argument("--scan-layers", action="store_true",
                 help="jaxfid scans its layers (T5Config.scan_layers)")
  p.add_argument("--hardware-rng", action="store_true",
                 help="also time the dense train step under the last --remat "
                      "with 'unsafe_rbg' keys (gin USE_HARDWARE_RNG)")
  p.add_argument("--compile", action="store_true",
                 help="also time the reference train step under torch.compile")
  p.add_argument("--fido-period", type=int, default=None,
                 help="also time jaxfid with cross-attention every K-th layer")
  p.add_argument("--fido-mq", action="store_true",
                 help="also time jaxfid with multi-query cross-attention")
  p.add_argument("--threads", type=int, default=None,
                 help="CPU threads for both runtimes: the process may run on "
                      "N CPUs (XLA sizes its pools from them; N = 1 also sets "
                      "--xla_cpu_multi_thread_eigen=false) and torch uses N "
                      "threads (default: each runtime's own default)")
  p.add_argument("--torch-threads", type=int, default=None,
                 help="torch.set_num_threads for the reference only "
                      "(overrides --threads for torch)")
  p.add_argument("--skip-torch", action="store_true")
  p.add_argument("--skip-jax", action="store_true",
                 help="only the reference (e.g. if both runtimes cannot share "
                      "one GPU process)")
  p.add_argument("--skip-train", action="store_true")
  p.add_argument("--peak-tflops", type=float, default=None)
  p.add_argument("--json-out", default=None,
                 help="also write the JSON result to this file")
  args = p.parse_args(argv)
  try:
    args.decode_batch_sizes = sorted(
        {int(x) for x in args.decode_batch_sizes.split(",") if x.strip()})
  except ValueError:
    p.error(f"--decode-batch-sizes must be integers, got "
            f"{args.decode_batch_sizes!r}")
  args.remat = list(dict.fromkeys(
      x.strip() for x in args.remat.split(",") if x.strip()))
  if not args.remat or set(args.remat) - {"none", "full", "dots"}:
    p.error(f"--remat must list none, full or dots, got {args.remat!r}")
  if args.steps < 1:
    p.error("--steps must be at least 1")
  if args.threads is not None and args.threads < 1:
    p.error("--threads must be at least 1")
  if args.fido_period is not None and args.fido_period < 1:
    p.error("--fido-period must be at least 1")
  if args.dtype is None:
    args.dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"
  return args


def hardware() -> dict:
  return {**describe(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "cpu_malloc": MALLOC["reason"]}


class JaxMemory:
  """Peak memory of a jaxfid row (see the module docstring)."""

  def __enter__(self):
    self._dev0 = self._device_peak()
    self._rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return self

  @staticmethod
  def _device_peak():
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")

  def __exit__(self, *exc):
    peak = self._device_peak()
    if peak is not None:
      self.gb, self.exact = peak / 1e9, peak > (self._dev0 or 0)
      self.source = "jax peak_bytes_in_use"
    else:
      rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      self.gb, self.exact = (rss - self._rss0) / 1e6, True
      self.source = "growth of process max RSS"


def _row(name, impl, mode, shape, step_time, flops, peak, mem_gb, mem_exact,
         mem_source, setup_s, extra=None) -> dict:
  tflops = flops / step_time / 1e12
  return {"name": name, "impl": impl, "mode": mode,
          "batch_size": shape.batch_size, "step_time_s": step_time,
          "examples_per_sec": shape.batch_size / step_time,
          "model_tflops_per_sec": tflops, "mfu": tflops / peak,
          "peak_memory_gb": mem_gb, "peak_memory_exact": mem_exact,
          "peak_memory_source": mem_source, "setup_s": setup_s,
          **(extra or {})}


def fido_label(cfg) -> str:
  parts = []
  if cfg.cross_attention_period > 1:
    parts.append(f"LSA-{cfg.cross_attention_period}")
  if cfg.multi_query_cross_attention:
    parts.append("MQ")
  return "FiDO " + "+".join(parts)


def run_pairs(cfg, shapes, args, peak, log) -> list[dict]:
  """jaxfid and torch eager side by side: train, then decodes by batch size.

  The two are prepared together and timed in alternation (``bench.alternate``):
  the fair comparison on a machine whose load changes from minute to minute.
  Memory: the torch row's CUDA peak (reset first) on GPU; not measured on CPU
  (both runtimes share the process's RSS).
  """
  import torch
  import torch_fid_reference as ref
  gpu = torch.cuda.is_available()
  jobs = []
  if not args.skip_train:
    jobs.append(("train", shapes["train"]))
  jobs += [("decode", shapes["decode"][b]) for b in args.decode_batch_sizes]
  rows = []
  for mode, shape in jobs:
    log(f"jaxfid and torch {mode} b={shape.batch_size}, alternating ...")
    batch = bench.synthetic_batch(cfg, shape)
    if gpu:
      torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    if mode == "train":
      jax_fn = bench.prepare_train(cfg, shape)
      t1 = time.perf_counter()
      torch_fn = ref.prepare_train(cfg, batch, dtype=args.dtype)
      flops = 3 * bench.forward_flops(cfg, shape)
    else:
      jax_fn = bench.prepare_decode(cfg, shape)
      t1 = time.perf_counter()
      torch_fn = ref.prepare_decode(cfg, batch, dtype=args.dtype,
                                    num_tokens=shape.answer_maxlength)
      flops = bench.forward_flops(cfg, shape)
    build_s = {"jaxfid": t1 - t0, "torch": time.perf_counter() - t1}
    with JaxMemory() as mem:
      r = bench.alternate({"jaxfid": jax_fn, "torch": torch_fn}, args.steps)
    torch_gb = torch.cuda.max_memory_allocated() / 1e9 if gpu else 0.0
    for impl in ("torch", "jaxfid"):
      x = r[impl]
      if impl == "jaxfid" and gpu:
        memory = (mem.gb, mem.exact, mem.source)
      elif gpu:
        memory = (torch_gb, True, "cuda max_memory_allocated")
      else:
        memory = (0.0, True, "growth of process max RSS (not measured: "
                  "runtimes alternate)")
      extra = {"cpu_time_s": x["cpu_time_s"], "alternated": True,
               "wall_s": x["wall_s"], "cpu_s": x["cpu_s"]}
      if impl == "jaxfid" and mode == "train":
        extra.update(remat=cfg.remat, scan_layers=cfg.scan_layers)
      rows.append(_row(f"{impl} {mode}", impl, mode, shape, x["step_time_s"],
                       flops, peak, *memory, x["first_s"] + build_s[impl],
                       extra))
      log(brief(rows[-1]))
  return rows


def run_jax(cfg, shapes, args, peak, log, *, paired=False) -> list[dict]:
  """jaxfid rows: decodes by batch (FiDO before dense), then train steps.

  With ``paired`` the dense model's rows were timed by ``run_pairs``.
  """
  cfgs = [] if paired else [("jaxfid", cfg)]
  if args.fido_period or args.fido_mq:
    fido = cfg.replace(cross_attention_period=args.fido_period or 1,
                       multi_query_cross_attention=args.fido_mq)
    cfgs.insert(0, (f"jaxfid {fido_label(fido)}", fido))
  rows = []
  for b in args.decode_batch_sizes:
    for name, c in cfgs:
      shape = shapes["decode"][b]
      log(f"{name} decode b={b} ...")
      with JaxMemory() as mem:
        t0 = time.perf_counter()
        r = bench.bench_decode(c, shape, steps=args.steps)
        total = time.perf_counter() - t0
      rows.append(_row(f"{name} decode", "jaxfid", "decode", shape,
                       r["step_time_s"], bench.forward_flops(c, shape), peak,
                       mem.gb, mem.exact, mem.source,
                       total - args.steps * r["step_time_s"]))
      log(brief(rows[-1]))
  if not args.skip_train:
    # The first remat policy for every model; the others for the dense one,
    # and the hardware RNG under the last.
    variants = [(name, c, False) for name, c in cfgs]
    variants += [(f"jaxfid remat-{r}", cfg.replace(remat=r), False)
                 for r in args.remat[1:]]
    if args.hardware_rng:
      last = args.remat[-1]
      variants.append((" ".join(["jaxfid"] + (
          [f"remat-{last}"] if last != args.remat[0] else []) + [
              "hardware-rng"]), cfg.replace(remat=last), True))
    for name, c, hardware_rng in variants:
      shape = shapes["train"]
      log(f"{name} train b={shape.batch_size} ...")
      with JaxMemory() as mem, launch.prng_context(hardware_rng):
        t0 = time.perf_counter()
        r = bench.bench_train(c, shape, steps=args.steps)
        total = time.perf_counter() - t0
      rows.append(_row(f"{name} train", "jaxfid", "train", shape,
                       r["step_time_s"], r["flops"], peak, mem.gb, mem.exact,
                       mem.source, total - args.steps * r["step_time_s"],
                       {"remat": c.remat, "scan_layers": c.scan_layers,
                        "hardware_rng": hardware_rng}))
      log(brief(rows[-1]))
  return rows


def run_torch(cfg, shapes, args, peak, log, *, paired=False) -> list[dict]:
  """Reference rows; with ``paired`` only torch.compile (eager was paired)."""
  import torch_fid_reference as ref
  rows = []
  if not args.skip_train:
    shape = shapes["train"]
    batch = bench.synthetic_batch(cfg, shape)
    variants = ([] if paired else [("torch", False)]) + (
        [("torch.compile", True)] if args.compile else [])
    for name, compiled in variants:
      log(f"{name} train b={shape.batch_size} ...")
      r = ref.bench_train(cfg, batch, steps=args.steps, dtype=args.dtype,
                          compile=compiled)
      rows.append(_row(f"{name} train", name, "train", shape, r["step_time_s"],
                       3 * bench.forward_flops(cfg, shape), peak,
                       r["peak_memory_gb"], True, r["peak_memory_source"],
                       r["setup_s"], {"loss": r["loss"]}))
      log(brief(rows[-1]))
  for b in ([] if paired else args.decode_batch_sizes):
    shape = shapes["decode"][b]
    log(f"torch decode b={b} ...")
    batch = bench.synthetic_batch(cfg, shape)
    r = ref.bench_decode(cfg, batch, steps=args.steps, dtype=args.dtype,
                         num_tokens=shape.answer_maxlength)
    rows.append(_row("torch decode", "torch", "decode", shape,
                     r["step_time_s"], bench.forward_flops(cfg, shape), peak,
                     r["peak_memory_gb"], True, r["peak_memory_source"],
                     r["setup_s"]))
    log(brief(rows[-1]))
  return rows


def add_ratios(rows: list[dict]) -> dict:
  """Each row's examples/s over the reference's (torch eager, torch.compile)."""
  ref = {(r["impl"], r["mode"], r["batch_size"]): r["examples_per_sec"]
         for r in rows if r["impl"] in ("torch", "torch.compile")}
  for r in rows:
    key = (r["mode"], r["batch_size"])
    eager = ref.get(("torch", *key))
    compiled = ref.get(("torch.compile", *key))
    r["vs_torch"] = r["examples_per_sec"] / eager if eager else None
    r["vs_torch_compile"] = (r["examples_per_sec"] / compiled
                             if compiled else None)
  summary = {}
  for r in rows:
    if r["impl"] != "jaxfid":
      continue
    label = r["name"].replace(" ", "_") + f"_b{r['batch_size']}"
    summary[f"{label}_vs_torch"] = r["vs_torch"]
    if r["mode"] == "train":
      summary[f"{label}_vs_torch_compile"] = r["vs_torch_compile"]
  return summary


def main(argv=None) -> int:
  args = parse_args(argv)
  log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
  try:
    cfg = config_lib.preset(args.size, dtype=args.dtype, remat=args.remat[0],
                            dropout_rate=args.dropout,
                            scan_layers=args.scan_layers)
  except ValueError as e:
    print(f"fid_vs_pytorch.py: error: --size: {e}", file=sys.stderr)
    return 2
  decode_n_context = args.decode_n_context or args.n_context
  shapes = {
      "train": bench.Shape(args.batch_size, args.n_context,
                           args.text_maxlength, args.answer_maxlength),
      "decode": {b: bench.Shape(b, decode_n_context, args.text_maxlength,
                                args.answer_maxlength)
                 for b in args.decode_batch_sizes}}
  hw = hardware()
  hw["threads"] = args.threads or "default"
  peaks = {}
  if not args.skip_torch:
    import torch_fid_reference as ref
    torch_threads = args.torch_threads or args.threads
    if torch_threads:
      import torch
      torch.set_num_threads(torch_threads)
    hw.update(ref.describe())
    peaks["torch"] = max(ref.measure_peak_tflops(args.dtype)
                         for _ in range(PEAK_TRIES))
  if not args.skip_jax:
    peaks["jax"] = max(bench.measure_peak_tflops(args.dtype)
                       for _ in range(PEAK_TRIES))
  peak = args.peak_tflops or max(peaks.values(), default=1.0)
  print(f"# jaxfid vs PyTorch FiD — {hw['date']}")
  for k, v in hw.items():
    print(f"- {k}: {v}")
  print(f"- model: {args.size} (d_model {cfg.d_model}, {cfg.num_layers}+"
        f"{cfg.num_decoder_layers} layers, {cfg.dtype}, jaxfid remat "
        f"{', '.join(args.remat)}, dropout {cfg.dropout_rate})")
  paired = not (args.skip_torch or args.skip_jax)
  print(f"- shape: train batch {args.batch_size}, {args.n_context} passages x "
        f"{args.text_maxlength} tokens, {args.answer_maxlength} answer tokens; "
        f"decode batches {args.decode_batch_sizes} x {decode_n_context} "
        f"passages; {args.steps} timed steps"
        + ("; jaxfid and torch eager alternate step by step (medians)"
           if paired else ""))
  print(f"- peak TFLOP/s for MFU: {peak:.2f} ("
        + ("given" if args.peak_tflops else ", ".join(
            f"{k} {args.dtype} matmul {v:.2f}" for k, v in peaks.items()))
        + ")", flush=True)
  rows = []
  if paired:
    rows += run_pairs(cfg, shapes, args, peak, log)
  if not args.skip_torch:
    rows += run_torch(cfg, shapes, args, peak, log, paired=paired)
    ref.release()
  if not args.skip_jax:
    rows += run_jax(cfg, shapes, args, peak, log, paired=paired)
  hw["load_average_at_end"] = load_average()
  order = {"train": 0, "decode": 1}
  rows.sort(key=lambda r: (order[r["mode"]], r["batch_size"],
                           r["impl"] != "jaxfid", r["name"]))
  summary = add_ratios(rows)
  print()
  print(f"load average (1, 5, 15 min): {hw['load_average']} at the "
        f"start, {hw['load_average_at_end']} at the end")
  print()
  print(table(rows))
  result = {"hardware": hw, "args": {k: v for k, v in vars(args).items()},
            "model": cfg.to_dict(), "peak_tflops": peak, "peaks": peaks,
            "rows": rows, "ratios": summary}
  if args.json_out:
    write_json(args.json_out, result)
  print()
  print("CPU s/step: process CPU seconds per step (all threads), the median "
        "of the alternated steps; on a shared machine it moves less with the "
        "load than the wall-clock step time.")
  print()
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
