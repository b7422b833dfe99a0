"""`jaxfid index dense` -> `jaxfid retrieve` -> `jaxfid predict`, on tiny data.

A random tiny HF T5 (the real vocabulary, so ``vocab_size=32128``) embeds 40
SQuAD paragraphs (tests/data/retrieval/squad_sample); its runs must equal
brute force over the stored embeddings, and the FiD JSON must feed
``jaxfid predict``.
"""
import json
import os
import re

import numpy as np
import pytest

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.cli import main
from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.index import build_dense_index
from jaxfid.dual_encoder.model import Embedder
from jaxfid.retrieval.dense import index as dense
from jaxfid.retrieval.search import open_index

SAMPLE = os.path.join(os.path.dirname(__file__), "data", "retrieval",
                      "squad_sample")


def _json_stdout(capsys):
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("dense_cli")
  with open(os.path.join(SAMPLE, "paragraphs.jsonl")) as f:
    paragraphs = [json.loads(line) for line in f][:40]
  ids = {p["_id"] for p in paragraphs}
  with open(os.path.join(SAMPLE, "questions.jsonl")) as f:
    questions = [q for q in map(json.loads, f) if q["paragraph"] in ids][:12]
  corpus, queries = d / "corpus.jsonl", d / "questions.jsonl"
  corpus.write_text("".join(json.dumps(p) + "\n" for p in paragraphs))
  queries.write_text("".join(json.dumps(q) + "\n" for q in questions))
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=16,
                                 d_kv=4, d_ff=32, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  return {"dir": d, "corpus": corpus, "queries": queries, "ckpt": ckpt,
          "questions": questions}


@pytest.fixture(scope="module")
def index(files):
  out = files["dir"] / "index"
  assert main(["index", "dense", "--checkpoint", str(files["ckpt"]),
               "--corpus", str(files["corpus"]), "--output", str(out),
               "--shard-size", "16", "--passage-maxlength", "64"]) == 0
  return out


def test_index_directory(index, files):
  meta = json.loads((index / "meta.json").read_text())
  assert meta["type"] == "dense" and meta["num_passages"] == 40
  assert meta["dim"] == 16 and meta["faiss"]["factory"] == "Flat"
  assert meta["encoder"]["settings"]["passage_maxlength"] == 64
  assert sorted(p.name for p in index.glob("embeddings_*.npy")) == [
      "embeddings_00000.npy", "embeddings_00001.npy", "embeddings_00002.npy"]
  assert not dense.staging_dir(index).exists()
  searcher = open_index(index)
  loaded = load_dual_encoder(files["ckpt"], passage_maxlength=64)
  embedder = Embedder(loaded.encoder, loaded.params, loaded.tokenizer)
  store = searcher.store
  texts = [f"{store.title(i)} {store.text(i)}" for i in (0, 17, 39)]
  np.testing.assert_allclose(searcher.vectors([0, 17, 39]),
                             embedder.embed(texts), atol=1e-5)


def test_runs_equal_brute_force_and_feed_predict(index, files, tmp_path,
                                                 capsys):
  run = tmp_path / "run.json"
  assert main(["retrieve", "--index", str(index), "--queries",
               str(files["queries"]), "--top-k", "4", "--output",
               str(run)]) == 0
  assert _json_stdout(capsys)["queries"] == 12
  examples = json.loads(run.read_text())
  searcher = open_index(index)
  loaded = load_dual_encoder(files["ckpt"])
  q = Embedder(loaded.encoder, loaded.params, loaded.tokenizer).embed(
      [ex["question"] for ex in examples], "query")
  scores = q @ searcher.vectors(np.arange(40)).T
  for ex, row in zip(examples, scores):
    want = np.argsort(-row, kind="stable")[:4]
    assert [c["id"] for c in ex["ctxs"]] == searcher.store.ids(want)
    np.testing.assert_allclose([c["score"] for c in ex["ctxs"]], row[want],
                               rtol=1e-5)
  trec = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(index), "--queries",
               str(files["queries"]), "--top-k", "4", "--output",
               str(trec)]) == 0
  lines = trec.read_text().splitlines()
  assert len(lines) == 48 and lines[0].split()[2] == examples[0]["ctxs"][0][
      "id"]
  preds = tmp_path / "pred.jsonl"
  capsys.readouterr()
  assert main(["predict", "--checkpoint", str(files["ckpt"]), "--data",
               str(run), "--n-context", "2", "--text-maxlength", "32",
               "--answer-maxlength", "3", "--batch-size", "8", "--output",
               str(preds)]) == 0
  assert len(preds.read_text().splitlines()) == 12


