"""FiD-KD on a world BM25 cannot rank: recall per round, against a control.

Writes the world of ``distill_world.py`` (300 training and 64
dev entities, six relations each: 1,800 training and 384 dev questions, a
corpus of 2,184 passages; questions paraphrase their passage, so BM25 ties
the entity's six passages) and runs ``jaxfid distill iterate`` on it with
``--top-k 3``, half the entity's passages, so that better retrieval gives
the next round's reader better inputs, and tiny models trained from scratch
on the CPU (``gin/fid/tiny.gin`` and ``gin/retrieval/distill_tiny.gin``
with :data:`READER` / :data:`RETRIEVER` bound over them). Then, as a
control, trains round 1's retriever again on round 1's scored data with
each question's reader scores shuffled among its passages (the same
training, no information on which passage holds the answer), indexes the
corpus with it and measures its dev answer recall.

Prints each round's record, the control's recall, the hardware and, last,
a JSON line ``{"rounds": [...], "control": {...}, "minutes", "hardware"}``.

  python benchmarks/distill_synthetic.py --output /tmp/kd_synthetic \
      [--rounds N] [--reader-steps N --reader-batch-size N]

Three choices differ from the FiD-KD paper's settings because the models
here start from random weights, not from T5 and BERT: the retriever sees
the other questions' passages of its batch as negatives
(IN_BATCH_NEGATIVES: a random encoder must first learn to match the
entity's name, which the paper's BERT already does); the reader's
embeddings are tied (a from-scratch reader learns to copy the answer
several times faster); and the reader has 4 encoder layers and 4,000 steps
(from round 2 on, retrieval brings other entities' passages of the asked
relation, and a reader must match names to tell them apart, which
pretrained T5 does and tiny.gin's 2 layers in 1,500 steps did not learn:
docs/retrieval.md).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import cpu_host  # noqa: E402
import jax  # noqa: E402,F401

from jaxfid.cli import main as cli_main  # noqa: E402
from jaxfid.dual_encoder.index import build_dense_index  # noqa: E402
import distill_world  # noqa: E402
from jaxfid.retrieval import evaluate  # noqa: E402
from jaxfid.retrieval.search import retrieve_to_file  # noqa: E402

TOP_K = 3  # half the entity's passages, which BM25 ties
DEV_ENTITIES = 64


def reader_bindings(top_k: int, steps: int, learning_rate: float,
                    encoder_layers: int, batch_size: int = 8) -> list[str]:
  """The reader's bindings over ``gin/fid/tiny.gin``, reading ``top_k``
  passages (``benchmarks/atlas_synthetic.py`` uses them too)."""
  return [
      f"TRAIN_STEPS={steps}", f"BATCH_SIZE={batch_size}",
      f"N_CONTEXT={top_k}", "TEXT_MAXLENGTH=28",
      "ANSWER_MAXLENGTH=4", f"EVAL_EVERY={steps}",
      f"CHECKPOINT_EVERY={steps}", "EVAL_MAX_EXAMPLES=96", "LOG_EVERY=100",
      "DROPOUT_RATE=0.0", f"LEARNING_RATE={learning_rate}",
      "config.T5Config.tie_word_embeddings=True",
      f"config.T5Config.num_layers={encoder_layers}", "MESH='data=1'",
      "loop.train.progress=False"]


def retriever_bindings(top_k: int, steps: int = 1000) -> list[str]:
  """The retriever's bindings over ``gin/retrieval/distill_tiny.gin``."""
  return [
      f"TRAIN_STEPS={steps}", f"N_CONTEXT={top_k}", "BATCH_SIZE=16",
      "QUERY_MAXLENGTH=16", "PASSAGE_MAXLENGTH=12", "IN_BATCH_NEGATIVES=True",
      f"CHECKPOINT_EVERY={steps}", f"EVAL_EVERY={steps}", "LOG_EVERY=100",
      "MESH='data=1'", "loop.train.progress=False"]


READER_STEPS, READER_BATCH_SIZE = 4000, 8


def distill_reader(steps: int = READER_STEPS,
                   batch_size: int = READER_BATCH_SIZE) -> list[str]:
  """This benchmark's reader: 4 encoder layers, learning rate 1e-3."""
  return reader_bindings(TOP_K, steps=steps, learning_rate=1e-3,
                         encoder_layers=4, batch_size=batch_size)


READER = distill_reader()
RETRIEVER = retriever_bindings(TOP_K)
READER_GIN = os.path.join(ROOT, "gin/fid/tiny.gin")
RETRIEVER_GIN = os.path.join(ROOT, "gin/retrieval/distill_tiny.gin")


