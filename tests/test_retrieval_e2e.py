"""End to end through the CLI: corpus -> BM25 index -> runs -> metrics.

Uses tests/data/retrieval/squad_sample: 200 SQuAD v1.1 dev paragraphs and
three questions of each (CC BY-SA 4.0, see the README there).
"""
import json
import os

import pytest

from jaxfid.cli import main

DATA = os.path.join(os.path.dirname(__file__), "data", "retrieval")
SAMPLE = os.path.join(DATA, "squad_sample")
PARAGRAPHS = os.path.join(SAMPLE, "paragraphs.jsonl")
QUESTIONS = os.path.join(SAMPLE, "questions.jsonl")


def _json_stdout(capsys):
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp("e2e") / "index"
  assert main(["index", "bm25", "--corpus", PARAGRAPHS, "--output",
               str(out)]) == 0
  return out


def test_index_directory(index_dir):
  meta = json.loads((index_dir / "meta.json").read_text())
  assert meta["type"] == "bm25" and meta["num_passages"] == 200
  assert (meta["k1"], meta["b"]) == (0.9, 0.4)


def test_trec_run_equals_lucene(index_dir, tmp_path, capsys):
  run = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(index_dir), "--queries", QUESTIONS,
               "--top-k", "5", "--output", str(run), "--tag", "lucene"]) == 0
  assert _json_stdout(capsys)["queries"] == 598
  with open(os.path.join(DATA, "lucene_reference", "squad_sample.trec")) as f:
    assert run.read_text() == f.read()


def test_fid_json_run_and_answer_recall(index_dir, tmp_path, capsys):
  run = tmp_path / "run.json"
  assert main(["retrieve", "--index", str(index_dir), "--queries", QUESTIONS,
               "--top-k", "20", "--output", str(run)]) == 0
  capsys.readouterr()
  examples = json.loads(run.read_text())
  assert len(examples) == 598
  first = examples[0]
  assert first["question"] == ("Which NFL team represented the AFC at Super "
                               "Bowl 50?")
  assert first["answers"] == ["Denver Broncos"]
  # as Lucene, only passages sharing a term with the question are returned
  sizes = [len(ex["ctxs"]) for ex in examples]
  assert max(sizes) == 20 and sizes.count(20) == 554 and min(sizes) >= 1
  ctx = first["ctxs"][0]
  assert set(ctx) == {"id", "title", "text", "score", "has_answer"}
  assert ctx["title"] == "Super Bowl 50" and ctx["has_answer"] is True
  scores = [c["score"] for c in first["ctxs"]]
  assert scores == sorted(scores, reverse=True)
  assert main(["eval-retrieval", "--run", str(run), "--data", QUESTIONS,
               "--k", "1,5,20"]) == 0
  metrics = _json_stdout(capsys)
  # BM25 on 200 paragraphs: 543/598 at rank 1, every answer in the top 20
  assert metrics["R@1"] == pytest.approx(543 / 598)
  assert metrics["R@5"] == pytest.approx(584 / 598)
  assert metrics["R@20"] == 1.0
  assert metrics["num_queries"] == 598
  # the same numbers from a TREC run plus the index, and from has_answer
  trec = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(index_dir), "--queries", QUESTIONS,
               "--top-k", "20", "--output", str(trec)]) == 0
  capsys.readouterr()
  assert main(["eval-retrieval", "--run", str(trec), "--data", QUESTIONS,
               "--index", str(index_dir), "--k", "1,5,20"]) == 0
  assert _json_stdout(capsys) == metrics
  hits = [[c["has_answer"] for c in ex["ctxs"]] for ex in examples]
  assert sum(any(h[:1]) for h in hits) == 543


