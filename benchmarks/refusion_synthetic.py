"""ReFusion on a task only the neighbours can solve: variants x seeds.

On the task of :mod:`jaxfid.refusion.synthetic` (made-up items whose labels
only the retrieval database's sentences carry; test items never seen in
training), trains with the real CLI and ``gin/refusion/tiny.gin``:

  * ``plain``: the prompt-tuned backbone alone (``FUSION_MODULES='none'``);
  * ``reranker`` / ``ordered_mask``: ReFusion, key/value fusion in every
    encoder layer, one scheme fixed;
  * ``search``: ReFusion with the bi-level search (``--arch-lr``), and
    ``search_lr0.01``: the same with tiny.gin's architecture learning rate;
  * ``concat``: the neighbour sentences appended to the input;
  * ablations of the database's vectors, with the reranker: ``reranker_x1``
    and ``reranker_x10`` (vectors 30x and 3x smaller than the default) and
    ``reranker_unit`` (L2-normalised vectors, inner-product search: GTR's
    setting).

Prints the retrieval hit rates, a table of test accuracy (per seed, mean
and standard deviation), the hardware, and last a JSON line.

  python benchmarks/refusion_synthetic.py --seeds 0,1,2 --output /tmp/rf_bench
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from jaxfid.cli import main as cli_main  # noqa: E402
from jaxfid.refusion import synthetic as syn  # noqa: E402

FUSION = ["FUSION_MODULES='key,value'"]
# name -> (database, gin bindings)
VARIANTS = {
    "plain": ("default", ["FUSION_MODULES='none'", "RETRIEVAL_DB=None"]),
    "reranker": ("default", FUSION + ["SEARCH=False",
                                      "FUSION_SCHEME='reranker'"]),
    "ordered_mask": ("default", FUSION + ["SEARCH=False",
                                          "FUSION_SCHEME='ordered_mask'"]),
    "search": ("default", FUSION + ["SEARCH=True"]),
    "search_lr0.01": ("default", FUSION + ["SEARCH=True",
                                           "ARCH_LEARNING_RATE=0.01"]),
    "concat": ("default", ["FUSION_MODULES='none'", "CONCAT_NEIGHBOURS=True",
                           "MAX_LENGTH=160"]),
    "reranker_x1": ("x1", FUSION + ["SEARCH=False"]),
    "reranker_x10": ("x10", FUSION + ["SEARCH=False"]),
    "reranker_unit": ("unit", FUSION + ["SEARCH=False"]),
}
DATABASES = {  # build_database settings
    "default": {},
    "x1": {"vector_scale": 1.0},
    "x10": {"vector_scale": 10.0},
    "unit": {"normalize": True, "metric": "ip"},
}


def hardware() -> str:
  model = platform.processor() or platform.machine()
  with contextlib.suppress(OSError):
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          model = line.split(":", 1)[1].strip()
          break
  return (f"{model}, {os.cpu_count()} CPUs, jax {jax.__version__} "
          f"({jax.default_backend()}, {jax.device_count()} devices)")


def run_variant(model_dir: str, data_dir: str, db: str, bindings: list[str],
                args) -> dict:
  """One CLI training run; returns its test line."""
  gin = ["TASK='sst-2'", f"MODEL_DIR='{model_dir}'", f"DATA_DIR='{data_dir}'",
         f"RETRIEVAL_DB='{db}'", f"TOP_K={args.top_k}", f"SEED={args.seed_now}",
         f"TRAIN_STEPS={args.steps}", f"EVAL_EVERY={args.steps}",
         f"CHECKPOINT_EVERY={args.steps}", "MAX_LENGTH=32", "MESH='data=1'",
         f"ARCH_LEARNING_RATE={args.arch_lr}",
         f"config.T5Config.d_model={args.d_model}",
         f"config.T5Config.d_kv={args.d_model // 4}",
         f"config.T5Config.d_ff={2 * args.d_model}",
         "loop.train.progress=False"] + bindings
  argv = ["train", f"--gin_file={os.path.join(ROOT, 'gin/refusion/tiny.gin')}"]
  argv += [f"--gin.{b}" for b in gin]
  with contextlib.redirect_stdout(io.StringIO()):
    code = cli_main(argv)
  if code != 0:
    raise SystemExit(f"training {model_dir} failed with exit code {code}")
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  return [line for line in lines if "test_accuracy" in line][-1]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--variants", default=",".join(VARIANTS))
  p.add_argument("--train-per-class", type=int, default=16)
  p.add_argument("--test-per-class", type=int, default=250)
  p.add_argument("--top-k", type=int, default=4)
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--d-model", type=int, default=32)
  p.add_argument("--arch-lr", type=float, default=0.1)
  p.add_argument("--output", default="/tmp/refusion_synthetic")
  args = p.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  variants = args.variants.split(",")
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    p.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
  if os.path.exists(args.output):
    shutil.rmtree(args.output)

  t0 = time.time()
  acc: dict[str, dict[int, float]] = {v: {} for v in variants}
  hits: dict[str, dict[int, dict]] = {}
  for seed in seeds:
    args.seed_now = seed
    base = os.path.join(args.output, f"seed{seed}")
    task = syn.make_task(seed, train_per_class=args.train_per_class,
                         dev_per_class=args.train_per_class,
                         test_per_class=args.test_per_class,
                         sentences_per_item=args.top_k)
    data = syn.write_task(task, os.path.join(base, "data"))
    dbs = {}
    for name in sorted({VARIANTS[v][0] for v in variants}):
      dbs[name] = str(syn.build_database(
          data / syn.SENTENCE_FILE, os.path.join(base, f"db_{name}"),
          **DATABASES[name]))
      hits.setdefault(name, {})[seed] = syn.retrieval_hit_rate(
          task, dbs[name], args.top_k, ("test",))
    for v in variants:
      db_name, bindings = VARIANTS[v]
      line = run_variant(os.path.join(base, v), str(data), dbs[db_name],
                         bindings, args)
      acc[v][seed] = line["test_accuracy"]
      print(f"seed {seed} {v:14s} test_accuracy {line['test_accuracy']:.3f} "
            f"({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)

  print(f"\nsynthetic task: {2 * args.train_per_class} train + "
        f"{2 * args.train_per_class} dev items, {2 * args.test_per_class} test "
        f"items, top-k {args.top_k}, {args.steps} steps, d_model "
        f"{args.d_model}")
  print("retrieval on the test queries (precision = share of the top-k "
        "about the query's item):")
  for name, per_seed in hits.items():
    print(f"  database {name:8s} " + ", ".join(
        f"seed {s}: hit@1 {h['hit_at_1']:.3f} precision {h['precision']:.3f}"
        for s, h in per_seed.items()))
  head = "".join(f"{'seed ' + str(s):>9s}" for s in seeds)
  print(f"\n{'variant':16s}{head}{'mean':>9s}{'std':>8s}")
  summary = {}
  for v in variants:
    values = [acc[v][s] for s in seeds]
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    summary[v] = {"per_seed": values, "mean": mean, "std": std}
    print(f"{v:16s}" + "".join(f"{x:9.3f}" for x in values)
          + f"{mean:9.3f}{std:8.3f}")
  print(f"\nhardware: {hardware()}; total {time.time() - t0:.0f}s")
  print(json.dumps({"seeds": seeds, "steps": args.steps,
                    "d_model": args.d_model, "top_k": args.top_k,
                    "arch_learning_rate": args.arch_lr,
                    "train_items": 2 * args.train_per_class,
                    "test_items": 2 * args.test_per_class,
                    "test_accuracy": summary,
                    "retrieval": hits, "hardware": hardware(),
                    "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
  main()
