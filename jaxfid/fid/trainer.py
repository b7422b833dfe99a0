"""The FiD trainer, top to bottom: data, mesh, init or restore, steps, eval, checkpoints.

gin configures ``train`` (see ``gin/fid/*.gin``; the macros ``MODEL_DIR``,
``TRAIN_DATA``, ``TRAIN_STEPS``, ``BATCH_SIZE``, ``N_CONTEXT``, ... are bound
to its arguments there). Nothing below the top level reads gin.

Reliability:
  * every batch and dropout mask is a function of (seed, step), and the
    latest checkpoint holds (step, params, optimizer state): rerunning the
    same command resumes and continues step for step as if never stopped;
  * SIGTERM (preemption) finishes the current step, writes a checkpoint and
    exits cleanly; SIGKILL loses at most the steps since the last checkpoint;
  * a non-finite loss never reaches the parameters: the step's update is
    dropped and the run stops naming the step (``on_nan='stop'``) or goes on
    (``'skip'``).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxfid.fid import predict as predict_lib
from jaxfid.core import sharding as shd
from jaxfid.fid import examples as fid_format, batches as pipeline
from jaxfid.core.errors import InputError
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.training import optim
from jaxfid.training import loop as loop_lib
from jaxfid.training.metrics_log import MetricsLog
from jaxfid.training.step import make_train_step


NonFiniteLoss = loop_lib.NonFiniteLoss  # re-exported: trainers import it here


@dataclasses.dataclass
class Shardings:
  mesh: Any
  params: Any
  state: Any
  batch: NamedSharding
  replicated: NamedSharding


def make_shardings(mesh, model: EncoderDecoderModel, optimizer) -> Shardings:
  """Parameter, optimizer-state and batch shardings from the logical axes."""
  is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, str) for a in x)
  specs = jax.tree.map(lambda axes: shd.logical_to_mesh(axes, mesh=mesh),
                       model.param_axes(), is_leaf=is_axes)
  is_spec = lambda x: isinstance(x, PartitionSpec)
  opt_shapes = jax.eval_shape(optimizer.init, model.abstract_params())
  opt_specs = optax.tree_map_params(
      optimizer, lambda _, spec: spec, opt_shapes, specs,
      transform_non_params=lambda _: PartitionSpec(), is_leaf=is_spec)
  to_named = lambda tree: jax.tree.map(lambda s: NamedSharding(mesh, s), tree,
                                       is_leaf=is_spec)
  replicated = NamedSharding(mesh, PartitionSpec())
  params = to_named(specs)
  state = {"step": replicated, "params": params, "opt_state": to_named(opt_specs)}
  batch = NamedSharding(mesh, shd.logical_to_mesh((shd.BATCH,), mesh=mesh))
  return Shardings(mesh, params, state, batch, replicated)


def checked_mesh(mesh: str, batch_size: int, accumulation_steps: int = 1):
  """The device mesh of a ``MESH`` spec, checked against the batch size.

  Raises InputError (MESH, BATCH_SIZE) for a bad spec or a batch that does
  not split over the data-parallel devices (times the microbatches).
  """
  try:
    device_mesh = shd.parse_mesh(mesh)
  except ValueError as e:
    raise InputError("MESH", str(e)) from None
  data_parallel = device_mesh.shape["data"] * device_mesh.shape["fsdp"]
  if batch_size % (data_parallel * accumulation_steps):
    raise InputError("BATCH_SIZE", f"{batch_size} is not divisible by the "
                     f"data-parallel size {data_parallel} (MESH {mesh!r}, "
                     f"{len(device_mesh.devices.flat)} devices) times "
                     f"ACCUMULATION_STEPS {accumulation_steps}")
  return device_mesh


def make_qa_evaluator(model, tokenizer, examples, *, n_context: int,
                      text_maxlength: int, answer_maxlength: int,
                      num_beams: int, batch_size: int, put_batch,
                      model_dir: str, progress: bool, log: MetricsLog,
                      ckpts: checkpointing.RunCheckpoints):
  """``evaluate(step, params) -> dict``: EM/F1 of generated answers.

  Writes per-example predictions to ``MODEL_DIR/eval``, the scores to
  metrics.jsonl, and keeps the best-EM parameters (``"best": True`` then).
  """
  predict_fn = predict_lib.make_predict_fn(
      model, max_decode_len=answer_maxlength, num_beams=num_beams)

  def evaluate(step: int, params) -> dict:
    preds = predict_lib.generate(
        model, params, tokenizer, examples, n_context=n_context,
        text_maxlength=text_maxlength, answer_maxlength=answer_maxlength,
        batch_size=batch_size, predict_fn=predict_fn, progress=progress,
        put_batch=put_batch)
    scores = predict_lib.score(examples, preds)
    if jax.process_index() == 0:
      predict_lib.write_predictions(
          os.path.join(model_dir, "eval", f"predictions_{step}.jsonl"),
          examples, preds, scores)
    result = {"eval_em": scores["em"], "eval_f1": scores["f1"],
              "eval_examples": len(examples)}
    log.write(step, result)
    if ckpts.maybe_save_best(step, params, scores["em"]):
      result["best"] = True
    return result

  return evaluate


def global_batch(host_batch: dict, sharding: NamedSharding, batch_size: int) -> dict:
  """Assemble global arrays from each host's rows (single host: a device_put)."""
  def put(x):
    shape = (batch_size, *x.shape[1:])
    return jax.make_array_from_process_local_data(sharding, x, shape)
  return jax.tree.map(put, host_batch)


