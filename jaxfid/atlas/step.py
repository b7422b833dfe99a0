"""Atlas's train step and optimizer: the loop's exact-accumulation step over
:meth:`AtlasModel.loss`, the frozen passage tower of QUERY_SIDE_ONLY
(QUERY_SIDE_MODE 'frozen'), FREEZE_RETRIEVER_STEPS and the retriever's own
learning rate.

The step is :func:`jaxfid.training.step.make_train_step` (dropout keys
``fold_in(key(seed), step)``, microbatch losses divided by the whole
batch's counts, the non-finite guard), with the whole batch's target tokens
and passages as its normaliser. With ``QUERY_SIDE_ONLY`` the passage
embeddings get no gradient (``stop_gradient``); in QUERY_SIDE_MODE 'frozen'
the step also keeps the separate passage tower's parameters as they were,
so that no optimizer term (AdamW's weight decay) moves them: the index
built from them at the start stays exact. In 'shared' mode there is one
tower, which the query side's updates move (Atlas's released code).

:func:`atlas_optimizer`: with RETRIEVER_LEARNING_RATE or
FREEZE_RETRIEVER_STEPS the reader and the retriever have optimizers of
their own (Atlas's ``optimizer`` and ``retr_optimizer``, ``src/util.py:
167-197``: the same kind, weight decay and schedule, each its own rate)
after one clipping of the joint gradient norm (Atlas's
``clip_grad_norm_(model.parameters())`` without ``--shard_optim``,
``train.py:124``). During the first FREEZE_RETRIEVER_STEPS steps the step
trains the reader alone and keeps the retriever's parameters and optimizer
state, as PyTorch's AdamW skips parameters without a gradient; the
retriever's schedule still runs on the global step (Atlas steps
``retr_scheduler`` every step, ``train.py:128-130``), while its Adam
moments and bias correction start at its first update.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxfid.atlas.config import AtlasConfig
from jaxfid.atlas.model import (READER, RETRIEVER, AtlasModel,
                                batch_normalizer)
from jaxfid.dual_encoder.model import QUERY_TOWER
from jaxfid.training.settings import OptimizerSettings
from jaxfid.training.step import make_train_step


def frozen_passage_tower(old: dict, new: dict) -> dict:
  """``new`` params with the retriever's passage tower (all but the query
  tower) taken from ``old``."""
  retriever = {key: (value if key == QUERY_TOWER else old[RETRIEVER][key])
               for key, value in new[RETRIEVER].items()}
  return {**new, RETRIEVER: retriever}


def _retrievers(tree) -> list[bool]:
  """Per leaf of ``tree``: whether its path passes through a RETRIEVER key
  (the retriever's parameters, its optimizer's moments and count)."""
  return [any(getattr(k, "key", None) == RETRIEVER for k in path)
          for path, _ in jax.tree_util.tree_leaves_with_path(tree)]


def keep_retriever(frozen, old, new):
  """``new`` with every retriever leaf taken from ``old`` where ``frozen``
  (a traced bool)."""
  flags = _retrievers(new)
  leaves, treedef = jax.tree.flatten(new)
  kept = [jnp.where(frozen, o, n) if f else n
          for f, o, n in zip(flags, jax.tree.leaves(old), leaves)]
  return jax.tree.unflatten(treedef, kept)


def per_model(atlas: AtlasConfig) -> bool:
  """Whether the reader and the retriever have optimizers of their own."""
  return (atlas.retriever_learning_rate is not None
          or atlas.freeze_retriever_steps > 0)


def atlas_optimizer(optimizer: OptimizerSettings, atlas: AtlasConfig,
                    train_steps: int) -> optax.GradientTransformation:
  """The run's optimizer (module docstring): OptimizerSettings' over all
  parameters, or one each for the reader and the retriever."""
  schedule = optimizer.schedule_fn(train_steps)
  if not per_model(atlas):
    return optimizer.make(schedule)
  rate = atlas.retriever_learning_rate
  retriever = (optimizer if rate is None else optimizer.replace(
      learning_rate=rate)).schedule_fn(train_steps)
  offset = atlas.freeze_retriever_steps
  each = optimizer.replace(clip_norm=None)
  tx = optax.multi_transform(
      {READER: each.make(schedule),
       RETRIEVER: each.make(lambda count: retriever(count + offset))},
      {READER: READER, RETRIEVER: RETRIEVER})
  if optimizer.clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(optimizer.clip_norm), tx)
  return tx


def make_atlas_step(model: AtlasModel, tx: optax.GradientTransformation, *,
                    seed: int, accumulation_steps: int):
  """``step(state, batch) -> (state, metrics)`` (pure; the loop jits it)."""
  def build(train_retriever: bool):
    return make_train_step(
        lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm,
                                           train_retriever=train_retriever),
        tx, seed=seed, accumulation_steps=accumulation_steps,
        normalizer=batch_normalizer, additive=model.additive_metrics)

  step = build(True)
  freeze = model.atlas.freeze_retriever_steps
  if freeze:
    joint, reader_only = step, build(False)

    def step(state, batch):
      frozen = state["step"] < freeze
      new, metrics = jax.lax.cond(frozen, reader_only, joint, state, batch)
      return {**new, "params": keep_retriever(frozen, state["params"],
                                              new["params"]),
              "opt_state": keep_retriever(frozen, state["opt_state"],
                                          new["opt_state"])}, metrics

  if not model.atlas.separate_towers:
    return step
  inner = step

  def frozen_step(state, batch):
    new, metrics = inner(state, batch)
    new["params"] = frozen_passage_tower(state["params"], new["params"])
    return new, metrics

  return frozen_step
