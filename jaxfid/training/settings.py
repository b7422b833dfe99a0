"""The run's options every method shares, as two config values.

``gin/training.gin`` binds ``loop.train.settings = @settings.Settings()``
and ``loop.train.optimizer = @settings.OptimizerSettings()``, each field
from its macro; the mesh itself is checked when the loop builds it
(:func:`jaxfid.training.state.checked_mesh`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import jax
import optax

from jaxfid.core import sharding
from jaxfid.core.config import Config, option
from jaxfid.core.errors import InputError
from jaxfid.training import optim

ON_NAN_CHOICES = ("stop", "skip")


def _mesh_problem(spec: str) -> str | None:
  try:
    sharding.mesh_axis_sizes(spec)
  except ValueError as e:
    return str(e)
  return None


def _file_problem(path: str | None) -> str | None:
  if path is not None and not os.path.isfile(path):
    return f"no such file: {path}"
  return None


@dataclasses.dataclass(frozen=True)
class Settings(Config):
  """The run settings every method shares (the trainer gin's macros).

  Attributes:
    model_dir: the run's directory: run config, checkpoints, metrics (a
      rerun of the same command resumes from it).
    train_steps: optimizer steps of the whole run.
    batch_size: examples per step (over all devices and microbatches).
    seed: every batch, dropout mask and initialisation derives from it.
    accumulation_steps: microbatches per step (exact: same loss and
      gradient as one batch).
    eval_every: steps between evaluations (when the method has eval data).
    checkpoint_every: steps between checkpoints.
    log_every: steps between metrics lines.
    keep_checkpoints: the latest checkpoints kept (the best is kept apart).
    init_checkpoint: parameters to start from (HF dir, T5X checkpoint, FiD
      reader or jaxfid MODEL_DIR); None: random initialisation from SEED.
    mesh: the device mesh, e.g. 'data=4,model=2' or 'fsdp=8' (one axis may
      be -1: the remaining devices); '' puts every device on data.
    on_nan: a non-finite loss drops the step's update, then 'stop's the run
      naming the step or 'skip's on.
    progress: progress bars on stderr (``loop.train.progress`` sets it).
    compiled_step: a file of ``jaxfid bench compile --save-executable``:
      the train step loaded from it instead of compiled, where it matches
      (:mod:`jaxfid.aot.executables`); None: compiled.
  """
  model_dir: str = option()
  train_steps: int = option(low=1)
  batch_size: int = option(low=1)
  seed: int = option(0)
  accumulation_steps: int = option(1, low=1)
  eval_every: int = option(500, low=1)
  checkpoint_every: int = option(500, low=1)
  log_every: int = option(10, low=1)
  keep_checkpoints: int = option(2, low=1)
  init_checkpoint: str | None = option(None)
  mesh: str = option("", test=_mesh_problem)
  on_nan: str = option("stop", choices=ON_NAN_CHOICES)
  progress: bool = option(True, macro="loop.train.progress")
  compiled_step: str | None = option(None, test=_file_problem)

  def __post_init__(self):
    super().__post_init__()
    batch, steps = self.batch_size, self.accumulation_steps
    if batch % steps:
      raise InputError("ACCUMULATION_STEPS", f"{steps} does not divide "
                       f"BATCH_SIZE {batch} (each step splits its batch into "
                       "ACCUMULATION_STEPS microbatches)")
    parallel = sharding.data_parallel_size(
        sharding.mesh_axis_sizes(self.mesh))
    if parallel and batch % (parallel * steps):
      raise InputError("BATCH_SIZE", f"{batch} is not divisible by the "
                       f"data-parallel size {parallel} of MESH {self.mesh!r} "
                       f"times ACCUMULATION_STEPS {steps}")

  # The processes are the run's, not options: what the loop runs on.
  @property
  def process_index(self) -> int:
    return jax.process_index()

  @property
  def process_count(self) -> int:
    return jax.process_count()


@dataclasses.dataclass(frozen=True)
class OptimizerSettings(Config):
  """The optimizer of the run's parameters (the trainer gin's macros).

  Attributes:
    learning_rate: the peak learning rate (0: parameters frozen).
    optimizer: 'adam' or 'adamw' (decoupled weight decay).
    schedule: 'constant', 'linear' (warmup, then linear decay to 0) or
      'cosine' (warmup, then Atlas's cosine decay to a tenth of the rate,
      its ``--scheduler cosine``).
    warmup_steps: steps of linear warmup from 0.
    weight_decay: decoupled weight decay of 'adamw' ('adam' has none).
    clip_norm: global gradient norm clipping; 0 or None: off.
  """
  learning_rate: float = option(1e-4, low=0)
  optimizer: str = option("adam", choices=optim.OPTIMIZERS)
  schedule: str = option("constant", choices=optim.SCHEDULES)
  warmup_steps: int = option(0, low=0)
  weight_decay: float = option(0.0, low=0)
  clip_norm: float | None = option(1.0, low=0)

  def schedule_fn(self, total_steps: int, restarts: Sequence[int] = (),
                  warmup_fraction: float | None = None) -> optax.Schedule:
    return optim.learning_rate_schedule(
        self.learning_rate, schedule=self.schedule,
        warmup_steps=self.warmup_steps, total_steps=total_steps,
        restarts=restarts, warmup_fraction=warmup_fraction)

  def make(self, schedule: optax.Schedule, decay_mask: Any = None
           ) -> optax.GradientTransformation:
    """The optimizer; ``decay_mask``: :func:`optim.make_optimizer`'s (the
    parameters 'adamw' decays; None: all)."""
    return optim.make_optimizer(schedule, optimizer=self.optimizer,
                                weight_decay=self.weight_decay,
                                clip_norm=self.clip_norm,
                                decay_mask=decay_mask)
