"""`jaxfid eval-retrieval`: metrics of a run file, printed as one JSON line.

* ``--qrels QRELS``: nDCG@10, MRR@10 and R@k (recall; k from ``--k``,
  default 100) against TREC or BEIR qrels;
* ``--data QA``: answer recall R@k (default k = 1,5,20,100) with DPR's
  answer matching; a TREC run also needs ``--index`` for the passage text.
"""
from __future__ import annotations

import argparse
import json

from jaxfid.commands.progress import add_progress_flag
from jaxfid.commands.registry import Command
from jaxfid.retrieval import evaluate


def _ks(text: str) -> list[int]:
  try:
    ks = [int(k) for k in text.split(",") if k.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"expected comma-separated integers, got {text!r}") from None
  if not ks or min(ks) < 1:
    raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
  return ks


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "eval-retrieval", help="evaluate a retrieval run",
      description="Evaluate a run (TREC or FiD JSON) against qrels "
      "(nDCG@10, MRR@10, recall) or a QA set (answer recall R@k).")
  p.add_argument("--run", required=True, help="run file (.trec or "
                 ".json/.jsonl)")
  source = p.add_mutually_exclusive_group(required=True)
  source.add_argument("--qrels", help="TREC or BEIR qrels file")
  source.add_argument("--data", help="QA set with answers (JSONL, FiD JSON "
                      "or the QA TSV of DPR's test sets)")
  p.add_argument("--k", type=_ks, default=None,
                 help="cutoffs, e.g. 1,5,20,100")
  p.add_argument("--index", help="index directory: the passage text of a "
                 "TREC run evaluated with --data; with --qrels, judged "
                 "documents missing from it are counted")
  add_progress_flag(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  if args.qrels:
    metrics = evaluate.evaluate_with_qrels(args.run, args.qrels,
                                           recall_ks=args.k or (100,),
                                           index_dir=args.index)
  else:
    metrics = evaluate.evaluate_with_answers(
        args.run, args.data, ks=args.k or evaluate.DEFAULT_ANSWER_KS,
        index_dir=args.index, progress=args.progress)
  print(json.dumps(metrics))
  return 0


COMMAND = Command("eval-retrieval", add_parser, order=80)
