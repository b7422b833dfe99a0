"""Dense search: ``jaxfid retrieve``'s path against raw FAISS, same index.

For each FAISS factory (``--factories``, default the exact ``Flat`` and
``IVF1024,PQ64``), one dense index directory is made the way a user imports
precomputed embeddings (``jaxfid index import-dpr``'s
:func:`~jaxfid.retrieval.dense.dpr_import.import_embeddings`: a corpus TSV,
DPR pickles of ``--vectors`` vectors, the FAISS index trained and written),
and ``--queries`` query vectors are written as a query-vectors file. Vectors
are random but clustered (``--clusters`` Gaussian centres), so inverted lists
behave as with real embeddings. Then, each in a process of its own, with
FAISS on each ``--threads`` setting, query embedding excluded (the vectors are
precomputed), the index open first (loading excluded), all queries searched
``--passes`` times (best kept), the four alternated ``--repeats`` times:

* **faiss**: the index object FAISS itself reads from the directory's file
  (for ``Flat``: an ``IndexFlatIP`` holding the same vectors, as jaxfid
  fills it from its embedding store), ``index.search(queries, top_k)`` on
  the whole float32 query matrix, ``nprobe`` set as for jaxfid;
* **jaxfid**: :func:`jaxfid.retrieval.search.search_all` on the opened
  index with ``query_vectors=FILE`` (and ``nprobe``): the ``jaxfid
  retrieve`` path up to the run file — batching, the vector look-up by
  query text, the FAISS search, tie order, each query's (row, score) hits;
* **jaxfid + TREC**: the same plus writing the TREC run file, as
  ``jaxfid retrieve`` does (raw FAISS writes nothing, so this row says
  what writing costs);
* **together**: raw FAISS and jaxfid's path in one process, pass by pass
  (best of each kept): their ratio without the 10-15% by which FAISS's own
  time differs from one process to the next on a shared VM;

and checks that jaxfid's rows equal FAISS's (ties aside: equal scores may
be ordered differently, jaxfid orders them by row).

Usage:
  python benchmarks/dense_search.py [--vectors 200000] [--dim 768]
      [--queries 1000] [--factories Flat,IVF1024,PQ64] [--nprobe 32]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def best_of_passes(run, passes: int) -> tuple[float, float, object]:
  """(best wall seconds, best CPU seconds, the last output) of ``passes``
  calls of ``run``."""
  best = best_cpu = float("inf")
  out = None
  for _ in range(passes):
    start, cpu = time.perf_counter(), _cpu()
    out = run()
    best = min(best, time.perf_counter() - start)
    best_cpu = min(best_cpu, _cpu() - cpu)
  return best, best_cpu, out


def clustered(rng: np.random.Generator, clusters: int, dim: int):
  """``draw(n)``: n float32 vectors [n, dim], each one of ``clusters``
  Gaussian centres (drawn here, once) plus noise of standard deviation 0.5;
  successive draws continue ``rng``."""
  centres = rng.standard_normal((clusters, dim), dtype=np.float32)

  def draw(n: int) -> np.ndarray:
    which = rng.integers(0, clusters, n)
    noise = rng.standard_normal((n, dim), dtype=np.float32)
    return centres[which] + 0.5 * noise
  return draw


def make_data(args, workdir: str) -> tuple[str, str, list[str]]:
  """Corpus TSV, DPR embedding pickle and query-vectors JSONL."""
  draw = clustered(np.random.default_rng(0), args.clusters, args.dim)

  corpus = os.path.join(workdir, "corpus.tsv")
  with open(corpus, "w") as f:
    f.write("id\ttext\ttitle\n")
    for i in range(args.vectors):
      f.write(f"{i}\tpassage {i}\t\n")
  vectors = draw(args.vectors)
  embeddings = os.path.join(workdir, "wiki_passages_0")
  with open(embeddings, "wb") as f:
    pickle.dump([(str(i), v) for i, v in enumerate(vectors)], f)
  texts = [f"question {i}" for i in range(args.queries)]
  queries = os.path.join(workdir, "queries.jsonl")
  with open(queries, "w") as f:
    for text, vector in zip(texts, draw(args.queries)):
      f.write(json.dumps({"question": text,
                          "vector": vector.tolist()}) + "\n")
  return corpus, embeddings, queries


# --- workers (each in its own process) ---------------------------------------
def _faiss_search(index_dir: str, info: dict, vectors: np.ndarray, opts: dict):
  """Raw FAISS on the directory's index: a callable returning (D, I)."""
  import faiss
  part = info["parts"][0]
  if part["file"] is None:  # flat: jaxfid fills it from the shards
    from jaxfid.retrieval.dense.embedding_store import EmbeddingStore
    store = EmbeddingStore(index_dir)
    index = faiss.IndexFlatIP(store.dim)
    index.add(np.asarray(store[np.arange(len(store))], np.float32))
  else:
    index = faiss.read_index(os.path.join(index_dir, part["file"]))
    faiss.ParameterSpace().set_index_parameter(index, "nprobe",
                                               opts["nprobe"])
  return lambda: index.search(vectors, opts["top_k"])


