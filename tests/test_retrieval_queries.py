"""Query files in their three formats, and the FiD/TREC run writers."""
import gzip
import json

import pytest

from jaxfid.core.errors import InputError
from jaxfid.retrieval.store.corpus import Passage
from jaxfid.retrieval.runs import (
    iter_fid_examples, run_format, write_fid_json, write_trec)
from jaxfid.retrieval.store.passage_store import (
    PassageStore, write_passage_store)
from jaxfid.retrieval.store.queries import Query, read_queries


def test_tsv_queries_with_and_without_header(tmp_path):
  path = tmp_path / "q.tsv"
  path.write_text("qid\tquery\n1\tfirst question\n2\tsecond\n")
  assert read_queries(path) == [Query("1", "first question"),
                                Query("2", "second")]
  plain = tmp_path / "q.txt"
  plain.write_text("a\tx\n")
  assert read_queries(plain) == [Query("a", "x")]


def test_jsonl_queries_beir_and_qa(tmp_path):
  beir = tmp_path / "queries.jsonl"
  beir.write_text('{"_id": "q1", "text": "what", "metadata": {}}\n')
  assert read_queries(beir) == [Query("q1", "what")]
  nq = tmp_path / "nq.jsonl.gz"
  nq.write_bytes(gzip.compress(
      b'{"question": "who", "answer": ["A", "B"]}\n'
      b'{"question": "when", "answers": "1990"}\n'))
  assert read_queries(nq) == [Query("0", "who", ("A", "B")),
                              Query("1", "when", ("1990",))]


def test_fid_json_list_as_queries(tmp_path):
  path = tmp_path / "dev.json"
  path.write_text(json.dumps([{"id": "x", "question": "q?",
                               "answers": ["a"], "ctxs": []}]))
  assert read_queries(path) == [Query("x", "q?", ("a",))]


@pytest.mark.parametrize("name, content, where, reason", [
    ("a.tsv", "1\tok\n2 no tab\n", "2", "expected 2 tab-separated"),
    ("b.tsv", "1\tx\n1\ty\n", "2", "duplicate query id '1'"),
    ("c.jsonl", '{"id": "1", "question": "x"}\n{"id": "2"}\n', "2",
     "missing query text"),
    ("d.jsonl", '{"id": "1", "question": "x"}\n{oops\n', "2", "bad JSON"),
    ("e.jsonl", '{"question": "x", "answers": [1]}\n', "1", "answers must"),
    ("f.json", '[{"question": "x"}, 3]', " element 1", "expected a JSON"),
])
def test_malformed_queries_name_file_and_line(tmp_path, name, content, where,
                                              reason):
  path = tmp_path / name
  path.write_text(content)
  with pytest.raises(InputError) as e:
    read_queries(path)
  assert str(e.value).startswith(f"{path}:{where}: ")
  assert reason in str(e.value)


def test_trec_writer(tmp_path):
  out = tmp_path / "run.trec"
  write_trec(out, ["q1", "q2"], [[("d1", 2.5), ("d2", 1.25)], []], tag="bm25")
  assert out.read_text() == ("q1 Q0 d1 1 2.5 bm25\n"
                             "q1 Q0 d2 2 1.25 bm25\n")
  assert run_format(out) == "trec" and run_format("x.JSONL") == "fid"
  with pytest.raises(ValueError):
    write_trec(out, ["q"], [[]], tag="two words")


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_fid_writer_reads_back(tmp_path, suffix):
  write_passage_store(tmp_path / "store", [
      Passage("p1", "Denver", "The Denver Broncos won."),
      Passage("p2", "", "Nothing here ✓")])
  store = PassageStore(tmp_path / "store")
  queries = [Query("q1", "who won?", ("Denver Broncos",)),
             Query("q2", "no answers")]
  out = tmp_path / f"run{suffix}"
  write_fid_json(out, queries, [[(1, 3.0), (0, 2.0)], [(0, 1.5)]], store)
  examples = [ex for _, ex in iter_fid_examples(out)]
  assert [ex["question"] for ex in examples] == ["who won?", "no answers"]
  assert examples[0]["answers"] == ["Denver Broncos"]
  assert examples[1]["answers"] == []
  ctxs = examples[0]["ctxs"]
  assert [set(c) for c in ctxs] == [{"id", "title", "text", "score",
                                     "has_answer"}] * 2
  assert [(c["id"], c["score"], c["has_answer"]) for c in ctxs] == [
      ("p2", 3.0, False), ("p1", 2.0, True)]
  assert ctxs[0]["text"] == "Nothing here ✓"
  assert examples[1]["ctxs"][0]["has_answer"] is False
