"""DPR-style dual-encoder training: data, the in-batch loss, learning, gin.

The learning test uses the demo's generated world (jaxfid.fid.demo_world):
each question asks for one relation of a made-up entity; its positive is the
gold document, its hard negatives the entity's other documents (what BM25
returns for the name). A tiny encoder trained from scratch must rank the gold
document first among all test documents far more often than at random
initialisation.
"""
import json

import gin
import jax
import numpy as np
import pytest

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.commands import gin_flags
from jaxfid.core.errors import InputError
from jaxfid.fid.demo_world import make_demo_data
from jaxfid.t5.config import preset
from jaxfid.dual_encoder import trainer as dense_train
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.data import (
    PairBatcher, parse_example, read_pair_examples)
from jaxfid.dual_encoder.model import (
    DualEncoder, DualEncoderConfig, Embedder, passage_text)
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.training import launch

TINY = preset("tiny", dropout_rate=0.0)


def _fid_records(docs, questions):
  by_entity, by_id = {}, {}
  for doc in docs:
    by_entity.setdefault(doc.title, []).append(doc)
    by_id[doc.id] = doc
  records = []
  for q in questions:
    gold = by_id[q["gold_id"]]
    others = [d for d in by_entity[gold.title] if d.id != gold.id][:3]
    ctxs = [{"title": d.title, "text": d.text, "has_answer": False}
            for d in others[:1]]
    ctxs.append({"title": gold.title, "text": gold.text, "has_answer": True})
    ctxs += [{"title": d.title, "text": d.text, "has_answer": False}
             for d in others[1:]]
    records.append({"question": q["question"], "answers": q["answers"],
                    "ctxs": ctxs})
  return records


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  d = tmp_path_factory.mktemp("dual")
  data = make_demo_data(num_train_entities=40, num_test_entities=8, seed=0)
  train = d / "train.json"
  train.write_text(json.dumps(_fid_records(data["train_docs"],
                                           data["train_questions"])))
  test = d / "test.jsonl"
  test.write_text("".join(json.dumps(r) + "\n" for r in _fid_records(
      data["test_docs"], data["test_questions"])))
  return {"dir": d, "train": train, "test": test, "data": data}


def test_reading_fid_and_dpr_examples(tmp_path):
  fid = {"question": "who?", "answers": ["Ada"],
         "ctxs": [{"title": "a", "text": "nobody here"},
                  {"title": "b", "text": "it was Ada Lovelace"},
                  {"title": "c", "text": "someone else", "has_answer": False}]}
  ex = parse_example("f", 1, fid)
  assert ex.positive == ("b", "it was Ada Lovelace")
  assert ex.hard_negatives == (("a", "nobody here"), ("c", "someone else"))
  no_hit = parse_example("f", 1, dict(fid, answers=["Zed"]))
  assert no_hit.positive == ("a", "nobody here")
  assert len(no_hit.hard_negatives) == 2
  dpr = {"question": "q", "positive_ctxs": [{"title": "p", "text": "pos"}],
         "negative_ctxs": [{"title": "n", "text": "neg"}],
         "hard_negative_ctxs": []}
  assert parse_example("f", 1, dpr).hard_negatives == (("n", "neg"),)
  assert parse_example("f", 1, dict(dpr, positive_ctxs=[])) is None
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(fid) + "\n" + json.dumps({"ctxs": []}) + "\n")
  with pytest.raises(InputError, match=":2: missing 'question'"):
    read_pair_examples(path)


def test_batches_and_in_batch_loss(world):
  examples = read_pair_examples(world["train"])
  tokenizer = load_tokenizer()
  batcher = PairBatcher(examples, tokenizer, batch_size=4, hard_negatives=2,
                        query_maxlength=12, passage_maxlength=16, seed=3)
  batch = batcher.batch(5)
  assert batch["query_tokens"].shape == (4, 12)
  assert batch["passage_tokens"].shape == (12, 16)
  assert batch["passage_mask"].all()
  np.testing.assert_array_equal(batcher.batch(5)["passage_tokens"],
                                batch["passage_tokens"])
  first = examples[int(batcher.indices(5)[0])]
  want = tokenizer.encode(passage_text(*first.positive))
  assert batch["passage_tokens"][0, :len(want)].tolist() == want
  lonely = PairBatcher([e.__class__(e.question, e.positive, ())
                        for e in examples], tokenizer, batch_size=4,
                       hard_negatives=1, query_maxlength=12,
                       passage_maxlength=16)
  lonely_batch = lonely.batch(0)
  assert lonely_batch["passage_mask"].tolist() == [True, False] * 4
  # the loss is the cross-entropy over every passage of the batch
  encoder = DualEncoder(TINY.replace(num_layers=1),
                        DualEncoderConfig(normalize=True))
  params = encoder.init_params(0)
  loss, metrics = jax.jit(lambda p, b: dense_train.contrastive_loss(
      encoder, p, b, temperature=0.5))(params, batch)
  embed = jax.jit(encoder.embed, static_argnames="tower")
  q = embed(params, batch["query_tokens"], tower="query")
  p = embed(params, batch["passage_tokens"])
  logits = np.asarray(q @ p.T) / 0.5
  logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  np.testing.assert_allclose(loss, -logp[np.arange(4), [0, 3, 6, 9]].mean(),
                             rtol=1e-5)
  assert 0 <= metrics["accuracy"] <= 1 and metrics["mean_rank"] >= 1


