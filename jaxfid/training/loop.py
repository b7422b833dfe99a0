"""The one training loop, top to bottom, for every method.

gin configures :func:`train` (``gin/training.gin``, included by every
method's gin file): the run's settings and optimizer as two config values
built from the run's macros (``MODEL_DIR``, ``TRAIN_STEPS``, ``BATCH_SIZE``,
``LEARNING_RATE``, ...; :mod:`jaxfid.training.settings`) and the method's
task object (``METHOD = @FidTask()``, ...; see :mod:`jaxfid.training.task`).
Nothing below the top level reads gin.

Guarantees, the same for every method:
  * every batch and dropout mask is a function of (seed, step), and the
    latest checkpoint holds the whole train state: rerunning the same
    command resumes and continues step for step as if never stopped;
  * SIGTERM (preemption) finishes the current step, writes a checkpoint and
    exits cleanly; SIGKILL loses at most the steps since the last checkpoint;
  * a non-finite loss never reaches the parameters: the step's update is
    dropped and the run stops naming the step (``on_nan='stop'``) or goes on
    (``'skip'``);
  * gradient accumulation is exact (microbatch losses are sums over the whole
    batch's normalizer); batches are sharded over the mesh's data axes and
    each process supplies only its rows;
  * metrics go to ``MODEL_DIR/metrics.jsonl`` and TensorBoard; a resumed run
    drops the lines the interrupted one wrote after its checkpoint;
  * faults: one run per MODEL_DIR (a lock; a killed run's lock is taken
    over), a killed run's temporaries are removed, an unreadable checkpoint
    is set aside and the run resumes from the newest readable one, a full
    disk is one line and loses nothing saved before;
  * multi-host: SIGTERM or Ctrl-C on any process stops all at the same step;
    process 0 writes the run's files, all write checkpoints.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any

import jax
from tqdm import tqdm

from jaxfid.checkpoints.model_dir import (RunCheckpoints, brief,
                                         write_run_config)
from jaxfid.core import paths
from jaxfid.core.errors import InputError
from jaxfid.core.registry import Registry
from jaxfid.runtime import console, multihost
from jaxfid.runtime.files import remove_stale_temporaries
from jaxfid.runtime.locks import DirectoryLock
from jaxfid.training import state as state_lib
from jaxfid.training.metrics_log import MetricsLog
from jaxfid.training.settings import OptimizerSettings, Settings
from jaxfid.training.task import Context, Prepared, Task, compilable


class NonFiniteLoss(FloatingPointError):
  """A step's loss or gradient was not finite (its update was not applied)."""


class StepLoop:
  """Progress bar, non-finite check and throughput for ``[start, total)``.

  ``on_nan='stop'`` raises :class:`NonFiniteLoss` naming the step when a
  step reports ``finite == 0``; ``'skip'`` warns and goes on (the step
  function has already left parameters and optimizer state untouched).
  """

  def __init__(self, *, total: int, start: int, desc: str, progress: bool,
               on_nan: str):
    self.on_nan = on_nan  # 'stop' or 'skip' (Settings.on_nan, checked)
    self.bar = tqdm(total=total, initial=start, desc=desc,
                    disable=not progress, file=sys.stderr)
    self._since, self._t_last = 0, time.time()

  def finished_step(self, step: int, metrics) -> dict:
    """Host copies of the metrics of the step that made the count ``step``."""
    self._since += 1
    self.bar.update(1)
    metrics = jax.device_get(metrics)
    if not metrics["finite"]:
      message = (f"non-finite loss {metrics['loss']} at step {step}; "
                 "the update was not applied")
      if self.on_nan == "stop":
        raise NonFiniteLoss(message)
      print(f"warning: {message}", file=sys.stderr)
    return metrics

  def rate(self, batch_size: int) -> float:
    """Examples per second since the previous call (or the start)."""
    now = time.time()
    value = self._since * batch_size / max(now - self._t_last, 1e-9)
    self._since, self._t_last = 0, now
    return value

  def restart_clock(self) -> None:
    self._since, self._t_last = 0, time.time()

  def show(self, **values) -> None:
    if values:
      self.bar.set_postfix(**values)

  def close(self) -> None:
    self.bar.close()


