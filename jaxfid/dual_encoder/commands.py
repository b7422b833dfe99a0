"""The dual encoder's commands: ``jaxfid index dense`` (embed every passage
with a checkpoint) and ``index import-embeddings`` (DPR's embeddings)."""
from __future__ import annotations

import argparse
import json

from jaxfid.commands import distributed
from jaxfid.commands.progress import add_progress_flag
from jaxfid.dual_encoder.index import build_dense_index, import_dpr_embeddings
from jaxfid.runtime import multihost


def _positive(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be positive, got {value}")
  return value


def _add_faiss_arguments(p) -> None:
  p.add_argument("--corpus", required=True,
                 help="corpus (BEIR/DPR JSONL or DPR TSV, optionally gzipped)"
                 " or sentences (.txt, one per line; JSONL with 'text')")
  p.add_argument("--output", required=True, help="index directory to write")
  p.add_argument("--faiss-factory", default="Flat",
                 help="FAISS index_factory string (default Flat: exact; e.g. "
                 "'IVF4096,PQ64' or 'HNSW32' for large corpora)")
  p.add_argument("--metric", choices=("ip", "l2"), default="ip",
                 help="similarity: inner product (default) or L2")
  p.add_argument("--index-shards", type=_positive, default=1,
                 help="FAISS sub-indexes over contiguous passage ranges, "
                 "searched together (default 1)")
  p.add_argument("--train-size", type=_positive, default=262_144,
                 help="vectors to train IVF/PQ indexes on (default 262144)")
  p.add_argument("--shard-size", type=_positive, default=100_000,
                 help="passages per embeddings_NNNNN.npy file")
  p.add_argument("--embedding-dtype", choices=("float32", "float16"),
                 default="float32", help="storage of the embeddings")
  p.add_argument("--encoding", default="utf-8",
                 help="text encoding of the corpus (default utf-8; e.g. "
                 "cp1252 or latin-1 for legacy files)")
  add_progress_flag(p)


def add_parser(types) -> None:
  p = types.add_parser(
      "dense", help="dense index: T5 dual encoder + FAISS",
      description="Embed every passage with a T5 dual encoder (mean pooling; "
      "GTR / Sentence-T5 projection and normalisation when the checkpoint "
      "has them) on all devices, store the embeddings in shards and build a "
      "FAISS index. Rerunning resumes an interrupted build; rebuilding with "
      "other FAISS settings reuses the embeddings. Multi-host: run it on "
      "every host with --distributed (the devices of all hosts embed, host "
      "0 writes; --output on a file system they share).")
  p.add_argument("--checkpoint", required=True,
                 help="HF T5 / T5EncoderModel / sentence-transformers "
                 "directory, T5X checkpoint or jaxfid MODEL_DIR")
  _add_faiss_arguments(p)
  p.add_argument("--batch-size", type=_positive, default=128,
                 help="passages per device call, over all devices")
  p.add_argument("--passage-maxlength", type=_positive, default=None,
                 help="tokens per passage (default: the checkpoint's, 256)")
  p.add_argument("--query-maxlength", type=_positive, default=None,
                 help="tokens per query (default: the checkpoint's, 64)")
  p.add_argument("--passage-format", choices=("title_text", "fid"),
                 default=None, help="'title text' (default) or 'title: T "
                 "context: P'")
  p.add_argument("--pooling", choices=("mean", "first"), default=None)
  p.add_argument("--normalize", action=argparse.BooleanOptionalAction,
                 default=None, help="L2-normalise vectors (default: as the "
                 "checkpoint says; GTR and Sentence-T5 do)")
  p.add_argument("--dtype", default=None,
                 help="activation dtype, e.g. bfloat16 on accelerators")
  p.add_argument("--mesh", default="",
                 help="device mesh, e.g. 'data=4,model=2' (default: all "
                 "devices on data)")
  distributed.add_arguments(p)
  p.set_defaults(func=run_dense)

  q = types.add_parser(
      "import-embeddings", help="dense index from DPR passage embeddings",
      description="Build a dense index from precomputed passage embeddings "
      "in DPR's format (pickled lists of (id, vector)). Queries then need "
      "--query-encoder here, or precomputed vectors at retrieval time "
      "(jaxfid retrieve --search-option query_vectors=FILE).")
  q.add_argument("--embeddings", required=True, action="append",
                 help="embedding file or glob, quoted (repeatable)")
  _add_faiss_arguments(q)
  q.add_argument("--query-encoder", default=None,
                 help="T5 checkpoint embedding queries into the same space")
  q.set_defaults(func=run_import)


def run_dense(args: argparse.Namespace) -> int:
  distributed.initialize(args)
  summary = build_dense_index(
      args.checkpoint, args.corpus, args.output, factory=args.faiss_factory,
      metric=args.metric, index_shards=args.index_shards,
      batch_size=args.batch_size, shard_size=args.shard_size,
      embedding_dtype=args.embedding_dtype, dtype=args.dtype, mesh=args.mesh,
      train_size=args.train_size, passage_maxlength=args.passage_maxlength,
      query_maxlength=args.query_maxlength,
      passage_format=args.passage_format, pooling=args.pooling,
      normalize=args.normalize, encoding=args.encoding,
      progress=args.progress)
  if multihost.is_leader():  # one summary for a multi-host build
    print(json.dumps(summary))
  return 0


def run_import(args: argparse.Namespace) -> int:
  summary = import_dpr_embeddings(
      args.embeddings, args.corpus, args.output, factory=args.faiss_factory,
      metric=args.metric, index_shards=args.index_shards,
      shard_size=args.shard_size, embedding_dtype=args.embedding_dtype,
      train_size=args.train_size, query_encoder=args.query_encoder,
      encoding=args.encoding, progress=args.progress)
  print(json.dumps(summary))
  return 0
