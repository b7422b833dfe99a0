"""Activation sharding constraints: present under a mesh, absent without one.

Under ``jax.set_mesh`` of a ``data=2,model=4`` mesh the lowered forward pass
carries a sharding constraint on every tensor t5x/flaxformer constrain (the
MLP hidden and q/k/v sharded over ``model``, the residual stream and logits),
and the sharded train step, forward pass and decoding equal one device's.
"""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxfid.core import sharding as shd
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.training import optim
from jaxfid.training.step import make_train_step

# Distinct sizes, so each constrained tensor is recognisable by its shape:
# B=4 questions, P=2 passages, L=8 tokens, T=3 targets, D=16, H=4, E=2, F=40.
B, P, L, T = 4, 2, 8, 3
CONFIG = T5Config(vocab_size=96, d_model=16, d_kv=2, d_ff=40, num_heads=4,
                  num_layers=2, num_decoder_layers=2,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                  dropout_rate=0.0)
# FiDO: multi-query cross-attention in every second decoder layer, tied logits.
FIDO = CONFIG.replace(cross_attention_period=2, multi_query_cross_attention=True,
                      tie_word_embeddings=True, feed_forward_proj="relu")
MESH = "data=2,model=4"
# Shardy's form of a constraint, e.g.
#   sdy.sharding_constraint %4 <@mesh, [{"data"}, {}, {"model"}]> : tensor<8x8x40xf32>
_CONSTRAINT = re.compile(
    r"sdy\.sharding_constraint %\S+ <@\w+, \[(.*?)\]> : tensor<([0-9x]+)x\w+>")


def _inputs():
  rng = np.random.default_rng(0)
  enc = rng.integers(2, CONFIG.vocab_size, size=(B, P, L)).astype(np.int32)
  enc[0, 1, 5:] = 0  # some padding
  dec = rng.integers(2, CONFIG.vocab_size, size=(B, T)).astype(np.int32)
  return enc, dec


def _constraints(text: str) -> set[tuple[tuple[int, ...], tuple[str, ...]]]:
  """{(shape, per-dimension mesh axes)} of every constraint in lowered text."""
  found = set()
  for dims, shape in _CONSTRAINT.findall(text):
    axes = tuple(",".join(re.findall(r'"(\w+)"', d))
                 for d in re.findall(r"\{[^}]*\}", dims))
    found.add((tuple(int(s) for s in shape.split("x")), axes))
  return found


def _place(model: EncoderDecoderModel, params, mesh):
  """Parameters placed as the rules say (as the trainers do)."""
  is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, str) for a in x)
  shardings = jax.tree.map(
      lambda axes: NamedSharding(mesh, shd.logical_to_mesh(axes, mesh=mesh)),
      model.param_axes(), is_leaf=is_axes)
  return jax.device_put(params, shardings)


def _lowered_text(config: T5Config, mesh_spec: str | None) -> str:
  model = EncoderDecoderModel(config)
  params = model.abstract_params()
  enc, dec = _inputs()
  fn = jax.jit(lambda p, e, d: model.logits(p, e, d))
  if mesh_spec is None:
    return fn.lower(params, enc, dec).as_text()
  with jax.set_mesh(shd.parse_mesh(mesh_spec)):
    return fn.lower(params, enc, dec).as_text()


def test_forward_carries_the_constraints_under_a_mesh():
  found = _constraints(_lowered_text(CONFIG, MESH))
  n, h, e, f, d, v = B * P, 4, 2, 40, 16, CONFIG.vocab_size
  want = {
      ((n, L, d), ("data", "", "")),               # embedding, residual (encoder)
      ((n, L, h, e), ("data", "", "model", "")),   # encoder q/k/v and context
      ((n, L, f), ("data", "", "model")),          # encoder MLP hidden
      ((B, P * L, d), ("data", "", "")),           # FiD's concatenated passages
      ((B, T, d), ("data", "", "")),               # embedding, residual (decoder)
      ((B, T, h, e), ("data", "", "model", "")),   # decoder q/k/v and context
      ((B, P * L, h, e), ("data", "", "model", "")),  # cross-attention keys/values
      ((B, T, f), ("data", "", "model")),          # decoder MLP hidden
      ((B, T, v), ("data", "", "model")),          # logits
  }
  # Exactly these: nothing else is constrained, nothing differently.
  assert found == want, (want - found, found - want)


def test_fsdp_gathers_each_kernel_where_it_is_used():
  """Under an ``fsdp`` axis every projection's kernel is constrained, where
  its layer uses it, to its layout with the ``embed`` shards gathered (the
  ``model`` split kept): the gather is part of the layer, so remat repeats
  it in the backward pass instead of keeping every gathered kernel (FiD-base
  at paper size on v5e-16 with ``MESH='fsdp=16'``: 18.18 GB per chip
  without, 9.73 with; docs/tpu_measured.md). On a mesh without ``fsdp`` the test
  above finds no kernel constraint: that program is unchanged."""
  found = _constraints(_lowered_text(CONFIG, "fsdp=2,model=4"))
  h, e, f, d, v = 4, 2, 40, 16, CONFIG.vocab_size
  kernels = {c for c in found if len(c[0]) == 2}
  assert kernels == {
      ((d, h * e), ("", "model")),   # query, key, value
      ((h * e, d), ("model", "")),   # attention output
      ((d, f), ("", "model")),       # MLP wi
      ((f, d), ("model", "")),       # MLP wo
      ((d, v), ("", "model")),       # untied logits
  }, kernels
  assert ((B * P, L, d), ("fsdp", "", "")) in found  # the batch on fsdp