def _jaxfid_search(index_dir: str, info: dict, texts: list, queries: str,
                   opts: dict, trec: bool = False):
  """jaxfid's search_all on the opened index (and the TREC file): a
  callable returning each query's hits."""
  import jaxfid.methods  # noqa: F401  (registers the dense index type)
  from jaxfid.retrieval.runs import write_trec
  from jaxfid.retrieval.search import _with_ids, open_index, search_all
  searcher = open_index(index_dir)
  search = {"query_vectors": queries}
  if info["parts"][0]["file"] is not None:
    search["nprobe"] = str(opts["nprobe"])
  searcher.search(texts[:1], opts["top_k"], **search)  # opens the index

  def run():
    found = search_all(searcher, texts, opts["top_k"], progress=False,
                       threads=opts["threads"], **search)
    if trec:
      write_trec(os.path.join(os.path.dirname(queries), "run.trec"),
                 [str(i) for i in range(len(texts))],
                 [_with_ids(searcher.store, hits) for hits in found])
    return found
  return run


def _same_rows(found, faiss_rows: np.ndarray) -> int:
  return int(sum(sorted(r for r, _ in hits) == sorted(row.tolist())
                 for hits, row in zip(found, faiss_rows)))


def worker(task: str, index_dir: str, queries: str, options: str) -> dict:
  sys.path.insert(0, ROOT)
  import faiss
  opts = json.loads(options)
  faiss.omp_set_num_threads(opts["threads"])
  with open(queries) as f:
    records = [json.loads(line) for line in f]
  texts = [r["question"] for r in records]
  passes = opts["passes"]
  out: dict = {"task": task, "queries": len(texts)}
  with open(os.path.join(index_dir, "meta.json")) as f:
    info = json.load(f)["faiss"]
  vectors = np.array([r["vector"] for r in records], np.float32)
  rows_file = os.path.join(os.path.dirname(queries), "faiss_rows.npy")
  if task == "faiss":
    out["seconds"], out["cpu_seconds"], (_, rows) = best_of_passes(
        _faiss_search(index_dir, info, vectors, opts), passes)
    np.save(rows_file, rows)
  elif task == "together":  # both in this process, pass by pass
    runs = {"faiss": _faiss_search(index_dir, info, vectors, opts),
            "jaxfid": _jaxfid_search(index_dir, info, texts, queries, opts)}
    best: dict = {}
    outputs: dict = {}
    for _ in range(passes):
      for name, run in runs.items():
        wall, cpu, outputs[name] = best_of_passes(run, 1)
        b = best.setdefault(name, [wall, cpu])
        b[0], b[1] = min(b[0], wall), min(b[1], cpu)
    out["seconds"], out["cpu_seconds"] = best["jaxfid"]
    out["faiss_seconds"], out["faiss_cpu_seconds"] = best["faiss"]
    out["same_rows"] = _same_rows(outputs["jaxfid"], np.load(rows_file))
  else:
    out["seconds"], out["cpu_seconds"], found = best_of_passes(
        _jaxfid_search(index_dir, info, texts, queries, opts,
                       trec=task == "jaxfid_trec"), passes)
    out["same_rows"] = _same_rows(found, np.load(rows_file))
  out["ms_per_query"] = 1000 * out["seconds"] / len(texts)
  return out