def _phase_of(phases, step: int) -> int:
  """Index of the phase that produced a checkpoint of ``step`` (> 0)."""
  begin = 0
  for i, phase in enumerate(phases):
    if begin < step <= phase.end:
      return i
    begin = phase.end
  raise InputError("TRAIN_STEPS", f"the latest checkpoint is of step {step}, "
                   f"beyond this run's {phases[-1].end} steps")


def train(*, task: Task, settings: Settings,
          optimizer: OptimizerSettings = OptimizerSettings(),
          progress: bool | None = None) -> dict:
  """Train ``task`` into ``settings.model_dir``; returns the last record.

  ``settings`` and ``optimizer`` have checked themselves (gin builds them
  from the trainer's macros); ``progress`` (``loop.train.progress``), when
  given, turns the progress bars on or off.
  """
  if progress is not None:
    settings = settings.replace(progress=progress)
  # 1. Data and model: the task reads and checks everything before any work.
  p = task.prepare(settings)
  plan = layout(task, p, optimizer)
  device_mesh, place, phases = plan.mesh, plan.placement, plan.phases
  abstract_states, shardings = plan.abstract_states, plan.shardings

  # 2. Run directory: lock, config, vocabulary (process 0), checkpoints (all).
  with _run_directory(settings.model_dir, task.run_config(p), p.vocabulary,
                      settings.keep_checkpoints) as ckpts:
    ctx = Context(settings=settings, placement=place, log=None,
                  checkpoints=ckpts,
                  save=lambda s, st: ckpts.save(s, st, force=True))
    if ckpts.latest_step() == phases[-1].end:
      done = task.completed(ctx, phases[-1].end)
      if done is not None:
        task.close()
        console.say(f"{settings.model_dir} is complete (step "
                    f"{phases[-1].end}); nothing to do")
        return done
    with jax.set_mesh(device_mesh), state_lib.Preemption() as preemption:
      # 3. Restore the newest readable checkpoint, or init. The initial
      # parameters are made once, where a fresh start or a later phase
      # (fresh_params='initial') needs them, and kept only for the latter.
      state, step, index = _restore_readable(ckpts, phases, abstract_states,
                                             shardings)
      again = any(p.fresh_params == "initial" for p in phases[index + 1:])
      initial = (_initial_params(task, p, place)
                 if state is None or again else None)
      if state is None:
        state = state_lib.fresh_state(phases[0].make_state, initial, 0,
                                      shardings[0])
        initial = initial if again else None
      ctx.log = MetricsLog(settings.model_dir, resume_step=step)
      task.start(p, ctx, step, state)
      loop = StepLoop(total=phases[-1].end, start=step,
                      desc=task.description, progress=settings.progress,
                      on_nan=settings.on_nan)
      last: dict = {}
      t0 = time.time()
      try:
        # 4. The phases: a new one starts from fresh optimizer states.
        for i in range(index, len(phases)):
          if i != index:
            params = (initial if phases[i].fresh_params == "initial"
                      else state["params"])
            state = state_lib.fresh_state(phases[i].make_state, params, step,
                                          shardings[i])
          step_fn = step_function(task, p, place, phases[i], i,
                                  shardings[i], state)
          state, step, stopped = _run_phase(task, p, ctx, loop, preemption,
                                            phases[i], step_fn, state, step,
                                            last)
          if stopped:
            return last
          _record(ctx, last, step, task.phase_end(p, ctx, phases[i], state))
        # 5. The end: the task's final evaluation (ReFusion's test set).
        _record(ctx, last, step, task.finish(p, ctx, step, state))
      finally:
        loop.close()
        task.close()
        ctx.log.close()
  last["step"] = step
  last["train_time_s"] = time.time() - t0
  return last