def load_initial_params(path: str, model: EncoderDecoderModel, shardings) -> dict:
  """INIT_CHECKPOINT's parameters for ``model``, placed with ``shardings``.

  A checkpoint of the run's architecture loads as it is. A dense T5 (any
  format ``load_checkpoint`` reads) into a FiDO run that differs only in the
  FiDO switches is converted by ``fido_params_from_dense`` (FiDO's
  uptraining; one line on stderr says so). Anything else raises InputError
  naming the fields that differ.
  """
  from jaxfid.fid import fido_uptrain
  from jaxfid.checkpoints.load import load_checkpoint
  other, params, _ = load_checkpoint(path)
  if fido_uptrain.can_uptrain(other.config, model.config):
    params = fido_uptrain.fido_params_from_dense(params, other.config,
                                                 model.config, source=path)
    print(f"INIT_CHECKPOINT {path}: dense T5 converted to FiDO "
          f"({fido_uptrain.describe(model.config)})", file=sys.stderr)
    return jax.device_put(params, shardings)
  diff = fido_uptrain.differing_fields(model.config, other.config)
  if fido_uptrain.is_dense(other.config):  # FiDO switches alone would convert
    diff = [f for f in diff if f not in fido_uptrain.FIDO_FIELDS] or diff
  if diff:
    values = ", ".join(f"{name} (checkpoint {getattr(other.config, name)}, "
                       f"run {getattr(model.config, name)})" for name in diff)
    if not set(diff) <= set(fido_uptrain.FIDO_FIELDS):
      hint = "list the matching gin/models file"
    elif fido_uptrain.is_dense(model.config):
      hint = "a FiDO checkpoint cannot start a dense run"
    else:
      hint = "only a dense T5 checkpoint is converted to FiDO"
    raise InputError(path, f"INIT_CHECKPOINT's model differs from the run's "
                     f"in {values}; {hint}")
  return jax.device_put(params, shardings)


