"""`jaxfid reatt adapt`: ReAtt's adaptation data as a queries file.

  jaxfid reatt adapt --mode ir --queries Q --qrels QRELS --corpus C --output OUT.jsonl
  jaxfid reatt adapt --mode ssm --corpus C --output OUT.jsonl [--per-passage N --seed S]

writes JSONL ``{"id", "question", "answers"}`` (IR supervision turned into
``relevance: l. document`` targets, or salient-span-masked sentences); then
``jaxfid retrieve --index INDEX --queries OUT.jsonl --top-k K --output
train.json`` adds each question's close documents, and ``jaxfid train
--gin_file=gin/reatt/...`` trains on it (QA supervision needs no
conversion). Iterative training is driven by gin (``RETRIEVAL_CORPUS``,
``ITERATION_STEPS``).
"""
from __future__ import annotations

import argparse
import json


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("reatt", help="ReAtt utilities (adaptation data)")
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
  a.add_argument("--per-passage", type=int, default=1,
                 help="masked sentences per passage (--mode ssm)")
  a.add_argument("--seed", type=int, default=0)
  a.add_argument("--output", required=True, help="queries JSONL to write")
  a.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from jaxfid.data import reatt_adaptation as adapt
  from jaxfid.data.errors import InputError
  from jaxfid.retrieval.corpus import iter_passages
  if args.mode == "ir":
    for name in ("queries", "qrels"):
      if not getattr(args, name):
        raise InputError(f"--{name}", "required with --mode ir")
    records = adapt.ir_supervision_records(args.queries, args.qrels,
                                           args.corpus)
  else:
    if args.per_passage < 1:
      raise InputError("--per-passage", "must be at least 1")
    records = adapt.salient_span_records(iter_passages(args.corpus),
                                         seed=args.seed,
                                         per_passage=args.per_passage)
  adapt.write_queries(args.output, records)
  print(json.dumps({"mode": args.mode, "queries": len(records),
                    "output": args.output}))
  return 0
