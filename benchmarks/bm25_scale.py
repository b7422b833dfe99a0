"""BM25 at scale: jaxfid vs bm25s on real-sentence corpora, side by side.

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

Per corpus size (``--sizes``, default 100k and 1M passages):

* **build**: ``jaxfid index bm25 --threads 1`` (and ``--threads N``) against
  bm25s (its README recipe: ``bm25s.tokenize`` with English stop words and
  PyStemmer, ``BM25(method="lucene")``, ``index``, ``save``; the corpus read
  with the same reader), each in its own process: wall time, CPU time
  (user + system, children included) and peak resident memory;
* **search**, one thread each: ``BM25Searcher.search`` (the ``jaxfid
  retrieve`` path: analysis, pruned top-k, tie order) against bm25s
  ``tokenize`` + ``retrieve(n_threads=1)`` (numpy backend), timed after the
  index is open, the two alternated ``--repeats`` times in the same minutes
  (best of each kept); then jaxfid ``search_all`` on 1 and all threads;
* **exactness**: jaxfid's rankings and scores against its exhaustive scorer
  (``BM25Index.match`` + ``top_k``, every matching document scored) on the
  same queries.

``--sizes 100000,1000000,3000000 --bm25s-max 1000000`` also builds 3M
passages with jaxfid only, and fits time, memory and disk against size to
project a 21M-passage (DPR Wikipedia) build.

Usage:
  python benchmarks/bm25_scale.py [--sizes 100000,1000000] [--workdir DIR]

Prints the hardware and load, one line per measurement, Markdown tables,
and a final JSON line. The machine's load is printed with each phase: CPU
time is the steadier measure on a shared machine.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(ROOT, "..", "shared", "data")
TOP_K = 100
PASSAGE_WORDS = 100
PROJECT_TO = 21_015_324  # DPR's psgs_w100.tsv


# --- the corpus --------------------------------------------------------------
def _tsv_column(path: str, columns: list[int], header: bool = True):
  with open(path, encoding="utf-8-sig") as f:
    rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    if header:
      next(rows)
    for row in rows:
      for c in columns:
        if c < len(row):
          yield "", row[c]


def _csv_text(path: str):
  with open(path, encoding="utf-8") as f:
    for row in csv.reader(f):
      yield "", row[1]


def _squad_sentences(path: str):
  split = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
  with open(path, encoding="utf-8") as f:
    for line in f:
      record = json.loads(line)
      for sentence in split.split(record["text"]):
        yield record["title"], sentence


def sentence_pool(shared: str) -> list[tuple[str, list[str]]]:
  """(title, words) of every distinct sentence of >= 5 words."""
  k_shot = os.path.join(shared, "lmbff_k_shot")
  csv.field_size_limit(1 << 30)
  sources = [
      _squad_sentences(os.path.join(shared, "squad_v1.1",
                                    "dev_paragraphs.jsonl")),
      _tsv_column(os.path.join(k_shot, "QNLI", "16-13", "test.tsv"), [2]),
      _tsv_column(os.path.join(k_shot, "RTE", "16-13", "test.tsv"), [1, 2]),
      _tsv_column(os.path.join(k_shot, "MRPC", "16-13", "test.tsv"), [3, 4]),
      _tsv_column(os.path.join(k_shot, "STS-B", "16-13", "test.tsv"), [7, 8]),
      _tsv_column(os.path.join(k_shot, "CoLA", "16-13", "test.tsv"), [3],
                  header=False),
      _csv_text(os.path.join(k_shot, "subj", "16-13", "test.csv")),
      _csv_text(os.path.join(k_shot, "mr", "16-13", "test.csv")),
      _csv_text(os.path.join(k_shot, "cr", "16-13", "test.csv")),
  ]
  seen: dict[str, str] = {}
  for source in sources:
    for title, sentence in source:
      sentence = " ".join(sentence.split())
      if len(sentence.split()) >= 5 and sentence not in seen:
        seen[sentence] = title
  return [(title, sentence.split()) for sentence, title in seen.items()]


def write_corpus(pool, n: int, path: str, seed: int = 0) -> None:
  """``n`` passages of 100 words from sentences drawn at random."""
  rng = np.random.default_rng(seed)
  with open(path, "w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f, delimiter="\t", lineterminator="\n")
    writer.writerow(["id", "text", "title"])
    words: list[str] = []
    title, written = "", 0
    while written < n:
      for i in rng.integers(0, len(pool), 100_000).tolist():
        sentence_title, sentence = pool[i]
        if not words:
          title = sentence_title
        words.extend(sentence)
        if len(words) >= PASSAGE_WORDS:
          writer.writerow([written, " ".join(words[:PASSAGE_WORDS]), title])
          written, words = written + 1, []
          if written == n:
            break


def write_queries(shared: str, n: int, path: str) -> None:
  """The first ``n`` NQ-open dev questions as QA JSONL."""
  source = os.path.join(shared, "nq_open", "NQ-open.dev.jsonl")
  with open(source, encoding="utf-8") as f, open(path, "w") as out:
    for i, line in zip(range(n), f):
      record = json.loads(line)
      out.write(json.dumps({"id": str(i), "question": record["question"],
                            "answers": record["answer"]}) + "\n")


# --- workers (each in its own process) --------------------------------------
def _cpu() -> float:
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_mb() -> float:
  own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
  return max(own, kids) / 1024


def _queries(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line)["question"] for line in f]


def worker(task: str, corpus: str, queries: str, index: str,
           option: str) -> dict:
  sys.path.insert(0, ROOT)
  out: dict = {"task": task}
  if task == "jaxfid_build":
    from jaxfid.retrieval.bm25.index import build_bm25_index
    start, cpu = time.perf_counter(), _cpu()
    meta = build_bm25_index(corpus, index, progress=False,
                            threads=int(option))
    out["passages"] = meta["num_passages"]
  elif task == "bm25s_build":
    import bm25s
    import Stemmer
    from jaxfid.retrieval.store.corpus import iter_passages, passage_contents
    start, cpu = time.perf_counter(), _cpu()
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
    texts = _queries(queries)
    searcher = BM25Searcher(index, read_meta(index))
    rank = searcher.store.id_rank
    searcher.search(texts[:20], TOP_K)  # page in the analyzer's tables
    start, cpu = time.perf_counter(), _cpu()
    found = [searcher.index.search(t, TOP_K, rank) for t in texts]
    out["queries"] = len(texts)
    out["results"] = sum(map(len, found))
  elif task == "bm25s_search":
    import bm25s
    import Stemmer
    texts = _queries(queries)
    model = bm25s.BM25.load(index)
    stemmer = Stemmer.Stemmer("english")
    start, cpu = time.perf_counter(), _cpu()
    tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer,
                            show_progress=False)
    model.retrieve(tokens, k=TOP_K, show_progress=False, n_threads=1)
    out["queries"] = len(texts)
  elif task == "jaxfid_threads":
    from jaxfid.retrieval.bm25 import index as bm25
    from jaxfid.retrieval.index_dir import read_meta
    from jaxfid.retrieval.search import search_all
    texts = _queries(queries) * 4
    searcher = bm25.BM25Searcher(index, read_meta(index))
    bm25.MIN_PARALLEL_WORK = 0  # workers whatever the size
    start, cpu = time.perf_counter(), _cpu()
    search_all(searcher, texts, TOP_K, progress=False, threads=int(option))
    out["queries"] = len(texts)
    out["threads"] = int(option)
  elif task == "exactness":
    from jaxfid.retrieval.bm25.index import BM25Searcher
    from jaxfid.retrieval.bm25.scoring import top_k
    from jaxfid.retrieval.index_dir import read_meta
    texts = _queries(queries)
    searcher = BM25Searcher(index, read_meta(index))
    rank = searcher.store.id_rank
    start, cpu = time.perf_counter(), _cpu()
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
  out["seconds"] = time.perf_counter() - start
  out["cpu_seconds"] = _cpu() - cpu
  out["peak_rss_mb"] = _peak_mb()
  return out


def run_worker(task: str, corpus: str, queries: str, index: str,
               option: str = "") -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", task, corpus,
         queries, index, option]
  env = dict(os.environ, PYTHONPATH=ROOT)
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                        check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"worker {task} failed:\n{proc.stderr}")
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  result["load"] = os.getloadavg()[0]
  print(f"  {json.dumps(result)}", flush=True)
  return result


def _disk_mb(path: str) -> float:
  total = 0
  for dirpath, _, files in os.walk(path):
    total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
  return total / 2**20


# --- the benchmark -----------------------------------------------------------
def hardware() -> dict:
  model = "?"
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f
                   if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  return {"platform": platform.platform(), "python": platform.python_version(),
          "cpu": model, "cpus": os.cpu_count(),
          "memory_gb": round(memory, 1), "numpy": np.__version__}


def bench_size(n: int, pool, workdir: str, queries: str, args) -> dict:
  corpus = os.path.join(workdir, f"corpus_{n}.tsv")
  start = time.perf_counter()
  write_corpus(pool, n, corpus)
  print(f"{n} passages: corpus written in {time.perf_counter() - start:.0f}"
        f" s ({os.path.getsize(corpus) / 2**20:.0f} MB)", flush=True)
  row: dict = {"passages": n}
  jx = os.path.join(workdir, f"jaxfid_{n}")
  row["jaxfid_build"] = run_worker("jaxfid_build", corpus, queries, jx, "1")
  row["jaxfid_disk_mb"] = _disk_mb(jx)
  if args.threads > 1:
    other = jx + "_threads"
    row["jaxfid_build_threads"] = run_worker("jaxfid_build", corpus, queries,
                                             other, str(args.threads))
    shutil.rmtree(other)
  with_bm25s = n <= args.bm25s_max
  bx = os.path.join(workdir, f"bm25s_{n}")
  if with_bm25s:
    row["bm25s_build"] = run_worker("bm25s_build", corpus, queries, bx)
    row["bm25s_disk_mb"] = _disk_mb(bx)
  os.unlink(corpus)
  if n <= args.search_max:
    for _ in range(args.repeats):  # alternated, so both see the same load
      row.setdefault("jaxfid_search", []).append(
          run_worker("jaxfid_search", "-", queries, jx))
      if with_bm25s:
        row.setdefault("bm25s_search", []).append(
            run_worker("bm25s_search", "-", queries, bx))
    row["exactness"] = run_worker("exactness", "-", queries, jx)
    if args.threads > 1:
      for threads in (1, args.threads):
        row[f"jaxfid_search_{threads}_threads"] = run_worker(
            "jaxfid_threads", "-", queries, jx, str(threads))
  shutil.rmtree(jx)
  if with_bm25s:
    shutil.rmtree(bx)
  return row


def _best(runs: list[dict], key: str) -> float:
  return min(r[key] for r in runs)


def tables(rows: list[dict], hw: dict) -> str:
  out = [f"Hardware: {hw['cpu']}, {hw['cpus']} CPUs, {hw['memory_gb']} GB; "
         f"{hw['platform']}; Python {hw['python']}, numpy {hw['numpy']}", "",
         "| passages | system | build wall | build CPU | peak memory (build) "
         "| index on disk | search, 1 thread (queries/s wall / CPU) |",
         "|---|---|---|---|---|---|---|"]
  for row in rows:
    n = f"{row['passages']:,}"
    for system in ("jaxfid", "bm25s"):
      build = row.get(f"{system}_build")
      if build is None:
        continue
      search = row.get(f"{system}_search")
      qps = "-"
      if search:
        q = search[0]["queries"]
        qps = (f"{q / _best(search, 'seconds'):.0f} / "
               f"{q / _best(search, 'cpu_seconds'):.0f}")
      out.append(f"| {n} | {system} | {build['seconds']:.0f} s | "
                 f"{build['cpu_seconds']:.0f} s | "
                 f"{build['peak_rss_mb'] / 1024:.2f} GB | "
                 f"{row[f'{system}_disk_mb'] / 1024:.2f} GB | {qps} |")
  out += ["", "| passages | jaxfid build, N threads (wall) | retrieval, 1 "
          "thread | retrieval, N threads | identical to exhaustive | max "
          "score difference |", "|---|---|---|---|---|---|"]
  for row in rows:
    threads = row.get("jaxfid_build_threads")
    cells = [f"{row['passages']:,}",
             f"{threads['seconds']:.0f} s" if threads else "-"]
    one = next((v for k, v in row.items() if k.startswith("jaxfid_search_1_")),
               None)
    many = next((v for k, v in row.items() if k.startswith("jaxfid_search_")
                 and k.endswith("_threads") and v is not one), None)
    for run in (one, many):
      cells.append(f"{run['queries'] / run['seconds']:.0f} queries/s"
                   if run else "-")
    exact = row.get("exactness")
    cells += ([f"{exact['identical']}/{exact['queries']}",
               f"{exact['max_score_diff']:.1g}"] if exact else ["-", "-"])
    out.append("| " + " | ".join(cells) + " |")
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
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="100000,1000000",
                      help="corpus sizes, comma-separated")
  parser.add_argument("--queries", type=int, default=1000,
                      help="NQ-open dev questions (default 1000)")
  parser.add_argument("--repeats", type=int, default=2,
                      help="alternated search runs per system (best kept)")
  parser.add_argument("--threads", type=int, default=os.cpu_count(),
                      help="threads for the parallel build and retrieval")
  parser.add_argument("--bm25s-max", type=int, default=1_000_000,
                      help="largest corpus bm25s is run on (memory)")
  parser.add_argument("--search-max", type=int, default=1_000_000,
                      help="largest corpus searched")
  parser.add_argument("--shared", default=SHARED, help="the shared data")
  parser.add_argument("--workdir", default=None,
                      help="where corpora and indexes go (default: a "
                      "temporary directory; everything is removed)")
  parser.add_argument("--json-out", default=None, help="also write the JSON")
  parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    print(json.dumps(worker(*args.worker)))
    return 0
  hw = hardware()
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
  result = {"hardware": hw, "load_at_end": os.getloadavg(), "rows": rows}
  if len(rows) >= 2:
    result["projection_21M"] = projection(rows)
  print(tables(rows, hw))
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
