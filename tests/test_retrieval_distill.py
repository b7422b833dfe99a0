"""FiD-KD: a dual encoder distilled from the reader's passage scores.

The loss against its formula computed by hand (and torch's KLDivLoss when
torch is importable), the direction of its gradient, and the contract
command on tiny scored data, whose retriever `jaxfid index dense` embeds
with.
"""
import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tiny_fid
from jaxfid.cli import main
from jaxfid.commands import gin_flags
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.distill_data import (ScoredBatcher,
                                              read_scored_examples)
from jaxfid.dual_encoder.distill_loss import distill_loss
from jaxfid.dual_encoder.model import (
    DualEncoder, DualEncoderConfig, Embedder, passage_text)
from jaxfid.dual_encoder.step import make_contrastive_step
from jaxfid.retrieval.search import open_index
from jaxfid.t5.config import preset
from jaxfid.training.task import train_state

TINY = preset("tiny", dropout_rate=0.0)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _by_hand(q, p, mask, gold, tg=1.0, ts=1.0, reduction="mean"):
  """The formula, question by question, over its valid passages."""
  b, d = q.shape
  n = p.shape[0] // b
  total, count = 0.0, 0
  for i in range(b):
    rows = [i * n + j for j in range(n) if mask[i * n + j]]
    s = p[rows] @ q[i] / np.sqrt(d)
    logp = _log_softmax(s / ts)
    t = np.exp(_log_softmax(gold[rows] / tg))
    total += np.sum(t * (np.log(t) - logp))
    count += len(rows)
  return total / (count if reduction == "mean" else b)


def _random(seed, b=3, n=4, d=8):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(b, d)).astype(np.float32),
          rng.normal(size=(b * n, d)).astype(np.float32),
          (3 * rng.normal(size=b * n)).astype(np.float32))


@pytest.mark.parametrize("tg, ts, reduction", [
    (1.0, 1.0, "mean"), (0.5, 2.0, "mean"), (1.0, 1.0, "batchmean")])
def test_loss_is_the_formula(tg, ts, reduction):
  q, p, gold = _random(0)
  mask = np.ones(len(p), bool)
  mask[[3, 6, 7]] = False          # questions with 3, 2 and 4 passages
  got, metrics = distill_loss(jnp.asarray(q), jnp.asarray(p),
                              jnp.asarray(mask), jnp.asarray(gold),
                              temperature_gold=tg, temperature_score=ts,
                              reduction=reduction)
  np.testing.assert_allclose(float(got), _by_hand(q, p, mask, gold, tg, ts,
                                                  reduction), rtol=1e-5)
  assert 1.0 <= float(metrics["mean_rank"]) <= 4.0


@pytest.mark.filterwarnings("ignore:reduction")  # torch's note on 'mean'
def test_loss_equals_torch_kldivloss():
  torch = pytest.importorskip("torch")
  q, p, gold = _random(1)
  b, d = q.shape
  # FiD's Retriever: score = einsum(q, p) / sqrt(d); KLDivLoss()(log_softmax
  # (score), softmax(gold)), default reduction 'mean'
  tq, tp = torch.tensor(q), torch.tensor(p).view(b, -1, d)
  score = torch.einsum("bd,bid->bi", tq, tp) / np.sqrt(d)
  want = torch.nn.KLDivLoss()(torch.log_softmax(score, dim=-1),
                              torch.softmax(torch.tensor(gold).view(b, -1),
                                            dim=-1))
  got, _ = distill_loss(jnp.asarray(q), jnp.asarray(p),
                        jnp.ones(len(p), bool), jnp.asarray(gold))
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)


def test_in_batch_negatives_widen_the_softmax_only():
  q, p, gold = _random(2)
  b, d = q.shape
  n = p.shape[0] // b
  mask = np.ones(len(p), bool)
  got, _ = distill_loss(jnp.asarray(q), jnp.asarray(p), jnp.asarray(mask),
                        jnp.asarray(gold), in_batch_negatives=True)
  s = q @ p.T / np.sqrt(d)                                   # [B, B*N]
  logp = _log_softmax(s)
  total = 0.0
  for i in range(b):
    t = np.exp(_log_softmax(gold[i * n:(i + 1) * n]))
    total += np.sum(t * (np.log(t) - logp[i, i * n:(i + 1) * n]))
  np.testing.assert_allclose(float(got), total / (b * n), rtol=1e-5)


