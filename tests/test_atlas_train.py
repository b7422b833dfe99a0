"""`jaxfid train --gin_file=gin/atlas/tiny.gin` end to end on the key-value
world (tests/reatt_world.py): each objective trains and logs eval_em with
the in-loop recall; a resumed run, also one stopped during a refresh,
continues exactly; QUERY_SIDE_ONLY keeps the passage tower and the index,
which `jaxfid retrieve --device` searches as the in-loop search did."""
from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest

from jaxfid.atlas.checkpoint import load_atlas
from jaxfid.atlas.index import load_index
from jaxfid.atlas.retrieval import InLoopRetriever, read_passages
from jaxfid.core import sharding as shd
from jaxfid.core.tokenization import Tokenizer
from jaxfid.atlas.model import RETRIEVER
from jaxfid.cli import main
from jaxfid.dual_encoder.model import QUERY_TOWER
from reatt_world import make_world, write_corpus, write_examples

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("atlas_data")
  docs, examples = make_world(num_keys=32, n_context=4)
  write_corpus(d / "corpus.jsonl", docs)
  write_examples(d / "train.json", examples)
  write_examples(d / "dev.json", examples[:8])
  return d


def _args(model_dir, data, loss, steps=4, *extra):
  return ["train", "--gin_file=gin/atlas/tiny.gin",
          f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.CORPUS='{data / 'corpus.jsonl'}'",
          f"--gin.TRAIN_DATA='{data / 'train.json'}'",
          f"--gin.EVAL_DATA='{data / 'dev.json'}'",
          f"--gin.RETRIEVER_LOSS='{loss}'", f"--gin.TRAIN_STEPS={steps}",
          "--gin.EVAL_EVERY=2", "--gin.CHECKPOINT_EVERY=2", "--gin.LOG_EVERY=1",
          "--gin.TEXT_MAXLENGTH=16", "--gin.ANSWER_MAXLENGTH=4",
          "--gin.QUERY_MAXLENGTH=8", "--gin.PASSAGE_MAXLENGTH=8",
          "--gin.INDEX_BATCH_SIZE=8", "--gin.TEMPERATURE_GOLD=0.1",
          "--gin.TEMPERATURE_SCORE=0.1", "--gin.loop.train.progress=False",
          *extra]


