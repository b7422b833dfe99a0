"""The dual encoder's ahead-of-time hooks (``jaxfid bench compile``).

``abstract_batch`` is checked against a real ``prepare`` + ``batch`` on a
small FiD file (some questions without enough hard negatives, so masked
rows are in it); the train step (plain and GradCache accumulation) and the
encoding program lower (fast tier) and compile (slow tier) on the simulated
CPU devices with the loop's shardings after ``prepare_shapes`` alone, with
data files that do not exist.
"""
from __future__ import annotations

import json

import pytest

from method_aot import (MISSING, assert_same_shapes, configured, lower_decode,
                        lower_phases)

GIN = "gin/retrieval/dual_encoder_tiny.gin"
SMALL = ["BATCH_SIZE = 8", "HARD_NEGATIVES = 2", "QUERY_MAXLENGTH = 8",
         "PASSAGE_MAXLENGTH = 12", "config.T5Config.num_layers = 1",
         "MESH = 'data=2,fsdp=2,model=2'", "loop.train.progress = False"]


def _records(n=10):
  out = []
  for i in range(n):
    ctxs = [{"title": f"t{i}", "text": f"gold passage {i}",
             "has_answer": True}]
    # every third question has a single negative: its second row is masked
    ctxs += [{"title": f"n{i}{j}", "text": f"other passage {i} {j}",
              "has_answer": False} for j in range(1 if i % 3 == 0 else 3)]
    out.append({"question": f"question number {i}?", "answers": ["x"],
                "ctxs": ctxs})
  return out


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("aot_dual") / "train.json"
  path.write_text(json.dumps(_records()))
  return path


def test_abstract_batch_is_the_real_batch(train_file, tmp_path):
  task, settings, _ = configured(GIN, SMALL + [
      f"MODEL_DIR = '{tmp_path / 'm'}'", f"TRAIN_DATA = '{train_file}'",
      f"EVAL_DATA = '{train_file}'"])
  p = task.prepare(settings)
  for step in (0, 1):
    host = task.batch(p, step, slice(0, settings.batch_size), None)
    assert not host["passage_mask"].all()   # masked rows are covered
    assert_same_shapes(task.abstract_batch(p, 0), host)
  with pytest.raises(ValueError):
    task.abstract_batch(p, 1)
  evaluator = p.evaluator   # the evaluation's tokens, 4 rows at a time
  assert_same_shapes(task.decode_program(p, 4)[1], {
      "query_tokens": evaluator.query_tokens[:4],
      "passage_tokens": evaluator.passage_tokens[:4]})


def _configured(extra):
  return configured(GIN, SMALL + list(extra) + [
      f"MODEL_DIR = '{MISSING}/m'", f"TRAIN_DATA = '{MISSING}/train.json'",
      f"EVAL_DATA = '{MISSING}/eval.json'"])


def test_lowers_from_the_configuration_alone():
  task, settings, optimizer = _configured([])
  p = task.prepare_shapes(settings)
  (train,) = lower_phases(task, p, optimizer)
  assert "mean_rank" in train.out_info[1]
  queries, passages = lower_decode(task, p, batch_size=4).out_info
  assert queries.shape == passages.shape == (4, p.model.dim)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    [], ["ACCUMULATION_STEPS = 2", "SHARED = False", "PROJECTION_DIM = 8"]],
    ids=["plain", "grad_cache_dpr"])
def test_compiles_from_the_configuration_alone(extra):
  task, settings, optimizer = _configured(extra)
  p = task.prepare_shapes(settings)
  (train,) = lower_phases(task, p, optimizer)
  assert train.compile().memory_analysis() is not None
  queries, passages = lower_decode(task, p, batch_size=4).compile().out_info
  assert queries.shape == passages.shape == (4, p.model.dim)


DISTILL = "gin/retrieval/distill_tiny.gin"


def test_distill_abstract_batch_is_the_real_batch_and_lowers(tmp_path):
  """The distillation objective: B*N passages and their gold scores (a
  question with fewer than N passages has masked rows); its train step, with
  GradCache accumulation, lowers from the configuration alone."""
  records = _records()
  for r in records:
    for j, c in enumerate(r["ctxs"]):
      c["score"] = -float(j)
  train = tmp_path / "scored.json"
  train.write_text(json.dumps(records))
  small = SMALL + ["N_CONTEXT = 3"]
  task, settings, _ = configured(DISTILL, small + [
      f"MODEL_DIR = '{tmp_path / 'm'}'", f"TRAIN_DATA = '{train}'"])
  p = task.prepare(settings)
  host = task.batch(p, 0, slice(0, settings.batch_size), None)
  assert host["passage_tokens"].shape[0] == 3 * settings.batch_size
  assert_same_shapes(task.abstract_batch(p, 0), host)
  task, settings, optimizer = configured(DISTILL, small + [
      "ACCUMULATION_STEPS = 2", f"MODEL_DIR = '{MISSING}/m'",
      f"TRAIN_DATA = '{MISSING}/train.json'"])
  p = task.prepare_shapes(settings)
  (step,) = lower_phases(task, p, optimizer)
  assert "mean_rank" in step.out_info[1]