def iterate_argv(paths: dict, work_dir: str, rounds: int,
                 extra: tuple[str, ...] = (),
                 reader: list[str] = READER) -> list[str]:
  """``jaxfid distill iterate``'s arguments on the world's files."""
  return ["distill", "iterate", "--work-dir", work_dir,
          "--corpus", paths["corpus.tsv"], "--train", paths["train.jsonl"],
          "--dev", paths["dev.jsonl"], "--rounds", str(rounds),
          "--top-k", str(TOP_K), f"--reader-gin_file={READER_GIN}",
          f"--retriever-gin_file={RETRIEVER_GIN}",
          *[f"--reader.{b}" for b in reader],
          *[f"--retriever.{b}" for b in RETRIEVER], "--no-progress", *extra]


def shuffle_scores(source: str, output: str, seed: int) -> None:
  """``source`` (scored FiD JSON) again with each question's passage scores
  permuted among its passages."""
  with open(source) as f:
    records = json.load(f)
  rng = np.random.default_rng(seed)
  for record in records:
    scores = [c["score"] for c in record["ctxs"]]
    for c, j in zip(record["ctxs"], rng.permutation(len(scores))):
      c["score"] = scores[j]
  with open(output, "w") as f:
    json.dump(records, f)


def control(paths: dict, work_dir: str, seed: int = 0) -> dict:
  """Round 1's retriever trained on shuffled reader scores: its dev recall."""
  out = os.path.join(work_dir, "control")
  os.makedirs(out, exist_ok=True)
  data = os.path.join(out, "train_shuffled.json")
  shuffle_scores(os.path.join(work_dir, "round_1", "train_scored.json"),
                 data, seed)
  model_dir = os.path.join(out, "retriever")
  argv = ["train", f"--gin_file={RETRIEVER_GIN}",
          f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_DATA='{data}'",
          *[f"--gin.{b}" for b in RETRIEVER]]
  with contextlib.redirect_stdout(io.StringIO()):
    if cli_main(argv) != 0:
      raise SystemExit("the control's training failed")
  index = os.path.join(out, "index")
  build_dense_index(model_dir, paths["corpus.tsv"], index, progress=False)
  run = os.path.join(out, "dev.json")
  retrieve_to_file(index, paths["dev.jsonl"], 100, run, progress=False)
  recall = evaluate.evaluate_with_answers(run, paths["dev.jsonl"],
                                          ks=(1, 5, 20, 100))
  return {f"recall@{k}": round(recall[f"R@{k}"], 6) for k in (1, 5, 20, 100)}


def run(output: str, rounds: int = 2, seed: int = 0,
        with_control: bool = True, extra: tuple[str, ...] = (),
        reader: list[str] = READER) -> dict:
  """Writes the world under ``output``, runs the rounds (and the control)
  with the reader's bindings ``reader``; returns ``{"rounds": [records],
  "control": {...} or None}``."""
  paths = distill_world.write_world(
      distill_world.make_world(num_dev_entities=DEV_ENTITIES, seed=seed),
      os.path.join(output, "world"))
  work_dir = os.path.join(output, "w")
  with contextlib.redirect_stdout(io.StringIO()):
    code = cli_main(iterate_argv(paths, work_dir, rounds, extra, reader))
  if code != 0:
    raise SystemExit(f"distill iterate failed with exit code {code}")
  with open(os.path.join(work_dir, "rounds.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return {"rounds": records,
          "control": control(paths, work_dir, seed) if with_control
          else None}


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--output", required=True, help="work directory")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--seed", type=int, default=0, help="the world's seed")
  p.add_argument("--no-control", action="store_true")
  p.add_argument("--reader-init", choices=("restart", "continue"),
                 default="restart", help="distill iterate's --reader-init")
  p.add_argument("--retriever-init", choices=("restart", "continue"),
                 default="continue",
                 help="distill iterate's --retriever-init")
  p.add_argument("--reader-steps", type=int, default=READER_STEPS,
                 help="the reader's training steps per round")
  p.add_argument("--reader-batch-size", type=int, default=READER_BATCH_SIZE,
                 help="the reader's batch size")
  args = p.parse_args(argv)
  t0 = time.time()
  reader = distill_reader(args.reader_steps, args.reader_batch_size)
  result = run(args.output, args.rounds, args.seed, not args.no_control,
               ("--reader-init", args.reader_init, "--retriever-init",
                args.retriever_init), reader)
  print(f"{'round':>5} {'R@1':>7} {'R@5':>7} {'R@20':>7} {'reader EM':>9}")
  for r in result["rounds"]:
    em = "" if r["eval_em"] is None else f"{r['eval_em']:.3f}"
    print(f"{r['round']:>5} {r['recall@1']:>7.3f} {r['recall@5']:>7.3f} "
          f"{r['recall@20']:>7.3f} {em:>9}")
  if result["control"]:
    c = result["control"]
    print(f"control (round 1's retriever on shuffled scores): R@1 "
          f"{c['recall@1']:.3f} R@5 {c['recall@5']:.3f} R@20 "
          f"{c['recall@20']:.3f}")
  print(cpu_host.summary())
  result.update(minutes=round((time.time() - t0) / 60, 2),
                hardware=cpu_host.describe())
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