def test_one_sgd_step_raises_the_readers_best_passage():
  encoder = DualEncoder(TINY, DualEncoderConfig(query_maxlength=8,
                                                passage_maxlength=12))
  params = encoder.init_params(0)
  rng = np.random.default_rng(0)
  b, n = 2, 4
  batch = {"query_tokens": rng.integers(2, 300, (b, 8)).astype(np.int32),
           "passage_tokens": rng.integers(2, 300, (b * n, 12)).astype(
               np.int32),
           "passage_mask": np.ones(b * n, bool),
           # the reader prefers passage 2 of question 0, passage 1 of 1
           "gold_scores": np.array([0, 0, 5, 0, 0, 5, 0, 0], np.float32)}
  loss_fn = lambda q, p, bt: distill_loss(q, p, bt["passage_mask"],
                                          bt["gold_scores"])
  step = jax.jit(make_contrastive_step(encoder, optax.sgd(1.0), seed=0,
                                       loss_fn=loss_fn))

  def margins(w):
    q = encoder.embed(w, batch["query_tokens"], tower="query")
    p = encoder.embed(w, batch["passage_tokens"]).reshape(b, n, -1)
    s = np.asarray(jnp.einsum("bnd,bd->bn", p, q))
    best = [2, 1]
    return np.array([s[i, best[i]] - np.delete(s[i], best[i]).max()
                     for i in range(b)])

  before = margins(params)
  state, metrics = step(train_state(params, 0, opt_state=optax.sgd(1.0).init(
      params)), batch)
  after = margins(state["params"])
  assert np.all(after > before), (before, after)
  _, again = step(state, batch)
  assert float(again["loss"]) < float(metrics["loss"])


def _scored(n, passages, seed=0):
  rng = np.random.default_rng(seed)
  records = tiny_fid.examples(n, passages)
  for r in records:
    for c in r["ctxs"]:
      c["score"] = float(rng.normal())
  return records


def test_reading_scored_data(tmp_path):
  path = tiny_fid.write_json(tmp_path / "s.json", _scored(6, 5))
  examples = read_scored_examples(path, n_context=3)
  assert len(examples) == 6 and all(len(e.passages) == 3 for e in examples)
  raw = json.loads(path.read_text())
  assert examples[0].scores == tuple(
      sorted((c["score"] for c in raw[0]["ctxs"]), reverse=True)[:3])
  batcher = ScoredBatcher(examples, load_tokenizer(None), batch_size=2,
                          n_context=4, query_maxlength=8,
                          passage_maxlength=16)
  batch = batcher.batch(5)
  assert batch["passage_tokens"].shape == (8, 16)
  assert batch["passage_mask"].tolist() == [True] * 3 + [False] + \
      [True] * 3 + [False]
  assert batch["gold_scores"].dtype == np.float32
  np.testing.assert_array_equal(batcher.batch(5, slice(1, 2))["gold_scores"],
                                batch["gold_scores"][4:])
  raw[2]["ctxs"][1].pop("score")
  bad = tiny_fid.write_json(tmp_path / "bad.json", raw)
  with pytest.raises(InputError, match="record 3: a passage without a "
                     "numeric 'score'.*--scored-data"):
    read_scored_examples(bad, n_context=3)


def test_the_retriever_trains_over_the_readers_best_n(tmp_path):
  """FiD's Dataset sorts ctxs by score, descending and stable, before
  ``[:n_context]`` (src/data.py:24,45,64-68): the reader's top N."""
  record = {"question": "q", "answers": ["a"], "ctxs": [
      {"title": f"t{i}", "text": f"p{i}", "score": s}
      for i, s in enumerate([0.1, 0.9, -2.0, 0.5, 0.9, 3.0])]}
  path = tiny_fid.write_json(tmp_path / "s.json", [record])
  [example] = read_scored_examples(path, n_context=4)
  assert [t for _, t in example.passages] == ["p5", "p1", "p4", "p3"]
  assert example.scores == (3.0, 0.9, 0.9, 0.5)
  assert example.scores == tuple(sorted(
      (c["score"] for c in record["ctxs"]), reverse=True)[:4])
  # a passage beyond N without a score: the sort needs them all, as FiD's
  record["ctxs"][5].pop("score")
  bad = tiny_fid.write_json(tmp_path / "bad.json", [record])
  with pytest.raises(InputError, match="record 1: a passage without"):
    read_scored_examples(bad, n_context=4)


