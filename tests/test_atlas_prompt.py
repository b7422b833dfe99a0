"""PROMPT_FORMAT against Atlas's released code on a hand-built example: the
reader's rows, the target and the retriever's query are the tokens Atlas
builds (its strings written out by hand from src/options.py's
``--qa_prompt_format`` / ``--encoder_format``, src/tasks/qa.py's target and
src/atlas.py's ``"</s>"``, tokenised by Hugging Face's T5 tokenizer as
Atlas's ``encode_passages`` / ``reader_tokenize`` / ``retriever_tokenize``
call it); the gold scores count the sentinel; the answer loses it before
EM (evaluate.py: ``decode(..., skip_special_tokens=True)``)."""
from __future__ import annotations

import gzip
import os
import types

import jax
import numpy as np
import pytest

from jaxfid.atlas import gold, prompts
from jaxfid.atlas.batches import AtlasBatcher
from jaxfid.atlas.retrieval import InLoopRetriever
from jaxfid.core.tokenization import Tokenizer, encode_padded
from jaxfid.evaluation import qa
from jaxfid.reader import predict as fid_predict
from jaxfid.reader.examples import FidExample
from jaxfid.retrieval.store.corpus import Passage
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel, shift_right
from method_aot import configured

DATA = os.path.join(os.path.dirname(__file__), "data")
L, T, Q = 32, 8, 16
QUESTION, ANSWER = "who wrote hamlet?", "William Shakespeare"
PASSAGES = [Passage("7", "Hamlet", "Hamlet is a tragedy by Shakespeare."),
            Passage("9", "Macbeth", "Macbeth is a play about a king.")]
# Atlas's strings for this example, written out by hand
ATLAS_ROWS = ["question: who wrote hamlet? answer: <extra_id_0> title: Hamlet "
              "context: Hamlet is a tragedy by Shakespeare.",
              "question: who wrote hamlet? answer: <extra_id_0> title: Macbeth "
              "context: Macbeth is a play about a king."]
ATLAS_TARGET = "<extra_id_0> William Shakespeare</s>"
ATLAS_QUERY = "question: who wrote hamlet? answer: <extra_id_0>"
FID_ROWS = ["question: who wrote hamlet? title: Hamlet context: Hamlet is a "
            "tragedy by Shakespeare.",
            "question: who wrote hamlet? title: Macbeth context: Macbeth is a "
            "play about a king."]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  """Hugging Face's T5 tokenizer (the published tokenizer.json)."""
  transformers = pytest.importorskip("transformers")
  path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
  with gzip.open(os.path.join(DATA, "t5_tokenizer.json.gz"), "rb") as src:
    path.write_bytes(src.read())
  return transformers.T5TokenizerFast(tokenizer_file=str(path))


def _batch(prompt_format: str) -> dict:
  tok = Tokenizer()
  example = FidExample(question=QUESTION, answers=(ANSWER,), id="0")
  batcher = AtlasBatcher(
      [example], PASSAGES, encode_padded(tok, [p.text for p in PASSAGES], 8),
      np.zeros((1, Q), np.int32), tok, batch_size=1, n_context=2,
      text_maxlength=L, target_maxlength=T, prompt_format=prompt_format)
  return batcher.batch(0, slice(0, 1), np.array([[0, 1]]),
                       np.array([[2.0, 1.0]]))


def _query_tokens(prompt_format: str) -> np.ndarray:
  retriever = types.SimpleNamespace(
      model=types.SimpleNamespace(atlas=types.SimpleNamespace(
          prompt_format=prompt_format)),
      tokenizer=Tokenizer(), query_maxlength=Q)
  return InLoopRetriever.query_tokens(retriever, [QUESTION])[0]


def test_the_reader_rows_target_and_query_are_atlas_tokens(hf):
  batch = _batch("atlas")
  # encode_passages: padding to max_length, truncation, EOS appended
  rows = hf(ATLAS_ROWS, max_length=L, padding="max_length", truncation=True)
  np.testing.assert_array_equal(batch["encoder_input_tokens"][0],
                                rows["input_ids"])
  # reader_tokenize: "</s>" appended, add_special_tokens=False
  target = hf([ATLAS_TARGET], max_length=T, padding="max_length",
              truncation=True, add_special_tokens=False)["input_ids"][0]
  np.testing.assert_array_equal(batch["decoder_target_tokens"][0], target)
  assert target[0] == Tokenizer().sentinel_id(0) == 32099
  # retriever_tokenize: the same query string
  query = hf([ATLAS_QUERY], max_length=Q, padding="max_length",
             truncation=True)["input_ids"][0]
  np.testing.assert_array_equal(_query_tokens("atlas"), query)


