"""Named remat policies (``T5Config.remat``): the loss and gradients of no
remat, and what each keeps for the backward pass."""
from __future__ import annotations

import contextlib
import io

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

# 2 encoder layers (one attention each), 2 decoder layers (two each)
CONFIG = T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=48, num_heads=4,
                  num_layers=2, num_decoder_layers=2,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                  dropout_rate=0.1)
ATTENTIONS = 2 + 2 * 2
POLICY = "save_out_proj_with_context"


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, CONFIG.vocab_size, size=(2, 3, 16)).astype(np.int32)
  tokens[:, :, -1] = 1
  tokens[0, 1, 6:] = 0  # a shorter passage
  targets = rng.integers(2, CONFIG.vocab_size, size=(2, 5)).astype(np.int32)
  targets[:, -1] = 1
  return {"encoder_input_tokens": jnp.asarray(tokens),
          "decoder_target_tokens": jnp.asarray(targets)}


def _loss_fn(remat: str, **fields):
  """(loss of the params with dropout on, params) for a tiny T5."""
  model, params = EncoderDecoderModel.create(
      CONFIG.replace(remat=remat, **fields), seed=0)
  batch = _batch()
  return (lambda p: model.loss(p, batch, jax.random.key(1))[0]), params


@pytest.mark.parametrize("fields", [
    {"attention": "reference"},
    # ~25 s each on a 2-core host: the loop above keeps the fast tier's
    pytest.param({"attention": "reference", "scan_layers": True},
                 marks=pytest.mark.slow),
    pytest.param({"attention": "pallas"},  # the kernel, interpreted on CPU
                 marks=pytest.mark.slow),
])
def test_policy_gives_the_loss_and_gradients_of_full_and_none(fields):
  results = {}
  for remat in ("none", "full", POLICY):
    fn, params = _loss_fn(remat, **fields)
    results[remat] = jax.jit(jax.value_and_grad(fn))(params)
  want_loss, want_grads = results["none"]
  for remat in ("full", POLICY):
    loss, grads = results[remat]
    assert abs(float(loss) - float(want_loss)) < 1e-6, remat
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                 grads, want_grads)


def _saved(remat: str) -> list[str]:
  fn, params = _loss_fn(remat)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(fn, params)
  return out.getvalue().splitlines()


def test_policy_saves_each_attentions_context_and_output_projection():
  full, policy = _saved("full"), _saved(POLICY)
  named = [line for line in policy if " named '" in line]
  assert sum("named 'context'" in line for line in named) == ATTENTIONS
  assert sum("named 'out_proj'" in line for line in named) == ATTENTIONS
  # nothing else beyond full remat's residuals (each layer's input, ...)
  assert len(named) == 2 * ATTENTIONS
  assert len(policy) == len(full) + 2 * ATTENTIONS
  assert not any(" named '" in line for line in full)


def _live_kernel_calls(jaxpr) -> int:
  """pallas_call equations (at any depth) with an output that a later
  equation or the jaxpr's result reads."""
  read = {id(v) for v in jaxpr.outvars}
  for eqn in jaxpr.eqns:
    read.update(id(v) for v in eqn.invars)
  n = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call" and any(
        id(v) in read for v in eqn.outvars):
      n += 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, jex.ClosedJaxpr):
          n += _live_kernel_calls(sub.jaxpr)
        elif isinstance(sub, jex.Jaxpr):
          n += _live_kernel_calls(sub)
  return n


def test_policys_backward_pass_does_not_rerun_the_attention_kernel():
  # the kernel takes the 2 encoder layers (the decoder's are causal or
  # cross-attention): a forward and a backward call each, and under 'full'
  # the forward again in the recomputation, whose output the policy keeps
  counts = {}
  for remat in ("none", "full", POLICY):
    fn, params = _loss_fn(remat, attention="pallas")
    counts[remat] = _live_kernel_calls(jax.make_jaxpr(jax.grad(fn))(params).jaxpr)
  assert counts == {"none": 4, "full": 6, POLICY: 4}