def test_vmapped_passages_keep_the_batch_on_data():
  """``passage_encoding='vmap'``: the encoder's constraints, batched by the
  vmap, keep the questions on ``data`` and leave the passage axis (moved
  first, ``[P, B, ...]``) unsharded, as the flattened rows' ``B*P`` axis
  holds each question's passages on one ``data`` shard."""
  config = CONFIG.replace(passage_encoding="vmap")
  found = _constraints(_lowered_text(config, MESH))
  h, e, f, d = 4, 2, 40, 16
  encoder = {
      ((P, B, L, d), ("", "data", "", "")),
      ((P, B, L, h, e), ("", "data", "", "model", "")),
      ((P, B, L, f), ("", "data", "", "model")),
  }
  flattened = _constraints(_lowered_text(CONFIG, MESH))
  rest = {c for c in flattened if c[0][0] != B * P}  # FiD's concatenation, decoder
  assert found == encoder | rest, (encoder | rest) - found


def test_multi_query_keys_are_not_split_over_model():
  found = _constraints(_lowered_text(FIDO, MESH))
  assert ((B, P * L, 1, 2), ("data", "", "", "")) in found  # one shared head
  assert ((B, T, CONFIG.vocab_size), ("data", "", "model")) in found  # tied logits
  assert ((B * P, L, 40), ("data", "", "model")) in found


def test_no_constraints_without_a_mesh():
  text = _lowered_text(CONFIG, None)
  assert "sharding_constraint" not in text and "@Sharding" not in text


def test_fsdp_shards_activations_over_batch_only():
  found = _constraints(_lowered_text(CONFIG, "fsdp=8"))
  assert ((B * P, L, 40), ("fsdp", "", "")) in found
  assert all("model" not in ",".join(axes) for _, axes in found)


@pytest.mark.parametrize("config", [CONFIG, FIDO], ids=["t5", "fido"])
def test_sharded_forward_and_decoding_match_one_device(config):
  model = EncoderDecoderModel(config)
  params = model.init_params(0)
  enc, dec = _inputs()
  want_logits = np.asarray(model.jit_logits(params, enc, dec))
  want_greedy = np.asarray(model.jit_predict(params, enc, max_decode_len=4))
  want_beam = np.asarray(model.jit_predict(params, enc, max_decode_len=4,
                                           num_beams=2))

  mesh = shd.parse_mesh(MESH)
  with jax.set_mesh(mesh):
    placed = _place(model, params, mesh)
    batch = NamedSharding(mesh, PartitionSpec("data"))
    enc_d, dec_d = jax.device_put(enc, batch), jax.device_put(dec, batch)
    logits = jax.jit(lambda p, e, d: model.logits(p, e, d))(placed, enc_d, dec_d)
    greedy = jax.jit(lambda p, e: model.predict(p, e, max_decode_len=4))(
        placed, enc_d)
    beam = jax.jit(lambda p, e: model.predict(p, e, max_decode_len=4,
                                              num_beams=2))(placed, enc_d)
  # The logits come out as constrained: batch over data, vocabulary over model.
  assert logits.sharding.spec == PartitionSpec("data", None, "model")
  np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_array_equal(np.asarray(greedy), want_greedy)
  np.testing.assert_array_equal(np.asarray(beam), want_beam)


def _train(mesh_spec: str | None, steps: int = 2):
  """Losses, final parameters and the step's lowered text (with dropout)."""
  model = EncoderDecoderModel(CONFIG.replace(dropout_rate=0.1))
  opt = optim.make_optimizer(1e-2, optimizer="adamw", weight_decay=0.01)
  loss_fn = lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm)
  step = jax.jit(make_train_step(loss_fn, opt, seed=0))
  rng = np.random.default_rng(1)
  batches = [{"encoder_input_tokens": rng.integers(
                  2, CONFIG.vocab_size, size=(B, P, L)).astype(np.int32),
              "decoder_target_tokens": rng.integers(
                  2, CONFIG.vocab_size, size=(B, T)).astype(np.int32)}
             for _ in range(steps)]

  mesh = None if mesh_spec is None else shd.parse_mesh(mesh_spec)

  def run():
    params = model.init_params(0)
    if mesh is not None:
      params = _place(model, params, mesh)
    state = {"step": np.zeros((), np.int32), "params": params,
             "opt_state": jax.jit(opt.init)(params)}
    text = step.lower(state, batches[0]).as_text()
    losses = []
    for batch in batches:
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    return losses, jax.device_get(state["params"]), text

  if mesh is None:
    return run()
  with jax.set_mesh(mesh):
    return run()


@pytest.mark.slow  # a sharded train step = one device: test_sharding's data=2,fsdp=2,model=2 mesh; the constraints: test_forward_carries_the_constraints_under_a_mesh
def test_sharded_train_step_matches_one_device():
  want_losses, want_params, text = _train(None)
  assert "sharding_constraint" not in text
  losses, params, text = _train(MESH)
  found = _constraints(text)
  assert ((B * P, L, 40), ("data", "", "model")) in found  # MLP hidden
  assert ((B, T, CONFIG.vocab_size), ("data", "", "model")) in found  # logits
  np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
  # Adam divides each gradient element by its own scale: for an element near
  # zero, reduction-order noise becomes a few % of a step (measured: 1.4e-4
  # at lr 1e-2 on one element of 640). A wrong layout moves parameters by
  # whole steps (and the losses above): atol is a tenth of a step.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-3),
               params, want_params)
