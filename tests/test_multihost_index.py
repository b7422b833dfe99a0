"""Multi-host index builds: 2 processes x 2 CPU devices equal 1 process x 4.

``jaxfid index dense`` and ``jaxfid index reatt`` run as two processes on
127.0.0.1 (gloo) must write the very files one process with four devices
writes (embeddings / keys, passage store, meta.json but for timings); a
two-process dense build resumes from reused shards; a failure on process 0
stops both processes with one line each; ``jaxfid reatt iterate`` runs a
round on two processes. Every process of a run shares this machine's disk.
"""
from __future__ import annotations

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import multihost
from hf_reference import make_tiny_hf_checkpoint
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.core.tokenization import bundled_vocab_path
from jaxfid.reatt import model as reatt
from reatt_world import make_world, tiny_model, write_corpus, write_examples

SAMPLE = os.path.join(os.path.dirname(__file__), "data", "retrieval",
                      "squad_sample")
STORE_FILES = ("passages.bin", "offsets.npy", "ids.txt", "id_offsets.npy")


def _ok(results):
  for code, _, err in results:
    assert code == 0, err[-3000:]
  return results


def _meta(directory) -> dict:
  meta = json.loads((directory / "meta.json").read_text())
  if isinstance(meta.get("faiss"), dict):  # (if it ever records timings)
    meta["faiss"].pop("seconds", None)
  return meta


def _no_summary(out: str) -> bool:
  """Whether a process printed no JSON line (gloo prints its own lines)."""
  return not [line for line in out.splitlines() if line.startswith("{")]


def _same_files(one, two, names) -> None:
  for name in names:
    assert (one / name).read_bytes() == (two / name).read_bytes(), name


# ------------------------------------------------------------------- dense


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
  d = tmp_path_factory.mktemp("mh_dense")
  with open(os.path.join(SAMPLE, "paragraphs.jsonl")) as f:
    paragraphs = [json.loads(line) for line in f][:10]
  corpus = d / "corpus.jsonl"
  corpus.write_text("".join(json.dumps(p) + "\n" for p in paragraphs))
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=16,
                                 d_kv=4, d_ff=32, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  argv = lambda out: ["index", "dense", "--checkpoint", str(ckpt), "--corpus",
                      str(corpus), "--output", str(out), "--shard-size", "4",
                      "--batch-size", "4", "--passage-maxlength", "32"]
  one = d / "one"
  _ok(multihost.run(argv(one), 1, 4))
  return {"dir": d, "argv": argv, "one": one}


def _same_dense_index(one, two) -> None:
  names = sorted(p.name for p in one.glob("embeddings_*.npy"))
  assert names == sorted(p.name for p in two.glob("embeddings_*.npy"))
  assert len(names) == 3
  for name in names:
    np.testing.assert_array_equal(np.load(one / name), np.load(two / name))
  _same_files(one, two, STORE_FILES + ("embeddings.json",))
  assert _meta(one) == _meta(two)


@pytest.mark.slow
def test_two_processes_write_the_one_process_dense_index(dense):
  two = dense["dir"] / "two"
  results = _ok(multihost.run(dense["argv"](two), 2, 2))
  _same_dense_index(dense["one"], two)
  summary = json.loads(results[0][1].strip().splitlines()[-1])
  assert summary["embedded"] == 10 and summary["reused"] == 0
  assert _no_summary(results[1][1])  # one summary, from process 0
  # A rebuild with one shard gone embeds only it, on both processes.
  (two / "embeddings_00001.npy").unlink()
  results = _ok(multihost.run(dense["argv"](two), 2, 2))
  summary = json.loads(results[0][1].strip().splitlines()[-1])
  assert (summary["embedded"], summary["reused"]) == (4, 6)
  _same_dense_index(dense["one"], two)


@pytest.mark.slow
def test_a_failure_on_process_0_stops_both_in_one_line(dense):
  out = dense["dir"] / "not_an_index"
  out.mkdir()
  (out / "notes.txt").write_text("keep me")
  results = multihost.run(dense["argv"](out), 2, 2)
  (code0, _, err0), (code1, _, err1) = results
  assert code0 == 2 and len(err0.strip().splitlines()) == 1, err0
  assert "not an index directory" in err0
  assert code1 == 2 and len(err1.strip().splitlines()) == 1, err1
  assert "process 0 failed while loading the encoder" in err1
  assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("command", [
    ["index", "dense", "--checkpoint", "x", "--corpus", "x", "--output", "x"],
    ["index", "reatt", "--checkpoint", "x", "--corpus", "x", "--output", "x"],
    ["reatt", "iterate", "--gin_file=gin/reatt/tiny.gin", "--corpus", "x",
     "--queries", "x", "--iterations", "1", "--steps-per-iteration", "1"]])
