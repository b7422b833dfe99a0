"""ReAtt's commands: `jaxfid reatt adapt | iterate` and `jaxfid index reatt`.

  jaxfid reatt adapt --mode ir --queries Q --qrels QRELS --corpus C --output OUT.jsonl [--with-title]
  jaxfid reatt adapt --mode ssm --corpus C --output OUT.jsonl [--per-passage N --seed S]
  jaxfid reatt adapt --mode ssm --corpus C --index INDEX --output train.json [--top-k K --token-top-k K2]
  jaxfid reatt iterate --gin_file=gin/reatt/tiny.gin --gin.MODEL_DIR="'out'" \
      --gin.TRAIN_DATA="'train.json'" [--gin.X=Y ...] --corpus C \
      --queries TRAIN_QUERIES --iterations N --steps-per-iteration S \
      [--top-k K] [--token-top-k K2] [--work-dir DIR]
  jaxfid index reatt --checkpoint MODEL_DIR --corpus CORPUS --output INDEX_DIR

``adapt``: :mod:`jaxfid.reatt.adaptation`; ``iterate``: rounds of training,
indexing and retrieval, one JSON line per round, resumable
(:mod:`jaxfid.reatt.iterate`); ``index reatt``: the token index
(:mod:`jaxfid.reatt.token_index`, multi-host :mod:`jaxfid.reatt.index_build`).
"""
from __future__ import annotations

import argparse
import json
import sys

from jaxfid.commands import distributed, gin_flags
from jaxfid.commands.gin_flags import GinRun
from jaxfid.commands.progress import add_progress_flag
from jaxfid.commands.registry import Command
from jaxfid.core.errors import InputError
from jaxfid.core.gin_checks import Reads
from jaxfid.reader.examples import write_fid_examples
from jaxfid.reatt import adaptation as adapt
from jaxfid.reatt import iterate as reatt_iterate
from jaxfid.reatt.index_build import build_from_checkpoint
from jaxfid.reatt.task import ReAttTask
from jaxfid.retrieval.search import open_index
from jaxfid.retrieval.store.corpus import iter_passages
from jaxfid.runtime import multihost
from jaxfid.training import launch

# `reatt iterate` runs `jaxfid train`'s trainer and reads its settings' macros
ITERATE_READS = Reads(roots=(launch.run,),
                      macros=dict.fromkeys(reatt_iterate.SETTINGS))


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("reatt", help="ReAtt utilities (adaptation data, iterative training)")
  sub = p.add_subparsers(dest="reatt_command", required=True)
  a = sub.add_parser(
      "adapt", help="IR supervision or salient span masking as QA queries",
      description="Write a queries file (JSONL with answers) for ReAtt "
      "domain adaptation.")
  a.add_argument("--mode", choices=("ir", "ssm"), required=True,
                 help="ir: qrels as 'relevance: l. document' targets; "
                 "ssm: mask an entity of a random sentence")
  a.add_argument("--corpus", required=True, help="corpus file")
  a.add_argument("--queries", help="queries file (--mode ir)")
  a.add_argument("--qrels", help="TREC or BEIR qrels (--mode ir)")
  a.add_argument("--with-title", action="store_true",
                 help="--mode ir: targets 'relevance: l. title text' (the "
                 "original's hold the text alone)")
  a.add_argument("--per-passage", type=int,
                 default=adapt.SENTENCES_PER_DOCUMENT,
                 help="sentences drawn per passage (--mode ssm; default 5, "
                 "the original's)")
  a.add_argument("--seed", type=int, default=0)
  a.add_argument("--index", default=None,
                 help="--mode ssm: retrieve the close documents from this "
                 "index and write FiD training data, the source passage "
                 "without its masked sentence first")
  a.add_argument("--top-k", type=int, default=100,
                 help="--index: close documents per question (default 100)")
  a.add_argument("--token-top-k", type=int, default=None,
                 help="--index of a token-level index: tokens retrieved per "
                 "query token")
  a.add_argument("--output", required=True,
                 help="queries JSONL to write (with --index: FiD training "
                 "data, .json or .jsonl)")
  a.set_defaults(func=run)
  _add_iterate(sub)


