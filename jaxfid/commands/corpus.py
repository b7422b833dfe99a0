"""`jaxfid corpus split`: cut documents into DPR-style 100-word passages.

``jaxfid corpus split --input DOCS --output PASSAGES.tsv [--words 100]``
reads any corpus format (BEIR/DPR JSONL, DPR TSV, gzipped or not) and writes
a DPR passage TSV (``id text title``).
"""
from __future__ import annotations

import argparse
import json

from jaxfid.commands.registry import Command
from jaxfid.retrieval.store.corpus import iter_passages
from jaxfid.retrieval.store.splitter import split_into_passages, write_dpr_tsv


def _positive(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be positive, got {value}")
  return value


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("corpus", help="corpus preparation",
                            description="Corpus preparation tools.")
  actions = p.add_subparsers(dest="corpus_action", required=True)
  s = actions.add_parser(
      "split", help="split documents into non-overlapping passages",
      description="Split documents into non-overlapping passages of N words "
      "that keep the document title (the DPR/FiD convention), written as a "
      "DPR TSV file.")
  s.add_argument("--input", required=True, help="documents (any corpus "
                 "format)")
  s.add_argument("--output", required=True, help="passage TSV to write")
  s.add_argument("--words", type=_positive, default=100,
                 help="words per passage (default 100)")
  s.add_argument("--encoding", default="utf-8",
                 help="text encoding of the input (default utf-8)")
  s.add_argument("--sequential-ids", action="store_true",
                 help="number passages 1, 2, ... as DPR does (default: "
                 "DOCID_K)")
  s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  passages = split_into_passages(iter_passages(args.input, args.encoding), words=args.words,
                                 sequential_ids=args.sequential_ids)
  count = write_dpr_tsv(args.output, passages)
  print(json.dumps({"output": args.output, "passages": count}))
  return 0


COMMAND = Command("corpus", add_parser, order=70)
