"""Real-world file formats through the readers and the CLI.

DPR's QA TSV (``question<TAB>['answer', ...]``), pyserini/FlashRAG JSONL
(``contents`` = ``"Title"\\ntext``, ``golden_answers``), JSON lines and
sentences whatever the suffix, and legacy encodings (``--encoding``); each
on a small file written here. Also ``--threads`` and ``--progress``.
"""
import json
import os
import subprocess
import sys

import pytest

from jaxfid.cli import main
from jaxfid.core.errors import InputError
from jaxfid.reader.examples import read_fid_examples
from jaxfid.retrieval.store.corpus import Passage, detect_format, read_corpus
from jaxfid.retrieval.store.queries import Query, read_queries

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QA_TSV = ("who got the first nobel prize in physics\t['Wilhelm Conrad "
          "Röntgen']\n"
          "\n"
          '"the ""cat"" in the hat author"\t["Dr. Seuss\'s", \'Theodor '
          "Geisel']\n"
          "where is the eiffel tower\t[]\n")


def _passages(path, **kwargs):
  return [p for _, p in read_corpus(path, **kwargs)]


def _stdout_json(capsys):
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_qa_tsv_as_queries_and_fid_questions(tmp_path):
  path = tmp_path / "nq-test.qa.csv"
  path.write_text(QA_TSV, encoding="utf-8")
  expected = [
      Query("0", "who got the first nobel prize in physics",
            ("Wilhelm Conrad Röntgen",)),
      Query("1", 'the "cat" in the hat author',
            ("Dr. Seuss's", "Theodor Geisel")),
      Query("2", "where is the eiffel tower", ())]
  assert read_queries(path) == expected
  examples = read_fid_examples(path)
  assert [(e.id, e.question, e.answers, e.ctxs) for e in examples] == [
      (q.id, q.text, q.answers, ()) for q in expected]
  with pytest.raises(InputError, match="no answers"):
    read_fid_examples(path, require_answers=True)
  # a later line that is not question<TAB>[answers] names the line
  path.write_text(QA_TSV + "a question without answers\n")
  with pytest.raises(InputError, match=r"nq-test.qa.csv:5: expected "):
    read_queries(path)
  with pytest.raises(InputError, match=r"nq-test.qa.csv:5: expected "):
    read_fid_examples(path)
  # id<TAB>text stays a plain query file
  plain = tmp_path / "q.tsv"
  plain.write_text("q1\twhat is [x]\n")
  assert read_queries(plain) == [Query("q1", "what is [x]")]


def test_flashrag_and_pyserini_jsonl(tmp_path):
  corpus = tmp_path / "wiki.jsonl"
  corpus.write_text(
      json.dumps({"id": "0", "contents": '"Aaron"\nAaron is a prophet.'})
      + "\n" + json.dumps({"id": "1", "contents": "no title here"}) + "\n"
      + json.dumps({"id": "2", "contents": '"Quoted" start\nsecond line'})
      + "\n" + json.dumps({"id": "3", "title": "T", "contents": '"x"\ny'})
      + "\n")
  assert _passages(corpus) == [
      Passage("0", "Aaron", "Aaron is a prophet."),
      Passage("1", "", "no title here"),
      Passage("2", "", '"Quoted" start\nsecond line'),
      Passage("3", "T", '"x"\ny')]
  questions = tmp_path / "test.jsonl"
  questions.write_text(json.dumps({"id": "test_0", "question": "who?",
                                   "golden_answers": ["Aaron", "Moses"]})
                       + "\n")
  assert read_queries(questions) == [Query("test_0", "who?",
                                           ("Aaron", "Moses"))]
  assert read_fid_examples(questions)[0].answers == ("Aaron", "Moses")


