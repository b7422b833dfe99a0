"""What a method gives the one training loop: a :class:`Task`.

The loop (:func:`jaxfid.training.loop.train`) owns what every method shares
(mesh, shardings, init or restore, resume, checkpoints, accumulation,
metrics); a task owns its model, data, batches, train steps (one per
:class:`Phase`), evaluation and events between steps.

The order of calls::

  task.prepare(settings)            read and check all data; build the model
  task.run_config()                 -> jaxfid_config.json (with "method")
  task.phases(settings, optimizer)  -> [Phase, ...] covering [0, final step)
  task.initial_params(path)         INIT_CHECKPOINT (only on a fresh start)
  task.start(ctx, step, state)      after init or restore
  loop: task.batch(step, rows, params) -> step -> metrics
        task.log_fields(metrics); task.evaluate(ctx, step, params)
        task.after_step(ctx, step, state)
  task.finish(ctx, step, state)     -> the final record (e.g. test scores)

Ahead-of-time compilation (``jaxfid bench compile``) calls, instead of
``prepare`` and without reading any data or checkpoint::

  task.prepare_shapes(settings)     build the model from the configuration
  task.phases(settings, optimizer)  the same phases the loop would run
  task.abstract_batch(settings, phase_index)  -> the global batch's shapes
  task.decode_program(settings, batch_size)   -> the predict program
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp
import optax

from jaxfid.core.errors import InputError
from jaxfid.training.settings import OptimizerSettings, Settings
from jaxfid.training.step import ADDITIVE_METRICS, make_train_step

State = dict  # {"step", "params", "opt_state", ...}


def train_state(params, step, **opt_states) -> State:
  """A train state: ``{"step": int32 step, "params": params, **opt_states}``."""
  return {"step": jnp.asarray(step, jnp.int32), "params": params,
          **opt_states}


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps ``[previous phase's end, end)`` trained by one step function.

  Attributes:
    name: shown in logs ('train', 'search', 'retrain').
    end: the step count at which the phase is complete.
    make_state: ``(params, step) -> State`` with fresh optimizer states
      (pure; the loop jits it with the state's shardings).
    step: ``(state, batch) -> (state, metrics)`` (pure; jitted, state
      donated). ``metrics`` must hold ``loss`` and ``finite``.
    learning_rate: the schedule's value at a 0-based step, for the log.
    fresh_params: where a fresh state's parameters come from when the phase
      starts: 'carry' (the previous phase's) or 'initial' (the run's initial
      parameters again, e.g. ReFusion's retraining of a searched structure).
  """
  name: str
  end: int
  make_state: Callable[[Any, Any], State]
  step: Callable[[State, Any], tuple[State, dict]]
  learning_rate: Callable[[int], Any]
  fresh_params: str = "carry"


def loss_phase(model, settings: Settings, optimizer: OptimizerSettings,
               schedule: optax.Schedule, name: str = "train") -> Phase:
  """The usual single phase: ``model.loss`` minimised by one optimizer over
  ``[0, TRAIN_STEPS)``, with exact gradient accumulation."""
  tx = optimizer.make(schedule)
  loss = lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm)
  return Phase(name, settings.train_steps,
               make_state=lambda p, s: train_state(p, s, opt_state=tx.init(p)),
               step=make_train_step(
                   loss, tx, seed=settings.seed,
                   accumulation_steps=settings.accumulation_steps,
                   additive=getattr(model, "additive_metrics",
                                    ADDITIVE_METRICS)),
               learning_rate=schedule)


@dataclasses.dataclass
class Context:
  """What the loop lends a task while it runs."""
  settings: Settings
  placement: Any        # jaxfid.training.state.Placement
  log: Any              # jaxfid.training.metrics_log.MetricsLog
  checkpoints: Any      # jaxfid.checkpoints.model_dir.RunCheckpoints
  save: Callable[[int, State], None]   # force a checkpoint of a state


