"""An Atlas joint run on 2 processes x 2 CPU devices (gloo on 127.0.0.1)
equals the 1-process 4-device run of the same command.

The run (gin/atlas/tiny.gin, tiny sizes): pdist's retriever gradient, the
reader started from INIT_CHECKPOINT (a FiD MODEL_DIR) and the retriever from
INIT_RETRIEVER (a dual encoder MODEL_DIR), each restored on every process's
first device and placed from there on the mesh across processes, a
refresh of the sharded index after step 2, evaluations with the in-loop
recall at steps 2 and 4, checkpoints at 2 and 4. The two-process run logs
the same losses and evaluation lines, saves the same index and writes the
same run files (process 0 alone; all processes write their checkpoint
parts). Stopped before its checkpoint of step 4, a rerun on two processes
loads the saved index of step 2 (each process reading its own devices'
rows) and ends as the uninterrupted run.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import multihost
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.dual_encoder.checkpoint import dual_encoder_run_config
from jaxfid.dual_encoder.model import DualEncoder, DualEncoderConfig
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from reatt_world import make_world, write_corpus, write_examples

SIZES = ("TRAIN_STEPS=4", "EVAL_EVERY=2", "CHECKPOINT_EVERY=2", "LOG_EVERY=1",
         "REFRESH_EVERY=2", "MESH='data=4'", "BATCH_SIZE=8", "N_CONTEXT=2",
         "TEXT_MAXLENGTH=16", "ANSWER_MAXLENGTH=4", "QUERY_MAXLENGTH=8",
         "PASSAGE_MAXLENGTH=8", "INDEX_BATCH_SIZE=8", "EVAL_BATCH_SIZE=4",
         "TEMPERATURE_GOLD=0.1", "TEMPERATURE_SCORE=0.1",
         "config.T5Config.d_model=32", "config.T5Config.d_ff=64",
         "config.T5Config.num_layers=1", "config.T5Config.num_decoder_layers=1",
         "loop.train.progress=False")
# The run's files that process 0 alone writes (beside its checkpoints).
RUN_FILES = ("jaxfid_config.json", "spiece.model", "metrics.jsonl",
             "eval/predictions_2.jsonl", "eval/predictions_4.jsonl",
             "atlas_index/2/meta.json", "atlas_index/2/embeddings.npy")


def _ok(results):
  for code, _, err in results:
    assert code == 0, err[-3000:]
  return results


def _records(model_dir) -> list[dict]:
  with open(model_dir / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


def _losses(model_dir) -> dict[str, float]:
  """``"<step> <name>"``: each step's loss, reader_loss, retriever_loss."""
  return {f"{r['step']} {k}": r[k] for r in _records(model_dir) if "loss" in r
          for k in ("loss", "reader_loss", "retriever_loss")}


def _evals(model_dir) -> list[tuple]:
  return [(r["step"], r["eval_em"], r["eval_recall@1"], r["eval_recall@5"],
           r["eval_recall@20"]) for r in _records(model_dir)
          if "eval_em" in r]


def _refreshed(model_dir) -> list[int]:
  return [r["step"] for r in _records(model_dir) if "index_refreshed" in r]


def _run_files(model_dir) -> list[str]:
  """Every file but the checkpoints' and TensorBoard's, relative."""
  out = []
  for root, _, files in os.walk(model_dir):
    rel = os.path.relpath(root, model_dir)
    if rel.split(os.sep)[0] not in ("checkpoints", "best", "tb"):
      out += [os.path.normpath(os.path.join(rel, f)) for f in files]
  return sorted(out)


def _model_dir(path, run_config: dict, params):
  checkpointing.write_run_config(path, run_config)
  ckpts = checkpointing.RunCheckpoints(str(path))
  ckpts.save(1, {"step": np.ones((), np.int32), "params": params})
  ckpts.close()
  return path


def _reader(path):
  """A FiD MODEL_DIR of the run's reader (INIT_CHECKPOINT): tiny.gin's T5
  with SIZES' widths and depths."""
  config = T5Config(d_model=32, d_kv=16, d_ff=64, num_heads=4, num_layers=1,
                    num_decoder_layers=1, feed_forward_proj="gated-gelu",
                    tie_word_embeddings=False, dropout_rate=0.0)
  return _model_dir(path, {"method": "fid", "model": config.to_dict()},
                    EncoderDecoderModel(config).init_params(3))


def _dual_encoder(path):
  """A tiny dual encoder MODEL_DIR (INIT_RETRIEVER)."""
  config = T5Config(d_model=32, d_kv=8, d_ff=64, num_heads=2, num_layers=1,
                    num_decoder_layers=1, dropout_rate=0.0)
  encoder = DualEncoder(config, DualEncoderConfig())
  return _model_dir(path, dual_encoder_run_config(encoder),
                    encoder.init_params(7))


@pytest.mark.slow
def test_two_processes_train_atlas_as_one(tmp_path):
  docs, examples = make_world(num_keys=24, n_context=2)
  write_corpus(tmp_path / "corpus.jsonl", docs)
  write_examples(tmp_path / "train.json", examples)
  write_examples(tmp_path / "dev.json", examples[:8])
  reader, dual = _reader(tmp_path / "fid"), _dual_encoder(tmp_path / "dual")
  argv = lambda model_dir: [
      "train", "--gin_file=gin/atlas/tiny.gin",
      f"--gin.MODEL_DIR='{model_dir}'",
      f"--gin.CORPUS='{tmp_path / 'corpus.jsonl'}'",
      f"--gin.TRAIN_DATA='{tmp_path / 'train.json'}'",
      f"--gin.EVAL_DATA='{tmp_path / 'dev.json'}'",
      "--gin.RETRIEVER_LOSS='pdist'", f"--gin.INIT_CHECKPOINT='{reader}'",
      f"--gin.INIT_RETRIEVER='{dual}'",
      *(f"--gin.{s}" for s in SIZES)]
  one, two = tmp_path / "one", tmp_path / "two"
  _ok(multihost.run(argv(one), 1, 4))
  results = _ok(multihost.run(argv(two), 2, 2))

  want = _losses(one)
  assert [k for k in want if k.endswith(" loss")] == [
      f"{s} loss" for s in (1, 2, 3, 4)]
  assert all(want[f"{s} retriever_loss"] > 0 for s in (1, 2, 3, 4))
  assert _losses(two) == pytest.approx(want, rel=1e-5)
  assert _evals(two) == _evals(one) and [e[0] for e in _evals(one)] == [2, 4]
  assert _refreshed(two) == _refreshed(one) == [0, 2]
  assert _run_files(two) == _run_files(one)
  assert set(RUN_FILES) <= set(_run_files(two))
  index = "atlas_index/2/embeddings.npy"
  assert (two / index).read_bytes() == (one / index).read_bytes()
  final = json.loads(results[0][1].strip().splitlines()[-1])
  assert final["step"] == 4 and "eval_recall@20" in final
  assert not [line for line in results[1][1].splitlines()
              if line.startswith("{")]  # one summary, from process 0

  # Stopped before step 4's checkpoint: the rerun on two processes loads
  # the index of step 2 (each process its devices' rows) and ends the same.
  resumed = tmp_path / "resumed"
  shutil.copytree(two, resumed)
  shutil.rmtree(resumed / "checkpoints" / "4")
  _ok(multihost.run(argv(resumed), 2, 2))
  assert _losses(resumed) == pytest.approx(want, rel=1e-5)
  assert _evals(resumed) == _evals(one)
  assert _refreshed(resumed) == [0, 2]  # loaded, not rebuilt
