"""The corpus of ``bm25_scale.py``: real English sentences, cut as DPR cuts
Wikipedia, and real NQ questions.

Every English sentence of at least five words in the data under
``../shared/data`` -- the SQuAD v1.1 dev paragraphs (Wikipedia, cut into
sentences after ``. ! ?``), QNLI's Wikipedia sentences, RTE, MRPC, STS-B,
CoLA and the subj/mr/cr reviews of the LM-BFF test sets -- deduplicated
(about 21k sentences). Passages are drawn from them uniformly at random
(seeded) and cut into exactly 100 words; queries are NQ-open dev questions.
"""
from __future__ import annotations

import csv
import json
import os
import re

import numpy as np

PASSAGE_WORDS = 100


#-----------------------------------------------------------
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