def init_or_restore(ckpts: checkpointing.RunCheckpoints, model, optimizer,
                    sh: Shardings, *, seed: int, init_params=None
                    ) -> tuple[dict, int]:
  """(state, step): the latest checkpoint, else fresh or given parameters.

  ``init_params``: optional function returning sharded parameters (e.g. from
  INIT_CHECKPOINT); otherwise the model's initialiser runs sharded.
  """
  start = ckpts.latest_step()
  if start is not None:
    abstract = jax.eval_shape(lambda: {
        "step": jnp.zeros((), jnp.int32), "params": model.abstract_params(),
        "opt_state": optimizer.init(model.abstract_params())})
    abstract = jax.tree.map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                 sharding=sharding),
        abstract, sh.state)
    state = ckpts.restore(abstract, start)
    print(f"resumed from step {start} in {ckpts.model_dir}", file=sys.stderr)
    return state, start
  if init_params is not None:
    params = init_params()
  else:
    params = jax.jit(lambda: model.init_params(seed), out_shardings=sh.params)()
  state = jax.jit(lambda p: {"step": jnp.zeros((), jnp.int32), "params": p,
                             "opt_state": optimizer.init(p)},
                  out_shardings=sh.state)(params)
  return state, 0


def compile_train_step(model, optimizer, sh: Shardings, *, seed: int,
                       accumulation_steps: int = 1):
  """The jitted, sharded, state-donating train step of ``model.loss``."""
  loss_fn = lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm)
  return jax.jit(make_train_step(loss_fn, optimizer, seed=seed,
                                 accumulation_steps=accumulation_steps),
                 in_shardings=(sh.state, sh.batch),
                 out_shardings=(sh.state, sh.replicated),
                 donate_argnums=0)


