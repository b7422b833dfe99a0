"""Parity of jaxfid.t5.decoding with HF transformers ``generate`` (torch T5).

A tiny random ``T5ForConditionalGeneration`` (float32, CPU) provides the
logits: ``tokens_to_logits`` calls it on the whole decoder prefix through
``jax.pure_callback`` (the cache holds the encoder ids and the prefix), so
this checks the decoding algorithms independently of jaxfid's Flax T5.
Skipped when torch or transformers is missing.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.t5 import decoding

EOS = 1


def _tiny_t5(vocab, batch, src_len, dec_len):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(1)
  cfg = transformers.T5Config(
      vocab_size=vocab, d_model=16, d_kv=8, d_ff=32, num_layers=2,
      num_decoder_layers=2, num_heads=2, decoder_start_token_id=0,
      pad_token_id=0, eos_token_id=EOS, dropout_rate=0.0,
      tie_word_embeddings=False)
  model = transformers.T5ForConditionalGeneration(cfg).eval()
  rng = np.random.default_rng(0)
  inputs = rng.integers(2, vocab, size=(batch, src_len))
  with torch.no_grad():
    # Sharper, input-dependent distributions than the default init, and an
    # EOS row aligned with the mean final hidden state so that beams end at
    # varied lengths.
    for name, p in model.named_parameters():
      if "layer_norm" not in name:
        p.normal_(0.0, 1.0)
    dec = torch.tensor(rng.integers(0, vocab, size=(batch, dec_len)))
    out = model(input_ids=torch.tensor(inputs), decoder_input_ids=dec,
                output_hidden_states=True)
    mean = out.decoder_hidden_states[-1].reshape(-1, cfg.d_model).mean(0)
    model.lm_head.weight[EOS] = 6.0 * mean / (mean @ mean)
  return torch, model, inputs


VOCAB, SRC_LEN, MAX_LEN = 40, 5, 8
BATCH = 3  # of the 4 built; these 3 stop early under different settings


class _DecoderCalls:
  """Counts forward calls of a torch module (one per decoding step)."""

  def __init__(self, module):
    self.count = 0
    module.register_forward_hook(self._hook)

  def _hook(self, *args):
    del args
    self.count += 1

  def during(self, fn):
    before = self.count
    result = fn()
    return result, self.count - before


@pytest.fixture(scope="module")
def t5():
  """(torch, model, encoder ids, tokens_to_logits, cache, decoder calls)."""
  torch, model, inputs = _tiny_t5(VOCAB, 4, SRC_LEN, MAX_LEN)
  inputs = inputs[:BATCH]
  calls = _DecoderCalls(model.decoder)

  def np_logits(input_ids, prefix, index):
    with torch.no_grad():
      out = model(
          input_ids=torch.tensor(np.asarray(input_ids), dtype=torch.long),
          decoder_input_ids=torch.tensor(
              np.asarray(prefix)[:, :int(index) + 1], dtype=torch.long))
    return out.logits[:, -1].float().numpy()

  def tokens_to_logits(state):
    # The cache holds the encoder ids and the decoder prefix; the torch model
    # recomputes the whole prefix each step (no torch cache).
    c = state.cache
    prefix = c["prefix"].at[:, state.cur_index].set(state.cur_token)
    logits = jax.pure_callback(
        np_logits, jax.ShapeDtypeStruct((prefix.shape[0], VOCAB), jnp.float32),
        c["input_ids"], prefix, state.cur_index)
    return logits, {"input_ids": c["input_ids"], "prefix": prefix}

  cache = {"input_ids": jnp.asarray(inputs, jnp.int32),
           "prefix": jnp.zeros((BATCH, MAX_LEN + 1), jnp.int32)}
  return torch, model, torch.tensor(inputs), tokens_to_logits, cache, calls


def _until_eos(seq):
  seq = [int(x) for x in seq]
  return seq[:seq.index(EOS) + 1] if EOS in seq else seq


def test_greedy_matches_generate(t5):
  torch, model, ids, tokens_to_logits, cache, calls = t5
  hf, hf_steps = calls.during(lambda: model.generate(
      input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
      num_beams=1, max_new_tokens=MAX_LEN))
  hf = hf.numpy()[:, 1:]
  (tokens, lengths), steps = calls.during(lambda: jax.block_until_ready(
      decoding.greedy_decode(tokens_to_logits, cache, batch_size=BATCH,
                             max_decode_len=MAX_LEN)))
  assert steps == hf_steps
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  want = [_until_eos(row) for row in hf]
  assert any(EOS in row for row in want)
  for b in range(BATCH):
    assert _until_eos(tokens[b]) == want[b]
    assert lengths[b] == len(want[b])
    assert (tokens[b, len(want[b]):] == 0).all()


def test_beam_search_matches_generate(t5):
  torch, model, ids, tokens_to_logits, cache, calls = t5
  k = 4
  outputs, saw_eos, steps = set(), False, set()
  for alpha, early_stopping in [(0.6, True), (0.6, False), (0.6, "never"),
                                (2.0, True), (2.0, False), (1.0, False),
                                (1.0, "never")]:
    out, hf_steps = calls.during(lambda: model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
        num_beams=k, num_return_sequences=k, length_penalty=alpha,
        early_stopping=early_stopping, max_new_tokens=MAX_LEN,
        output_scores=True, return_dict_in_generate=True))
    hf_seqs = out.sequences.numpy()[:, 1:].reshape(BATCH, k, -1)
    hf_scores = out.sequences_scores.numpy().reshape(BATCH, k)

    def ours():
      result = decoding.beam_search(
          tokens_to_logits, cache, batch_size=BATCH, num_beams=k,
          max_decode_len=MAX_LEN, alpha=alpha, length_penalty_style="hf",
          early_stopping=early_stopping)
      jax.block_until_ready(result)
      return result
    (tokens, scores), our_steps = calls.during(ours)
    # Same number of steps: the loops stop at the same time.
    assert our_steps == hf_steps, (alpha, early_stopping)
    steps.add(our_steps)
    tokens = np.asarray(tokens)
    got = [[_until_eos(tokens[b, j]) for j in range(k)] for b in range(BATCH)]
    want = [[_until_eos(hf_seqs[b, j]) for j in range(k)]
            for b in range(BATCH)]
    assert got == want, (alpha, early_stopping)
    np.testing.assert_allclose(np.asarray(scores), hf_scores, rtol=1e-5,
                               atol=1e-4)
    # After EOS we pad with 0 (HF 5.x pads with EOS here).
    for b, j in itertools.product(range(BATCH), range(k)):
      assert (tokens[b, j, len(got[b][j]):] == 0).all()
    outputs.add(str(want))
    saw_eos |= any(EOS in seq for seqs in want for seq in seqs)
  assert saw_eos
  # The settings really lead to different results and stopping times.
  assert len(outputs) > 2 and len(steps) > 1
