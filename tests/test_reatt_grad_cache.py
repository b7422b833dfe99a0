"""ReAtt's GradCache step: in-batch negatives span the global batch under
gradient accumulation (loss and gradients equal the full-batch step's)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxfid.core.tokenization import Tokenizer
from jaxfid.fid.task import FidTask
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader.config import FidReaderConfig
from jaxfid.reatt import model as reatt
from jaxfid.reatt.step import grad_cache, make_grad_cache_step
from jaxfid.reatt.task import ReAttTask
from jaxfid.t5.model import cross_entropy
from jaxfid.training.microbatches import merge_microbatches, split_microbatches
from jaxfid.training.step import make_train_step, target_tokens
from jaxfid.training.task import (OptimizerSettings, Prepared, Settings,
                                  train_state)
from reatt_world import make_world, tiny_model

TOK = Tokenizer()
B, P, L, A = 8, 3, 16, 4


@pytest.fixture(scope="module")
def world():
  _, examples = make_world(num_keys=B, n_context=P)
  return examples


def _batch(examples):
  tokens, pmask = fid_inputs.encode_examples(TOK, examples, P, L)
  qlen = np.array([len(TOK.encode(f"question: {e.question}"))
                   for e in examples], np.int32)
  targets = np.stack([fid_inputs.encode_target(TOK, e.answers[0], 4)
                      for e in examples])
  pmask[1, 2] = False  # a missing passage
  return {"encoder_input_tokens": tokens, "passage_mask": pmask,
          "question_length": qlen, "decoder_target_tokens": targets,
          "kl_weight": np.full(len(examples), 8.0 / len(examples), np.float32)}


def _params(model):
  params = model.init_params(0)
  params[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS] = jnp.array(
      [0.0, 0.002, -0.001, 0.0005])
  return params


@pytest.fixture(scope="module")
def full(world):
  """The model, params, batch and the A = 1 step's (loss, metrics, grads)."""
  model = tiny_model(bi_encoder_layers=1)
  params, batch = _params(model), _batch(world)
  norm = target_tokens(batch)
  (loss, metrics), grads = jax.jit(jax.value_and_grad(
      lambda p: model.loss(p, batch, None, normalizer=norm),
      has_aux=True))(params)
  return model, params, batch, (loss, metrics, grads)


def _at(tree, path):
  for k in path:
    tree = tree[k.key]
  return tree


def _assert_same(got, want, rtol=1e-5):
  """Every leaf of ``got`` equals ``want``'s (relative to the leaf's scale)."""
  for path, w in jax.tree_util.tree_leaves_with_path(want):
    w = np.asarray(w)
    np.testing.assert_allclose(np.asarray(_at(got, path)), w, rtol=rtol,
                               atol=rtol * max(np.abs(w).max(), 1e-12),
                               err_msg=jax.tree_util.keystr(path))


def test_equals_the_full_batch_step_on_one_device(full):
  model, params, batch, (loss1, m1, g1) = full
  loss4, m4, g4 = jax.jit(lambda p, b: grad_cache(
      model, p, b, None, target_tokens(b), A))(params, batch)
  np.testing.assert_allclose(loss4, loss1, rtol=1e-5)
  for name in ("qa_loss", "kl_loss", "token_accuracy", "num_target_tokens",
               "retrieval_accuracy", "retrieval_own_accuracy"):
    np.testing.assert_allclose(m4[name], m1[name], rtol=1e-5, err_msg=name)
  _assert_same(g4, g1)
  assert float(m1["kl_loss"]) > 0.01
  assert np.abs(np.asarray(g1["reatt"]["head_weights"])).max() > 0
  # plain accumulation scores each question against its microbatch only:
  # fewer negatives, another loss
  opt = optax.sgd(0.0)
  state = train_state(params, 0, opt_state=opt.init(params))
  fn = lambda p, b, r, n: model.loss(p, b, r, normalizer=n)
  _, plain = jax.jit(make_train_step(fn, opt, seed=0, accumulation_steps=A))(
      state, batch)
  assert abs(float(plain["loss"]) - float(loss1)) > 1e-3


