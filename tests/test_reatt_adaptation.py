"""ReAtt adaptation data: IR supervision as generation, salient span masking, the pipeline."""
from __future__ import annotations

import argparse
import json

import pytest

from jaxfid.cli import main
from jaxfid.core.errors import InputError
from jaxfid.reader import examples as fid_format
from jaxfid.reatt import adaptation as adapt
from jaxfid.reatt import commands as reatt_command
from jaxfid.retrieval.store.corpus import Passage

CORPUS = [
    {"_id": "d1", "title": "Eiffel Tower",
     "text": "The Eiffel Tower was built in 1889 by Gustave Eiffel. "
             "It stands in Paris."},
    {"_id": "d2", "title": "", "text": "the river flows. nothing capitalised."},
    {"_id": "d3", "title": "Mount Fuji",
     "text": "Mount Fuji rises 3776 metres above Honshu. It is a volcano."},
    {"_id": "d4", "title": "", "text": "Gustave Eiffel never saw Honshu."},
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
  # The original's targets hold the document's text alone
  # (prep.py::add_qrel_as_answer, field='text').
  assert records[0]["answers"] == [
      "relevance: 2. The Eiffel Tower was built in 1889 by Gustave Eiffel. "
      "It stands in Paris."]
  assert records[1]["answers"][1] == ("relevance: 1. Mount Fuji rises 3776 "
                                      "metres above Honshu. It is a volcano.")
  titled = adapt.ir_supervision_records(files / "queries.tsv",
                                        files / "qrels.txt",
                                        files / "corpus.jsonl", with_title=True)
  assert titled[1]["answers"][1] == (
      "relevance: 1. Mount Fuji Mount Fuji rises 3776 metres above Honshu. "
      "It is a volcano.")
  assert adapt.relevance_target(3, Passage("x", "", "text"), True) == (
      "relevance: 3. text")
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
  records = adapt.salient_span_records(passages, seed=1)
  # d1's second sentence leaves 4 words besides the mask, d2 has no
  # entity, d3's second sentence none.
  assert [r["id"] for r in records] == ["d1-ssm0", "d3-ssm0"]
  for r in records:
    assert r["question"].count(adapt.MASK) == 1
    entity = r["answers"][0][len(adapt.MASK) + 1:-len(adapt.END) - 1]
    assert r["answers"] == [f"{adapt.MASK} {entity} {adapt.END}"]
    source = next(p for p in passages if r["id"].startswith(p.id))
    sentence = r["question"].replace(adapt.MASK, entity)
    assert sentence in source.text
    assert r["source"] == {"id": source.id, "title": source.title,
                           "text": " ".join(source.text.replace(
                               sentence, "").split())}
  assert records == adapt.salient_span_records(passages, seed=1)


def test_salient_span_masking_follows_the_originals_rules():
  long = "Then " + "word " * 110 + "Milan."
  sentences = ["Yesterday Anna met the old baker in Lyon.",
               "Later a Paris train left Paris at noon.",  # not single
               "It rained.",                                  # no entity
               "He saw Rome.",                                # 3 words left
               long,                                          # > 512 chars
               "Finally the 7 boats reached Oslo in 1990."]   # '7': 1 char
  passage = Passage("p", "T", " ".join(sentences))
  masked = {}
  for seed in range(30):
    for r in adapt.salient_span_records([passage], seed=seed, per_passage=6):
      masked.setdefault(r["question"], set()).add(r["answers"][0])
      kept = [x for x in sentences if x != r["question"].replace(
          adapt.MASK, r["answers"][0].split()[1])]
      assert r["source"]["text"] == " ".join(kept) and len(kept) == 5
  assert masked == {
      "Yesterday <extra_id_0> met the old baker in Lyon.":
          {"<extra_id_0> Anna <extra_id_1>"},
      "Yesterday Anna met the old baker in <extra_id_0>.":
          {"<extra_id_0> Lyon <extra_id_1>"},
      "Finally the 7 boats reached <extra_id_0> in 1990.":
          {"<extra_id_0> Oslo <extra_id_1>"},
      "Finally the 7 boats reached Oslo in <extra_id_0>.":
          {"<extra_id_0> 1990 <extra_id_1>"}}
  # One masked sentence per draw, 5 sentences drawn per document by default;
  # a document of one sentence gives nothing.
  many = Passage("m", "", " ".join(f"Sentence number {i} names Person{i} "
                                   "today." for i in range(8)))
  got = adapt.salient_span_records([many], seed=0)
  assert len(got) == 5 and len({r["question"] for r in got}) == 5
  assert [r["id"] for r in got] == [f"m-ssm{k}" for k in range(5)]
  assert adapt.salient_span_records(
      [Passage("o", "", sentences[0])], per_passage=6) == []


def test_ssm_training_data_puts_the_trimmed_source_first(files, capsys):
  assert main(["index", "bm25", "--corpus", str(files / "corpus.jsonl"),
               "--output", str(files / "bm25")]) == 0
  capsys.readouterr()
  train = files / "ssm_train.json"
  assert _run_command(["reatt", "adapt", "--mode", "ssm", "--corpus",
                       str(files / "corpus.jsonl"), "--index",
                       str(files / "bm25"), "--top-k", "3", "--output",
                       str(train)]) == 0
  assert json.loads(capsys.readouterr().out)["queries"] == 2
  examples = fid_format.read_fid_examples(train, require_answers=True)
  passages = {d["_id"]: d for d in CORPUS}
  for e in examples:
    entity = e.answers[0].split()[1]
    source = e.ctxs[0]
    assert e.id.startswith(source.id) and len(e.ctxs) <= 3
    sentence = e.question.replace(adapt.MASK, entity)
    # the masked sentence is gone from the source passage, which comes first
    # (highest score) and only once; the other documents are BM25's
    assert sentence in passages[source.id]["text"]
    assert sentence not in source.text and source.text
    assert [c.id for c in e.ctxs].count(source.id) == 1
    assert all(source.score > c.score for c in e.ctxs[1:])
    assert all(sentence not in c.text for c in e.ctxs)
  assert {c.id for e in examples for c in e.ctxs[1:]} == {"d4"}
  # Without --index the queries carry their source, and a note says why.
  out = files / "ssm.jsonl"
  assert _run_command(["reatt", "adapt", "--mode", "ssm", "--corpus",
                       str(files / "corpus.jsonl"), "--output", str(out)]) == 0
  assert "--index" in capsys.readouterr().err
  assert all("source" in json.loads(line)
             for line in out.read_text().splitlines())


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
  with pytest.raises(InputError, match="--with-title"):
    _run_command(["reatt", "adapt", "--mode", "ssm", "--with-title",
                  "--corpus", "c", "--output", str(files / "x.jsonl")])
  with pytest.raises(InputError, match="--qrels"):
    _run_command(["reatt", "adapt", "--mode", "ir", "--queries", "q",
                  "--corpus", "c", "--output", str(files / "x.jsonl")])