def test_formats_recognised_by_content(tmp_path):
  jsonl = tmp_path / "corpus.txt"
  jsonl.write_text('{"id": "a", "title": "T", "text": "x"}\n')
  assert detect_format(jsonl) == "jsonl"
  assert _passages(jsonl) == [Passage("a", "T", "x")]
  no_ids = tmp_path / "sentences_jsonl.txt"
  no_ids.write_text('{"text": "first"}\n{"text": "second", "title": "S"}\n')
  assert _passages(no_ids) == [Passage("0", "", "first"),
                               Passage("1", "S", "second")]
  tsv = tmp_path / "psgs.txt"
  tsv.write_text("id\ttext\ttitle\n7\thello\tH\n")
  assert detect_format(tsv) == "tsv"
  assert _passages(tsv) == [Passage("7", "H", "hello")]
  sentences = tmp_path / "sentences.txt"
  sentences.write_text("{not json} but a sentence\n\nid and text\tx\n")
  assert detect_format(sentences) == "sentences"
  assert _passages(sentences) == [
      Passage("0", "", "{not json} but a sentence"),
      Passage("1", "", "id and text\tx")]
  queries = tmp_path / "queries.txt"
  queries.write_text('{"_id": "q", "text": "what"}\n')
  assert read_queries(queries) == [Query("q", "what")]


def test_legacy_encoding(tmp_path):
  path = tmp_path / "legacy.txt"
  path.write_bytes("café – naïve\nthe second one\n".encode("cp1252"))
  assert _passages(path, encoding="cp1252") == [
      Passage("0", "", "café – naïve"), Passage("1", "", "the second one")]
  with pytest.raises(InputError, match=r"legacy.txt:1: not valid UTF-8"):
    _passages(path)
  with pytest.raises(InputError, match="unknown encoding 'klingon'"):
    _passages(path, encoding="klingon")
  with pytest.raises(InputError, match="not ASCII-compatible"):
    _passages(path, encoding="utf-16")
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine\n\x81 is not cp1252\n")
  with pytest.raises(InputError, match=r"bad.txt:2: not valid cp1252"):
    _passages(bad, encoding="cp1252")


def test_cli_sentences_qa_tsv_and_progress(tmp_path, capsys):
  corpus = tmp_path / "facts.txt"  # cp1252 sentences, one per line
  corpus.write_bytes(
      "Wilhelm Conrad Röntgen won the first Nobel Prize in Physics.\n"
      "Theodor Geisel wrote as Dr. Seuss – the cat in the hat.\n"
      "The Eiffel Tower stands in Paris.\n".encode("cp1252"))
  index = tmp_path / "index"
  assert main(["index", "bm25", "--corpus", str(corpus), "--output",
               str(index), "--threads", "1"]) == 2
  assert "not valid UTF-8" in capsys.readouterr().err
  assert main(["index", "bm25", "--corpus", str(corpus), "--output",
               str(index), "--encoding", "cp1252", "--progress"]) == 0
  out = capsys.readouterr()
  assert json.loads(out.out)["num_passages"] == 3
  assert "passages/s" in out.err
  questions = tmp_path / "nq-test.qa.csv"
  questions.write_text(QA_TSV, encoding="utf-8")
  run = tmp_path / "run.json"
  assert main(["retrieve", "--index", str(index), "--queries",
               str(questions), "--top-k", "2", "--output", str(run),
               "--progress", "--threads", "2"]) == 0
  out = capsys.readouterr()
  assert "queries/s" in out.err
  examples = json.loads(run.read_text())
  assert [e["id"] for e in examples] == ["0", "1", "2"]
  assert examples[0]["answers"] == ["Wilhelm Conrad Röntgen"]
  assert examples[0]["ctxs"][0]["id"] == "0"
  assert examples[0]["ctxs"][0]["has_answer"] is True
  assert examples[2]["ctxs"][0]["text"] == "The Eiffel Tower stands in Paris."
  assert main(["eval-retrieval", "--run", str(run), "--data", str(questions),
               "--k", "1,2", "--progress"]) == 0
  out = capsys.readouterr()
  metrics = json.loads(out.out)
  assert metrics["num_queries"] == 3
  assert metrics["R@1"] == pytest.approx(2 / 3)  # the last has no answers
  assert "queries/s" in out.err
  trec = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(index), "--queries",
               str(questions), "--top-k", "2", "--output", str(trec)]) == 0
  capsys.readouterr()
  assert main(["eval-retrieval", "--run", str(trec), "--data",
               str(questions), "--index", str(index), "--k", "1"]) == 0
  assert _stdout_json(capsys)["R@1"] == pytest.approx(2 / 3)


