"""Regenerates the Lucene reference fixtures in this directory.

Not part of the test suite (it needs Java and Lucene 8: on Debian,
``apt-get install liblucene8-java``). Run from the repository root:

  python tests/data/retrieval/lucene_reference/make_fixtures.py

Writes:
  analysis.tsv        input<TAB>Lucene EnglishAnalyzer terms (space-separated)
  squad_sample.trec   Lucene BM25 (k1=0.9, b=0.4) top 5 for the SQuAD sample
  edge_corpus.tsv     small corpus of edge cases (id<TAB>contents)
  edge_queries.tsv    queries for it (qid<TAB>text)
  edge.trec           Lucene BM25 (k1=1.2, b=0.75) top 10 on the edge corpus
"""
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "squad_sample")
JARS = "/usr/share/java/*"

TRICKY = [
    "The quick brown fox's U.S.A. e-mail 3.14 1,000 running isn't us ms",
    "foo:bar 漢字かなカタカナabc John’s book, JOHN'S BOOK, o'clock",
    "rock'n'roll, 'tis the season's end. a.b.c. 1.2.3 1,2,3 1;2 a;b a,b",
    "a:b 1:2 a.1 1.a a1.2b x_y _x y_ ___ 12_34 www.google.com foo@bar.com",
    "http://example.org/path?x=1&y=2 C++ C# .NET node.js",
    "ΟΔΟΣ ΣΟΦΙΑ İstanbul Straße ǅemal naïve café Ωmega",
    "Ελληνικά Русский текст, العربية עברית \"quoted\" (paren) [brackets]",
    "ภาษาไทยabc हिन्दी 한국어abc 日本語のテキスト カタカナ・テスト ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３",
    "co\u00adoperate zero\u200bwidth combining e\u0301 x\u0301y 2nd 3rd 1st",
    "Fathers' rights; the 1990's; '90s; 'quote'; rock 'n' roll; in-law's",
    "technology assembly feasibly apology generalizations abilities sky",
    "x" * 300 + " " + "ab" * 140 + "'s",
]

EDGE_DOCS = [
    ("d01", "the and of to in is it"),  # only stop words: an empty document
    ("d02", "apple"),
    ("d03", "apple apple apple banana"),
    ("d04", "banana cherry"),
    ("d05", "banana cherry"),  # same text as d04: a tie broken by id
    ("d06", " ".join(["apple"] * 40 + ["filler"] * 500)),  # long document
    ("d07", " ".join(f"word{i}" for i in range(30)) + " cherry"),
    ("d08", "Café naïve Straße ΣΟΦΙΑ apple’s"),
    ("d09", "U.S.A. 3.14 e-mail foo:bar running runs ran"),
    ("d10", "technology assembly apology cherry cherry cherry"),
]
EDGE_QUERIES = [
    ("q1", "apple"),
    ("q2", "apple banana"),
    ("q3", "cherry cherry cherry banana"),  # a term repeated 3 times
    ("q4", "banana banana cherry"),  # repeated twice
    ("q5", "unknownword apple"),
    ("q6", "the of and"),  # only stop words: no result
    ("q7", "cafe café straße sofia σοφια u.s.a run"),
    ("q8", "technologies assemblies"),
]


def java(*args, stdin=None):
  with tempfile.TemporaryDirectory() as build:
    subprocess.run(["javac", "-d", build, "-cp", JARS,
                    os.path.join(HERE, "LuceneRef.java")], check=True)
    return subprocess.run(["java", "-cp", f"{JARS}:{build}", "LuceneRef",
                           *args], input=stdin, capture_output=True,
                          text=True, check=True).stdout


def clean(field):
  """One TSV field: Java's readLine also breaks lines at a bare CR."""
  return " ".join(field.replace("\r", " ").replace("\t", " ").split("\n"))


def write_tsv(path, rows):
  with open(path, "w", encoding="utf-8", newline="\n") as f:
    for row in rows:
      f.write("\t".join(map(clean, row)) + "\n")


def main():
  words = set()
  with open(os.path.join(SAMPLE, "paragraphs.jsonl"), encoding="utf-8") as f:
    for line in f:
      p = json.loads(line)
      words.update((p["title"] + " " + p["text"]).split())
  words = sorted(words)
  chosen = [w for w in words if "bl" in w.lower() or "log" in w.lower()]
  chosen += words[::7]
  inputs = TRICKY + sorted(set(chosen))
  out = java("analyze", stdin="\n".join(inputs) + "\n").split("\n")
  write_tsv(os.path.join(HERE, "analysis.tsv"), zip(inputs, out))

  with tempfile.TemporaryDirectory() as tmp:
    corpus, queries = os.path.join(tmp, "c.tsv"), os.path.join(tmp, "q.tsv")
    with open(os.path.join(SAMPLE, "paragraphs.jsonl"), encoding="utf-8") as f:
      docs = [json.loads(line) for line in f]
    write_tsv(corpus, [(d["_id"], d["title"] + " " + d["text"]) for d in docs])
    with open(os.path.join(SAMPLE, "questions.jsonl"), encoding="utf-8") as f:
      qs = [json.loads(line) for line in f]
    write_tsv(queries, [(q["id"], q["question"]) for q in qs])
    with open(os.path.join(HERE, "squad_sample.trec"), "w") as f:
      f.write(java("bm25", corpus, queries, "5", "0.9", "0.4"))

  write_tsv(os.path.join(HERE, "edge_corpus.tsv"), EDGE_DOCS)
  write_tsv(os.path.join(HERE, "edge_queries.tsv"), EDGE_QUERIES)
  with open(os.path.join(HERE, "edge.trec"), "w") as f:
    f.write(java("bm25", os.path.join(HERE, "edge_corpus.tsv"),
                 os.path.join(HERE, "edge_queries.tsv"), "10", "1.2", "0.75"))


if __name__ == "__main__":
  main()