@dataclasses.dataclass(frozen=True)
class Layout:
  """A prepared task's run laid out on devices: what :func:`train` steps
  and ``jaxfid bench compile`` compiles (:mod:`jaxfid.aot.programs`)."""
  mesh: Any                     # jax.sharding.Mesh
  placement: state_lib.Placement
  phases: list                  # [Phase, ...]
  abstract_params: Any
  abstract_states: list         # per phase, ShapeDtypeStruct leaves
  shardings: list               # per phase, the state's shardings


def layout(task: Task, p: Prepared, optimizer: OptimizerSettings,
           devices=None) -> Layout:
  """The mesh (``MESH`` over ``devices``, default all; checked against the
  batch), the placement of the prepared model (``p``: from ``prepare`` or
  ``prepare_shapes``), the phases and each phase's abstract train state and
  shardings; nothing is allocated."""
  settings = p.settings
  device_mesh = state_lib.checked_mesh(settings.mesh, settings.batch_size,
                                       settings.accumulation_steps, devices)
  place = state_lib.placement(device_mesh, p.model.param_axes())
  phases = task.phases(p, optimizer)
  abstract_params = p.model.abstract_params()
  abstract_states = [jax.eval_shape(p.make_state, abstract_params, 0)
                     for p in phases]
  shardings = [place.state(a, abstract_params) for a in abstract_states]
  return Layout(device_mesh, place, phases, abstract_params, abstract_states,
                shardings)


# COMPILED_STEP's loader: ``(path, jitted step, its arguments, phase name) ->
# the step to run`` (the executable saved in path where it matches, else the
# jitted step); registered by jaxfid.aot (jaxfid/aot/executables.py).
STEP_LOADERS: Registry = Registry(
    "compiled-step loader", "import jaxfid.aot.plugin (the jaxfid command "
    "does)")


def step_function(task: Task, p: Prepared, place: state_lib.Placement,
                  phase, index: int, shardings, state):
  """Phase ``index``'s step as the loop runs it: :func:`jit_step`, or with
  ``COMPILED_STEP`` set the executable saved there
  (:mod:`jaxfid.aot.executables`), which the loader checks against this
  step (a mismatch: one line, and the step compiles)."""
  jitted = jit_step(phase, shardings, place)
  if not p.settings.compiled_step:
    return jitted
  batch = jax.tree.map(lambda s: jax.ShapeDtypeStruct(
      s.shape, s.dtype, sharding=place.batch),
                       compilable(task).abstract_batch(p, index))
  return STEP_LOADERS.get("file", "COMPILED_STEP")(
      p.settings.compiled_step, jitted, (state, batch), phase.name)


def jit_step(phase, shardings, place: state_lib.Placement):
  """A phase's step as the loop runs it: jitted with the state's shardings
  and the batch's, metrics replicated, the state donated."""
  return jax.jit(phase.step, in_shardings=(shardings, place.batch),
                 out_shardings=(shardings, place.replicated),
                 donate_argnums=0)


def _initial_params(task: Task, p: Prepared, place):
  """The run's initial parameters, sharded: INIT_CHECKPOINT's, or SEED's.

  A loaded checkpoint sits on this process's first device (a MODEL_DIR's
  restore) or on the host; :func:`multihost.put` places each process's
  parts from its own copy (``jax.device_put`` cannot move a single-device
  array onto devices of other processes)."""
  settings = p.settings
  if settings.init_checkpoint:
    return multihost.put(task.initial_params(p, settings.init_checkpoint),
                         place.params)
  return jax.jit(lambda: p.model.init_params(settings.seed),
                 out_shardings=place.params)()


