"""Atlas's train step: the loop's exact-accumulation step over
:meth:`AtlasModel.loss`, and the frozen passage tower of QUERY_SIDE_ONLY
(QUERY_SIDE_MODE 'frozen').

The step is :func:`jaxfid.training.step.make_train_step` (dropout keys
``fold_in(key(seed), step)``, microbatch losses divided by the whole
batch's counts, the non-finite guard), with the whole batch's target tokens
and passages as its normaliser. With ``QUERY_SIDE_ONLY`` the passage
embeddings get no gradient (``stop_gradient``); in QUERY_SIDE_MODE 'frozen'
the step also keeps the separate passage tower's parameters as they were,
so that no optimizer term (AdamW's weight decay) moves them: the index
built from them at the start stays exact. In 'shared' mode there is one
tower, which the query side's updates move (Atlas's released code).
"""
from __future__ import annotations

import optax

from jaxfid.atlas.model import RETRIEVER, AtlasModel, batch_normalizer
from jaxfid.dual_encoder.model import QUERY_TOWER
from jaxfid.training.step import make_train_step


def frozen_passage_tower(old: dict, new: dict) -> dict:
  """``new`` params with the retriever's passage tower (all but the query
  tower) taken from ``old``."""
  retriever = {key: (value if key == QUERY_TOWER else old[RETRIEVER][key])
               for key, value in new[RETRIEVER].items()}
  return {**new, RETRIEVER: retriever}


def make_atlas_step(model: AtlasModel, tx: optax.GradientTransformation, *,
                    seed: int, accumulation_steps: int):
  """``step(state, batch) -> (state, metrics)`` (pure; the loop jits it)."""
  step = make_train_step(
      lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm), tx,
      seed=seed, accumulation_steps=accumulation_steps,
      normalizer=batch_normalizer, additive=model.additive_metrics)
  if not model.atlas.separate_towers:
    return step

  def frozen_step(state, batch):
    new, metrics = step(state, batch)
    new["params"] = frozen_passage_tower(state["params"], new["params"])
    return new, metrics

  return frozen_step
