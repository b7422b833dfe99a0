"""ReFusion's bi-level search: group optimizers, the step, the structure file.

The architecture weights (every ``fusion_alpha``) are the upper level,
everything else the lower. Each step is first-order alternation: the
architecture step on a dev batch, then the model step on a train batch, each
with its own optimizer and leaving the other group exactly unchanged. The
final argmax structure is written atomically to
``MODEL_DIR/refusion_structure.json`` (:func:`read_structure`).
"""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import optax

from jaxfid.core import paths
from jaxfid.core.config import Config, option
from jaxfid.refusion.model import ReFusionModel, is_arch_path
from jaxfid.runtime.files import atomic_write
from jaxfid.training.settings import OptimizerSettings
from jaxfid.training.step import make_train_step

STRUCTURE_FILE = "refusion_structure.json"
ARCH_SEED_OFFSET = 7919  # the architecture step's own dropout stream


ARCH_OPTIMIZERS = ("adam", "adamw")


@dataclasses.dataclass(frozen=True)
class SearchConfig(Config):
  """How a ReFusion run searches and trains its fusion.

  Attributes:
    search: ``SEARCH``, the bi-level search of the adaptive integrator
      (with fusion modules; without, there is nothing to search).
    retrain: ``RETRAIN``, after the search train the argmax structure again
      from the initial weights (fresh optimizer).
    arch_learning_rate: the architecture weights' peak learning rate.
    arch_optimizer: ``'adam'`` (constant rate) or ``'adamw'``
      (:func:`arch_optimizer`).
    arch_weight_decay: ``'adamw'``'s weight decay of the architecture
      weights.
    arch_warmup_steps: ``'adamw'``'s linear warm-up steps (then linear
      decay to 0).
    arch_clip_norm: clip the architecture gradients to this global norm;
      None or 0: off.
    fusion_lr_scale: ``FUSION_LR_SCALE``, the fusion parameters' learning
      rate relative to the backbone's (:func:`group_optimizers`).
  """
  search: bool = True
  retrain: bool = False
  arch_learning_rate: float = option(1e-4, low=0)
  arch_optimizer: str = option("adam", choices=ARCH_OPTIMIZERS)
  arch_weight_decay: float = option(0.0, low=0)
  arch_warmup_steps: int = option(0, low=0)
  arch_clip_norm: float | None = option(None, low=0)
  fusion_lr_scale: float = option(1.0, above=0)


def arch_optimizer(learning_rate: float, *, kind: str = "adam",
                   weight_decay: float = 0.0, warmup_steps: int = 0,
                   total_steps: int = 0, clip_norm: float | None = None
                   ) -> optax.GradientTransformation:
  """The architecture weights' optimizer: ``'adam'`` at a constant rate, or
  ``'adamw'`` (the original code's: warm-up, linear decay to 0 at
  ``total_steps``); ``clip_norm`` (0 or None: off)."""
  if kind == "adam":
    opt = optax.adam(learning_rate)
  elif kind == "adamw":
    decay = optax.linear_schedule(learning_rate, 0.0,
                                  max(total_steps - warmup_steps, 1))
    schedule = decay if warmup_steps <= 0 else optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, warmup_steps), decay],
        [warmup_steps])
    opt = optax.adamw(schedule, weight_decay=weight_decay)
  else:
    raise ValueError(f"architecture optimizer {kind!r}: one of "
                     f"{ARCH_OPTIMIZERS}")
  if clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(clip_norm), opt)
  return opt


def decays(params):
  """Which parameters AdamW's weight decay applies to (a tree of bools):
  all but the layer norms' ``scale`` (and any ``bias``; T5 has none), as the
  original's ``no_decay = ["bias", "LayerNorm.weight"]``."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: str(getattr(path[-1], "key", path[-1]))
      not in ("scale", "bias"), params)


def optimizers(params, optimizer: OptimizerSettings, options: SearchConfig,
               total_steps: int):
  """(learning-rate schedule, model step's optimizer, architecture step's
  optimizer) of a run of ``total_steps`` (:func:`group_optimizers` over
  OPTIMIZER ... with :func:`decays`, and :func:`arch_optimizer` over
  ARCH_*). ``params`` may be abstract."""
  schedule = optimizer.schedule_fn(total_steps)
  model_opt, arch_opt = group_optimizers(
      params, optimizer.make(schedule, decay_mask=decays),
      arch_optimizer(
          options.arch_learning_rate, kind=options.arch_optimizer,
          weight_decay=options.arch_weight_decay,
          warmup_steps=options.arch_warmup_steps, total_steps=total_steps,
          clip_norm=options.arch_clip_norm),
      fusion_lr_scale=options.fusion_lr_scale)
  return schedule, model_opt, arch_opt


def param_group(path) -> str:
  """'arch' (``fusion_alpha``), 'fusion' (the other ``fusion_*``
  parameters: reranker, beta, projection) or 'model' (the backbone)."""
  if is_arch_path(path):
    return "arch"
  name = str(getattr(path[-1], "key", path[-1]))
  return "fusion" if name.startswith("fusion_") else "model"


def group_optimizers(params, model_opt: optax.GradientTransformation,
                     arch_opt: optax.GradientTransformation | float, *,
                     fusion_lr_scale: float = 1.0):
  """(model step's optimizer, architecture step's optimizer), each leaving
  the other's group exactly unchanged; fusion updates scaled by
  ``fusion_lr_scale``; ``arch_opt`` may be a learning rate (Adam)."""
  if not isinstance(arch_opt, optax.GradientTransformation):
    arch_opt = optax.adam(arch_opt)
  groups = jax.tree_util.tree_map_with_path(
      lambda path, _: param_group(path), params)
  arch_or_not = jax.tree.map(lambda g: "arch" if g == "arch" else "model",
                             groups)
  zero = optax.set_to_zero()
  model = optax.multi_transform({"model": model_opt, "arch": zero},
                                arch_or_not)
  if fusion_lr_scale != 1.0:
    model = optax.chain(model, optax.multi_transform(
        {"model": optax.identity(), "arch": optax.identity(),
         "fusion": optax.scale(fusion_lr_scale)}, groups))
  return (model, optax.multi_transform({"model": zero, "arch": arch_opt},
                                       arch_or_not))


def make_step(model: ReFusionModel, model_opt: optax.GradientTransformation,
              arch_opt: optax.GradientTransformation, *, seed: int,
              with_arch: bool, accumulation_steps: int = 1):
  """``step(state, {"train": batch, "dev": batch}) -> (state, metrics)``:
  with ``with_arch`` the architecture step on ``dev``, then the model step
  on ``train``; each half drops a non-finite update (``finite``: both)."""
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
