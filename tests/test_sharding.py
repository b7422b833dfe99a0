"""Sharded training on 8 simulated CPU devices equals one device; cross-mesh restore."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from jaxfid.core import sharding as shd
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.training import optim
from jaxfid.training.step import make_train_step
from jaxfid.training import state as state_lib
from jaxfid.training.task import train_state

CONFIG = T5Config(vocab_size=96, d_model=16, d_kv=4, d_ff=32, num_heads=4,
                  num_layers=2, num_decoder_layers=2,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                  dropout_rate=0.1)
# The mesh with every axis runs in the fast tier; the others in the slow one.
MESHES = [pytest.param(m, marks=pytest.mark.slow) for m in (
    "data=8", "data=4,model=2", "data=2,model=4", "fsdp=8")] + [
        "data=2,fsdp=2,model=2"]


def _batches(n=3, b=8, p=2, l=8, t=4):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    enc = rng.integers(2, CONFIG.vocab_size, size=(b, p, l)).astype(np.int32)
    tgt = rng.integers(2, CONFIG.vocab_size, size=(b, t)).astype(np.int32)
    tgt[:, -1] = 1
    out.append({"encoder_input_tokens": enc, "decoder_target_tokens": tgt})
  return out


def _optimizer():
  return optim.make_optimizer(1e-2, optimizer="adamw", weight_decay=0.01)


def _state_shardings(model, opt, place):
  make_state = lambda p, s: train_state(p, s, opt_state=opt.init(p))
  abstract = jax.eval_shape(make_state, model.abstract_params(), 0)
  return make_state, abstract, place.state(abstract, model.abstract_params())


def _train(mesh_spec: str, steps=3, accumulation_steps=1, config=CONFIG):
  model = EncoderDecoderModel(config)
  opt = _optimizer()
  mesh = shd.parse_mesh(mesh_spec)
  place = state_lib.placement(mesh, model.param_axes())
  make_state, _, state_sh = _state_shardings(model, opt, place)
  with jax.set_mesh(mesh):
    params = jax.jit(lambda: model.init_params(0), out_shardings=place.params)()
    state = state_lib.fresh_state(make_state, params, 0, state_sh)
    loss_fn = lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm)
    step = jax.jit(make_train_step(loss_fn, opt, seed=0,
                                   accumulation_steps=accumulation_steps),
                   in_shardings=(state_sh, place.batch),
                   out_shardings=(state_sh, place.replicated))
    losses = []
    for batch in _batches(steps):
      state, metrics = step(state, place.global_batch(batch, slice(0, 8), 8))
      losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state["params"]), state, place


@pytest.fixture(scope="module")
def single_device():
  losses, params, _, _ = _train("data=1")
  return losses, params


@pytest.mark.parametrize("mesh_spec", MESHES)
def test_mesh_matches_one_device(mesh_spec, single_device):
  want_losses, want_params = single_device
  losses, params, state, _ = _train(mesh_spec)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               params, want_params)
  # The parameters really are sharded as the rules say.
  kernel = state["params"]["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  if "model=" in mesh_spec:
    assert kernel.sharding.spec[1] == "model"
  if "fsdp=" in mesh_spec:
    assert kernel.sharding.spec[0] == "fsdp"


def test_accumulation_on_a_mesh_matches():
  # Without dropout (microbatches draw their own dropout masks).
  config = CONFIG.replace(dropout_rate=0.0)
  want_losses, want_params, _, _ = _train("data=1", config=config)
  losses, params, _, _ = _train("data=4,model=2", accumulation_steps=2,
                                config=config)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               params, want_params)


def test_checkpoint_restores_under_another_mesh(tmp_path):
  _, params, state, _ = _train("data=4,model=2", steps=1)
  ckpts = checkpointing.RunCheckpoints(str(tmp_path), keep=1)
  ckpts.save(1, state)
  model = EncoderDecoderModel(CONFIG)
  mesh = shd.parse_mesh("data=2,model=4")
  place = state_lib.placement(mesh, model.param_axes())
  _, abstract, state_sh = _state_shardings(model, _optimizer(), place)
  restored = state_lib.restore_state(ckpts, 1, abstract, state_sh)
  ckpts.close()
  kernel = restored["params"]["encoder"]["layers_1"]["attention"]["query"]["kernel"]
  assert kernel.sharding.mesh.shape["model"] == 4
  assert kernel.sharding.spec == PartitionSpec(None, "model")
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored["params"]),
               params)
  assert int(restored["step"]) == 1


def test_every_parameter_has_logical_axes():
  for name in ("t5_base", "t5_1_1_xl"):
    from jaxfid.t5.config import preset
    model = EncoderDecoderModel(preset(name).replace(cross_attention_period=2,
                                          multi_query_cross_attention=True))
    shapes = jax.tree.leaves(model.abstract_params())
    axes = jax.tree.leaves(model.param_axes(),
                           is_leaf=lambda x: isinstance(x, tuple))
    assert len(shapes) == len(axes)
    for s, a in zip(shapes, axes):
      assert len(a) == len(s.shape) and all(isinstance(n, str) for n in a)


def test_logical_rules():
  mesh = shd.parse_mesh("data=4,model=2")
  assert shd.logical_to_mesh(("embed", "mlp"), mesh=mesh) == PartitionSpec(None, "model")
  assert shd.logical_to_mesh(("batch", "length"), mesh=mesh) == PartitionSpec("data", None)
  mesh = shd.parse_mesh("fsdp=8")
  assert shd.logical_to_mesh(("vocab", "embed"), mesh=mesh) == PartitionSpec(None, "fsdp")
  with pytest.raises(ValueError):
    shd.parse_mesh("data=16")
  with pytest.raises(ValueError):
    shd.parse_mesh("dta=8")
  assert shd.parse_mesh("data=-1,model=2").shape["data"] == 4
