"""ReAtt adaptation data: IR supervision as generation, salient span masking, the pipeline."""
from __future__ import annotations

import argparse
import json

import pytest

from jaxfid.cli import main
from jaxfid.reatt import commands as reatt_command
from jaxfid.fid import examples as fid_format
from jaxfid.reatt import adaptation as adapt
from jaxfid.core.errors import InputError
from jaxfid.retrieval.store.corpus import Passage

CORPUS = [
    {"_id": "d1", "title": "Eiffel Tower",
     "text": "The Eiffel Tower was built in 1889 by Gustave Eiffel. "
             "It stands in Paris."},
    {"_id": "d2", "title": "", "text": "the river flows. nothing capitalised."},
    {"_id": "d3", "title": "Mount Fuji",
     "text": "Mount Fuji rises 3776 metres above Honshu."},
]


@pytest.fixture
def files(tmp_path):
  with open(tmp_path / "corpus.jsonl", "w") as f:
    for d in CORPUS:
      f.write(json.dumps(d) + "\n")
  (tmp_path / "queries.tsv").write_text(
      "q1\twho built the tower\nq2\thow high is fuji\nq3\tunjudged\n")
  (tmp_path / "qrels.txt").write_text("q1 0 d1 2\nq1 0 d2 0\nq2 0 d3 1\n"
                                      "q2 0 d1 1\n")
  return tmp_path


def _run_command(argv):
  parser = argparse.ArgumentParser()
  reatt_command.add_parser(parser.add_subparsers(dest="command"))
  args = parser.parse_args(argv)
  return args.func(args)


def test_ir_supervision_becomes_relevance_generation(files):
  records = adapt.ir_supervision_records(files / "queries.tsv",
                                         files / "qrels.txt",
                                         files / "corpus.jsonl")
  assert [r["id"] for r in records] == ["q1", "q2"]  # q3 has no relevant doc
  assert records[0]["answers"] == [
      "relevance: 2. Eiffel Tower The Eiffel Tower was built in 1889 by "
      "Gustave Eiffel. It stands in Paris."]
  assert records[1]["answers"][1] == ("relevance: 1. Mount Fuji Mount Fuji "
                                      "rises 3776 metres above Honshu.")
  assert adapt.relevance_target(3, Passage("x", "", "text")) == "relevance: 3. text"
  (files / "bad.txt").write_text("q1 0 nowhere 1\n")
  with pytest.raises(InputError, match="nowhere"):
    adapt.ir_supervision_records(files / "queries.tsv", files / "bad.txt",
                                 files / "corpus.jsonl")


def test_salient_spans_and_masking():
  s = "The Eiffel Tower was built in 1889 by Gustave Eiffel."
  assert [s[a:b] for a, b in adapt.salient_spans(s)] == [
      "Eiffel Tower", "1889", "Gustave Eiffel"]
  assert adapt.salient_spans("the river flows.") == []
  passages = [Passage(d["_id"], d["title"], d["text"]) for d in CORPUS]
  records = adapt.salient_span_records(passages, seed=1, per_passage=5)
  assert {r["id"].split("-")[0] for r in records} == {"d1", "d3"}
  for r in records:
    assert r["question"].count(adapt.MASK) == 1
    source = next(p.text for p in passages if r["id"].startswith(p.id))
    assert r["question"].replace(adapt.MASK, r["answers"][0]) in " ".join(
        source.split())
  assert records == adapt.salient_span_records(passages, seed=1, per_passage=5)
  one = adapt.salient_span_records(passages, seed=0)
  assert len(one) == 2


def test_salient_span_masking_draws_the_sentence_first():
  # One sentence with one entity, one with four: drawing the sentence first
  # masks "Paris" half of the time; drawing (sentence, span) pairs
  # uniformly would do it a fifth of the time.
  text = ("He lived in Paris. Later Anna, Bert, Carl and Dora met him.")
  passage = Passage("p", "", text)
  assert len(adapt.salient_spans("Later Anna, Bert, Carl and Dora met him.")) == 4
  answers = [adapt.salient_span_records([passage], seed=s)[0]["answers"][0]
             for s in range(400)]
  share = answers.count("Paris") / len(answers)
  assert 0.42 < share < 0.58, share
  # Several draws per passage: distinct spans, in text order, all of them.
  many = adapt.salient_span_records([passage], seed=3, per_passage=9)
  assert [r["answers"][0] for r in many] == ["Paris", "Anna", "Bert", "Carl",
                                            "Dora"]
  assert [r["id"] for r in many] == [f"p-ssm{k}" for k in range(5)]


def test_adaptation_queries_feed_retrieve_and_training_data(files, capsys):
  out = files / "ssm.jsonl"
  assert _run_command(["reatt", "adapt", "--mode", "ssm", "--corpus",
                       str(files / "corpus.jsonl"), "--output", str(out)]) == 0
  assert json.loads(capsys.readouterr().out)["queries"] == 2
  assert main(["index", "bm25", "--corpus", str(files / "corpus.jsonl"),
               "--output", str(files / "bm25")]) == 0
  train = files / "train.json"
  assert main(["retrieve", "--index", str(files / "bm25"), "--queries",
               str(out), "--top-k", "2", "--output", str(train)]) == 0
  examples = fid_format.read_fid_examples(train, require_answers=True)
  assert len(examples) == 2 and all(len(e.ctxs) >= 1 for e in examples)
  assert all(adapt.MASK in e.question for e in examples)
  ir = files / "ir.jsonl"
  assert _run_command(["reatt", "adapt", "--mode", "ir", "--queries",
                       str(files / "queries.tsv"), "--qrels",
                       str(files / "qrels.txt"), "--corpus",
                       str(files / "corpus.jsonl"), "--output", str(ir)]) == 0
  assert len(ir.read_text().splitlines()) == 2
  with pytest.raises(InputError, match="--qrels"):
    _run_command(["reatt", "adapt", "--mode", "ir", "--queries", "q",
                  "--corpus", "c", "--output", str(files / "x.jsonl")])
