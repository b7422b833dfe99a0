"""The demo's train step with and without jaxfid's CPU malloc settings.

``jaxfid.runtime.host_memory.tune_cpu_malloc`` holds for a whole process, so
each setting runs in its own child process: the same train step as ``jaxfid
demo`` (``gin/fid/tiny.gin``'s model, batch 32 x 4 passages x 40 tokens, 6
target tokens, dropout off, Adam), compiled, warmed up for ``--warmup``
steps, then timed for ``--steps``. The children run one after another,
``--rounds`` times, the order reversed every other round, and the table
gives each setting's median over its rounds: wall and CPU (user, system)
milliseconds per step, page faults per step and the child's peak resident
memory.

Usage (from the repository root):
  python benchmarks/cpu_malloc.py            # 2 rounds of 40 steps each
  python benchmarks/cpu_malloc.py --size t5_small --batch-size 2 \\
      --n-context 8 --text-maxlength 128 --answer-maxlength 16 --steps 3

Prints the hardware, a markdown table and, last, one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_host import cpu_model, load_average  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import json, resource, sys, time
from jaxfid.runtime import host_memory
decided = host_memory.tune_cpu_malloc()
from jaxfid.fid import bench
from jaxfid.t5.config import preset
size, b, p, l, t, warmup, steps = sys.argv[1:]
cfg = preset(size, dropout_rate=0.0, dtype="float32", remat="none")
step = bench.prepare_train(cfg, bench.Shape(int(b), int(p), int(l), int(t)))
for _ in range(int(warmup)):
  step()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(int(steps)):
  step()
wall = time.perf_counter() - t0
r1, n = resource.getrusage(resource.RUSAGE_SELF), int(steps)
print(json.dumps({"decided": decided["reason"], "wall_ms": 1e3 * wall / n,
                  "user_ms": 1e3 * (r1.ru_utime - r0.ru_utime) / n,
                  "sys_ms": 1e3 * (r1.ru_stime - r0.ru_stime) / n,
                  "faults_per_step": (r1.ru_minflt - r0.ru_minflt) / n,
                  "max_rss_gb": r1.ru_maxrss / 1e6}))
"""
SETTINGS = {"tuned": {}, "glibc defaults": {"JAXFID_CPU_MALLOC": "0"}}


def run_child(env_changes: dict, args) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "JAXFID_CPU_MALLOC"}
  env.update(env_changes, PYTHONPATH=ROOT)
  out = subprocess.run(
      [sys.executable, "-c", CHILD, args.size, str(args.batch_size),
       str(args.n_context), str(args.text_maxlength), str(args.answer_maxlength),
       str(args.warmup), str(args.steps)],
      env=env, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="tiny")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--n-context", type=int, default=4)
  p.add_argument("--text-maxlength", type=int, default=40)
  p.add_argument("--answer-maxlength", type=int, default=6)
  p.add_argument("--warmup", type=int, default=10)
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--rounds", type=int, default=2)
  args = p.parse_args(argv)
  model, _ = cpu_model()
  hardware = {"processor": model, "cpus": len(os.sched_getaffinity(0)),
              "load_average_at_start": load_average()}
  print("hardware: " + json.dumps(hardware), file=sys.stderr, flush=True)
  results = {name: [] for name in SETTINGS}
  names = list(SETTINGS)
  for r in range(args.rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      print(f"round {r + 1}: {name} ...", file=sys.stderr, flush=True)
      results[name].append(run_child(SETTINGS[name], args))
  hardware["load_average_at_end"] = load_average()
  rows = []
  for name, runs in results.items():
    row = {"malloc": name, "decided": runs[0]["decided"]}
    for key in ("wall_ms", "user_ms", "sys_ms", "faults_per_step",
                "max_rss_gb"):
      row[key] = statistics.median(x[key] for x in runs)
    rows.append(row)
  print(f"\n{args.size}, batch {args.batch_size} x {args.n_context} passages "
        f"x {args.text_maxlength} tokens, {args.answer_maxlength} target "
        f"tokens; medians of {args.rounds} rounds of {args.steps} steps\n")
  print("| malloc | ms/step | user ms/step | system ms/step | page faults/step "
        "| peak RSS GB |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['malloc']} | {r['wall_ms']:.0f} | {r['user_ms']:.0f} | "
          f"{r['sys_ms']:.0f} | {r['faults_per_step']:.0f} | "
          f"{r['max_rss_gb']:.2f} |")
  print(json.dumps({"hardware": hardware, "args": vars(args), "rows": rows}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