def test_cli_flashrag_corpus_named_txt(tmp_path, capsys):
  corpus = tmp_path / "wiki18.txt"  # JSON lines, whatever the suffix
  corpus.write_text(
      json.dumps({"id": "0", "contents": '"Aaron"\nAaron was a prophet.'})
      + "\n" + json.dumps({"id": "1", "contents": '"Moses"\nMoses led.'})
      + "\n")
  index = tmp_path / "index"
  assert main(["index", "bm25", "--corpus", str(corpus), "--output",
               str(index)]) == 0
  capsys.readouterr()
  questions = tmp_path / "test.jsonl"
  questions.write_text(json.dumps({"id": "test_0", "question": "who was "
                                   "aaron", "golden_answers": ["prophet"]})
                       + "\n")
  run = tmp_path / "run.jsonl"
  assert main(["retrieve", "--index", str(index), "--queries",
               str(questions), "--top-k", "1", "--output", str(run)]) == 0
  capsys.readouterr()
  example = json.loads(run.read_text())
  assert example["answers"] == ["prophet"]
  assert example["ctxs"][0]["title"] == "Aaron"
  assert example["ctxs"][0]["text"] == "Aaron was a prophet."
  assert main(["eval-retrieval", "--run", str(run), "--data",
               str(questions), "--k", "1"]) == 0
  assert _stdout_json(capsys)["R@1"] == 1.0


_THREADS_SCRIPT = r"""
import multiprocessing
import os
import sys
import numpy as np
from jaxfid.retrieval.bm25 import index as bm25
from jaxfid.retrieval.search import open_index, search_all

pools = []
get_context = multiprocessing.get_context
multiprocessing.get_context = lambda *a: pools.append(a) or get_context(*a)
work = sys.argv[1]
rng = np.random.default_rng(0)
words = [f"w{i}z" for i in range(500)]
p = 1.0 / np.arange(1, 501)
p /= p.sum()
with open(f"{work}/corpus.tsv", "w") as f:
  f.write("id\ttext\ttitle\n")
  for i in range(9000):  # 5 tokenising batches: enough for 2 workers
    f.write(f"d{i}\t{' '.join(rng.choice(words, 30, p=p))}\t\n")
queries = [" ".join(rng.choice(words, 4, p=p)) for _ in range(1100)]
for threads in (1, 2):
  bm25.build_bm25_index(f"{work}/corpus.tsv", f"{work}/index{threads}",
                        progress=False, threads=threads)
assert len(pools) == 1, pools
names = ["data.csc.index.npy", "indices.csc.index.npy",
         "indptr.csc.index.npy", "vocab.index.json", "max_scores.npy"]
for name in names:
  one = open(f"{work}/index1/bm25/{name}", "rb").read()
  assert one == open(f"{work}/index2/bm25/{name}", "rb").read(), name
bm25.MIN_PARALLEL_WORK = 0
searcher = open_index(f"{work}/index1")
opened = bm25.BM25Searcher.__init__
def reopened(*args):  # forked workers should inherit the open searcher
  open(f"{work}/reopened", "w").close()
  opened(*args)
bm25.BM25Searcher.__init__ = reopened
serial = search_all(searcher, queries, 10, progress=False, threads=1)
parallel = search_all(searcher, queries, 10, progress=False, threads=2)
assert len(pools) == 2, pools
assert serial == parallel and sum(map(len, serial)) > 10000
assert not os.path.exists(f"{work}/reopened")
print("ok")
"""


def test_threads_give_the_same_index_and_results(tmp_path):
  # in a fresh process: worker processes are forked from it
  proc = subprocess.run(
      [sys.executable, "-c", _THREADS_SCRIPT, str(tmp_path)], cwd=ROOT,
      capture_output=True, text=True, timeout=600,
      env={**os.environ, "PYTHONPATH": ROOT})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "ok"


def test_tsv_line_numbers_after_multiline_fields(tmp_path):
  path = tmp_path / "psgs.tsv"
  path.write_text('id\ttext\ttitle\n\n1\t"two\nlines"\tT\n2\tok\tT\n'
                  '3\tmissing a column\n')
  with pytest.raises(InputError, match=r"psgs.tsv:6: expected 3 "):
    _passages(path)
  path.write_text('id\ttext\ttitle\n1\t"two\nlines"\tT\n\n3\tok\tT\n')
  assert [line for line, _ in read_corpus(path)] == [2, 5]