def _top1(encoder, params, tokenizer, data) -> float:
  embedder = Embedder(encoder, params, tokenizer, batch_size=64)
  docs = data["test_docs"]
  p = embedder.embed([passage_text(d.title, d.text) for d in docs],
                     max_length=24)
  q = embedder.embed([x["question"] for x in data["test_questions"]], "query",
                     max_length=16)
  best = np.argmax(q @ p.T, axis=1)
  gold = {d.id: i for i, d in enumerate(docs)}
  return float(np.mean([best[k] == gold[x["gold_id"]]
                        for k, x in enumerate(data["test_questions"])]))


def test_training_learns_and_writes_a_model_dir(world, tmp_path):
  model_dir = tmp_path / "model"
  result = dense_train.train(
      model_dir=str(model_dir), train_data=str(world["train"]),
      eval_data=str(world["test"]), model_config=TINY, train_steps=30,
      batch_size=16, query_maxlength=16, passage_maxlength=24,
      learning_rate=1e-3, schedule="constant", eval_every=30, log_every=15,
      checkpoint_every=30, mesh="data=2", progress=False)
  assert result["step"] == 30 and result["best"]
  lines = [json.loads(x) for x in
           (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert [x["step"] for x in lines if "loss" in x] == [15, 30]
  config = json.loads((model_dir / "jaxfid_config.json").read_text())
  assert config["method"] == "dual_encoder"
  assert config["model"]["num_decoder_layers"] == 0
  loaded = load_dual_encoder(model_dir)
  assert loaded.kind == "dual_encoder"
  tokenizer = loaded.tokenizer
  untrained = DualEncoder(TINY, DualEncoderConfig())
  before = _top1(untrained, untrained.init_params(0), tokenizer,
                 world["data"])
  after = _top1(loaded.encoder, loaded.params, tokenizer, world["data"])
  print(f"test top-1: {before:.3f} untrained, {after:.3f} trained")
  assert after > 0.6 and after > before + 0.3, (before, after)
  assert result["eval_top1"] > 0.6
  # the encoder also loads as a plain jaxfid model (ReFusion reads it so)
  from jaxfid.checkpoints.load import load_checkpoint
  model, params, _ = load_checkpoint(str(model_dir))
  np.testing.assert_allclose(params["encoder"]["encoder_norm"]["scale"],
                             loaded.params["encoder"]["encoder_norm"]["scale"])


def test_gin_file_trains_one_step_from_a_hf_encoder(world, tmp_path):
  # dual_encoder_tiny.gin includes dual_encoder_base.gin: both parse
  hf = make_tiny_hf_checkpoint(tmp_path / "hf", vocab_size=32128, d_model=16,
                               d_kv=4, d_ff=32, num_heads=2, num_layers=1,
                               num_decoder_layers=1)
  shrink = ["config.T5Config.d_model = 16", "config.T5Config.d_kv = 4",
            "config.T5Config.d_ff = 32", "config.T5Config.num_heads = 2",
            "config.T5Config.num_layers = 1"]
  bindings = shrink + [
      f"MODEL_DIR = '{tmp_path / 'm'}'", f"TRAIN_DATA = '{world['train']}'",
      "TRAIN_STEPS = 1", "BATCH_SIZE = 8", "QUERY_MAXLENGTH = 8",
      "PASSAGE_MAXLENGTH = 12", "DTYPE = 'float32'", "REMAT = 'none'",
      "MESH = 'data=2'", f"INIT_CHECKPOINT = '{hf}'",
      "dense_train.train.progress = False"]
  gin_flags.parse_gin(["gin/retrieval/dual_encoder_tiny.gin"], bindings)
  try:
    result = gin.get_configurable(launch.run)()
  finally:
    gin.clear_config()
  assert result["step"] == 1 and result["loss"] > 0
  assert (tmp_path / "m" / "checkpoints" / "1").is_dir()
  start = load_dual_encoder(hf).params["encoder"]["encoder_norm"]["scale"]
  trained = load_dual_encoder(tmp_path / "m").params
  np.testing.assert_allclose(trained["encoder"]["encoder_norm"]["scale"],
                             start, atol=2e-3)  # one step of lr 1e-3
  other = DualEncoder(TINY, DualEncoderConfig())
  with pytest.raises(InputError, match="differs from the run's in d_model"):
    dense_train.initial_params(other, str(hf), seed=0)
