"""FiDO vs FiD quality on the demo task: EM at equal training steps, with decode speed.

Runs ``jaxfid demo``'s experiment twice on the same data — the generated
world, BM25 top-N passages (``jaxfid.fid.commands.demo.prepare_data``) — once
with ``gin/fid/tiny.gin`` (FiD: cross-attention in both decoder layers) and
once with ``gin/fid/fido_tiny.gin`` (FiDO: cross-attention in the second
decoder layer only, multi-query), with the demo's hyperparameters, the same
seed and the same number of steps. Each model then answers the held-out
questions (EM/F1 as ``jaxfid predict`` scores them), and greedy decoding of a
batch of the demo's shape is timed (``jaxfid.fid.bench.bench_decode``).

Usage (from the repository root):
  python benchmarks/fido_demo_quality.py --output /tmp/fido_demo [--steps 1500]
  # one FiDO option alone: --only fido --fido-period 1 (multi-query only) or
  # --only fido --fido-mq false (layer-sparse only)

Prints one line per model and, last, a JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gin  # noqa: E402

from jaxfid.checkpoints.load import load_checkpoint
from jaxfid.commands import gin_flags  # noqa: E402
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.fid import bench
from jaxfid.fid.commands.demo import prepare_data  # noqa: E402
from jaxfid.reader import predict as predict_lib
from jaxfid.reader.examples import read_fid_examples
from jaxfid.t5.network import count_params
from jaxfid.training import launch  # noqa: E402

TEXT_MAXLENGTH, ANSWER_MAXLENGTH = 40, 6  # as jaxfid demo


def train_and_score(gin_file: str, model_dir: str, paths: dict,
                    args: argparse.Namespace, extra: list[str] = ()) -> dict:
  t0 = time.time()
  gin_flags.parse_gin([gin_file], [*extra,
      f"MODEL_DIR = '{model_dir}'", f"TRAIN_DATA = '{paths['train.json']}'",
      "EVAL_DATA = None", f"TRAIN_STEPS = {args.steps}",
      f"BATCH_SIZE = {args.batch_size}", f"N_CONTEXT = {args.n_context}",
      f"TEXT_MAXLENGTH = {TEXT_MAXLENGTH}",
      f"ANSWER_MAXLENGTH = {ANSWER_MAXLENGTH}", f"SEED = {args.seed}",
      f"CHECKPOINT_EVERY = {args.steps}", "LOG_EVERY = 50",
      f"LEARNING_RATE = {args.learning_rate}", "WARMUP_STEPS = 100",
      "DROPOUT_RATE = 0.0", "MESH = 'data=1'",
      "loop.train.progress = False"])
  try:
    last = gin.get_configurable(launch.run)()
  finally:
    gin.clear_config()
  train_s = time.time() - t0
  model, params, spiece = load_checkpoint(model_dir, which="latest")
  tokenizer = load_tokenizer(os.path.dirname(spiece) if spiece else None)
  examples = read_fid_examples(paths["test.json"])
  preds = predict_lib.generate(model, params, tokenizer, examples,
                               n_context=args.n_context,
                               text_maxlength=TEXT_MAXLENGTH,
                               answer_maxlength=ANSWER_MAXLENGTH,
                               batch_size=50, progress=False)
  scores = predict_lib.score(examples, preds)
  cfg = model.config
  shape = bench.Shape(50, args.n_context, TEXT_MAXLENGTH, ANSWER_MAXLENGTH)
  decode = bench.bench_decode(cfg, shape, steps=args.decode_steps)
  return {"gin_file": gin_file, "steps": last["step"],
          "final_loss": last.get("loss"), "test_em": scores["em"],
          "test_f1": scores["f1"], "test_questions": len(examples),
          "params": count_params(model.network(params)),
          "cross_attention_period": cfg.cross_attention_period,
          "multi_query_cross_attention": cfg.multi_query_cross_attention,
          "decode_b50_step_time_s": decode["step_time_s"],
          "train_minutes": train_s / 60}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--output", required=True)
  p.add_argument("--steps", type=int, default=1500)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--n-context", type=int, default=4)
  p.add_argument("--learning-rate", type=float, default=2e-3)
  p.add_argument("--train-entities", type=int, default=400)
  p.add_argument("--test-questions", type=int, default=200)
  p.add_argument("--decode-steps", type=int, default=5)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--only", choices=("fid", "fido"), default=None)
  p.add_argument("--fido-period", type=int, default=None,
                 help="override fido_tiny.gin's CROSS_ATTENTION_PERIOD (2)")
  p.add_argument("--fido-mq", choices=("true", "false"), default=None,
                 help="override fido_tiny.gin's MULTI_QUERY_CROSS_ATTENTION")
  args = p.parse_args(argv)
  out = os.path.abspath(args.output)
  info = prepare_data(out, n_context=args.n_context,
                      train_entities=args.train_entities,
                      test_questions=args.test_questions, seed=args.seed)
  runs = [("fid", "gin/fid/tiny.gin"), ("fido", "gin/fid/fido_tiny.gin")]
  results = {"bm25_recall": info["test_recall"], "args": vars(args)}
  for name, gin_file in runs:
    if args.only and name != args.only:
      continue
    extra = []
    if name == "fido" and args.fido_period is not None:
      extra.append(f"CROSS_ATTENTION_PERIOD = {args.fido_period}")
    if name == "fido" and args.fido_mq is not None:
      extra.append(f"MULTI_QUERY_CROSS_ATTENTION = {args.fido_mq == 'true'}")
    r = train_and_score(gin_file, os.path.join(out, name), info["paths"], args,
                        extra)
    results[name] = r
    print(f"{name}: EM {100 * r['test_em']:.1f} F1 {100 * r['test_f1']:.1f} "
          f"after {r['steps']} steps (loss {r['final_loss']:.4f}); "
          f"{r['params']:,} params; greedy decode b=50: "
          f"{r['decode_b50_step_time_s'] * 1000:.1f} ms; "
          f"train {r['train_minutes']:.1f} min", flush=True)
  print(json.dumps(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
