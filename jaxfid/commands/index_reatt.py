"""`jaxfid index reatt`: a ReAtt model's token-level index of a corpus.

``jaxfid index reatt --checkpoint MODEL_DIR --corpus CORPUS --output INDEX_DIR``
stores the retrieval head's key vector of every corpus token in a FAISS
inner-product index (exact by default, ``--faiss ivfpq`` compresses), with
the token-to-passage map and the model's query encoder, so that
``jaxfid retrieve --index INDEX_DIR ...`` needs nothing else. Added to
``jaxfid index`` by :mod:`jaxfid.commands.index`.
"""
from __future__ import annotations

import argparse
import json

from jaxfid.commands.progress import add_progress_flag
from jaxfid.reatt.token_index import build_from_checkpoint


def add_parser(types) -> None:
  p = types.add_parser(
      "reatt", help="ReAtt token index (retrieval-head keys in FAISS)",
      description="Encode every corpus token with a ReAtt model's bi-encoder "
      "and index the retrieval head's keys for `jaxfid retrieve`.")
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
  p.add_argument("--encoding", default="utf-8",
                 help="text encoding of the corpus (default utf-8; e.g. "
                 "cp1252 or latin-1 for legacy files)")
  add_progress_flag(p)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  meta = build_from_checkpoint(
      args.checkpoint, args.corpus, args.output, which=args.which,
      doc_maxlength=args.doc_maxlength, query_maxlength=args.query_maxlength,
      batch_size=args.batch_size, faiss_type=args.faiss, nlist=args.nlist,
      pq_m=args.pq_m, pq_bits=args.pq_bits, encoding=args.encoding,
      progress=args.progress)
  print(json.dumps({"index": args.output, "type": meta["type"],
                    "num_passages": meta["num_passages"],
                    "num_tokens": meta["num_tokens"], "head": meta["head"],
                    "faiss": meta["faiss"]}))
  return 0