def test_bad_launch_settings_are_one_line_errors(command):
  argv = command + ["--distributed", "--coordinator-address", "127.0.0.1:1"]
  (code, _, err), = multihost.run(argv, 1, 2)
  assert code == 2 and len(err.strip().splitlines()) == 1, err
  assert "--num-processes" in err


# ------------------------------------------------------------------- reatt


def _reatt_model_dir(path, text_maxlength=16):
  model = tiny_model(bi_encoder_layers=1)
  params = model.init_params(0)
  w = np.zeros(4, np.float32)
  w[1] = 1.0  # head 1 retrieves
  params[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS] = jnp.asarray(w)
  path.mkdir(parents=True)
  checkpointing.write_run_config(path, {
      **reatt.run_config_fields(model.reatt), "model": model.config.to_dict(),
      "text_maxlength": text_maxlength})
  shutil.copyfile(bundled_vocab_path(), path / "spiece.model")
  ckpts = checkpointing.RunCheckpoints(str(path))
  ckpts.save(1, {"step": jnp.ones((), jnp.int32), "params": params})
  ckpts.close()
  return path


@pytest.mark.slow
def test_two_processes_write_the_one_process_token_index(tmp_path):
  docs, _ = make_world(num_keys=20, n_context=3)
  write_corpus(tmp_path / "corpus.jsonl", docs)
  model_dir = _reatt_model_dir(tmp_path / "model")
  argv = lambda out: ["index", "reatt", "--checkpoint", str(model_dir),
                      "--corpus", str(tmp_path / "corpus.jsonl"), "--output",
                      str(out), "--batch-size", "4"]
  _ok(multihost.run(argv(tmp_path / "one"), 1, 4))
  results = _ok(multihost.run(argv(tmp_path / "two"), 2, 2))
  one, two = tmp_path / "one", tmp_path / "two"
  keys = np.fromfile(one / "keys.f32", np.float32)
  np.testing.assert_array_equal(keys, np.fromfile(two / "keys.f32",
                                                  np.float32))
  assert keys.size and np.all(np.isfinite(keys))
  _same_files(one, two, STORE_FILES + ("doc_offsets.npy", "bi_encoder.npz",
                                       "spiece.model"))
  assert _meta(one) == _meta(two) and _meta(two)["num_passages"] == 20
  assert json.loads(results[0][1].strip().splitlines()[-1])["head"] == 1
  assert _no_summary(results[1][1])


@pytest.mark.slow
def test_reatt_iterate_runs_a_round_on_two_processes(tmp_path):
  docs, examples = make_world(num_keys=8, n_context=2)
  write_corpus(tmp_path / "corpus.jsonl", docs)
  write_examples(tmp_path / "train.json", examples)
  with open(tmp_path / "queries.jsonl", "w") as f:
    for e in examples:
      f.write(json.dumps({"id": e.id, "question": e.question,
                          "answers": list(e.answers)}) + "\n")
  model_dir = tmp_path / "run"
  argv = ["reatt", "iterate", "--gin_file=gin/reatt/tiny.gin",
          f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.TRAIN_DATA='{tmp_path / 'train.json'}'",
          "--gin.BATCH_SIZE=4", "--gin.N_CONTEXT=2", "--gin.TEXT_MAXLENGTH=16",
          "--gin.ANSWER_MAXLENGTH=4", "--gin.LOG_EVERY=1",
          "--gin.RETRIEVAL_WARMUP_STEPS=0", "--gin.SCHEDULE='constant'",
          "--gin.INDEX_BATCH_SIZE=4", "--gin.MESH='data=4'",
          "--gin.config.T5Config.num_decoder_layers=1",
          "--gin.config.T5Config.d_model=32", "--gin.config.T5Config.d_ff=64",
          "--gin.loop.train.progress=False",
          "--corpus", str(tmp_path / "corpus.jsonl"),
          "--queries", str(tmp_path / "queries.jsonl"), "--iterations", "1",
          "--steps-per-iteration", "1", "--token-top-k", "100000"]
  results = _ok(multihost.run(argv, 2, 2, timeout=1200))
  lines = [json.loads(line) for line in results[0][1].splitlines()
           if line.startswith("{")]
  record, summary = lines[-2], lines[-1]
  assert record["iteration"] == 0 and record["queries"] == 8
  assert summary["complete"] and summary["step"] == 1
  work = model_dir / "iterate"
  assert json.loads((work / "index_0" / "meta.json").read_text())[
      "num_passages"] == 8
  train = json.loads((work / "train_0.json").read_text())
  assert len(train) == 8 and all(len(e["ctxs"]) == 2 for e in train)
  assert _no_summary(results[1][1])
  # A rerun on two processes skips the finished round.
  results = _ok(multihost.run(argv, 2, 2, timeout=1200))
  lines = [json.loads(line) for line in results[0][1].splitlines()
           if line.startswith("{")]
  assert lines[0]["skipped"] is True and lines[-1]["skipped"] == 1
