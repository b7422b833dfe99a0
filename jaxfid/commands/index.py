"""`jaxfid index <type>`: build a retrieval index directory from a corpus.

``jaxfid index bm25 --corpus CORPUS --output INDEX_DIR [--k1 0.9 --b 0.4]``
is defined here; the methods register theirs in
:data:`jaxfid.commands.registry.INDEX_COMMANDS`.
"""
from __future__ import annotations

import argparse
import json

from jaxfid.commands.progress import add_progress_flag, positive as _positive
from jaxfid.commands.registry import INDEX_COMMANDS, Command
from jaxfid.retrieval.bm25.index import build_bm25_index
from jaxfid.retrieval.bm25.scoring import BM25Params


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "index", help="build a retrieval index from a corpus",
      description="Build a retrieval index directory from a corpus (BEIR, "
      "DPR or pyserini JSONL, DPR TSV, or sentences one per line in .txt; "
      "optionally gzipped).")
  types = p.add_subparsers(dest="index_type", required=True,
                           metavar="{bm25,...}")
  _add_bm25(types)
  for _, add_type in INDEX_COMMANDS.items():
    add_type(types)


def _add_bm25(types) -> None:
  p = types.add_parser(
      "bm25", help="Lucene-equivalent BM25 index",
      description="BM25 scored as Lucene/pyserini score it (English "
      "analyzer, Porter stemming, one-byte length norms).")
  p.add_argument("--corpus", required=True, help="corpus file")
  p.add_argument("--output", required=True, help="index directory to write")
  p.add_argument("--k1", type=float, default=0.9,
                 help="term frequency saturation (default 0.9, pyserini's)")
  p.add_argument("--b", type=float, default=0.4,
                 help="length normalisation (default 0.4, pyserini's)")
  p.add_argument("--exact-lengths", action="store_true",
                 help="use exact document lengths instead of Lucene's "
                 "one-byte quantised ones (scores then differ from Lucene)")
  p.add_argument("--threads", type=_positive, default=None,
                 help="tokenising processes (default: all CPUs)")
  p.add_argument("--encoding", default="utf-8",
                 help="text encoding of the corpus (default utf-8; e.g. "
                 "cp1252 or latin-1 for legacy files)")
  add_progress_flag(p)
  p.set_defaults(func=run_bm25)


def run_bm25(args: argparse.Namespace) -> int:
  params = BM25Params(k1=args.k1, b=args.b,
                      lucene_norms=not args.exact_lengths)
  meta = build_bm25_index(args.corpus, args.output, params,
                          progress=args.progress, encoding=args.encoding,
                          threads=args.threads)
  print(json.dumps({"index": args.output, "type": meta["type"],
                    "num_passages": meta["num_passages"]}))
  return 0


def run(args: argparse.Namespace) -> int:
  return args.func(args)


COMMAND = Command("index", add_parser, order=50)
