"""ReAtt token index: exact search equals brute-force avg-max; IVF-PQ; the CLI."""
from __future__ import annotations

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.cli import main
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer, bundled_vocab_path
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader.examples import FidExample
from jaxfid.reatt import model as reatt
from jaxfid.reatt import token_index
from jaxfid.reatt.checkpoint import load_reatt
from jaxfid.retrieval.search import open_index
from reatt_world import make_world, tiny_model, write_corpus

HEAD = 1
LENGTH = 24


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  d = tmp_path_factory.mktemp("reatt_index")
  docs, examples = make_world(num_keys=16, n_context=3)
  write_corpus(d / "corpus.jsonl", docs)
  model = tiny_model(bi_encoder_layers=1)
  params = model.init_params(0)
  w = np.zeros(4, np.float32)
  w[HEAD] = 1.0  # softmax(w / 0.001) is one-hot: head 1 retrieves
  params[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS] = jnp.asarray(w)
  encoder = token_index.TokenEncoder.from_model(model, params)
  meta = token_index.build_token_index(
      encoder, Tokenizer(), d / "corpus.jsonl", d / "flat",
      doc_maxlength=LENGTH, query_maxlength=LENGTH, batch_size=8,
      progress=False)
  return {"dir": d, "docs": docs, "examples": examples, "model": model,
          "params": params, "meta": meta}


def _brute_force(searcher, query_text):
  """avg-max of the query against every passage's stored keys, in numpy."""
  q = searcher.encode_queries([query_text])[0]
  o = searcher.offsets
  scores = np.array([np.mean(np.max(q @ searcher.keys[o[i]:o[i + 1]].T, axis=1))
                     for i in range(len(o) - 1)], np.float32)
  order = np.lexsort((searcher.store.id_rank, -scores))
  return order, scores


def test_exact_search_is_brute_force_avg_max(setup):
  meta = setup["meta"]
  assert meta["type"] == "reatt" and meta["head"] == HEAD
  assert meta["num_passages"] == 16 and meta["faiss"] == "flat"
  searcher = open_index(setup["dir"] / "flat")
  assert isinstance(searcher, token_index.TokenSearcher)
  questions = [e.question for e in setup["examples"]]
  results = searcher.search(questions, 16, token_top_k=meta["num_tokens"])
  for text, hits in zip(questions, results):
    order, scores = _brute_force(searcher, text)
    assert [r for r, _ in hits] == order.tolist()
    np.testing.assert_allclose([s for _, s in hits], scores[order], rtol=1e-5,
                               atol=1e-6)


def test_index_scores_equal_the_training_relevance(setup):
  """The index's keys and queries are the training path's, for the head."""
  model, params, docs = setup["model"], setup["params"], setup["docs"]
  searcher = open_index(setup["dir"] / "flat")
  examples = [FidExample(question=e.question, ctxs=tuple(docs))
              for e in setup["examples"][:4]]
  tokens, pmask = fid_inputs.encode_examples(Tokenizer(), examples, 16, 2 * LENGTH)
  rel = np.asarray(jax.jit(lambda p, t, m: model.relevance(
      p, t, passage_mask=m))(params, tokens, pmask))
  for i, e in enumerate(examples):
    _, scores = _brute_force(searcher, e.question)
    np.testing.assert_allclose(scores, rel[i], rtol=1e-4, atol=1e-5)


def test_small_token_top_k_rescores_candidates_exactly(setup):
  searcher = open_index(setup["dir"] / "flat")
  text = setup["examples"][3].question
  _, scores = _brute_force(searcher, text)
  hits = searcher.search([text], 16, token_top_k=2)[0]
  q = searcher.encode_queries([text])[0]
  candidates = searcher.candidates(q, 2)
  assert 0 < len(hits) == len(candidates) < 16
  assert sorted(r for r, _ in hits) == candidates.tolist()
  for row, score in hits:
    assert score == pytest.approx(float(scores[row]), rel=1e-5, abs=1e-6)


def test_rerank_top_k_keeps_the_best_candidates_by_the_originals_sum(setup):
  """jzbjyb/ReAtt reatt/index.py: per (query token, passage) the best
  fetched token, 0 when none was, summed over query tokens; the top
  rerank_topk passages are rescored exactly."""
  searcher = open_index(setup["dir"] / "flat")
  text = setup["examples"][5].question
  q = searcher.encode_queries([text])[0]
  sims, ids = searcher.index.search(q, 6)
  owner = np.searchsorted(searcher.offsets, ids, side="right") - 1
  approx = {}
  for t in range(len(q)):
    for row in set(owner[t].tolist()):
      approx[row] = approx.get(row, 0.0) + float(sims[t][owner[t] == row].max())
  ranked = sorted(approx, key=lambda r: (-approx[r], searcher.store.id_rank[r]))
  assert len(ranked) > 3
  assert searcher.candidates(q, 6, 3).tolist() == sorted(ranked[:3])
  assert searcher.candidates(q, 6).tolist() == sorted(ranked)
  _, exact = _brute_force(searcher, text)
  hits = searcher.search([text], 16, token_top_k=6, rerank_top_k=3)[0]
  assert sorted(r for r, _ in hits) == sorted(ranked[:3])
  for row, score in hits:
    assert score == pytest.approx(float(exact[row]), rel=1e-5, abs=1e-6)
  with pytest.raises(InputError, match="positive"):
    searcher.search([text], 3, rerank_top_k=0)