def test_fid_rows_stay_an_option(hf):
  batch = _batch("fid")
  rows = hf(FID_ROWS, max_length=L, padding="max_length", truncation=True)
  np.testing.assert_array_equal(batch["encoder_input_tokens"][0],
                                rows["input_ids"])
  target = hf([ANSWER], max_length=T, padding="max_length",
              truncation=True)["input_ids"][0]
  np.testing.assert_array_equal(batch["decoder_target_tokens"][0], target)
  query = hf([QUESTION], max_length=Q, padding="max_length",
             truncation=True)["input_ids"][0]
  np.testing.assert_array_equal(_query_tokens("fid"), query)


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_the_gold_scores_count_the_sentinel(hf):
  """PDist, LOOP and EMDR^2 on the batch equal Atlas's formulas over
  Atlas's labels of the hand-built target: the sentinel, the answer, EOS."""
  model = EncoderDecoderModel(T5Config(
      vocab_size=32128, d_model=8, d_kv=4, d_ff=16, num_heads=2,
      num_layers=1, num_decoder_layers=1, dropout_rate=0.0,
      feed_forward_proj="gated-gelu", tie_word_embeddings=False))
  params = model.init_params(1)
  batch = _batch("atlas")
  tokens, mask = batch["encoder_input_tokens"], batch["passage_mask"]
  labels = np.array(hf([ATLAS_TARGET], add_special_tokens=False)["input_ids"])
  n = labels.shape[1]                                   # 32099, answer, EOS
  assert labels[0, 0] == 32099 and labels[0, -1] == 1
  targets = batch["decoder_target_tokens"]
  args = (model, params, tokens, mask, targets)
  pdist = np.asarray(jax.jit(gold.pdist_gold, static_argnums=0)(*args))
  loop = np.asarray(jax.jit(gold.loop_gold, static_argnums=0)(*args))
  emdr = np.asarray(jax.jit(
      lambda *a: gold.emdr_token_logprobs(model, *a, temperature_gold=0.5))(
          *args[1:]))
  for k in range(2):
    logp = _log_softmax(model.jit_logits(params, tokens[:, k],
                                         shift_right(labels)))[0]  # [n, V]
    own = logp[np.arange(n), labels[0]]                            # [n]
    # perplexity_score: -sum(token loss) / number of labels
    assert pdist[0, k] == pytest.approx(own.mean(), rel=1e-4)
    tempered = _log_softmax(logp / 0.5)   # log_softmax(logits / 0.5)
    np.testing.assert_allclose(emdr[0, k, :n],
                               tempered[np.arange(n), labels[0]], rtol=1e-4)
    other = _log_softmax(model.jit_logits(
        params, tokens[:, 1 - k:2 - k], shift_right(labels)))[0]
    # loop_score: the mean token loss without passage k
    assert loop[0, k] == pytest.approx(
        -other[np.arange(n), labels[0]].mean(), rel=1e-4)


def test_the_answer_loses_the_sentinel_before_em(hf):
  tok = Tokenizer()
  generated = [0, tok.sentinel_id(0), *tok.encode(ANSWER), 1]
  text = tok.decode(generated)
  assert text == "<extra_id_0> William Shakespeare"
  # Atlas: reader_tokenizer.decode(g, skip_special_tokens=True)
  atlas = hf.decode(generated, skip_special_tokens=True)
  assert prompts.answer(text, "atlas") == atlas == ANSWER
  assert qa.exact_match(prompts.answer(text, "atlas"), [ANSWER]) == 1.0
  assert qa.exact_match(text, [ANSWER]) == 0.0
  assert prompts.answer(text, "fid") == text


@pytest.mark.parametrize("prompt_format, em", [("atlas", 1.0), ("fid", 0.0)])
def test_the_atlas_task_scores_answers_without_sentinels(
    tmp_path, monkeypatch, prompt_format, em):
  fillers = [Passage(str(i), f"Play {i}", f"Play {i} is a comedy.")
             for i in range(20, 40)]  # eval_recall@20 needs 20 passages
  (tmp_path / "corpus.tsv").write_text(
      "id\ttext\ttitle\n" + "".join(f"{p.id}\t{p.text}\t{p.title}\n"
                                    for p in PASSAGES + fillers))
  (tmp_path / "qa.jsonl").write_text(
      f'{{"question": "{QUESTION}", "answers": ["{ANSWER}"]}}\n')
  task, settings, _ = configured("gin/atlas/tiny.gin", [
      f"MODEL_DIR = '{tmp_path / 'run'}'",
      f"CORPUS = '{tmp_path / 'corpus.tsv'}'",
      f"TRAIN_DATA = '{tmp_path / 'qa.jsonl'}'",
      f"EVAL_DATA = '{tmp_path / 'qa.jsonl'}'", "N_CONTEXT = 2",
      "ANSWER_MAXLENGTH = None", f"PROMPT_FORMAT = '{prompt_format}'"])
  p = task.prepare(settings)
  words = len(Tokenizer().encode(ANSWER))
  # targets padded to the longest one: the sentinel, the answer, EOS
  assert p.reader.target_length == words + 1 + (prompt_format == "atlas")
  monkeypatch.setattr(fid_predict, "make_predict_fn", lambda *a, **k: None)
  monkeypatch.setattr(fid_predict, "generate",
                      lambda *a, **k: [f"<extra_id_0> {ANSWER}"])
  placement = types.SimpleNamespace(replicated=None, shard=None,
                                    eval_batch_size=lambda b: b)
  got = p.reader.evaluator(str(tmp_path), 0, None, placement)
  assert got["eval_em"] == em


def test_a_run_config_without_prompt_format_was_trained_on_fid_rows():
  from jaxfid.atlas.checkpoint import model_from_run_config
  from jaxfid.atlas.config import AtlasConfig
  from jaxfid.dual_encoder.model import DualEncoderConfig
  config = T5Config(vocab_size=64, d_model=8, d_kv=4, d_ff=16, num_heads=2,
                    num_layers=1, num_decoder_layers=1)
  atlas = AtlasConfig(corpus="c").to_dict()
  run = {"model": config.to_dict(), "atlas": atlas,
         "retriever": {"model": config.to_dict(),
                       "dual_encoder": DualEncoderConfig().to_dict()}}
  assert model_from_run_config(run).atlas.prompt_format == "atlas"
  del atlas["prompt_format"]
  assert model_from_run_config(run).atlas.prompt_format == "fid"