def _add_iterate(sub) -> None:
  p = sub.add_parser(
      "iterate", help="iterative training: train, re-index, re-retrieve",
      description="Train a ReAtt run (gin) in N iterations of S steps (after "
      "RETRIEVAL_WARMUP_STEPS); after each, index the corpus with the model "
      "and retrieve the training queries' close documents, which become "
      "the next iteration's TRAIN_DATA. Rerunning resumes. Multi-host: run "
      "it on every host with --distributed (MODEL_DIR on a shared file "
      "system).")
  gin_flags.add_gin_arguments(p)
  p.add_argument("--corpus", required=True, help="corpus to re-index")
  p.add_argument("--queries", required=True,
                 help="training queries with answers (QA JSONL)")
  p.add_argument("--iterations", type=int, required=True)
  p.add_argument("--steps-per-iteration", type=int, required=True)
  p.add_argument("--top-k", type=int, default=None,
                 help="close documents per query (default N_CONTEXT)")
  p.add_argument("--token-top-k", type=int, default=None,
                 help="tokens retrieved per query token (default TOKEN_TOP_K)")
  p.add_argument("--work-dir", default=None,
                 help="indexes and training files (default MODEL_DIR/iterate)")
  distributed.add_arguments(p)
  p.set_defaults(func=run_iterate, accepts_gin_bindings=True)


def read_iterate_settings(run) -> dict:
  """The ReAtt run's settings that ``iterate`` needs (gin macros)."""
  values = run.macros(["METHOD", *reatt_iterate.SETTINGS])
  method = values["METHOD"]
  if method is not ReAttTask:
    raise InputError(run.files[-1] if run.files else "--gin_file",
                     f"not a ReAtt run: METHOD is "
                     f"{getattr(method, '__name__', 'unbound')}; use "
                     "gin/reatt/*.gin")
  return {key: values[macro] for macro, key in reatt_iterate.SETTINGS.items()}


def iterate_gin_run(gin_files, gin_bindings=(), gin_search_paths=(), *,
                    steps_per_iteration: int, **kwargs) -> dict:
  """``reatt iterate`` of a gin run (files + bindings); returns the summary.

  ``kwargs`` go to :func:`jaxfid.reatt.iterate.run_iterations`.
  """
  run = GinRun(tuple(gin_files), tuple(gin_bindings), tuple(gin_search_paths))
  run.check("reatt iterate", ITERATE_READS)
  settings = read_iterate_settings(run)
  return reatt_iterate.run_iterations(
      settings,
      lambda it: int(run.train(reatt_iterate.round_overrides(
          it, steps_per_iteration))["step"]),
      steps_per_iteration=steps_per_iteration, **kwargs)


def run_iterate(args: argparse.Namespace) -> int:
  distributed.initialize(args)
  summary = iterate_gin_run(
      args.gin_file, args.gin_bindings, args.gin_search_path,
      corpus=args.corpus, queries=args.queries, iterations=args.iterations,
      steps_per_iteration=args.steps_per_iteration, top_k=args.top_k,
      token_top_k=args.token_top_k, work_dir=args.work_dir,
      emit=(lambda record: print(json.dumps(record), flush=True))
      if multihost.is_leader() else None)  # one report for a multi-host run
  return 0 if summary["complete"] else 1