def test_rebuild_reuses_embeddings_and_shards_agree(index, files, tmp_path,
                                                    capsys):
  out = tmp_path / "copy"
  common = ["index", "dense", "--checkpoint", str(files["ckpt"]), "--corpus",
            str(files["corpus"]), "--shard-size", "16",
            "--passage-maxlength", "64"]
  assert main(common + ["--output", str(out), "--progress"]) == 0
  out_err = capsys.readouterr()
  assert json.loads(out_err.out.strip().splitlines()[-1])["embedded"] == 40
  assert re.search(r"embedding.*(passages/s|s/ passages)", out_err.err)
  assert main(common + ["--output", str(out), "--index-shards", "3"]) == 0
  summary = _json_stdout(capsys)
  assert (summary["embedded"], summary["reused"]) == (0, 40)
  queries = [q["question"] for q in files["questions"]]
  sharded = open_index(out).search(queries, 6)
  single = open_index(index).search(queries, 6)
  assert [[r for r, _ in hits] for hits in sharded] == [
      [r for r, _ in hits] for hits in single]
  np.testing.assert_allclose([[s for _, s in h] for h in sharded],
                             [[s for _, s in h] for h in single], rtol=1e-5)
  # another max length changes the vectors: everything is embedded again
  assert main(common[:-1] + ["32", "--output", str(out)]) == 0
  assert _json_stdout(capsys)["embedded"] == 40


def test_interrupted_build_resumes(files, tmp_path, monkeypatch):
  out = tmp_path / "resumed"

  def interrupt(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(dense, "build_faiss_index", interrupt)
  kwargs = {"shard_size": 16, "progress": False}
  with pytest.raises(KeyboardInterrupt):
    build_dense_index(files["ckpt"], files["corpus"], out, **kwargs)
  monkeypatch.undo()
  staging = dense.staging_dir(out)
  assert not out.exists() and len(list(staging.glob("embeddings_*"))) == 3
  (staging / "embeddings_00001.npy").unlink()
  summary = build_dense_index(files["ckpt"], files["corpus"], out,
                                    **kwargs)
  assert (summary["embedded"], summary["reused"]) == (16, 24)
  assert out.is_dir() and not staging.exists()


def test_malformed_corpus_is_one_line_error(files, tmp_path, capsys):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": \n')
  out = tmp_path / "never"
  assert main(["index", "dense", "--checkpoint", str(files["ckpt"]),
               "--corpus", str(bad), "--output", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert f"error: {bad}:2: bad JSON" in err
  assert len(err.splitlines()) == 1
  assert not out.exists() and not dense.staging_dir(out).exists()
  assert main(["index", "dense", "--checkpoint", str(files["ckpt"]),
               "--corpus", str(files["corpus"]), "--output", str(out),
               "--faiss-factory", "IVFoops"]) == 2
  assert "FAISS cannot build 'IVFoops'" in capsys.readouterr().err


def test_sentences_key_value_store(files, tmp_path):
  sentences = tmp_path / "sentences.txt"
  sentences.write_text("the first sentence\n\nanother one here\nlast\n")
  loaded = load_dual_encoder(files["ckpt"])
  build_dense_index(None, sentences, tmp_path / "kv", encoder=loaded,
                          progress=False)
  searcher = open_index(tmp_path / "kv")
  assert searcher.store.ids([0, 1, 2]) == ["0", "1", "2"]
  assert searcher.store.text(1) == "another one here"
  embedder = Embedder(loaded.encoder, loaded.params, loaded.tokenizer)
  np.testing.assert_allclose(searcher.vectors([2, 0]),
                             embedder.embed(["last", "the first sentence"]),
                             atol=1e-5)
  jsonl = tmp_path / "sentences.jsonl"
  jsonl.write_text('{"text": "alpha"}\n{"text": "beta", "title": "B"}\n')
  assert [p.id for _, p in dense.read_dense_corpus(jsonl)] == ["0", "1"]
  jsonl.write_text('{"text": "alpha"}\n{"title": "no text"}\n')
  with pytest.raises(InputError, match=":2: expected a JSON object"):
    list(dense.read_dense_corpus(jsonl))
