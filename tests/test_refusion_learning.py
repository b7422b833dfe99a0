"""ReFusion learns what only the retrieved neighbours know.

The synthetic task of ``benchmarks/refusion_world.py``: 16+16 training
items with made-up names and 200 test items never seen in training, whose
labels can only be read from the database's sentences about them (found by
the database's own random encoder: precision at k=4 ~0.99). Four real CLI
runs of ``gin/refusion/tiny.gin`` (a d_model-32 T5 from scratch, 60 steps
of batch 8) on the same data:

* the plain backbone (``FUSION_MODULES='none'``): chance, it can only
  memorise the training names;
* ReFusion, key/value fusion in every encoder layer, one fixed scheme
  (the reranker) and the bi-level search (architecture learning rate 0.1,
  so that the short search decides: at 0.01 one seed of five discretised
  to a structure scoring 0.55);
* the concatenation baseline (neighbour sentences appended): the same
  information as text, a sanity reference.

The database holds the random encoder's vectors at its own scale (norm
~5.7), and ``tiny.gin`` trains the fusion parameters at 10x the backbone's
learning rate (``FUSION_LR_SCALE``). Seed 0 (2026-12-01): plain 0.565,
reranker 0.995, search 1.0, concatenation 0.99. With the fusion parameters
at the backbone's rate the reranker scored 0.815 and the search 0.825, and
with the vectors added as stored (``FUSED_NORM='none'``, before issue #17)
the reranker 0.555 (``benchmarks/RESULTS.md``).
"""
from __future__ import annotations

import json
import pathlib

import pytest

from jaxfid.cli import main
from jaxfid.refusion import lmbff
import refusion_world as syn

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEED = 0
TOP_K = 4
MODEL = ["config.T5Config.d_model=32", "config.T5Config.d_kv=8",
         "config.T5Config.d_ff=64"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  d = tmp_path_factory.mktemp("refusion_learning")
  task = syn.make_task(SEED, test_per_class=100, sentences_per_item=TOP_K)
  data = syn.write_task(task, d / "data")
  db = syn.build_database(data / syn.SENTENCE_FILE, d / "database")
  return task, data, db, d


def _train(world, name: str, extra: list[str]) -> dict:
  _, data, db, d = world
  model_dir = d / name
  args = ["train", f"--gin_file={ROOT / 'gin/refusion/tiny.gin'}",
          f"--gin.MODEL_DIR='{model_dir}'", "--gin.TASK='sst-2'",
          f"--gin.DATA_DIR='{data}'", f"--gin.RETRIEVAL_DB='{db}'",
          f"--gin.TOP_K={TOP_K}", f"--gin.SEED={SEED}", "--gin.TRAIN_STEPS=60",
          "--gin.EVAL_EVERY=30", "--gin.CHECKPOINT_EVERY=1000",
          "--gin.MAX_LENGTH=32", "--gin.MESH='data=1'",
          "--gin.loop.train.progress=False"]
  args += [f"--gin.{b}" for b in MODEL + extra]
  assert main(args) == 0
  lines = [json.loads(l) for l in
           (model_dir / "metrics.jsonl").read_text().splitlines()]
  return [l for l in lines if "test_accuracy" in l][-1]


def test_the_text_alone_tells_nothing_about_a_test_label(world):
  task, data, _, _ = world
  spec = lmbff.get_task("sst-2")
  splits = {s: lmbff.read_split(spec, data, s) for s in syn.SPLITS}
  assert [len(splits[s]) for s in syn.SPLITS] == [32, 32, 200]
  for examples in splits.values():
    assert sum(e.label for e in examples) * 2 == len(examples)  # balanced
  seen = {i.name for s in ("train", "dev") for i in task.items[s]}
  seen_words = {w for name in seen for w in name.split()}
  for item, example in zip(task.items["test"], splits["test"]):
    assert item.name in example.text_a and item.name not in seen
    assert not set(item.name.split()) & seen_words  # no shared name word
  # Every test sentence's frame is used by both labels in training.
  frames = lambda split, label: {
      s.replace(i.name, "{name}") for (s, l), i in
      zip(task.examples[split], task.items[split]) if l == label}
  assert frames("test", 0) | frames("test", 1) <= (
      frames("train", 0) & frames("train", 1))


def test_the_database_encoder_finds_each_items_own_sentences(world):
  task, _, db, _ = world
  rates = syn.retrieval_hit_rate(task, db, TOP_K)
  assert rates["hit_at_1"] >= 0.98 and rates["precision"] >= 0.95
  assert rates["label_precision"] >= rates["precision"]


@pytest.mark.slow
def test_fusion_beats_the_backbone_where_only_neighbours_know(world):
  runs = {
      "plain": ["FUSION_MODULES='none'", "RETRIEVAL_DB=None"],
      "reranker": ["FUSION_MODULES='key,value'", "SEARCH=False",
                   "FUSION_SCHEME='reranker'"],
      "search": ["FUSION_MODULES='key,value'", "SEARCH=True",
                 "ARCH_LEARNING_RATE=0.1"],
      "concat": ["FUSION_MODULES='none'", "CONCAT_NEIGHBOURS=True",
                 "MAX_LENGTH=128"],
  }
  results = {name: _train(world, name, extra) for name, extra in runs.items()}
  acc = {name: r["test_accuracy"] for name, r in results.items()}
  print(acc)
  assert all(r["test_examples"] == 200 for r in results.values())
  assert acc["plain"] <= 0.65                          # chance: 0.5
  for fused in ("reranker", "search"):
    assert acc[fused] >= 0.8, acc
    assert acc[fused] >= acc["plain"] + 0.25, acc
  assert acc["concat"] >= 0.8, acc


def test_the_task_is_a_function_of_its_seed(tmp_path):
  a, b = syn.make_task(3, test_per_class=5), syn.make_task(3, test_per_class=5)
  assert a == b and a != syn.make_task(4, test_per_class=5)
  syn.write_task(a, tmp_path / "one")
  syn.write_task(b, tmp_path / "two")
  for name in ("train.tsv", "dev.tsv", "test.tsv", syn.SENTENCE_FILE):
    assert ((tmp_path / "one" / name).read_bytes()
            == (tmp_path / "two" / name).read_bytes())
  rows = a.row_items()
  assert (rows >= 0).all() and len(rows) == 4 * 2 * (16 + 16 + 5)
  for i, item in enumerate(a.all_items()):
    assert len(item.rows) == 4 and (rows[list(item.rows)] == i).all()
    for r in item.rows:
      sentence = a.sentences[r]
      assert sentence.startswith(item.name + " was ")
      assert any(p in sentence for p in syn.PHRASES[item.label])
      assert not any(p in sentence for p in syn.PHRASES[1 - item.label])
  with pytest.raises(ValueError, match="phrases_per_sentence"):
    syn.make_task(0, phrases_per_sentence=6)