def _run_phase(task: Task, p: Prepared, ctx: Context, loop: StepLoop,
               preemption, phase,
               step_fn, state, step: int, last: dict):
  """Steps ``[step, phase.end)`` of ``phase``: batch, step, log, evaluate,
  checkpoint; ``last`` collects the latest record. Returns (state, step,
  stopped): stopped by a signal after saving that step (``last`` says so).
  """
  settings, place = ctx.settings, ctx.placement
  batch_size = settings.batch_size
  rows = place.batch_rows(batch_size)
  loop.restart_clock()
  while step < phase.end:
    host = task.batch(p, step, rows, state["params"])
    state, metrics = step_fn(state, place.global_batch(host, rows,
                                                       batch_size))
    step += 1
    metrics = loop.finished_step(step, metrics)
    stopping = preemption.agreed()
    if step % settings.log_every == 0 or step == phase.end or stopping:
      last.clear()  # the record is the latest log line and what follows it
      last.update(_log_step(task, ctx.log, loop, phase, step, metrics,
                            batch_size))
    if task.evaluates(p) and (step % settings.eval_every == 0
                              or step == phase.end):
      last.update(_evaluate(task, p, ctx, step, state))
      loop.show(**task.progress_fields(last))
    if (step % settings.checkpoint_every == 0 or step == phase.end
        or stopping):
      ctx.checkpoints.save(step, state, force=step == phase.end or stopping)
    if stopping:
      console.say(f"{preemption.signal_name}: saved step {step} to "
                  f"{settings.model_dir}; exiting")
      last.update(step=step, preempted=True, signal=preemption.signal_name)
      return state, step, True
    task.after_step(p, ctx, step, state)
  return state, step, False


def _record(ctx: Context, last: dict, step: int, record: dict) -> None:
  """A phase's or the run's final record, logged and kept in ``last``."""
  if record:
    ctx.log.write(step, record)
    last.update(record)


@contextlib.contextmanager
def _run_directory(model_dir: str, run_config: dict, vocabulary: str | None,
                   keep: int):
  """MODEL_DIR locked (process 0, local directories), with the run config
  and vocabulary written and its checkpoints open."""
  paths.makedirs(model_dir)
  lock = (DirectoryLock(model_dir, what="MODEL_DIR", inside=True)
          if jax.process_index() == 0 and not paths.is_url(model_dir)
          else contextlib.nullcontext())
  with lock:
    if jax.process_index() == 0:
      if not paths.is_url(model_dir):  # what a killed run left half-written
        for sub in ("", "eval", "best"):
          remove_stale_temporaries(paths.join(model_dir, sub))
      write_run_config(model_dir, run_config)
      spiece = paths.join(model_dir, "spiece.model")
      if vocabulary and not paths.exists(spiece):
        paths.copy(vocabulary, spiece)
    ckpts = RunCheckpoints(model_dir, keep=keep)
    try:
      yield ckpts
    finally:
      ckpts.close()


def _restore_readable(ckpts: RunCheckpoints, phases, abstract_states,
                      state_shardings):
  """(state, step, phase index) of the newest checkpoint that restores;
  (None, 0, 0) without one. An unreadable checkpoint is set aside (renamed
  ``<step>.unreadable``) with a one-line warning, and the one before it is
  tried, so the run resumes exactly from the last good step."""
  for step in reversed(ckpts.steps()):
    index = _phase_of(phases, step)
    try:
      state = state_lib.restore_state(ckpts, step, abstract_states[index],
                                      state_shardings[index])
    except InputError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      kept = ckpts.set_aside(step)
      console.say(f"warning: checkpoint {ckpts.step_dir(step)} is "
                  f"unreadable ({brief(e)}); kept as {kept}, resuming "
                  "from the one before")
      continue
    console.say(f"resumed from step {step} in {ckpts.model_dir}")
    return state, step, index
  return None, 0, 0


def _log_step(task: Task, log: MetricsLog, loop: StepLoop, phase, step: int,
              metrics: dict, batch_size: int) -> dict:
  """The step's log line (the task's fields, learning rate, throughput)."""
  record = task.log_fields(metrics)
  record.update(task.log_record(step))
  record["learning_rate"] = float(phase.learning_rate(step - 1))
  record[task.throughput_name] = loop.rate(batch_size)
  log.write(step, record)
  loop.show(**task.progress_fields(record))
  return record


def _evaluate(task: Task, p: Prepared, ctx: Context, step: int, state
              ) -> dict:
  """The task's evaluation, logged; the best checkpoint kept."""
  result = task.evaluate(p, ctx, step, state["params"])
  ctx.log.write(step, result)
  if task.best_metric and ctx.checkpoints.maybe_save_best(
      step, state["params"], result[task.best_metric], name=task.best_metric):
    result["best"] = True
  return result