def test_equals_the_full_batch_step_on_a_data_mesh(full):
  model, params, batch, (loss1, _, g1) = full
  mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
  rows = NamedSharding(mesh, PartitionSpec("data"))
  sharded = {k: jax.device_put(v, rows) for k, v in batch.items()}
  replicated = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
  opt = optax.sgd(1.0)
  step = jax.jit(make_grad_cache_step(model, opt, seed=0,
                                      accumulation_steps=A))
  state = train_state(replicated, 0, opt_state=opt.init(replicated))
  new, metrics = step(state, sharded)
  np.testing.assert_allclose(metrics["loss"], loss1, rtol=1e-5)
  assert metrics["finite"] == 1.0
  # sgd(1): new params = params - grads
  got = jax.tree.map(lambda a, b: a - b, params, jax.device_get(new["params"]))
  _assert_same(got, g1, rtol=2e-5)


def test_dropout_masks_are_the_same_in_both_passes(world):
  """With dropout, GradCache equals autodiff through the same microbatched
  forward passes (pass 2 replays pass 1's masks)."""
  model = tiny_model(bi_encoder_layers=1, dropout_rate=0.3)
  params, batch = _params(model), _batch(world)
  rng = jax.random.key(7)
  norm = target_tokens(batch)
  a = 2

  def reference(p):
    micro = jax.tree.map(lambda x: split_microbatches(x, a), batch)
    qa, qs, qms, ks, kms, ts = 0.0, [], [], [], [], []
    for i in range(a):
      mb = jax.tree.map(lambda x: x[i], micro)
      enc, logits, target = model.forward(p, mb, jax.random.fold_in(rng, i))
      qa = qa + cross_entropy(logits, mb["decoder_target_tokens"], norm)[0]
      qs.append(enc.queries)
      qms.append(enc.query_mask)
      ks.append(enc.keys.reshape(B // a, P, *enc.keys.shape[1:]))
      kms.append(enc.key_mask.reshape(B // a, P, -1))
      ts.append(target)
    merge = lambda xs: merge_microbatches(jnp.stack(xs))
    k, km = merge(ks), merge(kms)                     # [B, P, L, H, E], [B, P, L]
    kl, _ = model.retrieval_loss(
        p, merge(qs), merge(qms), k.reshape(B * P, *k.shape[2:]),
        km.reshape(B * P, -1), merge(ts), batch["kl_weight"])
    return qa + kl

  want_loss, want = jax.jit(jax.value_and_grad(reference))(params)
  step = jax.jit(lambda p, r: grad_cache(model, p, batch, r, norm, a))
  loss, _, got = step(params, rng)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  _assert_same(got, want)
  # and dropout is on: another key, another loss
  other, _, _ = step(params, jax.random.key(8))
  assert abs(float(other) - float(loss)) > 1e-4


def test_the_task_uses_grad_cache_when_accumulating_in_batch(full, tmp_path):
  """ReAttTask's step with ACCUMULATION_STEPS = A and in-batch negatives
  gives the full batch's loss (plain accumulation would not: first test)."""
  model, params, batch, (loss1, _, _) = full
  reader = FidReaderConfig(train_data="unread.json", n_context=P,
                           text_maxlength=L, answer_maxlength=4)
  task = ReAttTask(reader=FidTask(reader=reader, model_config=model.config),
                   reatt=model.reatt)
  settings = Settings(model_dir=str(tmp_path / "run"), train_steps=2,
                      batch_size=B, accumulation_steps=A, progress=False)
  p = Prepared(settings=settings, model=model)  # the phases need the model
  (phase,) = task.phases(p, OptimizerSettings(learning_rate=0.0))
  _, metrics = jax.jit(phase.step)(phase.make_state(params, 0), batch)
  np.testing.assert_allclose(metrics["loss"], loss1, rtol=1e-5)