def test_qrels_metrics(index_dir, tmp_path, capsys):
  qrels = tmp_path / "qrels.txt"
  with open(QUESTIONS) as f, open(qrels, "w") as out:
    for line in f:
      q = json.loads(line)
      out.write(f"{q['id']} 0 {q['paragraph']} 1\n")
  run = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(index_dir), "--queries", QUESTIONS,
               "--top-k", "100", "--output", str(run)]) == 0
  capsys.readouterr()
  assert main(["eval-retrieval", "--run", str(run), "--qrels",
               str(qrels)]) == 0
  metrics = _json_stdout(capsys)
  assert metrics["R@100"] == 1.0
  assert metrics["nDCG@10"] == pytest.approx(0.94973, abs=1e-4)
  assert metrics["MRR@10"] == pytest.approx(0.93649, abs=1e-4)


def test_malformed_corpus_is_one_line_and_writes_nothing(tmp_path, capsys):
  corpus = tmp_path / "bad.tsv"
  corpus.write_text("id\ttext\ttitle\n1\tfine\tT\n1\tagain\tT\n")
  out = tmp_path / "index"
  assert main(["index", "bm25", "--corpus", str(corpus), "--output",
               str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert err == (f"jaxfid index: error: {corpus}:3: duplicate id '1' (first "
                 "seen on line 2)")
  assert not out.exists()
  assert [p.name for p in tmp_path.iterdir()] == ["bad.tsv"]


def test_bad_queries_and_options(index_dir, tmp_path, capsys):
  queries = tmp_path / "q.tsv"
  queries.write_text("1\tfine\nbroken line\n")
  run = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(index_dir), "--queries",
               str(queries), "--top-k", "3", "--output", str(run)]) == 2
  assert f"{queries}:2: expected 2 tab-separated" in capsys.readouterr().err
  assert not run.exists()
  queries.write_text("1\tsuper bowl\n")
  assert main(["retrieve", "--index", str(index_dir), "--queries",
               str(queries), "--top-k", "3", "--output", str(run),
               "--token-top-k", "5"]) == 2
  assert "--token-top-k does not apply" in capsys.readouterr().err
  assert main(["retrieve", "--index", str(tmp_path), "--queries",
               str(queries), "--top-k", "3", "--output", str(run)]) == 2
  assert "not an index directory" in capsys.readouterr().err


def test_corpus_split_then_index(tmp_path, capsys):
  docs = tmp_path / "docs.jsonl"
  with open(docs, "w") as f:
    f.write(json.dumps({"_id": "a", "title": "Alpha",
                        "text": " ".join(["word"] * 250)}) + "\n")
    f.write(json.dumps({"_id": "b", "title": "", "text": "short one"}) + "\n")
  passages = tmp_path / "psgs.tsv"
  assert main(["corpus", "split", "--input", str(docs), "--output",
               str(passages)]) == 0
  assert _json_stdout(capsys)["passages"] == 4
  rows = passages.read_text().splitlines()
  assert rows[0] == "id\ttext\ttitle"
  assert [r.split("\t")[0] for r in rows[1:]] == ["a_0", "a_1", "a_2", "b_0"]
  assert rows[-1] == "b_0\tshort one\t"
  index = tmp_path / "index"
  assert main(["index", "bm25", "--corpus", str(passages), "--output",
               str(index), "--k1", "1.2", "--b", "0.75"]) == 0
  capsys.readouterr()
  queries = tmp_path / "q.tsv"
  queries.write_text("q\tshort\n")
  run = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(index), "--queries", str(queries),
               "--top-k", "10", "--output", str(run)]) == 0
  assert run.read_text().split()[:4] == ["q", "Q0", "b_0", "1"]
  # the index directory is replaced in place
  assert main(["index", "bm25", "--corpus", str(passages), "--output",
               str(index)]) == 0


def test_refuses_to_replace_a_directory_that_is_not_an_index(tmp_path,
                                                            capsys):
  out = tmp_path / "precious"
  out.mkdir()
  (out / "notes.txt").write_text("keep me")
  assert main(["index", "bm25", "--corpus", PARAGRAPHS, "--output",
               str(out)]) == 2
  assert "not an index directory" in capsys.readouterr().err
  assert (out / "notes.txt").read_text() == "keep me"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["precious"]
