"""The reader's attention over passage tokens while it generates an answer
(jaxfid/reader/attention.py, EncoderDecoderModel.answer_attention): on an
absolute scale, its first position the reader score, its rows per question."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader import attention, predict
from jaxfid.reader.examples import FidExample, Passage
from jaxfid.reader.inputs import encode_example
from jaxfid.reader.load import LoadedReader
from jaxfid.retrieval.store.corpus import Passage as StoredPassage
from jaxfid.serving.batcher import Batcher
from jaxfid.serving.commands.serve_app import ServerState, build_app
from jaxfid.serving.metrics import Metrics
from jaxfid.serving.service import QaService
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel, shift_right

CONFIG = T5Config(vocab_size=32128, d_model=32, d_kv=8, d_ff=48, num_heads=4,
                  num_layers=2, num_decoder_layers=2,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                  dropout_rate=0.0)


@pytest.fixture(scope="module")
def model_params():
  return EncoderDecoderModel.create(CONFIG, seed=5)


@pytest.fixture(scope="module")
def tokenizer():
  return Tokenizer()


def _batch(tokenizer, passages=("the cat sat", "a dog ran far away", "red")):
  example = FidExample(question="what sat?", ctxs=tuple(
      Passage(id=f"d{k}", title=f"t{k}", text=text, score=3.0 - k)
      for k, text in enumerate(passages)))
  tokens, mask = encode_example(tokenizer, example, 4, 24, True)
  pad = np.zeros_like(tokens)
  return example, {"encoder_input_tokens": np.stack([tokens, pad]),
                   "passage_mask": np.stack([mask, np.zeros_like(mask)])}


def test_each_answer_position_sums_to_1_and_the_first_is_the_reader_score(
    model_params, tokenizer):
  model, params = model_params
  _, batch = _batch(tokenizer)
  answer = np.array([[5, 9, 1, 0], [1, 0, 0, 0]], np.int32)
  got = np.asarray(model.answer_attention(
      params, batch["encoder_input_tokens"], answer,
      passage_mask=batch["passage_mask"]))
  assert got.shape == (2, 4, 4 * 24)
  np.testing.assert_allclose(got[0].sum(-1), 1.0, atol=1e-5)
  assert np.all(got[0].reshape(4, 4, 24)[:, 3] == 0)  # the padding passage
  scores = np.asarray(model.passage_scores(
      params, batch["encoder_input_tokens"],
      passage_mask=batch["passage_mask"]))
  np.testing.assert_allclose(got[0, 0].reshape(4, 24).sum(-1), scores[0],
                             atol=1e-6)
  # a later position: the layers' and heads' mean of the softmax, by hand
  net = model.network(params)
  enc = model.encode(net, jnp.asarray(batch["encoder_input_tokens"]),
                     jnp.asarray(batch["passage_mask"]))
  _, dec = net.decode(enc.hidden, enc.mask, shift_right(answer),
                      output_attention_logits=True)
  want = np.mean([np.asarray(jax.nn.softmax(c, -1)).mean(1)
                  for c in dec.cross_attention_logits], 0)
  np.testing.assert_allclose(got[0, 2], want[0, 2], atol=1e-6)


def test_rows_are_tokens_with_shares_that_sum_to_each_passage_weight(
    model_params, tokenizer):
  model, params = model_params
  _, batch = _batch(tokenizer)
  answer = np.array([[tokenizer.encode("cat")[0], 1, 0, 0], [1, 0, 0, 0]],
                    np.int32)
  weights = attention.make_attention_fn(model)(
      params, jax.tree.map(jnp.asarray, batch), jnp.asarray(answer))
  row, = attention.attention_rows(tokenizer, weights, answer, batch, real=1)
  assert row["answer_tokens"] == [" cat", "</s>"]
  assert len(row["passages"]) == 3  # the padding passage left out
  first = row["passages"][0]
  assert "".join(first["tokens"]) == (
      " question: what sat? title: t0 context: the cat sat</s>")
  for p in row["passages"]:
    assert len(p["weights"]) == len(p["tokens"])
    assert [len(r) for r in p["by_answer_token"]] == [len(p["tokens"])] * 2
    assert sum(p["weights"]) == pytest.approx(p["weight"], abs=1e-5)
    np.testing.assert_allclose(np.mean(p["by_answer_token"], 0),
                               p["weights"], atol=2e-6)
  assert sum(p["weight"] for p in row["passages"]) == pytest.approx(1, abs=1e-5)
  scores = np.asarray(model.passage_scores(
      params, batch["encoder_input_tokens"],
      passage_mask=batch["passage_mask"]))[0, :3]
  np.testing.assert_allclose(
      [sum(p["by_answer_token"][0]) for p in row["passages"]], scores,
      atol=1e-5)


def test_generate_with_attention_gives_generate_s_answers(model_params,
                                                          tokenizer):
  model, params = model_params
  example, _ = _batch(tokenizer)
  other = FidExample(question="q?", ctxs=(Passage(title="t", text="words", score=1.0, id="x"),))
  kwargs = dict(n_context=4, text_maxlength=24, answer_maxlength=3,
                batch_size=1)
  answers, rows = attention.generate_with_attention(
      model, params, tokenizer, [example, other], **kwargs)
  assert answers == predict.generate(model, params, tokenizer,
                                     [example, other], progress=False,
                                     **kwargs)
  assert [[p["id"] for p in r["passages"]] for r in rows] == [
      ["d0", "d1", "d2"], ["x"]]
  assert all(1 <= len(r["answer_tokens"]) <= 3 for r in rows)


class _Searcher:
  """Finds one passage for any question."""
  store = [StoredPassage("d0", "Zorvane", "Zorvane's pet is a cat.")]

  def search(self, questions, k):
    return [[(0, 3.5)] for _ in questions]


def test_the_serve_api_returns_the_attention_only_when_asked(model_params,
                                                             tokenizer):
  """`jaxfid serve`'s service and routes over a real Batcher reading with
  the tiny model (no socket): "attention": true adds the answer's tokens
  and each passage's token shares; without it the response is as before."""
  pytest.importorskip("starlette")
  from test_serve_http import _call  # pylint: disable=import-outside-toplevel
  model, params = model_params
  reader = LoadedReader(model, params, tokenizer, True)
  batcher = Batcher(reader, n_context=2, text_maxlength=24,
                    decode_maxlength=3, beam_sizes=(1,), max_batch=1,
                    max_wait_ms=0)
  assert batcher.compile() == 1
  batcher.start()
  service = QaService(_Searcher(), batcher, n_context=2, beam_size=1)
  app = build_app(ServerState(Metrics(batcher.buckets), service))
  try:
    question = {"question": "what is the pet of Zorvane?"}
    status, plain, _ = _call(app, "POST", "/v1/answer",
                             json.dumps(question).encode())
    status_2, read, _ = _call(app, "POST", "/v1/answer", json.dumps(
        {**question, "attention": True}).encode())
    status_3, batch, _ = _call(app, "POST", "/v1/answer:batch", json.dumps(
        {"questions": [question["question"]], "attention": True}).encode())
  finally:
    batcher.close()
    service.close()
  assert status == status_2 == status_3 == 200
  assert "answer_tokens" not in plain
  assert all("attention" not in p for p in plain["passages"])
  assert read["answer"] == plain["answer"]
  assert 1 <= len(read["answer_tokens"]) <= 3
  passage, = read["passages"]
  shares = passage["attention"]
  assert "".join(shares["tokens"]).startswith(" question: what is the pet")
  assert shares["weight"] == pytest.approx(1, abs=1e-5)  # the only passage
  assert sum(shares["by_answer_token"][0]) == pytest.approx(
      passage["reader_score"], abs=1e-5)
  assert batch["answers"][0]["passages"][0]["attention"] == shares