def run_worker(task: str, index_dir: str, queries: str, opts: dict) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", task,
         index_dir, queries, json.dumps(opts)]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        env=dict(os.environ, PYTHONPATH=ROOT))
  if proc.returncode != 0:
    raise RuntimeError(f"{task} failed:\n{proc.stderr[-3000:]}")
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  result["load"] = os.getloadavg()[0]
  print(f"  {json.dumps(result)}", flush=True)
  return result


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--vectors", type=int, default=200_000)
  parser.add_argument("--dim", type=int, default=768)
  parser.add_argument("--queries", type=int, default=1000)
  parser.add_argument("--clusters", type=int, default=1000)
  parser.add_argument("--top-k", type=int, default=100)
  parser.add_argument("--factories", default="Flat;IVF1024,PQ64",
                      help="FAISS factories, separated by ';'")
  parser.add_argument("--nprobe", type=int, default=32)
  parser.add_argument("--threads", default=f"1,{os.cpu_count()}",
                      help="FAISS threads, comma-separated settings")
  parser.add_argument("--passes", type=int, default=3)
  parser.add_argument("--repeats", type=int, default=2,
                      help="alternated worker runs per system (best kept)")
  parser.add_argument("--workdir", default=None)
  parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    print(json.dumps(worker(*args.worker)))
    return 0
  sys.path.insert(0, ROOT)
  import faiss
  from jaxfid.retrieval.dense.dpr_import import import_embeddings
  print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python "
        f"{platform.python_version()}, numpy {np.__version__}, faiss "
        f"{faiss.__version__}; load {os.getloadavg()}", flush=True)
  rows = []
  threads = [int(t) for t in args.threads.split(",")]
  with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
    corpus, embeddings, queries = make_data(args, workdir)
    for factory in args.factories.split(";"):
      index_dir = os.path.join(workdir, factory.replace(",", "_"))
      import_embeddings(embeddings, corpus, index_dir, factory=factory,
                        progress=False)
      for count in threads:
        opts = {"threads": count, "top_k": args.top_k,
                "nprobe": args.nprobe, "passes": args.passes}
        runs: dict[str, list] = {}
        for _ in range(args.repeats):
          for task in ("faiss", "jaxfid", "jaxfid_trec", "together"):
            runs.setdefault(task, []).append(
                run_worker(task, index_dir, queries, opts))
        rows.append({"factory": factory, "threads": count, "runs": runs})
  print(f"\n{args.vectors:,} vectors x {args.dim}, {args.queries:,} queries, "
        f"top {args.top_k}, nprobe {args.nprobe} (IVF); best of "
        f"{args.repeats} processes x {args.passes} passes; load at end "
        f"{os.getloadavg()}\n")
  print("| index | FAISS threads | FAISS ms/query (CPU) | jaxfid ms/query "
        "(CPU) | jaxfid / FAISS, wall (CPU) | in one process, alternated: "
        "jaxfid / FAISS, wall (CPU) | jaxfid + TREC file ms/query | same "
        "rows as FAISS |")
  print("|---|---|---|---|---|---|---|---|")
  n = args.queries
  for row in rows:
    best = {task: (min(r["seconds"] for r in rs),
                   min(r["cpu_seconds"] for r in rs))
            for task, rs in row["runs"].items()}
    (fw, fc), (jw, jc) = best["faiss"], best["jaxfid"]
    together = row["runs"]["together"]
    tw = min(r["seconds"] for r in together) / min(
        r["faiss_seconds"] for r in together)
    tc = min(r["cpu_seconds"] for r in together) / min(
        r["faiss_cpu_seconds"] for r in together)
    same = min(r["same_rows"] for task in ("jaxfid", "together")
               for r in row["runs"][task])
    print(f"| {row['factory']} | {row['threads']} | {1000 * fw / n:.3f} "
          f"({1000 * fc / n:.3f}) | {1000 * jw / n:.3f} ({1000 * jc / n:.3f})"
          f" | {jw / fw:.2f} ({jc / fc:.2f}) | {tw:.2f} ({tc:.2f}) | "
          f"{1000 * best['jaxfid_trec'][0] / n:.3f} | {same}/{n} |")
  print(json.dumps(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
