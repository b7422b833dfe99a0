"""The ReAtt trainer: FiD's loop with the split encoder, the KL loss and iterative refresh.

gin configures ``train`` (``gin/reatt/*.gin``: the FiD macros plus
``BI_ENCODER_LAYERS``, ``KL_WEIGHT``, ``HEAD_TEMPERATURE``,
``IN_BATCH_NEGATIVES``, ``RETRIEVAL_WARMUP_STEPS``, ``RETRIEVAL_CORPUS``,
``ITERATION_STEPS``, ...). It reuses the FiD trainer's pieces (shardings,
global batches, checkpoints, metrics, evaluation) and differs in:

* the model: :class:`~jaxfid.reatt.model.ReAttModel` (T5 + head weights);
  ``INIT_CHECKPOINT`` may be any T5 checkpoint (head weights start at 0) or
  a ReAtt MODEL_DIR;
* the batches: FiD batches plus each question's exact ``question_length``
  and a per-question ``kl_weight`` = ``KL_WEIGHT / BATCH_SIZE`` (0 before
  ``RETRIEVAL_WARMUP_STEPS``), so the KL term sums correctly over
  microbatches (in-batch negatives then come from the microbatch);
* the schedule: with ``RESTART_SCHEDULE`` each phase (the QA-only warm-up,
  then every iteration) gets its own warm-up and decay, as the paper's
  separate runs do; ``WARMUP_FRACTION`` sets warm-up as a share of a phase;
* iterative training: with ``RETRIEVAL_CORPUS`` set, after the warm-up and
  every ``ITERATION_STEPS`` steps the corpus is re-indexed with the current
  model (``MODEL_DIR/index``), every training question's ``N_CONTEXT``
  close documents are re-retrieved and written to
  ``MODEL_DIR/iterations/train_step<S>.jsonl``, and training continues on
  them. A resumed run reloads the latest such file (or redoes the refresh
  when it was interrupted), so it continues as an uninterrupted one would.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from typing import Sequence

import jax
import numpy as np
import optax

from jaxfid.fid import examples as fid_format, batches as pipeline
from jaxfid.core.errors import InputError
from jaxfid.fid.examples import FidExample, Passage
from jaxfid.reatt import model as reatt
from jaxfid.t5.config import T5Config
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.training import optim
from jaxfid.training import loop as loop_lib
from jaxfid.training.metrics_log import MetricsLog
from jaxfid.fid.trainer import (
    Preemption, checked_mesh, make_qa_evaluator, compile_train_step,
    global_batch, init_or_restore, make_shardings)

LOGGED = ("loss", "qa_loss", "kl_loss", "token_accuracy", "retrieval_accuracy",
          "retrieval_own_accuracy", "head_max_prob", "retrieval_head",
          "grad_norm")


class ReAttBatcher:
  """FiD batches + ``question_length`` [B] and ``kl_weight`` [B] (host rows)."""

  def __init__(self, examples: Sequence[FidExample], tokenizer, *,
               batch_size: int, n_context: int, text_maxlength: int,
               answer_maxlength: int, kl_weight: float,
               retrieval_warmup_steps: int, seed: int = 0,
               dataset: str = "nq", process_index: int = 0,
               process_count: int = 1):
    self.fid = pipeline.FidBatcher(
        examples, tokenizer, batch_size=batch_size, n_context=n_context,
        text_maxlength=text_maxlength, answer_maxlength=answer_maxlength,
        seed=seed, dataset=dataset, process_index=process_index,
        process_count=process_count)
    ids = tokenizer.encode_batch([f"{fid_format.QUESTION_PREFIX} {e.question}"
                                  for e in examples])
    # An example without passages is all question: it has no document.
    self.question_length = np.array(
        [min(len(i), text_maxlength) if e.ctxs else text_maxlength
         for i, e in zip(ids, examples)], np.int32)
    self.kl_per_question = kl_weight / batch_size
    self.retrieval_warmup_steps = retrieval_warmup_steps

  def batch(self, step: int) -> dict[str, np.ndarray]:
    host = dict(self.fid.batch(step))
    rows = self.fid.indices(step)[self.fid.local_rows]
    host["question_length"] = self.question_length[rows]
    weight = self.kl_per_question if step >= self.retrieval_warmup_steps else 0.0
    host["kl_weight"] = np.full(len(rows), weight, np.float32)
    return host

  def close(self) -> None:
    self.fid.close()


def phase_boundaries(train_steps: int, retrieval_warmup_steps: int,
                     iteration_steps: int) -> list[int]:
  """Steps where a phase ends and (with a corpus) close documents refresh."""
  if iteration_steps <= 0:
    return []
  out, s = [], retrieval_warmup_steps + iteration_steps
  while s < train_steps:
    out.append(s)
    s += iteration_steps
  return out


def learning_rate_schedule(learning_rate: float, *, schedule: str,
                           warmup_steps: int, warmup_fraction: float | None,
                           total_steps: int, restarts: Sequence[int] = ()
                           ) -> optax.Schedule:
  """One warm-up-then-decay schedule, or one per phase between ``restarts``."""
  edges = [0, *restarts, total_steps]
  parts, joins = [], []
  for a, b in zip(edges[:-1], edges[1:]):
    length = max(b - a, 1)
    warm = (int(round(warmup_fraction * length)) if warmup_fraction is not None
            else warmup_steps)
    parts.append(optim.learning_rate_schedule(
        learning_rate, schedule=schedule, warmup_steps=warm,
        total_steps=length))
    joins.append(b)
  return optax.join_schedules(parts, joins[:-1]) if len(parts) > 1 else parts[0]


def make_optimizer(schedule: optax.Schedule, *, optimizer: str,
                   weight_decay: float, clip_norm: float | None
                   ) -> optax.GradientTransformation:
  if optimizer == "adam":
    opt = optax.adam(schedule)
  elif optimizer == "adamw":
    opt = optax.adamw(schedule, weight_decay=weight_decay)
  else:
    raise InputError("OPTIMIZER", f"must be 'adam' or 'adamw', got {optimizer!r}")
  return optax.chain(optax.clip_by_global_norm(clip_norm), opt) if clip_norm else opt


def initial_params(path: str, model: reatt.ReAttModel, shardings) -> dict:
  """INIT_CHECKPOINT: a ReAtt MODEL_DIR, or any T5 checkpoint (+ zero head weights)."""
  from jaxfid.checkpoints.load import load_checkpoint
  config_file = os.path.join(path, checkpointing.CONFIG_FILE)
  if (os.path.exists(config_file)
      and checkpointing.read_run_config(path).get("method") == "reatt"):
    other, params, _ = reatt.load_reatt(path)
    other_config = other.config
  else:
    other, params, _ = load_checkpoint(path)
    other_config = other.config
    params = reatt.add_head_weights(params, other_config.num_heads)
  norm = lambda c: dataclasses.replace(c, dropout_rate=0.0, dtype="float32",
                                       remat="none")
  if norm(model.config) != norm(other_config):
    diff = [f.name for f in dataclasses.fields(T5Config)
            if getattr(norm(model.config), f.name) != getattr(norm(other_config), f.name)]
    raise InputError(path, f"INIT_CHECKPOINT's model differs from the run's "
                     f"in {', '.join(diff)}; list the matching gin/models file")
  return jax.device_put(params, shardings)


def refresh_close_documents(model: reatt.ReAttModel, params: dict, tokenizer,
                            examples: Sequence[FidExample], corpus: str,
                            index_dir: str, *, n_context: int,
                            doc_maxlength: int, query_maxlength: int,
                            token_top_k: int, batch_size: int = 64,
                            progress: bool | None = None) -> list[FidExample]:
  """Re-index ``corpus`` with the current model; each example's ctxs become
  its ``n_context`` best passages (scores = avg-max relevance)."""
  from jaxfid.reatt import token_index
  from jaxfid.retrieval.search import search_all
  encoder = token_index.TokenEncoder.from_model(model, params)
  meta = token_index.build_token_index(
      encoder, tokenizer, corpus, index_dir, doc_maxlength=doc_maxlength,
      query_maxlength=query_maxlength, batch_size=batch_size,
      progress=progress)
  searcher = token_index.TokenSearcher(index_dir, meta)
  hits = search_all(searcher, [e.question for e in examples], n_context,
                    progress, token_top_k=token_top_k)
  out = []
  for example, found in zip(examples, hits):
    ctxs = []
    for row, score in found:
      p = searcher.store[row]
      ctxs.append(Passage(title=p.title, text=p.text, score=score, id=p.id))
    out.append(dataclasses.replace(example, ctxs=tuple(ctxs)))
  return out


def _iteration_file(model_dir: str, step: int) -> str:
  return os.path.join(model_dir, "iterations", f"train_step{step}.jsonl")


def train(*, model_dir: str, train_data: str, eval_data: str | None = None,
          model_config: T5Config = T5Config(), train_steps: int = 10000,
          batch_size: int = 64, n_context: int = 100, text_maxlength: int = 250,
          answer_maxlength: int = 20, learning_rate: float = 5e-5,
          optimizer: str = "adamw", schedule: str = "linear",
          warmup_steps: int = 0, warmup_fraction: float | None = None,
          restart_schedule: bool = False, weight_decay: float = 0.0,
          clip_norm: float = 1.0, accumulation_steps: int = 1,
          eval_every: int = 500, checkpoint_every: int = 500,
          log_every: int = 10, keep_checkpoints: int = 2, seed: int = 0,
          mesh: str = "", init_checkpoint: str | None = None,
          dataset: str = "nq", eval_batch_size: int = 8,
          eval_max_examples: int | None = None, eval_beams: int = 1,
          on_nan: str = "stop", progress: bool = True,
          bi_encoder_layers: int = 12, kl_weight: float = 8.0,
          head_temperature: float = 0.001, in_batch_negatives: bool = True,
          retrieval_warmup_steps: int = 0, relevance_chunk: int = 0,
          query_maxlength: int = 0,
          retrieval_corpus: str | None = None, iteration_steps: int = 0,
          token_top_k: int = 2048, index_batch_size: int = 64) -> dict:
  """Train a ReAtt model; returns the last metrics (see the module docstring)."""
  from jaxfid.core.tokenization import load_tokenizer
  if on_nan not in ("stop", "skip"):
    raise InputError("ON_NAN", f"must be 'stop' or 'skip', got {on_nan!r}")
  if retrieval_corpus and jax.process_count() > 1:
    raise InputError("RETRIEVAL_CORPUS", "iterative refresh runs on one host")

  # 1. Data and tokenizer.
  train_examples = fid_format.read_fid_examples(
      train_data, require_answers=True, n_context=n_context)
  eval_examples = (fid_format.read_fid_examples(
      eval_data, require_answers=True, n_context=n_context) if eval_data else [])
  if eval_max_examples:
    eval_examples = eval_examples[:eval_max_examples]
  spiece_dir = init_checkpoint if init_checkpoint and os.path.isfile(
      os.path.join(init_checkpoint, "spiece.model")) else None
  tokenizer = load_tokenizer(spiece_dir)

  # 2. Model, optimizer, mesh.
  reatt_config = reatt.ReAttConfig(
      bi_encoder_layers=bi_encoder_layers, head_temperature=head_temperature,
      in_batch_negatives=in_batch_negatives, relevance_chunk=relevance_chunk,
      query_maxlength=query_maxlength,
      separator_ids=tuple(tokenizer.encode(fid_format.TITLE_PREFIX)))
  try:
    model = reatt.ReAttModel(model_config, reatt_config)
  except ValueError as e:
    raise InputError("BI_ENCODER_LAYERS", str(e)) from None
  boundaries = phase_boundaries(train_steps, retrieval_warmup_steps,
                                iteration_steps)
  restarts = []
  if restart_schedule:
    if 0 < retrieval_warmup_steps < train_steps:
      restarts.append(retrieval_warmup_steps)
    restarts.extend(boundaries)
  lr_schedule = learning_rate_schedule(
      learning_rate, schedule=schedule, warmup_steps=warmup_steps,
      warmup_fraction=warmup_fraction, total_steps=train_steps,
      restarts=restarts)
  opt = make_optimizer(lr_schedule, optimizer=optimizer,
                       weight_decay=weight_decay, clip_norm=clip_norm)
  device_mesh = checked_mesh(mesh, batch_size, accumulation_steps)
  sh = make_shardings(device_mesh, model, opt)

  # 3. Run directory.
  os.makedirs(model_dir, exist_ok=True)
  checkpointing.write_run_config(model_dir, {
      **reatt.run_config_fields(reatt_config), "model": model_config.to_dict(),
      "n_context": n_context, "text_maxlength": text_maxlength,
      "answer_maxlength": answer_maxlength, "dataset": dataset,
      "kl_weight": kl_weight, "retrieval_warmup_steps": retrieval_warmup_steps})
  if not os.path.exists(os.path.join(model_dir, "spiece.model")):
    shutil.copyfile(tokenizer.path, os.path.join(model_dir, "spiece.model"))
  ckpts = checkpointing.RunCheckpoints(model_dir, keep=keep_checkpoints)

  with jax.set_mesh(device_mesh), Preemption() as preemption:
    # 4. Init or restore.
    state, start = init_or_restore(
        ckpts, model, opt, sh, seed=seed,
        init_params=(lambda: initial_params(init_checkpoint, model, sh.params))
        if init_checkpoint else None)
    step_fn = compile_train_step(model, opt, sh, seed=seed,
                                 accumulation_steps=accumulation_steps)
    log = MetricsLog(model_dir, resume_step=start)
    refresh_at = boundaries if retrieval_corpus else []

    def make_batcher(examples) -> ReAttBatcher:
      return ReAttBatcher(
          examples, tokenizer, batch_size=batch_size, n_context=n_context,
          text_maxlength=text_maxlength, answer_maxlength=answer_maxlength,
          kl_weight=kl_weight, retrieval_warmup_steps=retrieval_warmup_steps,
          seed=seed, dataset=dataset, process_index=jax.process_index(),
          process_count=jax.process_count())

    def refresh(step: int) -> list[FidExample]:
      examples = refresh_close_documents(
          model, state["params"], tokenizer, train_examples, retrieval_corpus,
          os.path.join(model_dir, "index"), n_context=n_context,
          doc_maxlength=text_maxlength,
          query_maxlength=query_maxlength or text_maxlength,
          token_top_k=token_top_k, batch_size=index_batch_size,
          progress=progress)
      path = _iteration_file(model_dir, step)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      fid_format.write_fid_examples(path, examples)
      log.write(step, {"refreshed_close_documents": len(examples)})
      return examples

    done = [s for s in refresh_at if s <= start]
    current = train_examples
    if done:
      path = _iteration_file(model_dir, done[-1])
      if os.path.exists(path):
        current = fid_format.read_fid_examples(path, require_answers=True)
      elif done[-1] == start:
        current = refresh(start)
      else:
        raise InputError(path, "missing: the close documents of this "
                         "iteration; retrain from the previous one")
    batcher = make_batcher(current)
    evaluate = make_qa_evaluator(
        model, tokenizer, eval_examples, n_context=n_context,
        text_maxlength=text_maxlength, answer_maxlength=answer_maxlength,
        num_beams=eval_beams, batch_size=eval_batch_size,
        put_batch=lambda b: jax.device_put(b, sh.replicated),
        model_dir=model_dir, progress=progress, log=log, ckpts=ckpts)

    # 5. The loop.
    last: dict = {}
    t0 = time.time()
    loop = loop_lib.StepLoop(total=train_steps, start=start, desc="train reatt",
                             progress=progress, on_nan=on_nan)
    step = start
    try:
      while step < train_steps:
        batch = global_batch(batcher.batch(step), sh.batch, batch_size)
        state, metrics = step_fn(state, batch)
        step += 1
        metrics = loop.finished_step(step, metrics)
        if step % log_every == 0 or step == train_steps:
          last = {k: float(metrics[k]) for k in LOGGED}
          last.update(learning_rate=float(lr_schedule(step - 1)),
                      kl_weight=kl_weight if step > retrieval_warmup_steps else 0.0,
                      examples_per_sec=loop.rate(batch_size))
          log.write(step, last)
          loop.show(loss=f"{last['loss']:.4f}", kl=f"{last['kl_loss']:.3f}")
        if eval_examples and (step % eval_every == 0 or step == train_steps):
          last.update(evaluate(step, state["params"]))
        if step % checkpoint_every == 0 or step == train_steps:
          ckpts.save(step, state)
        if preemption.requested:
          ckpts.save(step, state, force=True)
          print(f"SIGTERM: saved step {step} to {model_dir}; exiting",
                file=sys.stderr)
          break
        if step in refresh_at:
          ckpts.save(step, state, force=True)
          batcher.close()
          batcher = make_batcher(refresh(step))
          loop.restart_clock()
    finally:
      loop.close()
      batcher.close()
      log.close()
      ckpts.close()
  last["step"] = step
  last["train_time_s"] = time.time() - t0
  return last