def test_rescoring_in_small_chunks_changes_nothing(setup, monkeypatch):
  searcher = open_index(setup["dir"] / "flat")
  questions = [e.question for e in setup["examples"][:4]]
  want = searcher.search(questions, 16, token_top_k=1000)
  monkeypatch.setattr(token_index, "_RESCORE_TOKENS", 7)
  got = searcher.search(questions, 16, token_top_k=1000)
  for w, g in zip(want, got):
    assert [r for r, _ in g] == [r for r, _ in w]
    np.testing.assert_allclose([s for _, s in g], [s for _, s in w], rtol=1e-5,
                               atol=1e-6)


def test_ivfpq_index_rescores_exactly(setup):
  d = setup["dir"]
  encoder = token_index.TokenEncoder.from_model(setup["model"], setup["params"])
  meta = token_index.build_token_index(
      encoder, Tokenizer(), d / "corpus.jsonl", d / "pq", doc_maxlength=LENGTH,
      query_maxlength=LENGTH, batch_size=8, faiss_type="ivfpq", nlist=2,
      pq_m=4, pq_bits=4, progress=False)
  assert meta["faiss"] == "ivfpq" and (d / "pq" / "tokens.faiss").exists()
  searcher = open_index(d / "pq")
  text = setup["examples"][0].question
  _, exact = _brute_force(searcher, text)
  hits = searcher.search([text], 5, token_top_k=64, nprobe="2")[0]
  assert len(hits) == 5
  for row, score in hits:
    assert score == pytest.approx(float(exact[row]), rel=1e-5, abs=1e-6)
  with pytest.raises(InputError, match="pq-m"):
    token_index.build_token_index(
        encoder, Tokenizer(), d / "corpus.jsonl", d / "bad", doc_maxlength=8,
        query_maxlength=8, faiss_type="ivfpq", pq_m=3, progress=False)
  assert not (d / "bad").exists()


def test_search_rejects_unknown_or_bad_options(setup):
  searcher = open_index(setup["dir"] / "flat")
  with pytest.raises(InputError, match="--k1"):
    searcher.search(["red"], 3, k1=0.9)
  with pytest.raises(InputError, match="integer"):
    searcher.search(["red"], 3, token_top_k="many")


def _model_dir(path, model, params):
  checkpointing.write_run_config(path, {
      **reatt.run_config_fields(model.reatt), "model": model.config.to_dict(),
      "text_maxlength": LENGTH})
  shutil.copyfile(bundled_vocab_path(), path / "spiece.model")
  ckpts = checkpointing.RunCheckpoints(str(path))
  ckpts.save(1, {"step": jnp.ones((), jnp.int32), "params": params})
  ckpts.close()


def test_cli_index_reatt_then_retrieve(setup, tmp_path, capsys):
  model_dir = tmp_path / "model"
  _model_dir(model_dir, setup["model"], setup["params"])
  model, params, spiece = load_reatt(str(model_dir))
  assert spiece is not None and model.reatt == setup["model"].reatt
  np.testing.assert_array_equal(params["reatt"]["head_weights"],
                                setup["params"]["reatt"]["head_weights"])
  out = tmp_path / "index"
  assert main(["index", "reatt", "--checkpoint", str(model_dir), "--corpus",
               str(setup["dir"] / "corpus.jsonl"), "--output", str(out),
               "--batch-size", "8", "--progress"]) == 0
  out_err = capsys.readouterr()
  assert re.search(r"indexing.*(passages/s|s/ passages)", out_err.err)
  summary = json.loads(out_err.out.strip().splitlines()[-1])
  assert summary["num_passages"] == 16 and summary["head"] == HEAD
  queries = tmp_path / "queries.tsv"
  queries.write_text("".join(f"q{i}\t{e.question}\n"
                             for i, e in enumerate(setup["examples"][:3])))
  run = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(out), "--queries", str(queries),
               "--top-k", "4", "--output", str(run), "--token-top-k",
               "10000"]) == 0
  lines = run.read_text().splitlines()
  assert len(lines) == 12
  # Same ranking as the index built in-process from the same parameters.
  searcher = open_index(setup["dir"] / "flat")
  want = searcher.search([setup["examples"][0].question], 4, token_top_k=10000)[0]
  got = [line.split()[2] for line in lines if line.startswith("q0 ")]
  assert got == searcher.store.ids([r for r, _ in want])
  # A FiD MODEL_DIR is refused in one line.
  checkpointing.write_run_config(tmp_path / "fid", {"method": "fid",
                                                    "model": {}})
  assert main(["index", "reatt", "--checkpoint", str(tmp_path / "fid"),
               "--corpus", str(setup["dir"] / "corpus.jsonl"), "--output",
               str(tmp_path / "x")]) == 2
  assert "not a 'reatt' MODEL_DIR" in capsys.readouterr().err
