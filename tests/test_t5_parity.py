"""jaxfid's T5 against transformers' PyTorch T5 on copied (random) weights.

The reference is ``T5ForConditionalGeneration`` loaded from a tiny checkpoint
the test writes (``tests/hf_reference.py``); jaxfid loads the same directory
through its public entry point ``jaxfid.load_t5``.
"""
from __future__ import annotations

import numpy as np
import pytest

import jaxfid
from jaxfid.t5.layers import relative_position_buckets
import hf_reference as ref

torch = pytest.importorskip("torch")  # the PyTorch reference (`torch` extra)

CASES = {
    "v1.0-tied": dict(version="1.0"),
    "v1.1-untied": dict(version="1.1"),
    "v1.1-tied": dict(version="1.1", tied=True),
    "v1.0-untied": dict(version="1.0", tied=False),
    # num_heads * d_kv != d_model, other bucket settings, more layers.
    "v1.1-odd-sizes": dict(version="1.1", d_model=24, d_kv=10, num_heads=3,
                           d_ff=40, num_layers=3, num_decoder_layers=2,
                           relative_attention_num_buckets=16,
                           relative_attention_max_distance=20),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
  directory = tmp_path_factory.mktemp(request.param)
  ref.make_tiny_hf_checkpoint(directory, seed=len(request.param),
                              **CASES[request.param])
  return directory, ref.load_reference_model(directory), jaxfid.load_t5(directory)


def _until_eos(seq):
  """Tokens up to and including the first EOS (HF pads after it with 0 or 1)."""
  seq = list(seq)
  return seq[: seq.index(1) + 1] if 1 in seq else seq


def _assert_same_generation(got, want):
  for g, w in zip(got, want):
    w = _until_eos(w)
    np.testing.assert_array_equal(g[: len(w)], w)
    assert not g[len(w):].any()  # 0 after EOS


def _inputs(vocab, seed=0):
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, vocab, size=(3, 40))
  enc[1, 25:] = 0          # padded example
  enc[2, 6:] = 0           # mostly padding
  dec = rng.integers(2, vocab, size=(3, 9))
  dec[:, 0] = 0
  return enc, dec


def test_logits_match_hf(case):
  _, hf, model = case
  enc, dec = _inputs(model.config.vocab_size)
  want = ref.reference_logits(hf, enc, (enc != 0).astype(np.int64), dec)
  got = np.asarray(model(encoder_input_tokens=enc, decoder_input_tokens=dec))
  assert got.dtype == np.float32 and got.shape == want.shape
  rel = np.abs(got - want).max() / np.abs(want).max()
  assert rel < 1e-5, rel


def test_greedy_matches_hf_generate(case):
  _, hf, model = case
  enc, _ = _inputs(model.config.vocab_size, seed=1)
  with torch.no_grad():
    want = hf.generate(input_ids=torch.as_tensor(enc),
                       attention_mask=torch.as_tensor(enc != 0),
                       max_new_tokens=12, do_sample=False, num_beams=1,
                       use_cache=False)  # HF 5 cache breaks on 2+3 layers
  want = want.numpy()[:, 1:]  # drop the start token
  got = np.asarray(model.generate(enc, max_decode_len=12))
  _assert_same_generation(got, want)


@pytest.mark.parametrize("alpha,early_stopping", [(0.6, False), (2.0, True)])
def test_beam_search_matches_hf(case, alpha, early_stopping):
  _, hf, model = case
  enc, _ = _inputs(model.config.vocab_size, seed=2)
  with torch.no_grad():
    want = hf.generate(input_ids=torch.as_tensor(enc),
                       attention_mask=torch.as_tensor(enc != 0),
                       max_new_tokens=10, do_sample=False, num_beams=4,
                       length_penalty=alpha, early_stopping=early_stopping,
                       use_cache=False)
  want = want.numpy()[:, 1:]
  got = np.asarray(model.generate(enc, max_decode_len=10, num_beams=4,
                                  alpha=alpha, length_penalty_style="hf",
                                  early_stopping=early_stopping))
  _assert_same_generation(got, want)


def test_bfloat16_activations_close_to_float32(case):
  directory, _, model = case
  bf16 = jaxfid.load_t5(directory, dtype="bfloat16")
  enc, dec = _inputs(model.config.vocab_size)
  want = np.asarray(model(encoder_input_tokens=enc, decoder_input_tokens=dec))
  got = np.asarray(bf16(encoder_input_tokens=enc, decoder_input_tokens=dec))
  assert got.dtype == np.float32
  probs = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(
      x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
  # Next-token probabilities within 1e-2 everywhere. Logits: bf16 keeps 8
  # mantissa bits (0.4% per rounding) and random weights make every layer
  # count, so their mean relative error is ~1.5%; bound it at 3%.
  assert np.abs(probs(got) - probs(want)).max() < 1e-2
  assert np.abs(got - want).mean() / np.abs(want).mean() < 3e-2


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_match_hf(bidirectional):
  from transformers.models.t5.modeling_t5 import T5Attention
  for buckets, distance in [(32, 128), (16, 20), (8, 7)]:
    ours = relative_position_buckets(300, 300, bidirectional=bidirectional,
                                     num_buckets=buckets, max_distance=distance)
    rel = torch.arange(300)[None, :] - torch.arange(300)[:, None]
    theirs = T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=buckets,
        max_distance=distance).numpy()
    np.testing.assert_array_equal(ours, theirs)
