"""Dense retrieval throughput: corpus embedding, and FAISS via jaxfid vs direct.

Measurements (each in a fresh Python process, so that its peak resident
memory, ``ru_maxrss``, is its own):

* ``embed``: ``jaxfid index dense`` end to end (read a corpus, write the
  passage store, tokenise, embed on all devices, write shards, exact index)
  on ``--passages`` synthetic passages of ~100 words with a random T5
  encoder (``--encoder tiny`` or ``small``; T5.1.1 shapes, random weights:
  the throughput does not depend on the values);
* ``faiss_direct``: ``faiss.IndexFlatIP`` (or ``--factory``) built from an
  in-memory float32 array of ``--vectors`` random ``--dim``-d vectors, then
  ``--queries`` queries, top ``--top-k`` (the fastest of ``--repeats``);
* ``faiss_jaxfid``: the same vectors through jaxfid: embedding shards
  written with ``ShardWriter``, ``build_faiss_index`` (flat indexes are
  filled from the shards when opened), ``ShardedIndex.load``, ``search``
  (which merges parts and orders ties) and the (row, score) lists
  ``DenseSearcher.search_vectors`` returns; ``--index-shards`` parts.

Usage:
  python benchmarks/bench_dense.py [--vectors 200000] [--dim 768]
      [--passages 2000] [--encoder tiny] [--factory Flat] [--workdir DIR]

Prints the hardware, one line per measurement and a final JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENCODERS = {
    "tiny": dict(d_model=64, d_kv=16, d_ff=128, num_heads=4, num_layers=2),
    "small": dict(d_model=512, d_kv=64, d_ff=1024, num_heads=6, num_layers=8),
}


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _vectors(n: int, dim: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.standard_normal((n, dim), dtype=np.float32)


# --- measurements (run in a child process) ----------------------------------
def measure_embed(args) -> dict:
  import jax

  from jaxfid.t5.config import T5Config
  from jaxfid.dual_encoder.index import build_dense_index
  from jaxfid.dual_encoder.checkpoint import LoadedEncoder
  from jaxfid.dual_encoder.model import DualEncoder, DualEncoderConfig
  from jaxfid.core.tokenization import load_tokenizer
  rng = np.random.default_rng(0)
  words = np.array(["alpha", "river", "history", "music", "the", "of",
                    "station", "league", "novel", "village", "energy",
                    "population", "century", "film", "island", "war"])
  corpus = os.path.join(args.workdir, "corpus.tsv")
  with open(corpus, "w", encoding="utf-8") as f:
    f.write("id\ttext\ttitle\n")
    for i in range(args.passages):
      f.write(f"{i}\t{' '.join(rng.choice(words, 100))}\tTitle {i}\n")
  config = T5Config(**ENCODERS[args.encoder], feed_forward_proj="gated-gelu",
                    tie_word_embeddings=False, dropout_rate=0.0,
                    dtype=args.dtype)
  settings = DualEncoderConfig(passage_maxlength=args.passage_maxlength)
  encoder = DualEncoder(config, settings)
  loaded = LoadedEncoder(encoder, encoder.init_params(0), load_tokenizer(),
                         "random", "random", f"random-{args.encoder}")
  # compile outside the timing: one tiny index first
  warm = os.path.join(args.workdir, "warm.tsv")
  with open(corpus, encoding="utf-8") as src, open(warm, "w") as dst:
    dst.writelines(src.readline() for _ in range(args.batch_size + 1))
  build_dense_index(None, warm, os.path.join(args.workdir, "warm_index"),
                    encoder=loaded, batch_size=args.batch_size,
                    progress=False)
  t = time.perf_counter()
  build_dense_index(None, corpus, os.path.join(args.workdir, "index"),
                    encoder=loaded, batch_size=args.batch_size,
                    progress=False)
  seconds = time.perf_counter() - t
  return {"passages": args.passages, "encoder": args.encoder,
          "devices": len(jax.devices()), "seconds": seconds,
          "passages_per_s": args.passages / seconds,
          "passage_maxlength": args.passage_maxlength,
          "peak_rss_mb": _rss_mb()}


def _best_of(repeats: int, fn) -> float:
  """The fastest of ``repeats`` timed calls (the machine may be shared)."""
  times = []
  for _ in range(max(1, repeats)):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return min(times)


def measure_faiss_direct(args) -> dict:
  import faiss
  x = _vectors(args.vectors, args.dim, 0)
  q = _vectors(args.queries, args.dim, 1)
  base = _rss_mb()
  t = time.perf_counter()
  index = faiss.index_factory(args.dim, args.factory,
                              faiss.METRIC_INNER_PRODUCT)
  if not index.is_trained:
    index.train(x[:args.train_size])
  index.add(x)
  build = time.perf_counter() - t
  del x
  search = _best_of(args.repeats, lambda: index.search(q, args.top_k))
  return {"build_s": build, "vectors_per_s": args.vectors / build,
          "search_s": search, "queries_per_s": args.queries / search,
          "peak_rss_mb": _rss_mb(), "rss_before_index_mb": base}


def measure_faiss_jaxfid(args) -> dict:
  from jaxfid.retrieval.dense.embedding_store import EmbeddingStore, ShardWriter
  from jaxfid.retrieval.dense.faiss_index import ShardedIndex, build_faiss_index
  from jaxfid.retrieval.dense.index import hit_lists
  directory = os.path.join(args.workdir, "faiss_jaxfid")
  writer = ShardWriter(directory, args.vectors, args.dim,
                       shard_size=args.shard_size, source={"bench": 1})
  x = _vectors(args.vectors, args.dim, 0)
  t = time.perf_counter()
  for i in range(writer.num_shards):
    a, b = writer.shard_rows(i)
    writer.write(i, x[a:b])
  write = time.perf_counter() - t
  del x
  q = _vectors(args.queries, args.dim, 1)
  base = _rss_mb()
  t = time.perf_counter()
  store = EmbeddingStore(directory)
  info = build_faiss_index(store, directory, factory=args.factory,
                           index_shards=args.index_shards,
                           train_size=args.train_size, progress=False)
  index = ShardedIndex.load(directory, info, store)
  build = time.perf_counter() - t
  # what DenseSearcher.search_vectors does: search, ties, (row, score) lists
  search = _best_of(args.repeats,
                    lambda: hit_lists(*index.search(q, args.top_k)))
  return {"write_shards_s": write, "build_s": build,
          "vectors_per_s": args.vectors / build, "search_s": search,
          "queries_per_s": args.queries / search,
          "index_shards": args.index_shards, "peak_rss_mb": _rss_mb(),
          "rss_before_index_mb": base}


MEASURES = {"embed": measure_embed, "faiss_direct": measure_faiss_direct,
            "faiss_jaxfid": measure_faiss_jaxfid}


# --- driver -----------------------------------------------------------------
def hardware() -> dict:
  import faiss
  import jaxfid  # noqa: F401  (first: keeps JAX on the CPU beside libtpu)
  import jax  # noqa: F401  (describe reports JAX's devices once imported)
  from cpu_host import describe
  return {**describe(), "faiss": faiss.__version__,
          "faiss_threads": faiss.omp_get_max_threads()}


def run_child(name: str, argv: list[str]) -> dict:
  out = subprocess.run(
      [sys.executable, __file__, "--measure", name, *argv], check=True,
      capture_output=True, text=True,
      env={**os.environ, "PYTHONPATH": ROOT + os.pathsep +
           os.environ.get("PYTHONPATH", "")})
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--vectors", type=int, default=200_000)
  p.add_argument("--dim", type=int, default=768)
  p.add_argument("--queries", type=int, default=1000)
  p.add_argument("--top-k", type=int, default=100)
  p.add_argument("--repeats", type=int, default=3,
                 help="searches timed; the fastest is reported")
  p.add_argument("--factory", default="Flat")
  p.add_argument("--train-size", type=int, default=100_000)
  p.add_argument("--index-shards", type=int, default=1)
  p.add_argument("--shard-size", type=int, default=100_000)
  p.add_argument("--passages", type=int, default=2000)
  p.add_argument("--encoder", choices=sorted(ENCODERS), default="tiny")
  p.add_argument("--passage-maxlength", type=int, default=128)
  p.add_argument("--batch-size", type=int, default=128)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--skip", default="", help="comma-separated measurements")
  p.add_argument("--workdir", default=None)
  p.add_argument("--measure", default=None, help=argparse.SUPPRESS)
  args, _ = p.parse_known_args()
  if args.measure:
    print(json.dumps(MEASURES[args.measure](args)))
    return
  argv = sys.argv[1:]
  hw = hardware()
  print("hardware:", json.dumps(hw))
  results = {"hardware": hw, "config": {
      k: getattr(args, k) for k in ("vectors", "dim", "queries", "top_k",
                                    "factory", "index_shards", "passages",
                                    "encoder", "passage_maxlength",
                                    "batch_size", "dtype")}}
  skip = set(filter(None, args.skip.split(",")))
  with tempfile.TemporaryDirectory(dir=args.workdir) as work:
    for name in MEASURES:
      if name in skip:
        continue
      sub = os.path.join(work, name)
      os.makedirs(sub)
      results[name] = run_child(name, argv + ["--workdir", sub])
      print(f"{name}: {json.dumps(results[name])}", flush=True)
  print(json.dumps(results))


if __name__ == "__main__":
  main()
