"""``jaxfid distill iterate``: FiD-KD's rounds of reader and retriever.

  jaxfid distill iterate --work-dir W --corpus corpus.tsv --train train.jsonl \\
      --dev dev.jsonl --rounds 2 --top-k 20 \\
      --reader-gin_file=gin/fid/tiny.gin \\
      --retriever-gin_file=gin/retrieval/distill_tiny.gin \\
      [--reader.NAME=VALUE ...] [--retriever.NAME=VALUE ...]

The rounds are :mod:`jaxfid.distill.iterate`'s. The command binds each gin
run's MODEL_DIR, TRAIN_DATA, EVAL_DATA and, from round 2, INIT_CHECKPOINT
(the previous round's model with ``--retriever-init`` / ``--reader-init
continue``; the reader's default is its gin run's own, as FiD's
``train_reader.py`` without ``--model_path``); the gin runs give everything
else. Single process.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from jaxfid.commands.gin_flags import GinRun
from jaxfid.commands.progress import add_progress_flag
from jaxfid.commands.registry import Command
from jaxfid.core.errors import InputError
from jaxfid.core.gin_checks import Reads
from jaxfid.distill import iterate as distill_iterate
from jaxfid.dual_encoder.task import DualEncoderTask
from jaxfid.fid.task import FidTask
from jaxfid.training import launch

INITS = ("restart", "continue")
READER_MACROS = ("METHOD", "TRAIN_STEPS", "N_CONTEXT", "TEXT_MAXLENGTH")
RETRIEVER_MACROS = ("METHOD", "OBJECTIVE", "TRAIN_STEPS", "N_CONTEXT")
# both gin runs are `jaxfid train`'s trainer, of which the rounds read these
ITERATE_READS = Reads(roots=(launch.run,), macros=dict.fromkeys(
    ("MODEL_DIR", "TRAIN_DATA", "EVAL_DATA", "INIT_CHECKPOINT",
     *READER_MACROS, *RETRIEVER_MACROS)))


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "distill", help="FiD-KD: a retriever distilled from the reader, in "
      "rounds")
  sub = p.add_subparsers(dest="distill_command", required=True)
  it = sub.add_parser(
      "iterate", help="rounds of reader training, passage scoring, "
      "retriever distillation, re-indexing and re-retrieval",
      description="Round 0 retrieves with BM25; each later round trains the "
      "reader on the current retrieval, scores the training passages, "
      "trains the retriever on the scores, indexes the corpus with it and "
      "retrieves again. W/rounds.jsonl: one record per round (answer recall "
      "on the dev questions, the reader's dev EM). Rerunning resumes. "
      "--reader.NAME=VALUE / --retriever.NAME=VALUE bind gin macros of the "
      "two trainings.")
  it.add_argument("--work-dir", required=True, help="the rounds' outputs")
  it.add_argument("--corpus", required=True, help="passages (DPR TSV, ...)")
  it.add_argument("--train", required=True,
                  help="training questions (QA JSONL: question, answers)")
  it.add_argument("--dev", required=True,
                  help="dev questions (QA JSONL), for recall and EM")
  it.add_argument("--rounds", type=int, required=True,
                  help="distillation rounds after the BM25 round 0")
  it.add_argument("--top-k", type=int, default=20,
                  help="passages retrieved (and scored) per training "
                  "question (default 20)")
  it.add_argument("--reader-gin_file", action="append", default=[],
                  required=True, help="the reader's gin file (repeatable)")
  it.add_argument("--retriever-gin_file", action="append", default=[],
                  required=True,
                  help="the retriever's gin file (repeatable; the "
                  "distillation objective)")
  it.add_argument("--reader-init", choices=INITS, default="restart",
                  help="each round's reader: 'restart' from the reader gin "
                  "run's own initialisation (its INIT_CHECKPOINT, e.g. "
                  "t5-base; FiD's train_reader.py without --model_path), or "
                  "'continue' from the previous round's reader (default "
                  "restart)")
  it.add_argument("--retriever-init", choices=INITS, default="continue",
                  help="each round's retriever: 'continue' from the previous "
                  "round's retriever, or 'restart' from the retriever gin "
                  "run's own initialisation (FiD's train_retriever.py "
                  "without --model_path) (default continue)")
  it.add_argument("--gin_search_path", action="append", default=[],
                  help="extra directory to resolve gin files and includes")
  add_progress_flag(it)
  it.set_defaults(func=run_iterate,
                  gin_binding_prefixes=("reader", "retriever"))


def _settings(reader: GinRun, retriever: GinRun, work_dir: str, train: str
              ) -> distill_iterate.Settings:
  """Checks both gin runs (one-line errors) and reads what the rounds use."""
  # the rounds bind MODEL_DIR and TRAIN_DATA; check the runs as they will be
  for run, name in ((reader, "reader"), (retriever, "retriever")):
    try:
      run.check("distill iterate", ITERATE_READS, {
          "MODEL_DIR": os.path.join(work_dir, "round_1", name),
          "TRAIN_DATA": train})
    except InputError as e:  # name the flag as the user wrote it
      if not e.path.startswith("--gin."):
        raise
      raise InputError(f"--{name}." + e.path[len("--gin."):], e.reason,
                       e.where) from None
  r = reader.macros(READER_MACROS)
  d = retriever.macros(RETRIEVER_MACROS)
  where = reader.files[-1]
  if r["METHOD"] is not FidTask:
    raise InputError(where, "not a FiD run (--reader-gin_file): METHOD is "
                     f"{getattr(r['METHOD'], '__name__', 'unbound')}; use "
                     "gin/fid/*.gin")
  where = retriever.files[-1]
  if d["METHOD"] is not DualEncoderTask or d["OBJECTIVE"] != "distill":
    raise InputError(where, "not a distillation run (--retriever-gin_file): "
                     "use gin/retrieval/distill_*.gin (a dual encoder with "
                     "OBJECTIVE='distill')")
  for name, run, values in (("reader", reader, r), ("retriever", retriever,
                                                    d)):
    for macro in ("TRAIN_STEPS", "N_CONTEXT"):
      if not isinstance(values[macro], int) or values[macro] < 1:
        raise InputError(run.files[-1], f"the {name}'s {macro} must be a "
                         f"positive integer, got {values[macro]!r}")
  return distill_iterate.Settings(
      reader_steps=r["TRAIN_STEPS"], reader_n_context=r["N_CONTEXT"],
      text_maxlength=r["TEXT_MAXLENGTH"], retriever_steps=d["TRAIN_STEPS"],
      retriever_n_context=d["N_CONTEXT"])


def run_identity(reader: GinRun, retriever: GinRun, *, corpus: str,
                 train: str, dev: str, top_k: int,
                 reader_init: str = "restart",
                 retriever_init: str = "continue") -> dict:
  """What a work directory's run is (its state file): a rerun with other
  inputs, top-k, gin or initialisations is refused (the rounds' count may
  grow); an initialisation enters only when it is not the default."""
  identity = {
      "corpus": os.path.abspath(corpus), "train": os.path.abspath(train),
      "dev": os.path.abspath(dev), "top_k": top_k,
      "reader": [list(reader.files), list(reader.bindings)],
      "retriever": [list(retriever.files), list(retriever.bindings)]}
  if reader_init != "restart":
    identity["reader_init"] = reader_init
  if retriever_init != "continue":
    identity["retriever_init"] = retriever_init
  return identity


def iterate(reader: GinRun, retriever: GinRun, *, work_dir: str, corpus: str,
            train: str, dev: str, rounds: int, top_k: int,
            reader_init: str = "restart", retriever_init: str = "continue",
            progress: bool | None = None, emit=None) -> dict:
  """``distill iterate`` of two gin runs; returns the summary
  (:func:`jaxfid.distill.iterate.run_rounds`)."""
  settings = _settings(reader, retriever, work_dir, train)
  identity = run_identity(reader, retriever, corpus=corpus, train=train,
                          dev=dev, top_k=top_k, reader_init=reader_init,
                          retriever_init=retriever_init)

  def train_reader(rnd, train_data, eval_data, init) -> int:
    macros = {"MODEL_DIR": rnd.reader, "TRAIN_DATA": train_data,
              "EVAL_DATA": eval_data}
    if init is not None:
      macros["INIT_CHECKPOINT"] = init
    # the trainer's own output goes to stderr: stdout is the rounds' records
    with contextlib.redirect_stdout(sys.stderr):
      return int(reader.train(macros)["step"])

  def train_retriever(rnd, train_data, init) -> int:
    macros = {"MODEL_DIR": rnd.retriever, "TRAIN_DATA": train_data}
    if init is not None:
      macros["INIT_CHECKPOINT"] = init
    with contextlib.redirect_stdout(sys.stderr):
      return int(retriever.train(macros)["step"])

  return distill_iterate.run_rounds(
      settings, train_reader=train_reader, train_retriever=train_retriever,
      identity=identity, work_dir=work_dir, corpus=corpus, train=train,
      dev=dev, rounds_=rounds, top_k=top_k,
      continue_reader=reader_init == "continue",
      continue_retriever=retriever_init == "continue", progress=progress,
      emit=emit)


def run_iterate(args: argparse.Namespace) -> int:
  search = tuple(args.gin_search_path)
  summary = iterate(
      GinRun(tuple(args.reader_gin_file), tuple(args.reader_bindings),
             search),
      GinRun(tuple(args.retriever_gin_file), tuple(args.retriever_bindings),
             search),
      work_dir=args.work_dir, corpus=args.corpus, train=args.train,
      dev=args.dev, rounds=args.rounds, top_k=args.top_k,
      reader_init=args.reader_init, retriever_init=args.retriever_init,
      progress=args.progress,
      emit=lambda record: print(json.dumps(record), flush=True))
  return 0 if summary["complete"] else 1


COMMAND = Command("distill", add_parser, order=125, model=True,
                  gin={"distill iterate": ITERATE_READS})