class Task:
  """Base class of a method's training task (see the module docstring).

  Subclasses set ``name`` (the run config's ``method``) and ``model``, and
  implement :meth:`prepare`, :meth:`phases` and :meth:`batch`; the rest has
  defaults.
  """
  name: str = "task"
  description: str = "train"      # the progress bar's label
  throughput_name: str = "examples_per_sec"
  best_metric: str | None = None  # an evaluate() key to keep the best of
  model: Any = None
  vocabulary: str | None = None   # spiece.model to copy into MODEL_DIR

  def prepare(self, settings: Settings) -> None:
    raise NotImplementedError

  def run_config(self) -> dict:
    return {"method": self.name, "model": self.model.config.to_dict()}

  def phases(self, settings: Settings, optimizer: OptimizerSettings
             ) -> list[Phase]:
    raise NotImplementedError

  def initial_params(self, path: str):
    """INIT_CHECKPOINT's parameters for this run's model (host arrays)."""
    raise NotImplementedError

  def batch(self, step: int, rows: slice, params) -> Any:
    """The rows ``rows`` of the global batch of 0-based ``step``."""
    raise NotImplementedError

  def log_fields(self, metrics: dict) -> dict:
    return {k: float(metrics[k]) for k in ("loss", "token_accuracy",
                                           "grad_norm") if k in metrics}

  def log_record(self, step: int) -> dict:
    """Fields of the step's log line that do not come from the step."""
    return {}

  def progress_fields(self, record: dict) -> dict:
    return {"loss": f"{record['loss']:.4f}"} if "loss" in record else {}

  def evaluates(self) -> bool:
    return False

  def evaluate(self, ctx: Context, step: int, params) -> dict:
    return {}

  def completed(self, ctx: Context, final_step: int) -> dict | None:
    """The final record of a run that already finished, else None."""
    return None

  def start(self, ctx: Context, step: int, state: State) -> None:
    """After init or restore, before the first step of this process."""

  def phase_end(self, ctx: Context, phase: Phase, state: State) -> dict:
    """When ``phase`` is complete (also on a resume exactly at its end)."""
    return {}

  def after_step(self, ctx: Context, step: int, state: State) -> None:
    """After the step's log, evaluation and checkpoint."""

  def finish(self, ctx: Context, step: int, state: State) -> dict:
    return {}

  def close(self) -> None:
    pass

  # ---- ahead-of-time compilation (``jaxfid bench compile``) ----------------

  @classmethod
  def compile_bindings(cls, macro: Callable[[str], Any]) -> dict:
    """Macros (name -> value) ``jaxfid bench compile`` binds so that the
    task's configs build from a gin file whose data is not set (a
    placeholder path nothing reads); ``macro(name)`` is the run's value of
    a macro (None: unset). Default: none."""
    del macro
    return {}

  def prepare_shapes(self, settings: Settings) -> None:
    """What :meth:`prepare` does that :meth:`phases` and the programs need
    (``model`` above all), from the configuration alone: no data or
    checkpoint is read, no file opened, nothing allocated on a device."""
    raise InputError("METHOD", f"the {self.name} task cannot be compiled "
                     "ahead of time")

  def abstract_batch(self, settings: Settings, phase: int) -> Any:
    """The global train batch of phase ``phase`` (an index into
    :meth:`phases`), as ``jax.ShapeDtypeStruct`` leaves: the shapes and
    dtypes :meth:`batch` would give for all ``settings.batch_size`` rows."""
    raise InputError("METHOD", f"the {self.name} task cannot be compiled "
                     "ahead of time")

  def decode_program(self, settings: Settings, batch_size: int
                     ) -> tuple[Callable[[Any, Any], Any], Any]:
    """``(fn, abstract_batch)``: the method's prediction program as a pure
    ``fn(params, batch)`` (what ``jaxfid predict`` or the task's evaluation
    runs per batch: encoding and cached greedy or beam decoding, or scoring),
    and its batch of ``batch_size`` rows as ``jax.ShapeDtypeStruct``s."""
    raise InputError("METHOD", f"the {self.name} task has no prediction "
                     "program to compile")
