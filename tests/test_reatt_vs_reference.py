"""ReAtt's loss, gradients and first Adam steps against a PyTorch reference
on copied weights.

The reference (``tests/reatt_reference.py``) follows the original training
code (jzbjyb/FiD ``src/model.py``) on an HF T5; jaxfid loads the same
checkpoint through ``jaxfid.load_t5``. Equal losses and gradients mean a
difference in what the two learn comes from elsewhere than the model and
its loss (issue #27 item 9).
"""
from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import jaxfid
from hf_reference import make_tiny_hf_checkpoint, require_torch
from jaxfid.checkpoints import names
from jaxfid.reatt import model as reatt
from jaxfid.training.step import make_train_step
from jaxfid.training.task import train_state

B, P, L, T = 2, 3, 12, 4
BI_ENCODER_LAYERS, TAU, ALPHA = 2, 0.001, 8.0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  require_torch()
  return make_tiny_hf_checkpoint(tmp_path_factory.mktemp("reatt_ref"),
                                 version="1.1", num_layers=3, seed=3)


def _batch(vocab: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, vocab, size=(B, P, L))
  question_length = np.array([4, 5])
  tokens[0, 1, 9:] = 0   # rows of different lengths
  tokens[1, 2, 7:] = 0
  decoder_input = rng.integers(2, vocab, size=(B, T))
  decoder_input[:, 0] = 0
  targets = rng.integers(2, vocab, size=(B, T))
  targets[1, 3] = 0      # a padded target
  return tokens, question_length, decoder_input, targets


def _jax_batch(tokens, question_length, decoder_input, targets) -> dict:
  return {"encoder_input_tokens": tokens.astype(np.int32),
          "question_length": question_length.astype(np.int32),
          "decoder_input_tokens": decoder_input.astype(np.int32),
          "decoder_target_tokens": targets.astype(np.int32)}


@pytest.mark.parametrize("position_bias", [False, True])
def test_reatt_loss_and_gradients_equal_the_reference(checkpoint,
                                                      position_bias):
  torch, transformers = require_torch()
  from reatt_reference import reatt_loss
  hf = transformers.T5ForConditionalGeneration.from_pretrained(
      checkpoint, attn_implementation="eager").eval()
  loaded = jaxfid.load_t5(checkpoint)
  heads = loaded.config.num_heads
  weights = np.array([0.001, -0.0005, 0.0015, 0.0], np.float32)[:heads]
  tokens, qlen, dec_in, targets = _batch(loaded.config.vocab_size)

  head_weights = torch.tensor(weights, requires_grad=True)
  want = reatt_loss(hf, torch.tensor(tokens), torch.tensor(qlen),
                    torch.tensor(dec_in), torch.tensor(targets),
                    bi_encoder_layers=BI_ENCODER_LAYERS,
                    head_weights=head_weights, tau=TAU, kl_weight=ALPHA,
                    position_bias=position_bias)
  want["loss"].backward()

  model = reatt.ReAttModel(loaded.config, reatt.ReAttConfig(
      bi_encoder_layers=BI_ENCODER_LAYERS, head_temperature=TAU,
      position_bias=position_bias))
  params = reatt.add_head_weights(loaded.params, heads)
  params[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS] = weights
  batch = _jax_batch(tokens, qlen, dec_in, targets)
  (loss, metrics), grads = jax.jit(jax.value_and_grad(
      lambda p: model.loss(p, batch, kl_weight=ALPHA), has_aux=True))(params)

  for key, got in (("loss", loss), ("qa_loss", metrics["qa_loss"]),
                   ("kl_loss", metrics["kl_loss"])):
    np.testing.assert_allclose(float(got), want[key].item(), rtol=1e-5,
                               err_msg=key)
  assert want["kl_loss"].item() > 1e-3  # the KL term takes part
  np.testing.assert_allclose(grads[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS],
                             head_weights.grad.numpy(), rtol=1e-4, atol=1e-5)
  torch_grads = {n: t.grad for n, t in hf.named_parameters()}
  flat = names.flatten(reatt.t5_part(grads))
  assert len(flat) == len(torch_grads)
  for path, g in flat.items():
    rename = names.to_hf(path)
    ref = torch_grads[rename.hf]
    assert ref is not None, rename.hf
    scale = float(np.abs(ref.numpy()).max()) + 1e-12
    np.testing.assert_allclose(rename.to_hf(np.asarray(g)) / scale,
                               ref.numpy() / scale, atol=2e-5,
                               err_msg=f"{path} ({rename.hf})")


def test_reatt_training_follows_the_reference(checkpoint):
  """Five Adam steps (clipped at 1, as ``benchmarks/reatt_vs_pytorch.py``
  trains both) from the same weights on the same batches: the losses and
  the trained weights agree, so the two trainers part only where float
  noise grows (the benchmark: after about 50 steps)."""
  torch, transformers = require_torch()
  from reatt_reference import reatt_loss
  hf = transformers.T5ForConditionalGeneration.from_pretrained(
      checkpoint, attn_implementation="eager").eval()  # dropout off
  loaded = jaxfid.load_t5(checkpoint)
  model = reatt.ReAttModel(loaded.config.replace(dropout_rate=0.0),
                           reatt.ReAttConfig(bi_encoder_layers=BI_ENCODER_LAYERS,
                                             head_temperature=TAU))
  heads = loaded.config.num_heads
  params = reatt.add_head_weights(loaded.params, heads)
  head_weights = torch.tensor(
      np.asarray(params[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS]),
      requires_grad=True)
  weights = [*hf.parameters(), head_weights]
  adam = torch.optim.Adam(weights, lr=1e-3)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
  step = jax.jit(make_train_step(
      lambda p, b, r, n: model.loss(p, b, r, normalizer=n), tx, seed=0))
  state = train_state(params, 0, opt_state=tx.init(params))
  for s in range(5):
    tokens, qlen, dec_in, targets = _batch(loaded.config.vocab_size, seed=s)
    state, metrics = step(state, {
        **_jax_batch(tokens, qlen, dec_in, targets),
        "kl_weight": np.full(B, ALPHA / B, np.float32)})
    want = reatt_loss(hf, torch.tensor(tokens), torch.tensor(qlen),
                      torch.tensor(dec_in), torch.tensor(targets),
                      bi_encoder_layers=BI_ENCODER_LAYERS,
                      head_weights=head_weights, tau=TAU, kl_weight=ALPHA)
    adam.zero_grad()
    want["loss"].backward()
    torch.nn.utils.clip_grad_norm_(weights, 1.0)
    adam.step()
    np.testing.assert_allclose(float(metrics["loss"]), want["loss"].item(),
                               rtol=1e-5, err_msg=f"step {s}")
  trained = state["params"]
  np.testing.assert_allclose(trained[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS],
                             head_weights.detach().numpy(), atol=1e-5)
  theirs = dict(hf.named_parameters())
  initial = names.flatten(loaded.params)
  moved = 0.0
  for path, got in names.flatten(reatt.t5_part(trained)).items():
    rename = names.to_hf(path)
    want = theirs[rename.hf].detach().numpy()
    np.testing.assert_allclose(rename.to_hf(np.asarray(got)), want, atol=1e-4,
                               err_msg=f"{path} ({rename.hf})")
    moved = max(moved, float(np.abs(np.asarray(got) - initial[path]).max()))
  assert moved > 0.002  # five steps of 1e-3 moved the weights