class Preemption:
  """Turns SIGTERM into a flag the loop checks after each step."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handler)
    except ValueError:  # not the main thread
      self._previous = None
    return self

  def _handler(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def train(*, model_dir: str, train_data: str, eval_data: str | None = None,
          model_config: T5Config = T5Config(), train_steps: int = 10000,
          batch_size: int = 64, n_context: int = 100, text_maxlength: int = 250,
          answer_maxlength: int = 20, learning_rate: float = 1e-4,
          optimizer: str = "adam", schedule: str = "constant",
          warmup_steps: int = 0, weight_decay: float = 0.0,
          clip_norm: float = 1.0, accumulation_steps: int = 1,
          eval_every: int = 500, checkpoint_every: int = 500,
          log_every: int = 10, keep_checkpoints: int = 2, seed: int = 0,
          mesh: str = "", init_checkpoint: str | None = None,
          dataset: str = "nq", eval_batch_size: int = 8,
          eval_max_examples: int | None = None, eval_beams: int = 1,
          first_phase_n_context: int | None = None,
          final_phase_steps: int = 1000, on_nan: str = "stop",
          progress: bool = True) -> dict:
  """Train a FiD reader; returns the last metrics.

  Two-phase training (the paper's): with ``first_phase_n_context`` set, steps
  before the last ``final_phase_steps`` use that many passages, the rest
  ``n_context``.
  """
  from jaxfid.core.tokenization import load_tokenizer
  if on_nan not in ("stop", "skip"):
    raise ValueError(f"on_nan must be 'stop' or 'skip', got {on_nan!r}")

  # 1. Data: read and validate everything before any work.
  train_examples = fid_format.read_fid_examples(
      train_data, require_answers=True, n_context=n_context)
  eval_examples = (fid_format.read_fid_examples(
      eval_data, require_answers=True, n_context=n_context) if eval_data else [])
  if eval_max_examples:
    eval_examples = eval_examples[:eval_max_examples]
  spiece_dir = init_checkpoint if init_checkpoint and os.path.isfile(
      os.path.join(init_checkpoint, "spiece.model")) else None
  tokenizer = load_tokenizer(spiece_dir)

  # 2. Model, optimizer, mesh and shardings.
  model = EncoderDecoderModel(model_config)
  opt, lr_schedule = optim.make_optimizer(
      learning_rate, optimizer=optimizer, schedule=schedule,
      warmup_steps=warmup_steps, total_steps=train_steps,
      weight_decay=weight_decay, clip_norm=clip_norm)
  device_mesh = checked_mesh(mesh, batch_size, accumulation_steps)
  sh = make_shardings(device_mesh, model, opt)

  # 3. Run directory: config, vocabulary, checkpoints.
  os.makedirs(model_dir, exist_ok=True)
  checkpointing.write_run_config(model_dir, {
      "method": "fid", "model": model_config.to_dict(),
      "n_context": n_context, "text_maxlength": text_maxlength,
      "answer_maxlength": answer_maxlength, "dataset": dataset})
  if not os.path.exists(os.path.join(model_dir, "spiece.model")):
    shutil.copyfile(tokenizer.path, os.path.join(model_dir, "spiece.model"))
  ckpts = checkpointing.RunCheckpoints(model_dir, keep=keep_checkpoints)

  with jax.set_mesh(device_mesh), Preemption() as preemption:
    # 4. Init or restore.
    state, start = init_or_restore(
        ckpts, model, opt, sh, seed=seed,
        init_params=(lambda: load_initial_params(init_checkpoint, model,
                                                 sh.params))
        if init_checkpoint else None)
    step_fn = compile_train_step(model, opt, sh, seed=seed,
                                 accumulation_steps=accumulation_steps)
    log = MetricsLog(model_dir, resume_step=start)
    batchers: dict[int, pipeline.FidBatcher] = {}

    def batcher_for(step: int) -> pipeline.FidBatcher:
      n = n_context
      if first_phase_n_context and step < train_steps - final_phase_steps:
        n = first_phase_n_context
      if n not in batchers:
        batchers[n] = pipeline.FidBatcher(
            train_examples, tokenizer, batch_size=batch_size, n_context=n,
            text_maxlength=text_maxlength, answer_maxlength=answer_maxlength,
            seed=seed, dataset=dataset, process_index=jax.process_index(),
            process_count=jax.process_count())
      return batchers[n]

    evaluate = make_qa_evaluator(
        model, tokenizer, eval_examples, n_context=n_context,
        text_maxlength=text_maxlength, answer_maxlength=answer_maxlength,
        num_beams=eval_beams, batch_size=eval_batch_size,
        put_batch=lambda b: jax.device_put(b, sh.replicated),
        model_dir=model_dir, progress=progress, log=log, ckpts=ckpts)

    # 5. The loop.
    last = {}
    t0 = time.time()
    loop = loop_lib.StepLoop(total=train_steps, start=start, desc="train",
                             progress=progress, on_nan=on_nan)
    step = start
    try:
      while step < train_steps:
        host = batcher_for(step).batch(step)
        batch = global_batch(host, sh.batch, batch_size)
        state, metrics = step_fn(state, batch)
        step += 1
        metrics = loop.finished_step(step, metrics)
        if step % log_every == 0 or step == train_steps:
          last = {"loss": float(metrics["loss"]),
                  "token_accuracy": float(metrics["token_accuracy"]),
                  "grad_norm": float(metrics["grad_norm"]),
                  "learning_rate": float(lr_schedule(step - 1)),
                  "examples_per_sec": loop.rate(batch_size)}
          log.write(step, last)
          loop.show(loss=f"{last['loss']:.4f}")
        if eval_examples and (step % eval_every == 0 or step == train_steps):
          last.update(evaluate(step, state["params"]))
          loop.show(loss=f"{last.get('loss', 0):.4f}",
                    em=f"{last['eval_em']:.3f}")
        if step % checkpoint_every == 0 or step == train_steps:
          ckpts.save(step, state)
        if preemption.requested:
          ckpts.save(step, state, force=True)
          print(f"SIGTERM: saved step {step} to {model_dir}; exiting",
                file=sys.stderr)
          break
    finally:
      loop.close()
      for b in batchers.values():
        b.close()
      log.close()
      ckpts.close()
  last["step"] = step
  last["train_time_s"] = time.time() - t0
  return last