def _metrics(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("loss", ["adist", "emdr2", "pdist", "loop", "none"])
def test_each_objective_trains_on_the_mesh_and_logs_recall(data, tmp_path,
                                                           loss):
  model_dir = tmp_path / "run"
  assert main(_args(model_dir, data, loss)) == 0
  lines = _metrics(model_dir)
  steps = [m for m in lines if "reader_loss" in m]
  assert [m["step"] for m in steps] == [1, 2, 3, 4]
  for m in steps:
    assert np.isfinite(m["loss"]) and m["reader_loss"] > 0
    assert m["loss"] == pytest.approx(m["reader_loss"] + m["retriever_loss"],
                                      rel=1e-5)
    assert (m["retriever_loss"] == 0) == (loss == "none")
  evals = [m for m in lines if "eval_em" in m]
  assert [m["step"] for m in evals] == [2, 4]
  for m in evals:
    assert {"eval_recall@1", "eval_recall@5", "eval_recall@20"} <= set(m)
    assert 0 <= m["eval_recall@1"] <= m["eval_recall@5"] <= m[
        "eval_recall@20"] <= 1
  assert [m["step"] for m in lines if "index_refreshed" in m] == [0]
  run = json.loads((model_dir / "jaxfid_config.json").read_text())
  assert run["method"] == "atlas" and run["atlas"]["retriever_loss"] == loss


def _latest_params(model_dir):
  _, params = load_atlas(str(model_dir), which="latest")
  return params


def _assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_resumed_run_and_a_run_stopped_mid_refresh_continue_exactly(
    data, tmp_path):
  extra = ("--gin.REFRESH_EVERY=2",)
  straight = tmp_path / "straight"
  assert main(_args(straight, data, "pdist", 4, *extra)) == 0
  refreshed = [m["step"] for m in _metrics(straight) if "index_refreshed" in m]
  assert refreshed == [0, 2]
  assert sorted(os.listdir(straight / "atlas_index")) == ["2"]
  want = _latest_params(straight)
  last = [m for m in _metrics(straight) if m["step"] == 4 and "loss" in m]
  # resumed from step 2 with its saved index; then from step 2 without it
  # (killed during the refresh after step 2: it is redone)
  for drop_index in (False, True):
    run = tmp_path / f"resumed_{drop_index}"
    shutil.copytree(straight, run)
    shutil.rmtree(run / "checkpoints" / "4")
    if drop_index:
      shutil.rmtree(run / "atlas_index" / "2")
    assert main(_args(run, data, "pdist", 4, *extra)) == 0
    _assert_same(_latest_params(run), want)
    again = [m for m in _metrics(run) if m["step"] == 4 and "loss" in m]
    assert again[0]["loss"] == last[0]["loss"]
    assert ([m["step"] for m in _metrics(run) if "index_refreshed" in m]
            == ([0, 2, 2] if drop_index else [0, 2]))


def test_query_side_only_keeps_the_passage_tower_and_its_index(data, tmp_path,
                                                              capsys):
  model_dir = tmp_path / "qso"
  assert main(_args(model_dir, data, "adist", 4, "--gin.QUERY_SIDE_ONLY=True",
                    "--gin.REFRESH_EVERY=2", "--gin.OPTIMIZER='adamw'",
                    "--gin.WEIGHT_DECAY=0.1", "--gin.INDEX_DTYPE='float32'")) == 0
  assert [m["step"] for m in _metrics(model_dir)
          if "index_refreshed" in m] == [0]
  model, params = load_atlas(str(model_dir), which="latest")
  mesh = shd.parse_mesh("")
  again = InLoopRetriever(model, read_passages(str(data / "corpus.jsonl")),
                          Tokenizer(), mesh, passage_maxlength=8,
                          query_maxlength=8, batch_size=8, dtype="float32")
  again.refresh(jax.device_put(params, again.replicated))  # the final passage tower embeds as the initial one
  saved = load_index(str(model_dir / "atlas_index" / "0"), mesh)
  # (equal up to the summation order of another device layout; AdamW's
  # decay alone would move every weight by 4e-4 of itself)
  np.testing.assert_allclose(again.index.host_rows(), saved.host_rows(),
                             rtol=1e-5, atol=1e-6)
  retriever = params[RETRIEVER]
  passage = {k: v for k, v in retriever.items() if k != QUERY_TOWER}
  moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
           zip(jax.tree.leaves(retriever[QUERY_TOWER]), jax.tree.leaves(passage))]
  assert max(moved) > 0  # the query tower, a copy at the start, trained
  # the saved index, searched by `jaxfid retrieve --device` with the trained
  # query tower (this run's, to spare the slow tier a run of its own)
  _retrieve_gives_the_in_loop_hits(model_dir, data, "float32", capsys)


def test_init_retriever_and_an_atlas_init_checkpoint_start_the_run(
    data, tmp_path):
  from jaxfid.checkpoints import model_dir as checkpointing
  from jaxfid.dual_encoder.checkpoint import dual_encoder_run_config
  from jaxfid.dual_encoder.model import DualEncoder, DualEncoderConfig
  from jaxfid.t5.config import preset
  encoder = DualEncoder(preset("tiny", dropout_rate=0.0), DualEncoderConfig())
  weights = encoder.init_params(7)
  dual = str(tmp_path / "dual")
  checkpointing.write_run_config(dual, dual_encoder_run_config(encoder))
  ckpts = checkpointing.RunCheckpoints(dual)
  ckpts.save(1, {"step": np.ones((), np.int32), "params": weights})
  ckpts.close()
  frozen = ("--gin.LEARNING_RATE=0.0", "--gin.EVAL_EVERY=100",
            "--gin.QUERY_SIDE_ONLY=True")
  first = tmp_path / "first"
  assert main(_args(first, data, "pdist", 1, f"--gin.INIT_RETRIEVER='{dual}'",
                    *frozen)) == 0
  retriever = _latest_params(first)[RETRIEVER]
  _assert_same({k: v for k, v in retriever.items() if k != QUERY_TOWER},
               weights)
  _assert_same(retriever[QUERY_TOWER], weights)  # a copy of the passage tower
  second = tmp_path / "second"
  assert main(_args(second, data, "pdist", 1,
                    f"--gin.INIT_CHECKPOINT='{first}'", *frozen)) == 0
  _assert_same(_latest_params(second), _latest_params(first))


