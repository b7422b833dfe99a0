"""Atlas's training options against its released code (facebookresearch/atlas
src/util.py, train.py): the piecewise REFRESH_EVERY and
FREEZE_RETRIEVER_STEPS against ``IndexRefreshScheduler`` written out, the
'cosine' SCHEDULE against ``CosineScheduler``, and the per-model optimizers
of RETRIEVER_LEARNING_RATE and FREEZE_RETRIEVER_STEPS on a tiny model."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.atlas.config import AtlasConfig
from jaxfid.atlas.model import READER, RETRIEVER, AtlasModel
from jaxfid.atlas.step import atlas_optimizer, make_atlas_step
from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.model import DualEncoder, DualEncoderConfig
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.training.optim import learning_rate_schedule
from jaxfid.training.settings import OptimizerSettings
from jaxfid.training.task import train_state


def _atlas_refreshes(format_str, freeze, train_steps):
  """Atlas's IndexRefreshScheduler.is_time_to_refresh (src/util.py:131-158)
  at each step the training loop asks it (train.py:65: the steps done)."""
  if format_str == "-1":
    parsed = [(0, 2**32, 2**32)]
  elif format_str.isdigit():
    parsed = [(0, 2**32, int(format_str))]
  else:
    parsed = []
    for piece in format_str.split(","):
      startend, rate = piece.split(":")
      start, end = startend.split("-")
      parsed.append((int(start), int(end), int(rate)))
  out = []
  for step in range(train_steps):
    if not step == 0 and step < freeze:
      continue
    for st, en, rate in parsed:
      if st <= step < en:
        if (step - st) % rate == 0:
          out.append(step)
        break
  return out


@pytest.mark.parametrize("schedule, freeze, steps", [
    ("0-1000:500,1000-10000:2000", 0, 10000),
    ("0-100:10,100-1000:50", 250, 1200),   # the last 200 steps: no piece
    ("0-30:7,20-60:4", 0, 60),             # overlapping: the first wins
    ("100", 0, 1000), ("-1", 0, 50), ("100", 350, 1000)])
def test_refresh_steps_are_atlas_index_refresh_scheduler(schedule, freeze,
                                                          steps):
  config = AtlasConfig(corpus="c", refresh_every=schedule,
                       freeze_retriever_steps=freeze)
  assert config.refresh_steps(steps) == _atlas_refreshes(schedule, freeze,
                                                         steps)
  if schedule.isdigit():  # the int form is the same schedule
    assert AtlasConfig(corpus="c", refresh_every=int(schedule),
                       freeze_retriever_steps=freeze).refresh_steps(
                           steps) == config.refresh_steps(steps)


def test_a_bad_refresh_schedule_is_one_line():
  for bad in ("0-1000", "0-1000:0", "500-100:10", "every 5"):
    with pytest.raises(InputError, match="REFRESH_EVERY: .*start"):
      AtlasConfig(corpus="c", refresh_every=bad)


def test_cosine_schedule_is_atlas_cosine_scheduler():
  """CosineScheduler.lr_lambda (src/util.py:91-95), ratio 0.1."""
  warmup, total = 10, 110

  def atlas(step, ratio=0.1):
    if step < warmup:
      return float(step) / warmup
    s = float(step - warmup) / (total - warmup)
    return ratio + (1.0 - ratio) * math.cos(0.5 * math.pi * s)

  schedule = learning_rate_schedule(3e-4, schedule="cosine",
                                    warmup_steps=warmup, total_steps=total)
  for step in range(total):
    assert float(schedule(step)) == pytest.approx(3e-4 * atlas(step),
                                                  rel=1e-5, abs=1e-12)


def _tiny_atlas(**atlas):
  config = T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_heads=2,
                    num_layers=1, num_decoder_layers=1, dropout_rate=0.0,
                    feed_forward_proj="gated-gelu", tie_word_embeddings=False)
  return AtlasModel(EncoderDecoderModel(config),
                    DualEncoder(config, DualEncoderConfig(shared=True)),
                    AtlasConfig(corpus="c", retriever_loss="pdist",
                                temperature_gold=0.5, temperature_score=0.5,
                                **atlas))


def _batch(b=2, k=3, length=6, t=3):
  rng = np.random.default_rng(0)
  ints = lambda *shape: jnp.asarray(rng.integers(2, 40, shape), jnp.int32)
  return {"encoder_input_tokens": ints(b, k, length),
          "passage_mask": jnp.ones((b, k), bool),
          "decoder_target_tokens": ints(b, t), "query_tokens": ints(b, 4),
          "passage_tokens": ints(b, k, 5)}


def _moved(new, old, lr, decay):
  """|new - old| without AdamW's decay term, per leaf, as one array: an
  Adam first step moves each parameter by ``lr`` (``|g| / sqrt(g^2)``)."""
  pairs = zip(jax.tree.leaves(new), jax.tree.leaves(old))
  return np.concatenate([
      np.abs(np.asarray(n) - np.asarray(o) * (1 - lr * decay)).ravel()
      for n, o in pairs])


@pytest.mark.slow  # ~15 s of CPU: two step programs compiled
def test_frozen_retriever_steps_then_its_own_learning_rate():
  """FREEZE_RETRIEVER_STEPS=2 and RETRIEVER_LEARNING_RATE: steps 0-1 train
  the reader alone (no retriever loss, the retriever and its optimizer
  state kept); step 2 is the retriever's first AdamW update (PyTorch counts
  steps per parameter), at its own rate."""
  freeze, lr, lr_retriever, decay = 2, 1e-2, 1e-3, 0.1
  model = _tiny_atlas(freeze_retriever_steps=freeze,
                      retriever_learning_rate=lr_retriever)
  optimizer = OptimizerSettings(learning_rate=lr, optimizer="adamw",
                                weight_decay=decay, clip_norm=1e3)
  tx = atlas_optimizer(optimizer, model.atlas, train_steps=10)
  step = jax.jit(make_atlas_step(model, tx, seed=0, accumulation_steps=1))
  params = model.init_params(0)
  state = train_state(params, 0, opt_state=tx.init(params))
  batch = _batch()
  history = [state]
  for _ in range(3):
    state, metrics = step(state, batch)
    history.append(state)
    assert float(metrics["retriever_loss"] > 0) == (len(history) > freeze + 1)
  first, second, third = (h["params"] for h in history[1:])
  for a, b in zip(jax.tree.leaves(params[RETRIEVER]),
                  jax.tree.leaves(second[RETRIEVER])):
    np.testing.assert_array_equal(a, b)
  # the reader's first update: Adam's first step moves by its rate
  assert np.median(_moved(first[READER], params[READER], lr, decay)) == (
      pytest.approx(lr, rel=0.02))
  # the retriever's first update, at step 2: its own rate, its own count
  assert np.median(_moved(third[RETRIEVER], second[RETRIEVER], lr_retriever,
                          decay)) == pytest.approx(lr_retriever, rel=0.02)
  counts = {jax.tree_util.keystr(path): int(leaf) for path, leaf in
            jax.tree_util.tree_leaves_with_path(history[-1]["opt_state"])
            if "count" in jax.tree_util.keystr(path)}
  assert sorted(v for k, v in counts.items() if f"'{RETRIEVER}'" in k) == [1, 1]
  assert sorted(v for k, v in counts.items() if f"'{READER}'" in k) == [3, 3]


@pytest.mark.slow  # ~40 s on a loaded 2-core CPU: the eager tiny model
def test_the_reader_reads_the_first_n_context_of_retriever_n_context():
  """RETRIEVER_N_CONTEXT=3 over N_CONTEXT=2 (src/atlas.py:447,489-490): the
  reader's loss over the first 2 passages, the retriever's over all 3."""
  model = _tiny_atlas(retriever_n_context=3)
  wide = AtlasModel(model.reader, model.retriever, model.atlas,
                    reader_n_context=2)
  params, batch = model.init_params(0), _batch(k=3)
  first = {**batch,
           "encoder_input_tokens": batch["encoder_input_tokens"][:, :2],
           "passage_mask": batch["passage_mask"][:, :2]}
  _, got = wide.loss(params, batch)
  _, reader_only = model.loss(params, first, train_retriever=False)
  _, everything = model.loss(params, batch)
  assert float(got["reader_loss"]) == pytest.approx(
      float(reader_only["reader_loss"]), rel=1e-6)
  assert float(got["reader_loss"]) != pytest.approx(
      float(everything["reader_loss"]), rel=1e-4)
  assert float(got["retriever_loss"]) == pytest.approx(
      float(everything["retriever_loss"]), rel=1e-6)
  assert model.atlas.retrieved(2) == 3
  assert AtlasConfig(corpus="c").retrieved(2) == 2
