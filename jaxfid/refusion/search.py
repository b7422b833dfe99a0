"""ReFusion's bi-level search: group optimizers, the step, the structure file.

The architecture weights (every fusion module's ``fusion_alpha``) are the
upper-level variables, everything else the lower level. Each search step is
first-order alternation (DARTS' first-order approximation): the architecture
step on a dev batch, then the model step on a train batch, each with its own
optimizer, the other group's update exactly zero. When the search ends every
module takes its argmax scheme; the structure is written atomically to
``MODEL_DIR/refusion_structure.json`` (read back by
:func:`jaxfid.refusion.model.load_refusion`).
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import optax

from jaxfid.core import paths
from jaxfid.core.files import atomic_write
from jaxfid.refusion.model import ReFusionModel, is_arch_path
from jaxfid.training.step import make_train_step

STRUCTURE_FILE = "refusion_structure.json"
ARCH_SEED_OFFSET = 7919  # the architecture step's own dropout stream


def group_optimizers(params, model_opt: optax.GradientTransformation,
                     arch_learning_rate: float):
  """(model step's optimizer, architecture step's optimizer) over all params.

  Each updates its own group and leaves the other exactly unchanged.
  ``params`` may be abstract (only its tree and paths are read).
  """
  labels = jax.tree_util.tree_map_with_path(
      lambda path, _: "arch" if is_arch_path(path) else "model", params)
  zero = optax.set_to_zero()
  return (optax.multi_transform({"model": model_opt, "arch": zero}, labels),
          optax.multi_transform({"model": zero,
                                 "arch": optax.adam(arch_learning_rate)},
                                labels))


def make_step(model: ReFusionModel, model_opt: optax.GradientTransformation,
              arch_opt: optax.GradientTransformation, *, seed: int,
              with_arch: bool, accumulation_steps: int = 1):
  """``step(state, {"train": batch, "dev": batch}) -> (state, metrics)``.

  With ``with_arch`` (the search): the architecture step on the ``dev``
  batch (its optimizer leaves the model weights exactly as they are; state
  key ``arch_opt_state``), then the model step on the ``train`` batch
  (leaving the architecture weights as they are). Without it, only the model
  step (no ``dev`` batch needed). Both are
  :func:`~jaxfid.training.step.make_train_step` steps (exact accumulation
  over ``accumulation_steps`` microbatches); the update of a step whose
  either half is not finite is dropped by that half, and ``finite`` reports
  both.
  """
  loss_fn = lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm)
  model_step = make_train_step(loss_fn, model_opt, seed=seed,
                               accumulation_steps=accumulation_steps)
  arch_step = make_train_step(loss_fn, arch_opt, seed=seed + ARCH_SEED_OFFSET,
                              accumulation_steps=accumulation_steps)

  def step_fn(state, batch):
    metrics = {}
    params, arch_finite = state["params"], jnp.ones((), jnp.float32)
    if with_arch:
      arch_state, arch_metrics = arch_step(
          {"step": state["step"], "params": params,
           "opt_state": state["arch_opt_state"]}, batch["dev"])
      params = arch_state["params"]
      metrics["arch_loss"] = arch_metrics["loss"]
      arch_finite = arch_metrics["finite"]
    new, model_metrics = model_step(
        {"step": state["step"], "params": params,
         "opt_state": state["opt_state"]}, batch["train"])
    out = dict(new)
    if with_arch:
      out["arch_opt_state"] = arch_state["opt_state"]
    metrics.update(model_metrics)
    metrics["finite"] = model_metrics["finite"] * arch_finite
    return out, metrics

  return step_fn


def structure_record(model: ReFusionModel, params, step: int) -> dict:
  """What ``refusion_structure.json`` holds after a search ending at ``step``:
  the module paths, the argmax structure and softmax(alpha) per module."""
  weights = [w for _, w in model.arch_weights(params)]
  return {"step": step, "paths": ["/".join(p) for p in model.paths],
          "structure": list(model.discretize(params)),
          "arch_weights": weights}


def describe(record: dict) -> str:
  """``'encoder/layers_0/...=reranker,...'``: the structure in one line."""
  return ",".join(f"{p}={s}" for p, s in zip(record["paths"],
                                             record["structure"]))


def write_structure(model_dir: str, record: dict) -> None:
  """``MODEL_DIR/refusion_structure.json``, whole or absent."""
  with atomic_write(paths.join(model_dir, STRUCTURE_FILE)) as f:
    json.dump(record, f, indent=2)


def read_structure(model_dir: str) -> dict | None:
  """The saved structure record of a run, or None when the search has not
  ended (or the run does not search)."""
  path = paths.join(model_dir, STRUCTURE_FILE)
  if not paths.exists(path):
    return None
  return json.loads(paths.read_text(path))