def _retrieve_gives_the_in_loop_hits(model_dir, data, dtype, capsys):
  """`jaxfid retrieve --device` over the run's index of step 0 with its
  latest checkpoint: the hits of the run's in-loop search (its logged recall
  at step 4, and the run's retriever on the run's mesh)."""
  out = model_dir.parent / "hits.jsonl"
  capsys.readouterr()
  assert main(["retrieve", "--index", str(model_dir / "atlas_index" / "0"),
               "--device", "--queries", str(data / "dev.json"), "--top-k",
               "20", "--output", str(out)]) == 0
  assert json.loads(capsys.readouterr().out.splitlines()[-1])["queries"] == 8
  got = [json.loads(line) for line in out.read_text().splitlines()]
  logged = [m for m in _metrics(model_dir) if m.get("step") == 4
            and "eval_recall@1" in m][0]
  for k in (1, 5, 20):
    assert np.mean([any(c["has_answer"] for c in r["ctxs"][:k])
                    for r in got]) == logged[f"eval_recall@{k}"]
  model, params = load_atlas(str(model_dir), which="latest")
  passages = read_passages(str(data / "corpus.jsonl"))
  mesh = shd.parse_mesh("")
  loop = InLoopRetriever(model, passages, Tokenizer(), mesh,
                         passage_maxlength=8, query_maxlength=8, batch_size=8,
                         dtype=dtype)
  loop.index = load_index(str(model_dir / "atlas_index" / "0"), mesh)
  ids, scores = loop.search(jax.device_put(params, loop.replicated),
                            loop.query_tokens([r["question"] for r in got]),
                            20)
  assert [[c["id"] for c in r["ctxs"]] for r in got] == [
      [passages[i].id for i in row] for row in ids]
  np.testing.assert_allclose([[c["score"] for c in r["ctxs"]] for r in got],
                             scores, rtol=1e-5)


def test_atlas_schedules_resume_exactly(data, tmp_path):
  """A piecewise REFRESH_EVERY, FREEZE_RETRIEVER_STEPS, the cosine
  SCHEDULE, RETRIEVER_LEARNING_RATE and RETRIEVER_N_CONTEXT: the refreshes
  fall where Atlas's scheduler puts them, the frozen step has no retriever
  loss, and a run resumed from step 2 ends as the straight one."""
  extra = ("--gin.REFRESH_EVERY='0-2:1,2-10:2'",
           "--gin.FREEZE_RETRIEVER_STEPS=1", "--gin.SCHEDULE='cosine'",
           "--gin.WARMUP_STEPS=1", "--gin.RETRIEVER_LEARNING_RATE=5e-4",
           "--gin.RETRIEVER_N_CONTEXT=6")
  straight = tmp_path / "straight"
  assert main(_args(straight, data, "pdist", 4, *extra)) == 0
  lines = _metrics(straight)
  assert [m["step"] for m in lines if "index_refreshed" in m] == [0, 1, 2]
  losses = [m["retriever_loss"] for m in lines if "retriever_loss" in m]
  assert losses[0] == 0 and all(x > 0 for x in losses[1:])
  run_config = json.loads((straight / "jaxfid_config.json").read_text())
  assert run_config["atlas"]["retriever_n_context"] == 6
  want = _latest_params(straight)
  run = tmp_path / "resumed"
  shutil.copytree(straight, run)
  shutil.rmtree(run / "checkpoints" / "4")
  assert main(_args(run, data, "pdist", 4, *extra)) == 0
  _assert_same(_latest_params(run), want)
