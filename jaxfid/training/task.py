"""What a method gives the one training loop: a :class:`Task`.

The loop (:func:`jaxfid.training.loop.train`) owns what every method shares
(mesh, shardings, init or restore, resume, checkpoints, accumulation,
metrics, SIGTERM); a task is its configuration (gin builds it) and these
hooks, called in this order. ``p`` is what ``prepare`` returned.

  prepare(settings) -> p           reads and checks all data and builds the
                                   model: a frozen :class:`Prepared`
                                   (settings, model, vocabulary, and the
                                   method's data, batches, evaluator); every
                                   bad input fails here, before any work
  run_config(p) -> dict            jaxfid_config.json (with "method")
  phases(p, optimizer)             [Phase, ...] covering [0, final step);
                                   pure steps, the same on every call
  initial_params(p, path)          INIT_CHECKPOINT's params (fresh start)
  completed(ctx, final_step)       a finished run's final record, or None
  start(p, ctx, step, state)       after init or restore, before any step
  batch(p, step, rows, params)     rows ``rows`` of the global batch of
                                   0-based ``step``: a function of (seed,
                                   step) and the params, so resume is exact
  log_fields(metrics), log_record(step), progress_fields(record)
  evaluates(p); evaluate(p, ctx, step, params) -> record, every EVAL_EVERY
                                   steps (``best_metric`` among its keys)
  after_step(p, ctx, step, state)  after the step's log, eval, checkpoint
  phase_end(p, ctx, phase, state)  a phase complete (also on a resume at
                                   its end) -> record
  finish(p, ctx, step, state)      -> the final record (e.g. test scores)
  close()                          always, last

Only ``prepare``, ``phases`` and ``batch`` have no default. A task's own
attributes are set in ``__init__``; the events (``start``, ``after_step``,
``phase_end``) may change run-time state declared there (a refreshed
index's batcher, ReFusion's searched structure).

A task that ``jaxfid bench compile`` (and ``COMPILED_STEP``) can compile
also is :class:`Compilable`; the command says in one line when not:

  compile_bindings(macro)          (class) placeholders for unset data paths
  prepare_shapes(settings) -> p    ``prepare`` from the configuration alone:
                                   nothing read, opened or allocated
  abstract_batch(p, phase)         ShapeDtypeStructs of ``batch``'s global
                                   batch in phase ``phase``, exactly
  decode_program(p, batch_size)    (fn(params, batch), abstract batch): the
                                   evaluation's prediction program
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prepared:
  """What :meth:`Task.prepare` returns; a method's subclass adds its data,
  batches and evaluator."""
  settings: Settings
  model: Any                      # init_params, abstract_params, param_axes
  vocabulary: str | None = None   # spiece.model to copy into MODEL_DIR


class Task:
  """Base class of a method's training task (see the module docstring)."""
  name: str = "task"              # the run config's "method"
  description: str = "train"      # the progress bar's label
  throughput_name: str = "examples_per_sec"
  best_metric: str | None = None  # an evaluate() key to keep the best of

  def prepare(self, settings: Settings) -> Prepared:
    raise NotImplementedError

  def run_config(self, p: Prepared) -> dict:
    return {"method": self.name, "model": p.model.config.to_dict()}

  def phases(self, p: Prepared, optimizer: OptimizerSettings) -> list[Phase]:
    raise NotImplementedError

  def initial_params(self, p: Prepared, path: str):
    """INIT_CHECKPOINT's parameters for this run's model (host arrays)."""
    raise NotImplementedError

  def batch(self, p: Prepared, step: int, rows: slice, params) -> Any:
    raise NotImplementedError

  def log_fields(self, metrics: dict) -> dict:
    return {k: float(metrics[k]) for k in ("loss", "token_accuracy",
                                           "grad_norm") if k in metrics}

  def log_record(self, step: int) -> dict:
    """Fields of the step's log line that do not come from the step."""
    return {}

  def progress_fields(self, record: dict) -> dict:
    return {"loss": f"{record['loss']:.4f}"} if "loss" in record else {}

  def evaluates(self, p: Prepared) -> bool:
    return False

  def evaluate(self, p: Prepared, ctx: Context, step: int, params) -> dict:
    return {}

  def completed(self, ctx: Context, final_step: int) -> dict | None:
    return None

  def start(self, p: Prepared, ctx: Context, step: int, state: State) -> None:
    pass

  def phase_end(self, p: Prepared, ctx: Context, phase: Phase,
                state: State) -> dict:
    return {}

  def after_step(self, p: Prepared, ctx: Context, step: int,
                 state: State) -> None:
    pass

  def finish(self, p: Prepared, ctx: Context, step: int, state: State) -> dict:
    return {}

  def close(self) -> None:
    pass


class Compilable:
  """The hooks of ahead-of-time compilation (the module docstring), mixed
  into a :class:`Task` that has them."""

  @classmethod
  def compile_bindings(cls, macro: Callable[[str], Any]) -> dict:
    """Macros (name -> value) that let the task's configs build from a gin
    file whose data is not set (a placeholder path nothing reads);
    ``macro(name)`` is the run's value (None: unset)."""
    del macro
    return {}

  def prepare_shapes(self, settings: Settings) -> Prepared:
    raise NotImplementedError

  def abstract_batch(self, p: Prepared, phase: int) -> Any:
    raise NotImplementedError

  def decode_program(self, p: Prepared, batch_size: int
                     ) -> tuple[Callable[[Any, Any], Any], Any]:
    raise NotImplementedError


def compilable(task: Task) -> Compilable:
  """``task``, when it can be compiled ahead of time; else InputError."""
  if not isinstance(task, Compilable):
    raise InputError("METHOD", f"the {task.name} task cannot be compiled "
                     "ahead of time")
  return task