def run(args: argparse.Namespace) -> int:
  if args.mode == "ir":
    for name in ("queries", "qrels"):
      if not getattr(args, name):
        raise InputError(f"--{name}", "required with --mode ir")
    if args.index:
      raise InputError("--index", "applies to --mode ssm; retrieve IR "
                       "queries with `jaxfid retrieve`")
    records = adapt.ir_supervision_records(args.queries, args.qrels,
                                           args.corpus, args.with_title)
  else:
    if args.with_title:
      raise InputError("--with-title", "applies to --mode ir")
    for name, value in (("--per-passage", args.per_passage),
                        ("--top-k", args.top_k),
                        ("--token-top-k", args.token_top_k)):
      if value is not None and value < 1:
        raise InputError(name, "must be at least 1")
    records = adapt.salient_span_records(iter_passages(args.corpus),
                                         seed=args.seed,
                                         per_passage=args.per_passage)
    if args.index:
      options = ({} if args.token_top_k is None
                 else {"token_top_k": args.token_top_k})
      examples = adapt.ssm_training_examples(
          records, open_index(args.index), args.top_k, **options)
      write_fid_examples(args.output, examples)
      print(json.dumps({"mode": args.mode, "queries": len(records),
                        "output": args.output, "format": "fid"}))
      return 0
    print("note: these queries' answers are in their source passages; "
          "`jaxfid retrieve` returns those whole. For training data without "
          "the leak, pass --index (the source, without the masked sentence, "
          "comes first)", file=sys.stderr)
  adapt.write_queries(args.output, records)
  print(json.dumps({"mode": args.mode, "queries": len(records),
                    "output": args.output}))
  return 0


def add_index_parser(types) -> None:
  """Adds ``reatt`` to ``jaxfid index``'s types."""
  p = types.add_parser(
      "reatt", help="ReAtt token index (retrieval-head keys in FAISS)",
      description="Encode every corpus token with a ReAtt model's bi-encoder "
      "(on all devices) and index the retrieval head's keys for `jaxfid "
      "retrieve`. Multi-host: run it on every host with --distributed (host "
      "0 writes; the corpus readable on every host).")
  p.add_argument("--checkpoint", required=True, help="ReAtt MODEL_DIR")
  p.add_argument("--corpus", required=True, help="corpus file")
  p.add_argument("--output", required=True, help="index directory to write")
  p.add_argument("--which", choices=("auto", "best", "latest"), default="auto",
                 help="checkpoint of MODEL_DIR (default: best if any)")
  p.add_argument("--faiss", choices=("flat", "ivfpq"), default="flat",
                 help="exact inner product (flat) or compressed IVF-PQ")
  p.add_argument("--nlist", type=int, default=1024, help="IVF lists")
  p.add_argument("--pq-m", type=int, default=16,
                 help="PQ sub-quantizers (must divide the head width)")
  p.add_argument("--pq-bits", type=int, default=8, help="bits per sub-code")
  p.add_argument("--doc-maxlength", type=int, default=None,
                 help="tokens per passage (default: the run's text_maxlength)")
  p.add_argument("--query-maxlength", type=int, default=None,
                 help="tokens per query (default: the run's)")
  p.add_argument("--batch-size", type=int, default=64,
                 help="passages per encoder call")
  distributed.add_arguments(p)
  p.add_argument("--encoding", default="utf-8",
                 help="text encoding of the corpus (default utf-8; e.g. "
                 "cp1252 or latin-1 for legacy files)")
  add_progress_flag(p)
  p.set_defaults(func=run_index)


def run_index(args: argparse.Namespace) -> int:
  distributed.initialize(args)
  meta = build_from_checkpoint(
      args.checkpoint, args.corpus, args.output, which=args.which,
      doc_maxlength=args.doc_maxlength, query_maxlength=args.query_maxlength,
      batch_size=args.batch_size, faiss_type=args.faiss, nlist=args.nlist,
      pq_m=args.pq_m, pq_bits=args.pq_bits, encoding=args.encoding,
      progress=args.progress)
  if not multihost.is_leader():  # one summary for a multi-host build
    return 0
  print(json.dumps({"index": args.output, "type": meta["type"],
                    "num_passages": meta["num_passages"],
                    "num_tokens": meta["num_tokens"], "head": meta["head"],
                    "faiss": meta["faiss"]}))
  return 0


COMMAND = Command("reatt", add_parser, order=120, model=True,
                  gin={"reatt iterate": ITERATE_READS})
