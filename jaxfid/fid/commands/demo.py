"""``jaxfid demo``: a complete small FiD experiment on CPU, from nothing.

It generates the demo world (:mod:`jaxfid.fid.demo_world`), indexes every
document with BM25 and retrieves N_CONTEXT passages per question (as
``jaxfid index bm25`` / ``retrieve``), trains a tiny FiD from scratch
(``gin/fid/tiny.gin``, the best checkpoint by dev EM kept), answers the test
questions with it and reports their EM beside the retrieval recall; the
last lines are the ``jaxfid predict`` and ``jaxfid serve`` commands of the
result, runnable as printed. Everything lands in ``--output`` (default
``demo_out``; the checkpoint a MODEL_DIR in ``demo_out/model``).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import sys
import threading
import time

import gin

from jaxfid.checkpoints.load import load_checkpoint
from jaxfid.commands import gin_flags, gin_specs, shell
from jaxfid.commands.registry import Command
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.fid import demo_world as synthetic
from jaxfid.reader import predict as predict_lib
from jaxfid.reader.examples import read_fid_examples
from jaxfid.retrieval.bm25.index import build_bm25_index
from jaxfid.retrieval.search import retrieve_to_file
from jaxfid.serving.commands.serve import SERVE_STACK
from jaxfid.training import launch


DEMO_READS = gin_specs.TRAIN_READS  # the demo's training is a `jaxfid train`
INTERRUPTED_EXIT = 143  # 128 + SIGTERM, as a shell reports a killed command
ANSWER_SECONDS = 15  # answering the held-out questions at the end (measured)


class RemainingTime:
  """Prints once the demo's estimated remaining time (the steps left at the
  speed of ``metrics.jsonl``'s second training record, plus answering)."""

  def __init__(self, metrics_path: str, *, total_steps: int, batch_size: int,
               poll_s: float = 2.0):
    self.metrics_path, self.total_steps = metrics_path, total_steps
    self.batch_size, self.poll_s = batch_size, poll_s
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True)

  def start(self) -> None:
    self._thread.start()

  def stop(self) -> None:
    self._done.set()
    self._thread.join()

  def estimate(self) -> float | None:
    """Seconds left from the second training record (the first one's speed
    includes compilation), or None before it."""
    try:
      with open(self.metrics_path, encoding="utf-8") as f:
        lines = f.readlines()
    except OSError:
      return None
    seen = 0
    for line in lines:
      try:
        record = json.loads(line)
      except ValueError:  # a line being written
        continue
      rate = record.get("examples_per_sec")
      if rate:
        seen += 1
        if seen == 2:
          steps_per_s = rate / self.batch_size
          left = max(self.total_steps - record["step"], 0)
          return left / steps_per_s + ANSWER_SECONDS
    return None

  def _watch(self) -> None:
    while not self._done.wait(self.poll_s):
      seconds = self.estimate()
      if seconds is not None:
        print(f"\n[demo] about {seconds / 60:.1f} min left (training at the "
              "measured speed, then answering the held-out questions)",
              file=sys.stderr, flush=True)
        return


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "demo", help="train and evaluate a tiny FiD on generated data with "
      "BM25 retrieval (CPU, minutes)",
      description="Generates made-up entities and questions about them, "
      "retrieves passages with BM25, trains a tiny FiD from scratch, picks "
      "its checkpoint by dev EM and reports test EM (docs/demo.md).",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--output", default="demo_out", help="directory for the "
                 "data, the checkpoints (OUTPUT/model) and the predictions")
  p.add_argument("--steps", type=int, default=1000, help="training steps")
  p.add_argument("--batch-size", type=int, default=32,
                 help="training questions per step")
  p.add_argument("--n-context", type=int, default=4,
                 help="passages retrieved and read per question")
  p.add_argument("--learning-rate", type=float, default=2e-3,
                 help="peak learning rate")
  p.add_argument("--train-entities", type=int, default=400,
                 help="made-up entities to train on (8 questions each)")
  p.add_argument("--dev-questions", type=int, default=200,
                 help="held-out questions that pick the checkpoint")
  p.add_argument("--test-questions", type=int, default=200,
                 help="held-out questions the EM is reported on")
  p.add_argument("--seed", type=int, default=0,
                 help="seed of the data and the initialisation")
  p.set_defaults(func=run)


def _write_corpus(path: str, docs) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, delimiter="\t", lineterminator="\n")
    writer.writerow(["id", "text", "title"])
    for d in docs:
      writer.writerow([d.id, d.text, d.title])


def _write_questions(path: str, questions) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for q in questions:
      f.write(json.dumps({"id": q["id"], "question": q["question"],
                          "answers": q["answers"]}) + "\n")


