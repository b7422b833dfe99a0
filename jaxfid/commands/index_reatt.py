"""`jaxfid index reatt`: a ReAtt model's token-level index of a corpus.

``jaxfid index reatt --checkpoint MODEL_DIR --corpus CORPUS --output INDEX_DIR``
stores the retrieval head's key vector of every corpus token in a FAISS
inner-product index (exact by default, ``--faiss ivfpq`` compresses), with
the token-to-passage map and the model's query encoder, so that
``jaxfid retrieve --index INDEX_DIR ...`` needs nothing else. Multi-host
(the launch flags of :mod:`jaxfid.commands.distributed`): every host's
devices encode, host 0 writes (:mod:`jaxfid.reatt.index_build`). Added to
``jaxfid index`` by :mod:`jaxfid.commands.index`.
"""
from __future__ import annotations

import argparse
import json

from jaxfid.commands import distributed
from jaxfid.commands.progress import add_progress_flag
from jaxfid.core import multihost
from jaxfid.reatt.index_build import build_from_checkpoint


def add_parser(types) -> None:
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
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
