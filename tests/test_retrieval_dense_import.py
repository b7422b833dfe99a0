"""`jaxfid index import-embeddings`: DPR's pickled (id, vector) lists.

Tiny pickles written here the way DPR writes them (``pickle.dump`` of a list
of tuples), with prefixed ('wiki:3') and plain ids, out of order, over two
files; queries come as precomputed vectors or from a T5 encoder.
"""
import json
import os
import pickle

import numpy as np
import pytest

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.cli import main
from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.index import import_dpr_embeddings
from jaxfid.retrieval.dense import index as dense
from jaxfid.retrieval.dense.dpr_import import import_embeddings
from jaxfid.retrieval.dense.vector_files import load_pickle
from jaxfid.retrieval.search import open_index

N, DIM = 30, 16


def _json_stdout(capsys):
  return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("dpr")
  rng = np.random.default_rng(0)
  vectors = rng.standard_normal((N, DIM)).astype(np.float32)
  corpus = d / "psgs.tsv"
  corpus.write_text("id\ttext\ttitle\n" + "".join(
      f"{i + 1}\tpassage text {i}\ttitle {i}\n" for i in range(N)))
  first = [(f"wiki:{i + 1}", vectors[i]) for i in range(12)]
  second = [(str(i + 1), vectors[i]) for i in reversed(range(12, N))]
  with open(d / "wiki_passages_0", "wb") as f:
    pickle.dump(first, f, protocol=4)
  with open(d / "wiki_passages_1", "wb") as f:
    pickle.dump(second, f, protocol=2)
  queries = rng.standard_normal((5, DIM)).astype(np.float32)
  texts = [f"question {k}?" for k in range(5)]
  qfile = d / "questions.tsv"
  qfile.write_text("".join(f"q{k}\t{t}\n" for k, t in enumerate(texts)))
  qvec = d / "query_vectors.jsonl"
  qvec.write_text("".join(json.dumps({"question": t, "vector": v.tolist()})
                          + "\n" for t, v in zip(texts, queries)))
  return {"dir": d, "vectors": vectors, "corpus": corpus, "queries": queries,
          "texts": texts, "qfile": qfile, "qvec": qvec,
          "glob": str(d / "wiki_passages_*")}


def test_import_then_retrieve_with_query_vectors(data, tmp_path, capsys):
  out = tmp_path / "index"
  assert main(["index", "import-embeddings", "--embeddings", data["glob"],
               "--corpus", str(data["corpus"]), "--output", str(out),
               "--shard-size", "8", "--index-shards", "2"]) == 0
  assert _json_stdout(capsys)["num_passages"] == N
  searcher = open_index(out)
  assert searcher.meta["query_encoder"] is None
  np.testing.assert_array_equal(searcher.vectors(np.arange(N)),
                                data["vectors"])
  run = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(out), "--queries",
               str(data["qfile"]), "--top-k", "3", "--output", str(run),
               "--search-option", f"query_vectors={data['qvec']}"]) == 0
  scores = data["queries"] @ data["vectors"].T
  lines = [line.split() for line in run.read_text().splitlines()]
  for k in range(5):
    best = np.argsort(-scores[k])[:3]
    got = [x for x in lines if x[0] == f"q{k}"]
    assert [x[2] for x in got] == [str(i + 1) for i in best]
    np.testing.assert_allclose([float(x[4]) for x in got], scores[k][best],
                               rtol=1e-5)
  capsys.readouterr()
  assert main(["retrieve", "--index", str(out), "--queries",
               str(data["qfile"]), "--top-k", "3", "--output",
               str(tmp_path / "no.trec")]) == 2
  assert "has no query encoder" in capsys.readouterr().err
  assert not (tmp_path / "no.trec").exists()


def test_import_with_a_query_encoder(data, tmp_path):
  ckpt = make_tiny_hf_checkpoint(tmp_path / "t5", vocab_size=32128,
                                 d_model=DIM, d_kv=4, d_ff=32, num_heads=2,
                                 num_layers=1, num_decoder_layers=1)
  out = tmp_path / "index"
  import_dpr_embeddings(data["glob"], data["corpus"], out,
                        query_encoder=ckpt, factory="HNSW16", progress=False)
  searcher = open_index(out)
  assert searcher.meta["query_encoder"]["dim"] == DIM
  assert (out / "faiss_00000.index").is_file()
  hits = searcher.search(data["texts"][:2], 4)
  assert [len(h) for h in hits] == [4, 4]
  other = make_tiny_hf_checkpoint(tmp_path / "t5b", vocab_size=32128,
                                  d_model=8, d_kv=4, d_ff=16, num_heads=2,
                                  num_layers=1, num_decoder_layers=1)
  with pytest.raises(InputError, match="encoder gives 8-d vectors"):
    import_dpr_embeddings(data["glob"], data["corpus"], tmp_path / "x",
                          query_encoder=other, progress=False)
  assert not dense.staging_dir(tmp_path / "x").exists()


def _write(path, pairs, protocol=4):
  with open(path, "wb") as f:
    pickle.dump(pairs, f, protocol=protocol)
  return str(path)


def test_bad_embedding_files(data, tmp_path):
  v = data["vectors"]
  out = tmp_path / "out"
  full = [(str(i + 1), v[i]) for i in range(N)]
  cases = [
      (full[:-1], f"no embedding for passage '{N}'"),
      (full + [("7", v[6])], "second vector for passage '7'"),
      (full[:3] + [("999", v[3])], "id '999' is not in the corpus"),
      (full[:2] + [("3", v[2][:5])], "vector of 5 dimensions, expected 16"),
      ({"1": v[0]}, "expected a list of"),
  ]
  for k, (pairs, message) in enumerate(cases):
    path = _write(tmp_path / f"bad{k}.pkl", pairs)
    with pytest.raises(InputError, match=message):
      import_embeddings(path, data["corpus"], out, progress=False)
    assert not out.exists() and not dense.staging_dir(out).exists()
  with pytest.raises(InputError, match="no embedding file matches"):
    import_embeddings(str(tmp_path / "nothing_*"), data["corpus"], out)


def test_pickles_cannot_run_code(tmp_path):
  class Evil:
    def __reduce__(self):
      return (os.system, ("echo pwned",))

  path = _write(tmp_path / "evil.pkl", [("1", Evil())])
  with pytest.raises(InputError, match="refusing to load"):
    load_pickle(path)
  for protocol in (2, 3, 4, 5):
    good = _write(tmp_path / f"ok{protocol}.pkl",
                  [("1", np.arange(3, dtype=np.float32))], protocol)
    loaded = load_pickle(good)
    np.testing.assert_array_equal(loaded[0][1], [0, 1, 2])