def _entities(questions: int) -> int:
  """Held-out entities enough for ``questions`` (8 relations each)."""
  return max(questions // 4, 10)


def prepare_data(output: str, *, n_context: int, train_entities: int,
                 test_questions: int, seed: int,
                 dev_questions: int = 200) -> dict:
  """Generate, index and retrieve; returns file paths and retrieval recall."""
  world = synthetic.make_demo_data(
      num_train_entities=train_entities,
      num_test_entities=_entities(test_questions), seed=seed,
      num_dev_entities=_entities(dev_questions))
  data = os.path.join(output, "data")
  os.makedirs(data, exist_ok=True)
  splits = ("train", "dev", "test")
  paths = {name: os.path.join(data, name) for name in (
      "corpus.tsv", "bm25", *(f"{s}_questions.jsonl" for s in splits),
      *(f"{s}.json" for s in splits))}
  _write_corpus(paths["corpus.tsv"], world["train_docs"] + world["test_docs"]
                + world["dev_docs"])
  _write_questions(paths["train_questions.jsonl"], world["train_questions"])
  _write_questions(paths["dev_questions.jsonl"],
                   world["dev_questions"][:dev_questions])
  _write_questions(paths["test_questions.jsonl"],
                   world["test_questions"][:test_questions])
  build_bm25_index(paths["corpus.tsv"], paths["bm25"], progress=False)
  for split in splits:
    retrieve_to_file(paths["bm25"], paths[f"{split}_questions.jsonl"],
                     n_context, paths[f"{split}.json"], progress=False)
  with open(paths["test.json"]) as f:
    test = json.load(f)
  recall = sum(any(c.get("has_answer") for c in ex["ctxs"]) for ex in test)
  return {"paths": paths, "test_recall": recall / max(len(test), 1),
          "train_questions": len(world["train_questions"]),
          "dev_questions": min(dev_questions, len(world["dev_questions"])),
          "test_questions": len(test), "documents": len(world["train_docs"]) +
          len(world["test_docs"]) + len(world["dev_docs"])}


def serve_command(model_dir: str, index: str, *, n_context: int,
                  text_maxlength: int, decode_maxlength: int) -> str:
  """The ``jaxfid serve`` command of the demo's checkpoint and index (its
  last line: what a newcomer runs to look at what was trained)."""
  return (f"{shell.jaxfid_command()} serve --checkpoint {shlex.quote(model_dir)} --index "
          f"{shlex.quote(index)} --n-context {n_context} --text-maxlength "
          f"{text_maxlength} --decode-maxlength {decode_maxlength}")


def predict_command(model_dir: str, data: str, *, n_context: int,
                    text_maxlength: int, answer_maxlength: int) -> str:
  """The ``jaxfid predict`` command that answers ``data`` with the demo's
  checkpoint into ``pred.jsonl``."""
  return (f"{shell.jaxfid_command()} predict --checkpoint "
          f"{shlex.quote(model_dir)} --data {shlex.quote(data)} --n-context "
          f"{n_context} --text-maxlength {text_maxlength} --decode-maxlength "
          f"{answer_maxlength} --output pred.jsonl")


def next_steps(model_dir: str, data: str, index: str, *, n_context: int,
               text_maxlength: int, answer_maxlength: int) -> list[str]:
  """The demo's last lines: the predict and serve commands of what it made
  (the serve one last), preceded by the serve extra's pip command when it
  is not installed (``pip install -e .``), so that each runs as printed."""
  lines = ["try: " + predict_command(model_dir, data, n_context=n_context,
                                     text_maxlength=text_maxlength,
                                     answer_maxlength=answer_maxlength)]
  try:
    shell.require_extra("serve", SERVE_STACK, "jaxfid serve")
  except InputError as e:
    lines.append(f"to serve it, first: {shell.install_command('serve')} "
                 f"({e.path} is not installed)")
  lines.append("look at it (API and page): " + serve_command(
      model_dir, index, n_context=n_context, text_maxlength=text_maxlength,
      decode_maxlength=answer_maxlength))
  return lines


def best_checkpoint(model_dir: str) -> dict:
  """``{'step', 'value'}`` of the best-dev-EM checkpoint the trainer kept
  (what :func:`load_checkpoint` loads)."""
  with open(os.path.join(model_dir, "best", "best_metric.json"),
            encoding="utf-8") as f:
    return json.load(f)


# The flags that set a macro of the demo's run (named in its errors).
FLAG_MACROS = {"TRAIN_STEPS": "--steps", "BATCH_SIZE": "--batch-size",
               "N_CONTEXT": "--n-context", "LEARNING_RATE": "--learning-rate",
               "SEED": "--seed", "EVAL_EVERY": "--steps",
               "CHECKPOINT_EVERY": "--steps"}


def gin_bindings(args, model_dir: str, data: str, text_maxlength: int,
                 answer_maxlength: int) -> list[str]:
  """The training run's bindings over ``gin/fid/tiny.gin``."""
  return [
      f"MODEL_DIR = {model_dir!r}",
      f"TRAIN_DATA = {os.path.join(data, 'train.json')!r}",
      # the checkpoint is chosen on dev; test only measures it
      f"EVAL_DATA = {os.path.join(data, 'dev.json')!r}",
      f"TRAIN_STEPS = {args.steps!r}",
      f"BATCH_SIZE = {args.batch_size!r}", f"N_CONTEXT = {args.n_context!r}",
      f"TEXT_MAXLENGTH = {text_maxlength}",
      f"ANSWER_MAXLENGTH = {answer_maxlength}", f"SEED = {args.seed!r}",
      f"EVAL_EVERY = {max(args.steps // 2, 1)}", "EVAL_BATCH_SIZE = 50",
      f"CHECKPOINT_EVERY = {max(args.steps // 2, 1)}", "LOG_EVERY = 50",
      # Learns in ~1,000 steps with these (measured; see README):
      f"LEARNING_RATE = {args.learning_rate!r}", "WARMUP_STEPS = 100",
      "DROPOUT_RATE = 0.0", "MESH = 'data=1'"]


def check_gin(bindings: list[str]) -> None:
  """Validates the run before anything is written; errors name the flag."""
  try:
    gin_flags.GinRun(("gin/fid/tiny.gin",), tuple(bindings)).check(
        "demo", DEMO_READS)
  except InputError as e:
    if e.path in FLAG_MACROS:
      raise InputError(FLAG_MACROS[e.path], e.reason) from None
    raise


def run(args) -> int:
  t0 = time.time()
  out = os.path.abspath(args.output)
  model_dir = os.path.join(out, "model")
  text_maxlength, answer_maxlength = 40, 6
  bindings = gin_bindings(args, model_dir, os.path.join(out, "data"),
                          text_maxlength, answer_maxlength)
  check_gin(bindings)
  print(f"[1/3] generating data and retrieving with BM25 into {out}/data",
        file=sys.stderr)
  info = prepare_data(out, n_context=args.n_context,
                      train_entities=args.train_entities,
                      test_questions=args.test_questions, seed=args.seed,
                      dev_questions=args.dev_questions)
  paths = info["paths"]
  print(f"      {info['documents']} documents, {info['train_questions']} "
        f"training, {info['dev_questions']} dev and {info['test_questions']} "
        f"test questions; BM25 top-{args.n_context} holds the answer for "
        f"{100 * info['test_recall']:.1f}% of test questions", file=sys.stderr)

  print(f"[2/3] training a tiny FiD from scratch for {args.steps} steps, "
        f"keeping the checkpoint of the best dev EM (in {model_dir})",
        file=sys.stderr)
  gin_flags.parse_gin(["gin/fid/tiny.gin"], bindings)
  estimate = RemainingTime(os.path.join(model_dir, "metrics.jsonl"),
                           total_steps=args.steps, batch_size=args.batch_size)
  estimate.start()
  try:
    result = gin.get_configurable(launch.run)()
  finally:
    estimate.stop()
    gin.clear_config()
  t_train = time.time() - t0
  if result.get("preempted"):
    # The trainer saved a checkpoint; a half-trained model is not the demo's.
    name = result.get("signal") or "SIGTERM"
    print(f"jaxfid demo: interrupted ({name}) at step {result.get('step')} "
          f"of {args.steps}; the checkpoint is in {model_dir}; run the same "
          "command again to resume", file=sys.stderr)
    return 130 if name == "SIGINT" else INTERRUPTED_EXIT

  chosen = best_checkpoint(model_dir)
  print(f"[3/3] answering the test questions with the checkpoint of step "
        f"{chosen['step']} (best dev EM: {100 * chosen['value']:.1f})",
        file=sys.stderr)
  model, params, spiece = load_checkpoint(model_dir, which="best")
  tokenizer = load_tokenizer(os.path.dirname(spiece) if spiece else None)
  examples = read_fid_examples(paths["test.json"])
  preds = predict_lib.generate(model, params, tokenizer, examples,
                               n_context=args.n_context,
                               text_maxlength=text_maxlength,
                               answer_maxlength=answer_maxlength, batch_size=50)
  scores = predict_lib.score(examples, preds)
  pred_path = os.path.join(out, "test_predictions.jsonl")
  predict_lib.write_predictions(pred_path, examples, preds, scores)
  summary = {"test_em": round(scores["em"], 4), "test_f1": round(scores["f1"], 4),
             "test_questions": len(examples),
             "dev_em": round(chosen["value"], 4),
             "dev_questions": info["dev_questions"],
             "checkpoint_step": chosen["step"],
             "bm25_recall_at_n_context": round(info["test_recall"], 4),
             "steps": args.steps, "minutes": round((time.time() - t0) / 60, 1),
             "train_minutes": round(t_train / 60, 1), "model_dir": model_dir,
             "predictions": pred_path}
  print(f"EM on {len(examples)} questions about unseen entities: "
        f"{100 * scores['em']:.1f} (BM25 recall@{args.n_context} "
        f"{100 * info['test_recall']:.1f}); {summary['minutes']} min",
        file=sys.stderr)
  for line in next_steps(model_dir, paths["test.json"], paths["bm25"],
                        n_context=args.n_context,
                        text_maxlength=text_maxlength,
                        answer_maxlength=answer_maxlength):
    print(line, file=sys.stderr)
  print(json.dumps(summary))
  return 0


COMMAND = Command("demo", add_parser, order=110, model=True,
                  gin={"demo": DEMO_READS})