def test_distill_base_binds_the_originals_retriever_options():
  """The FiD README's train_retriever.py command, and src/options.py's
  defaults for what it does not set (--weight_decay 0.1: options.py:30)."""
  gin_flags.parse_gin(["gin/retrieval/distill_base.gin"], ["MODEL_DIR = 'x'"])
  try:
    macros = {m: gin.query_parameter(f"%{m}") for m in (
        "LEARNING_RATE", "OPTIMIZER", "SCHEDULE", "WEIGHT_DECAY",
        "DROPOUT_RATE", "WARMUP_STEPS", "N_CONTEXT", "TRAIN_STEPS",
        "QUERY_MAXLENGTH", "PASSAGE_MAXLENGTH")}
  finally:
    gin.clear_config()
  assert macros == {"LEARNING_RATE": 1e-4, "OPTIMIZER": "adamw",
                    "SCHEDULE": "linear", "WEIGHT_DECAY": 0.1,
                    "DROPOUT_RATE": 0.1, "WARMUP_STEPS": 1000,
                    "N_CONTEXT": 100, "TRAIN_STEPS": 20000,
                    "QUERY_MAXLENGTH": 40, "PASSAGE_MAXLENGTH": 200}
  # distill_tiny.gin's larger rate keeps the original's decay per step
  gin_flags.parse_gin(["gin/retrieval/distill_tiny.gin"], ["MODEL_DIR = 'x'"])
  try:
    tiny = (gin.query_parameter("%LEARNING_RATE")
            * gin.query_parameter("%WEIGHT_DECAY"))
  finally:
    gin.clear_config()
  assert tiny == pytest.approx(1e-4 * 0.1)


@pytest.mark.slow  # ~16 s; the fast tier trains distill_tiny.gin one step
# on a mesh with accumulation in test_gin_configs.py
def test_the_contract_command_trains_and_index_dense_embeds_with_it(
    tmp_path, capsys):
  data = tiny_fid.write_json(tmp_path / "train_scored.json", _scored(8, 4))
  ret = tmp_path / "ret"
  assert main(["train", "--gin_file=gin/retrieval/distill_tiny.gin",
               f"--gin.MODEL_DIR='{ret}'", f"--gin.TRAIN_DATA='{data}'",
               "--gin.TRAIN_STEPS=3", "--gin.LOG_EVERY=1",
               "--gin.CHECKPOINT_EVERY=3"]) == 0
  lines = [json.loads(x) for x in (ret / "metrics.jsonl").read_text()
           .splitlines() if '"loss"' in x]
  assert [x["step"] for x in lines] == [1, 2, 3]
  assert all(np.isfinite(x["loss"]) and x["loss"] >= 0 for x in lines)
  config = json.loads((ret / "jaxfid_config.json").read_text())
  assert config["objective"] == "distill" and config["n_context"] == 4
  assert config["kl_reduction"] == "mean" and config["scale_by_sqrt_dim"]
  corpus = tmp_path / "corpus.tsv"
  corpus.write_text("id\ttext\ttitle\n" + "".join(
      f"{i}\tthe thing {i} is {w}\tdoc {i}\n"
      for i, w in enumerate(tiny_fid.WORDS)))
  capsys.readouterr()
  assert main(["index", "dense", "--checkpoint", str(ret), "--corpus",
               str(corpus), "--output", str(tmp_path / "index")]) == 0
  loaded = load_dual_encoder(ret)
  untrained = DualEncoder(loaded.encoder.config, loaded.encoder.settings)
  searcher = open_index(tmp_path / "index")
  vectors = searcher.vectors([0, 1, 2])
  store = searcher.store
  # the run's passage format ('fid': "title: T context: P")
  assert loaded.encoder.settings.passage_format == "fid"
  texts = [passage_text(store.title(i), store.text(i), "fid")
           for i in (0, 1, 2)]
  np.testing.assert_allclose(
      vectors, Embedder(loaded.encoder, loaded.params,
                        loaded.tokenizer).embed(texts), atol=1e-5)
  for seed in (0, 1):   # not an untrained encoder's
    fresh = Embedder(untrained, untrained.init_params(seed),
                     loaded.tokenizer).embed(texts)
    assert not np.allclose(vectors, fresh, atol=1e-4)
