"""`jaxfid retrieve`: search an index for every query, write a run file.

``jaxfid retrieve --index INDEX_DIR --queries QUERIES --top-k K --output RUN``
writes a TREC run, or FiD JSON when RUN ends in ``.json``/``.jsonl``.
Index-specific options (``--token-top-k`` for token-level indexes, or any
``--search-option NAME=VALUE``) are passed to the index type's searcher;
``--device`` searches on the accelerators, for index types with a device
search (:func:`jaxfid.retrieval.search.open_index`).
"""
from __future__ import annotations

import argparse
import json

from jaxfid.commands.progress import add_progress_flag
from jaxfid.commands.registry import Command
from jaxfid.retrieval.search import retrieve_to_file


def _key_value(text: str) -> tuple[str, str]:
  name, sep, value = text.partition("=")
  if not sep or not name:
    raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
  return name.replace("-", "_"), value


def _one_word(text: str) -> str:
  if len(text.split()) != 1:
    raise argparse.ArgumentTypeError("the run tag must be one word")
  return text


def _positive(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be positive, got {value}")
  return value


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "retrieve", help="retrieve passages for queries from an index",
      description="Search an index for every query and write a TREC run "
      "(RUN.trec) or FiD JSON (RUN.json / RUN.jsonl).")
  p.add_argument("--index", required=True, help="index directory")
  p.add_argument("--queries", required=True,
                 help="queries: TSV id<TAB>text, JSONL (id/_id + question/"
                 "text), QA JSONL (question + answers) or the QA TSV of "
                 "DPR's test sets (question<TAB>['answer', ...])")
  p.add_argument("--top-k", type=_positive, required=True,
                 help="passages per query")
  p.add_argument("--output", required=True,
                 help="run file: .trec (TREC) or .json/.jsonl (FiD)")
  p.add_argument("--tag", type=_one_word, default="jaxfid",
                 help="run tag in the TREC file (default jaxfid)")
  p.add_argument("--token-top-k", type=_positive, default=None,
                 help="token-level indexes: tokens retrieved per query token")
  p.add_argument("--search-option", type=_key_value, action="append",
                 default=[], metavar="NAME=VALUE",
                 help="other index-specific search option (repeatable)")
  p.add_argument("--threads", type=_positive, default=None,
                 help="CPUs to search on (default: all): worker processes "
                 "for BM25, FAISS threads for dense indexes")
  p.add_argument("--device", action="store_true",
                 help="search on the accelerators (all local devices, the "
                 "index's rows sharded over them): index types that hold "
                 "their vectors on the devices (an Atlas run's "
                 "MODEL_DIR/atlas_index/STEP)")
  add_progress_flag(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  options = dict(args.search_option)
  if args.token_top_k is not None:
    options["token_top_k"] = args.token_top_k
  summary = retrieve_to_file(args.index, args.queries, args.top_k,
                             args.output, tag=args.tag,
                             progress=args.progress, threads=args.threads,
                             device=args.device, **options)
  print(json.dumps(summary))
  return 0


COMMAND = Command("retrieve", add_parser, order=60)
