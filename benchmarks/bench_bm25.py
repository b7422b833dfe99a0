"""BM25 indexing and query throughput: jaxfid vs bm25s used directly.

Two corpora:

* SQuAD v1.1 dev paragraphs (``--squad``, 2,067 Wikipedia paragraphs) with
  all 10,570 dev questions (``--squad-questions``, the official zip); answer
  recall R@1/5/20/100 (DPR matching) is reported for both systems;
* a synthetic corpus of ``--synthetic N`` passages (default 1,000,000) of
  ~100 pseudo-words drawn from a Zipfian vocabulary, with random queries.

Each measurement runs in a fresh Python process so that its peak resident
memory (``ru_maxrss``) is its own: indexing and searching are measured
separately. jaxfid's indexing time covers the whole ``jaxfid index bm25``
pipeline (parse the corpus, write the passage store, tokenise, score, save);
bm25s's covers reading the same corpus with jaxfid's reader, ``bm25s.tokenize``
(its README's recipe: English stop words, PyStemmer "english") and
``BM25(method="lucene").index``, plus ``save``. Queries run single-threaded
in both (bm25s's numpy backend; numba is not installed here), top 100.

Usage:
  python benchmarks/bench_bm25.py [--synthetic 200000] [--workdir DIR]

Prints the hardware, one line per measurement, and a final JSON line with
all results.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(ROOT, "..", "shared", "data", "squad_v1.1")
TOP_K = 100
RECALL_KS = (1, 5, 20, 100)


# --- data preparation -------------------------------------------------------
def squad_questions(zip_path: str, out_path: str) -> str:
  """Writes the SQuAD dev questions as QA JSONL (id, question, answers)."""
  with zipfile.ZipFile(zip_path) as z:
    data = json.load(z.open("dev-v1.1.json"))["data"]
  with open(out_path, "w", encoding="utf-8") as f:
    for article in data:
      for paragraph in article["paragraphs"]:
        for qa in paragraph["qas"]:
          answers = list(dict.fromkeys(a["text"] for a in qa["answers"]))
          f.write(json.dumps({"id": qa["id"], "question": qa["question"],
                              "answers": answers}) + "\n")
  return out_path


def synthetic_corpus(n: int, corpus_path: str, queries_path: str,
                     num_queries: int = 1000, seed: int = 0) -> None:
  """N passages of ~100 Zipf-distributed pseudo-words, and random queries."""
  rng = np.random.default_rng(seed)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
  vocab_size = 200_000
  lengths = rng.integers(3, 11, size=vocab_size)
  vocab = np.array(["".join(rng.choice(letters, size=k)) for k in lengths])
  weights = 1.0 / np.arange(1, vocab_size + 1) ** 1.05
  weights /= weights.sum()
  with open(corpus_path, "w", encoding="utf-8") as f:
    f.write("id\ttext\ttitle\n")
    chunk = 10_000
    for start in range(0, n, chunk):
      count = min(chunk, n - start)
      words = vocab[rng.choice(vocab_size, size=(count, 100), p=weights)]
      titles = vocab[rng.choice(vocab_size, size=(count, 2), p=weights)]
      for i in range(count):
        f.write(f"{start + i}\t{' '.join(words[i])}\t{' '.join(titles[i])}\n")
  with open(queries_path, "w", encoding="utf-8") as f:
    for q in range(num_queries):
      size = int(rng.integers(3, 9))
      words = vocab[rng.choice(vocab_size, size=size, p=weights)]
      f.write(f"q{q}\t{' '.join(words)}\n")


# --- workers (run in their own process) -------------------------------------
def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _recall(queries, ranked_rows, text_of) -> dict:
  """Answer recall of ranked rows; ``text_of(row)`` gives passage text."""
  from jaxfid.retrieval.text.answer_match import AnswerMatcher
  from jaxfid.evaluation.retrieval import answer_recall
  hits = []
  for query, rows in zip(queries, ranked_rows):
    matcher = AnswerMatcher(query.answers or ())
    hits.append([matcher(text_of(row)) for row in rows])
  return answer_recall(hits, RECALL_KS)


def worker(system: str, phase: str, corpus: str, queries_path: str,
           index_dir: str) -> dict:
  sys.path.insert(0, ROOT)
  from jaxfid.retrieval.store.corpus import iter_passages, passage_contents
  from jaxfid.retrieval.store.queries import read_queries
  out: dict = {"system": system, "phase": phase}
  if system == "jaxfid" and phase == "index":
    from jaxfid.retrieval.bm25.index import build_bm25_index
    start = time.perf_counter()
    meta = build_bm25_index(corpus, index_dir, progress=False)
    out["seconds"] = time.perf_counter() - start
    out["passages"] = meta["num_passages"]
  elif system == "jaxfid" and phase == "search":
    from jaxfid.retrieval.search import open_index
    queries = read_queries(queries_path)
    start = time.perf_counter()
    searcher = open_index(index_dir)
    out["load_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    rows = searcher.search([q.text for q in queries], TOP_K)
    out["seconds"] = time.perf_counter() - start
    out["queries"] = len(queries)
    out["peak_rss_mb"] = _peak_rss_mb()  # before the recall bookkeeping
    if queries and queries[0].answers:
      out.update(_recall(queries, [[r for r, _ in hits] for hits in rows],
                         searcher.store.text))
  elif system == "bm25s" and phase == "index":
    import bm25s
    import Stemmer
    start = time.perf_counter()
    texts = [passage_contents(p) for p in iter_passages(corpus)]
    tokens = bm25s.tokenize(texts, stopwords="en",
                            stemmer=Stemmer.Stemmer("english"),
                            show_progress=False)
    model = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    model.index(tokens, show_progress=False)
    model.save(index_dir, show_progress=False)
    out["seconds"] = time.perf_counter() - start
    out["passages"] = len(texts)
  elif system == "bm25s" and phase == "search":
    import bm25s
    import Stemmer
    queries = read_queries(queries_path)
    start = time.perf_counter()
    model = bm25s.BM25.load(index_dir)
    out["load_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    tokens = bm25s.tokenize([q.text for q in queries], stopwords="en",
                            stemmer=Stemmer.Stemmer("english"),
                            show_progress=False)
    k = min(TOP_K, model.scores["num_docs"])
    docs, _ = model.retrieve(tokens, k=k, show_progress=False)
    out["seconds"] = time.perf_counter() - start
    out["queries"] = len(queries)
    out["peak_rss_mb"] = _peak_rss_mb()  # before the recall bookkeeping
    if queries and queries[0].answers:
      texts = [p.text for p in iter_passages(corpus)]
      out.update(_recall(queries, docs.tolist(), texts.__getitem__))
  else:
    raise ValueError(f"unknown worker {system}/{phase}")
  out.setdefault("peak_rss_mb", _peak_rss_mb())
  return out


def run_worker(system, phase, corpus, queries, index_dir) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", system, phase,
         corpus, queries, index_dir]
  env = dict(os.environ, DISABLE_TQDM="1", PYTHONPATH=ROOT)
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                        check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"worker {system}/{phase} failed:\n{proc.stderr}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def bench(name: str, corpus: str, queries: str, workdir: str) -> dict:
  results = {}
  for system in ("jaxfid", "bm25s"):
    index_dir = os.path.join(workdir, f"{name}_{system}_index")
    index = run_worker(system, "index", corpus, queries, index_dir)
    search = run_worker(system, "search", corpus, queries, index_dir)
    row = {
        "index_seconds": round(index["seconds"], 3),
        "passages_per_second": round(index["passages"] / index["seconds"], 1),
        "index_peak_rss_mb": round(index["peak_rss_mb"], 1),
        "search_seconds": round(search["seconds"], 3),
        "queries_per_second": round(search["queries"] / search["seconds"], 1),
        "load_seconds": round(search["load_seconds"], 3),
        "search_peak_rss_mb": round(search["peak_rss_mb"], 1),
        "passages": index["passages"], "queries": search["queries"],
    }
    row.update({k: round(v, 4) for k, v in search.items()
                if k.startswith("R@")})
    results[system] = row
    print(f"{name} {system}: {json.dumps(row)}", flush=True)
  return results


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--squad", default=os.path.join(
      SHARED, "dev_paragraphs.jsonl"), help="SQuAD paragraphs JSONL")
  parser.add_argument("--squad-questions", default=os.path.join(
      SHARED, "dev-v1.1.json.zip"), help="official SQuAD v1.1 dev zip")
  parser.add_argument("--synthetic", type=int, default=1_000_000,
                      help="synthetic corpus size (0 to skip)")
  parser.add_argument("--workdir", default=None,
                      help="where corpora and indexes go (default: a "
                      "temporary directory, removed afterwards)")
  parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    print(json.dumps(worker(*args.worker)))
    return 0
  print(f"platform: {platform.platform()}; python {platform.python_version()}"
        f"; cpus: {os.cpu_count()}; processor: {platform.processor() or '?'}",
        flush=True)
  with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
    results = {"hardware": {"platform": platform.platform(),
                            "cpu_count": os.cpu_count()}}
    if os.path.exists(args.squad) and os.path.exists(args.squad_questions):
      questions = squad_questions(args.squad_questions,
                                  os.path.join(workdir, "squad_qa.jsonl"))
      results["squad"] = bench("squad", args.squad, questions, workdir)
    else:
      print(f"SQuAD files not found ({args.squad}); skipped", flush=True)
    if args.synthetic > 0:
      corpus = os.path.join(workdir, "synthetic.tsv")
      queries = os.path.join(workdir, "synthetic_queries.tsv")
      start = time.perf_counter()
      synthetic_corpus(args.synthetic, corpus, queries)
      print(f"synthetic corpus of {args.synthetic} passages generated in "
            f"{time.perf_counter() - start:.1f}s", flush=True)
      results[f"synthetic_{args.synthetic}"] = bench(
          f"synthetic_{args.synthetic}", corpus, queries, workdir)
  print(json.dumps(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
