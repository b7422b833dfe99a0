"""ReFusion's two ways of classifying a split (issue #27 item 4): rank
classification and the original T5 script's generation with exact match."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.core.tokenization import EOS_ID, Tokenizer
from jaxfid.refusion import fusion as F
from jaxfid.refusion import lmbff
from jaxfid.refusion.model import ReFusionModel
from jaxfid.refusion.scoring import SplitScorer, predicted_classes
from jaxfid.t5.config import preset
from jaxfid.t5.model import shift_right

SPEC = lmbff.get_task("sst-2", "original_t5")      # negative / positive


def _row(tokenizer, *pieces, width=4):
  ids = [i for p in pieces for i in (tokenizer.encode(p) if isinstance(p, str)
                                     else [p])]
  return (ids + [0] * width)[:width]


def test_generated_text_is_matched_to_a_label_word_as_the_original():
  """decode(skip_special_tokens=True), then strip().lower() equality: case
  and sentinels do not count, anything else that is no label word is -1."""
  tok = Tokenizer()
  rows = np.array([
      _row(tok, "positive", EOS_ID),
      _row(tok, "Negative", EOS_ID),
      _row(tok, tok.sentinel_id(0), "positive", EOS_ID),   # sentinel skipped
      _row(tok, "positive", "sentiment"),                  # two words
      _row(tok, EOS_ID, "positive"),                       # nothing before EOS
      _row(tok, "great", EOS_ID),                          # another task's word
  ], np.int32)
  assert predicted_classes(SPEC, tok, rows) == [1, 0, 1, -1, -1, -1]


class _Generator:
  """A stand-in model: 'positive' for inputs starting with token 5, else
  'negative' (or unrelated text where the input starts with token 7)."""

  def __init__(self, tok):
    self.fusion = "stub"
    self.rows = jnp.asarray(np.array([_row(tok, "negative", EOS_ID),
                                      _row(tok, "positive", EOS_ID),
                                      _row(tok, "bad", EOS_ID)], np.int32))

  def generate(self, params, batch, max_decode_len):
    first = batch["encoder_input_tokens"][:, 0]
    which = jnp.where(first == 5, 1, jnp.where(first == 7, 2, 0))
    return self.rows[which][:, :max_decode_len]


def test_split_scorer_generates_and_matches_exact_label_words():
  tok = Tokenizer()
  first = np.array([5, 5, 3, 7, 3, 5, 7])
  arrays = {"test": {
      "encoder_input_tokens": np.stack([first, first], 1).astype(np.int32),
      "decoder_target_tokens": np.zeros((7, 2), np.int32),
      "labels": np.array([1, 0, 0, 1, 0, 1, 0], np.int32)}}
  scorer = SplitScorer("f1", np.zeros((2, 2), np.int32), arrays,
                       lambda p, b, r: b, batch_size=3, scoring="generate",
                       generate_tokens=2, spec=SPEC, tokenizer=tok)
  scores = scorer(_Generator(tok), {}, "test",
                  lambda b: jax.tree.map(jnp.asarray, b))
  # predictions 1, 1, 0, -1, 0, 1, -1: 4 of 7 right; TP 2, FP 1, FN 1
  assert scores["accuracy"] == pytest.approx(4 / 7)
  assert scores["f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
  with pytest.raises(ValueError, match="needs the task"):
    SplitScorer("f1", np.zeros((2, 2), np.int32), arrays, None, 3,
                scoring="generate")


@pytest.mark.slow  # compiles greedy decoding of a tiny fused T5
def test_generation_fuses_the_neighbours_as_ranking_does():
  """The first generated token is the argmax of the teacher-forced logits
  at the first position, with the same neighbours fused."""
  cfg = dataclasses.replace(preset("tiny"), dropout_rate=0.0, vocab_size=64,
                            d_model=16, d_kv=4, d_ff=32, num_heads=2)
  fusion = F.FusionConfig(modules="key,value", top_k=3, db_dim=16,
                          scheme="reranker", fused_norm="rms")
  model = ReFusionModel(cfg, fusion)
  params = model.init_params(0)
  rng = np.random.default_rng(0)
  batch = {"encoder_input_tokens": jnp.asarray(
               rng.integers(2, 64, (4, 6)), jnp.int32),
           "neighbours": jnp.asarray(rng.normal(size=(4, 1, 3, 16)) * 5,
                                     jnp.float32)}
  tokens = model.generate(params, batch, 3)                     # [B, 3]
  net = model.network(params)
  extras = model.make_extras(batch)
  enc = model.encode(net, batch["encoder_input_tokens"], extras=extras)
  logits, _ = net.decode(enc.hidden, enc.mask, shift_right(tokens),
                         extras=extras)                          # [B, 3, V]
  np.testing.assert_array_equal(tokens[:, 0], jnp.argmax(logits[:, 0], -1))
  # and the neighbours do change those logits
  zero = model.make_extras(dict(batch, neighbours=0 * batch["neighbours"]))
  enc0 = model.encode(net, batch["encoder_input_tokens"], extras=zero)
  logits0, _ = net.decode(enc0.hidden, enc0.mask, shift_right(tokens),
                          extras=zero)
  assert not np.allclose(logits[:, 0], logits0[:, 0], atol=1e-3)


def test_original_t5_inputs_carry_no_eos():
  """The original T5 script encodes its source with add_special_tokens=False:
  under TEMPLATES='original_t5' the inputs have no EOS (and the prompt may
  use that token); the other template sets end every input with EOS."""
  from jaxfid.refusion import template_sets
  from jaxfid.refusion.batches import label_token_matrix
  from jaxfid.refusion.data import encode_splits
  tok = Tokenizer()
  ex = lmbff.Example("a fine film .", None, 1, "x:1")
  rows = {}
  for templates in ("paper", "original_t5"):
    spec = lmbff.get_task("sst-2", templates)
    rows[templates] = encode_splits(
        spec, {"train": [ex]}, tok, label_token_matrix(spec.label_words, tok),
        max_length=32, retrieval_db=None, top_k=1, fused=False, hidden=False,
        concat_neighbours=False, neighbour_cache=None, progress=False,
        input_eos=template_sets.input_eos(templates))["train"][
            "encoder_input_tokens"][0]
  t5 = tok.encode(lmbff.render_input(SPEC, ex))
  np.testing.assert_array_equal(rows["original_t5"][:len(t5)], t5)
  assert not np.any(rows["original_t5"][len(t5):])
  paper = tok.encode(lmbff.render_input(lmbff.TASKS["sst-2"], ex))
  np.testing.assert_array_equal(rows["paper"][:len(paper) + 1],
                                paper + [EOS_ID])
