"""ReFusion on a task only the neighbours can solve: variants x seeds.

On the task of :mod:`jaxfid.refusion.synthetic` (made-up items whose labels
only the retrieval database's sentences carry; test items never seen in
training), trains with the real CLI and ``gin/refusion/tiny.gin``:

  * ``plain``: the prompt-tuned backbone alone (``FUSION_MODULES='none'``);
  * ``reranker`` / ``ordered_mask``: ReFusion, key/value fusion in every
    encoder layer, one scheme fixed (``ordered_mask_st``: its
    straight-through sampler);
  * ``search``: ReFusion with the bi-level search (``--arch-lr``);
    ``search_xavier``: the original's Xavier initialisation;
    ``search_st``: the straight-through ordered mask; ``search_adamw``: the
    original's architecture optimizer (AdamW, weight decay 1e-4, 10% of the
    steps warm-up, linear decay);
  * ``concat``: the neighbour sentences appended to the input;
  * ``*_lr1``: the fusion parameters at the backbone's learning rate
    (``FUSION_LR_SCALE=1``; tiny.gin's is 10);
  * ablations: ``reranker_raw`` / ``search_raw`` (``FUSED_NORM='none'`` and
    ``FUSION_LR_SCALE=1``: the projected vectors added as stored, as before
    issue #17), ``reranker_x30`` (database vectors 30x the encoder's
    scale), ``reranker_unit`` (L2-normalised vectors, inner-product search:
    GTR's setting).

The database is embedded by a random 256-wide T5 encoder at its own scale
(``--vector-scale``), unnormalised, L2 search. Two settings:

  * ``--setting test``: tests/test_refusion_learning.py's (d_model 32, 60
    steps of batch 8 at lr 1e-3, top-k 4, 100 test items per class);
  * ``--setting outside``: issue #17's outside check (tiny.gin's d_model 64,
    1,000 steps of batch 32 at lr 3e-3, top-k 8, 8 sentences per item).

Prints the retrieval hit rates, a table of test accuracy (per seed, mean
and standard deviation), the hardware, and last a JSON line.

  python benchmarks/refusion_synthetic.py --setting outside --seeds 0,1,2 \\
      --variants plain,search --output /tmp/rf_outside
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import cpu_host  # noqa: E402
import jax  # noqa: E402,F401

from jaxfid.cli import main as cli_main  # noqa: E402
import refusion_world as syn  # noqa: E402

FUSION = ["FUSION_MODULES='key,value'"]
RERANKER = FUSION + ["SEARCH=False", "FUSION_SCHEME='reranker'"]
MASK = FUSION + ["SEARCH=False", "FUSION_SCHEME='ordered_mask'"]
SEARCH = FUSION + ["SEARCH=True"]
LR1 = ["FUSION_LR_SCALE=1.0"]
# name -> (database, gin bindings)
VARIANTS = {
    "plain": ("own", ["FUSION_MODULES='none'", "RETRIEVAL_DB=None"]),
    "reranker": ("own", RERANKER),
    "ordered_mask": ("own", MASK),
    "ordered_mask_st": ("own", MASK + ["MASK_SAMPLER='straight_through'"]),
    "search": ("own", SEARCH),
    "search_xavier": ("own", SEARCH + ["FUSION_INIT='xavier'"]),
    "search_st": ("own", SEARCH + ["MASK_SAMPLER='straight_through'"]),
    "search_adamw": ("own", SEARCH + ["ARCH_OPTIMIZER='adamw'",
                                      "ARCH_WEIGHT_DECAY=1e-4"]),
    "concat": ("own", ["FUSION_MODULES='none'", "CONCAT_NEIGHBOURS=True",
                       "MAX_LENGTH=160"]),
    "reranker_lr1": ("own", RERANKER + LR1),
    "ordered_mask_lr1": ("own", MASK + LR1),
    "search_lr1": ("own", SEARCH + LR1),
    "reranker_raw": ("own", RERANKER + LR1 + ["FUSED_NORM='none'"]),
    "search_raw": ("own", SEARCH + LR1 + ["FUSED_NORM='none'"]),
    "reranker_x30": ("x30", RERANKER),
    "reranker_unit": ("unit", RERANKER),
}
DATABASES = {  # build_database settings (vector_scale from --vector-scale)
    "own": {},
    "x30": {"vector_scale": 30.0},
    "unit": {"normalize": True, "metric": "ip"},
}
SETTINGS = {
    "test": {"d_model": 32, "steps": 60, "batch_size": 8,
             "learning_rate": 1e-3, "top_k": 4, "arch_lr": 0.1,
             "test_per_class": 100},
    "outside": {"d_model": 64, "steps": 1000, "batch_size": 32,
                "learning_rate": 3e-3, "top_k": 8, "arch_lr": 1e-2,
                "test_per_class": 100},
}


def run_variant(model_dir: str, data_dir: str, db: str, bindings: list[str],
                args, seed: int) -> dict:
  """One CLI training run; returns its test line."""
  gin = ["TASK='sst-2'", f"MODEL_DIR='{model_dir}'", f"DATA_DIR='{data_dir}'",
         f"RETRIEVAL_DB='{db}'", f"TOP_K={args.top_k}", f"SEED={seed}",
         f"TRAIN_STEPS={args.steps}", f"EVAL_EVERY={args.steps}",
         f"CHECKPOINT_EVERY={args.steps}", "MAX_LENGTH=32", "MESH='data=1'",
         f"BATCH_SIZE={args.batch_size}",
         f"LEARNING_RATE={args.learning_rate}",
         f"ARCH_LEARNING_RATE={args.arch_lr}",
         f"ARCH_WARMUP_STEPS={args.steps // 10}",
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
  p.add_argument("--setting", choices=sorted(SETTINGS), default="test")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--variants", default="plain,reranker,ordered_mask,search,"
                 "concat")
  p.add_argument("--train-per-class", type=int, default=16)
  p.add_argument("--vector-scale", type=float, default=1.0)
  for name, kind in (("test-per-class", int), ("top-k", int), ("steps", int),
                     ("d-model", int), ("batch-size", int),
                     ("learning-rate", float), ("arch-lr", float)):
    p.add_argument(f"--{name}", type=kind, default=None,
                   help="default: the setting's")
  p.add_argument("--output", default="/tmp/refusion_synthetic")
  args = p.parse_args()
  for key, value in SETTINGS[args.setting].items():
    if getattr(args, key) is None:
      setattr(args, key, value)
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
    base = os.path.join(args.output, f"seed{seed}")
    task = syn.make_task(seed, train_per_class=args.train_per_class,
                         dev_per_class=args.train_per_class,
                         test_per_class=args.test_per_class,
                         sentences_per_item=args.top_k)
    data = syn.write_task(task, os.path.join(base, "data"))
    dbs = {}
    for name in sorted({VARIANTS[v][0] for v in variants}):
      settings = {"vector_scale": args.vector_scale, **DATABASES[name]}
      dbs[name] = str(syn.build_database(
          data / syn.SENTENCE_FILE, os.path.join(base, f"db_{name}"),
          **settings))
      hits.setdefault(name, {})[seed] = syn.retrieval_hit_rate(
          task, dbs[name], args.top_k, ("test",))
    for v in variants:
      db_name, bindings = VARIANTS[v]
      line = run_variant(os.path.join(base, v), str(data), dbs[db_name],
                         bindings, args, seed)
      acc[v][seed] = line["test_accuracy"]
      print(f"seed {seed} {v:16s} test_accuracy {line['test_accuracy']:.3f} "
            f"({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)

  print(f"\nsynthetic task ({args.setting}): {2 * args.train_per_class} train"
        f" + {2 * args.train_per_class} dev items, {2 * args.test_per_class} "
        f"test items, top-k {args.top_k}, {args.steps} steps of batch "
        f"{args.batch_size} at lr {args.learning_rate}, d_model "
        f"{args.d_model}, database vectors x{args.vector_scale:g}")
  print("retrieval on the test queries (precision = share of the top-k "
        "about the query's item):")
  for name, per_seed in hits.items():
    print(f"  database {name:5s} " + ", ".join(
        f"seed {s}: hit@1 {h['hit_at_1']:.3f} precision {h['precision']:.3f}"
        for s, h in per_seed.items()))
  head = "".join(f"{'seed ' + str(s):>9s}" for s in seeds)
  print(f"\n{'variant':18s}{head}{'mean':>9s}{'std':>8s}")
  summary = {}
  for v in variants:
    values = [acc[v][s] for s in seeds]
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    summary[v] = {"per_seed": values, "mean": mean, "std": std}
    print(f"{v:18s}" + "".join(f"{x:9.3f}" for x in values)
          + f"{mean:9.3f}{std:8.3f}")
  print(f"\nhardware: {cpu_host.summary()}; total {time.time() - t0:.0f}s")
  print(json.dumps({"setting": args.setting, "seeds": seeds,
                    "steps": args.steps, "batch_size": args.batch_size,
                    "learning_rate": args.learning_rate,
                    "d_model": args.d_model, "top_k": args.top_k,
                    "arch_learning_rate": args.arch_lr,
                    "vector_scale": args.vector_scale,
                    "train_items": 2 * args.train_per_class,
                    "test_items": 2 * args.test_per_class,
                    "test_accuracy": summary,
                    "retrieval": hits, "hardware": cpu_host.describe(),
                    "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
  main()
