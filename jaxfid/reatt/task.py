"""ReAtt's training task for the one loop: FiD's reader, split encoder, KL loss.

The FiD gin's ``FidTask`` is this task's ``reader`` (data, batches, QA
evaluation); ``reatt = @ReAttConfig()`` and ``training = @ReAttTraining()``
add ReAtt's settings. Beyond FiD: :class:`~jaxfid.reatt.model.ReAttModel`
(``INIT_CHECKPOINT`` any T5 or ReAtt MODEL_DIR), ReAtt batches with
``question_length`` and ``kl_weight``, the GradCache step with in-batch
negatives and ``ACCUMULATION_STEPS`` > 1, per-phase schedules and Adam
restarts, and iterative refresh with ``RETRIEVAL_CORPUS``.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from jaxfid.checkpoints import matching
from jaxfid.checkpoints.load import load_checkpoint
from jaxfid.checkpoints.model_dir import CONFIG_FILE, read_run_config
from jaxfid.core import paths
from jaxfid.core.config import Config, option
from jaxfid.core.errors import InputError
from jaxfid.reader.examples import (TITLE_PREFIX, FidExample, read_fid_examples,
                                 write_fid_examples)
from jaxfid.reader.task import ReaderPrepared, ReaderTask
from jaxfid.reatt import model as reatt
from jaxfid.reatt.batches import ReAttBatcher
from jaxfid.reatt.checkpoint import load_reatt
from jaxfid.reatt.refresh import (iteration_file, phase_boundaries,
                                  refresh_close_documents)
from jaxfid.reatt.restarts import restart_adam_at
from jaxfid.reatt.step import make_grad_cache_step
from jaxfid.training.task import (Compilable, Context, OptimizerSettings,
                                  Phase, Prepared, Settings, Task, loss_phase,
                                  train_state)

LOGGED = ("loss", "qa_loss", "kl_loss", "token_accuracy", "retrieval_accuracy",
          "retrieval_own_accuracy", "head_max_prob", "retrieval_head",
          "grad_norm")


def initial_reatt_params(path: str, model: reatt.ReAttModel) -> dict:
  """INIT_CHECKPOINT: a ReAtt MODEL_DIR, or any T5 checkpoint (+ zero head
  weights); the learned score scale is added at 0 (or dropped) as the
  model has it."""
  if (os.path.exists(os.path.join(path, CONFIG_FILE))
      and read_run_config(path).get("method") == "reatt"):
    other, params, _ = load_reatt(path)
  else:
    other, params, _ = load_checkpoint(path)
  params = reatt.add_head_weights(params, other.config.num_heads,
                                  model.reatt.score_scale)
  matching.check_init_config(path, model.config, other.config)
  return params


@dataclasses.dataclass(frozen=True)
class ReAttTraining(Config):
  """How a ReAtt run trains and refreshes its close documents.

  Attributes:
    kl_weight: ``KL_WEIGHT``, alpha of ``QA + alpha * KL``.
    retrieval_warmup_steps: ``RETRIEVAL_WARMUP_STEPS``, QA-loss-only steps
      before the KL term.
    retrieval_corpus: ``RETRIEVAL_CORPUS``, the corpus re-indexed for
      iterative training (None: no refresh).
    iteration_steps: ``ITERATION_STEPS``, steps per iteration (0: no
      refresh).
    token_top_k: ``TOKEN_TOP_K``, tokens fetched per query token.
    index_batch_size: ``INDEX_BATCH_SIZE``, passages per encoder call when
      indexing.
    warmup_fraction: ``WARMUP_FRACTION``, warm-up as a share of each phase
      (None: ``WARMUP_STEPS``).
    restart_schedule: ``RESTART_SCHEDULE``, a fresh warm-up and decay per
      phase (the QA-only warm-up, then every iteration).
    restart_optimizer: ``RESTART_OPTIMIZER``, a fresh Adam (moments and
      step count) per phase; False carries the moments across phases.
    rerank_top_k: ``RERANK_TOP_K``, candidate passages kept by approximate
      score before exact rescoring; 0 rescores every candidate.
  """
  kl_weight: float = option(8.0, low=0)
  retrieval_warmup_steps: int = option(0, low=0)
  retrieval_corpus: str | None = None
  iteration_steps: int = option(0, low=0)
  token_top_k: int = option(2048, low=1)
  index_batch_size: int = option(64, low=1)
  warmup_fraction: float | None = option(None, low=0, high=1)
  restart_schedule: bool = False
  restart_optimizer: bool = True
  rerank_top_k: int = option(0, low=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReAttPrepared(Prepared):
  """A ReAtt run: the reader's data with this model, and the steps whose
  close documents are refreshed."""
  reader: ReaderPrepared
  refresh_at: list[int] = dataclasses.field(default_factory=list)


class ReAttTask(Task, Compilable):
  """Train ReAtt (see the module docstring); ``reader`` is FiD's task."""
  name = "reatt"
  description = "train reatt"
  best_metric = "eval_em"

  def __init__(self, *, reader: ReaderTask,
               reatt: reatt.ReAttConfig = reatt.ReAttConfig(),
               training: ReAttTraining = ReAttTraining()):
    self.reader, self.config, self.training = reader, reatt, training
    self.examples: list[FidExample] = []  # the close documents trained on
    self._batcher: ReAttBatcher | None = None

  # ---- data and model ---------------------------------------------------------

  def prepare(self, settings: Settings) -> ReAttPrepared:
    corpus = self.training.retrieval_corpus
    if corpus and settings.process_count > 1:
      raise InputError("RETRIEVAL_CORPUS", "iterative refresh runs on one "
                       "host; use `jaxfid reatt iterate` for multi-host runs")
    if corpus and paths.is_url(settings.model_dir):
      raise InputError("RETRIEVAL_CORPUS", "iterative refresh keeps its index "
                       "in MODEL_DIR/index and needs a local MODEL_DIR")
    self._check_reader()
    data = self.reader.prepare_data(settings)
    model = self._make_model(self.config.replace(
        separator_ids=tuple(data.tokenizer.encode(TITLE_PREFIX))))
    return ReAttPrepared(
        settings=settings, model=model, vocabulary=data.vocabulary,
        reader=self.reader.with_model(data, model),
        refresh_at=(phase_boundaries(
            settings.train_steps, self.training.retrieval_warmup_steps,
            self.training.iteration_steps) if corpus else []))

  def _check_reader(self) -> None:
    if not self.reader.passage_eos:
      raise InputError("PASSAGE_EOS", "ReAtt's rows end with EOS (as the "
                       "original's, and as its token index encodes documents)"
                       ": set PASSAGE_EOS = True")

  def _make_model(self, config: reatt.ReAttConfig) -> reatt.ReAttModel:
    try:
      return reatt.ReAttModel(self.reader.model_config, config)
    except ValueError as e:
      raise InputError("BI_ENCODER_LAYERS", str(e)) from None

  # ---- ahead-of-time compilation ------------------------------------------

  def prepare_shapes(self, settings: Settings) -> ReAttPrepared:
    """The model from the configuration alone: no data, tokenizer or index
    is read. ``separator_ids`` keep the configuration's (``title:`` in the
    T5 vocabulary; they are constants of the program, not shapes), and the
    target length must be given: ``prepare`` pads to the longest target of
    the training data when TARGET_MAXLENGTH is None."""
    self._check_reader()
    if self.reader.lengths.target_maxlength is None:
      raise InputError("TARGET_MAXLENGTH", "compiling ahead of time reads no "
                       "training data to find the longest target: set "
                       "TARGET_MAXLENGTH (or ANSWER_MAXLENGTH)")
    model = self._make_model(self.config)
    return ReAttPrepared(settings=settings, model=model, reader=ReaderPrepared(
        settings=settings, model=model,
        target_length=self.reader.lengths.target_maxlength))

  compile_bindings = ReaderTask.compile_bindings  # the reader's TRAIN_DATA

  def abstract_batch(self, p: ReAttPrepared, phase: int) -> dict:
    """:class:`ReAttBatcher`'s global batch: the FiD reader's (rows
    [B, P, L], passage mask [B, P], targets [B, T]) plus
    ``question_length`` and ``kl_weight`` [B] (the KL term's inputs; the
    in-batch documents are the batch's own rows)."""
    if phase != 0:
      raise ValueError(f"ReAtt trains in one phase, not phase {phase}")
    b = p.settings.batch_size
    return {**self.reader.abstract_batch(p.reader, phase),
            "question_length": jax.ShapeDtypeStruct((b,), jnp.int32),
            "kl_weight": jax.ShapeDtypeStruct((b,), jnp.float32)}

  def decode_program(self, p: ReAttPrepared, batch_size: int):
    """The reader's evaluation program (:class:`QaEvaluator`'s) with this
    model: the split encoder, then greedy or beam decoding of
    DECODE_MAXLENGTH tokens."""
    return self.reader.decode_program(p.reader, batch_size, model=p.model)

  def run_config(self, p: ReAttPrepared) -> dict:
    return {**self.reader.run_config(p.reader),
            **reatt.run_config_fields(p.model.reatt),
            "kl_weight": self.training.kl_weight,
            "retrieval_warmup_steps": self.training.retrieval_warmup_steps}

  def initial_params(self, p: ReAttPrepared, path: str) -> dict:
    return initial_reatt_params(path, p.model)

  def use_examples(self, p: ReAttPrepared, examples: list[FidExample]
                   ) -> None:
    if self._batcher is not None:
      self._batcher.close()
    reader, settings = self.reader, p.settings
    self.examples = examples
    self._batcher = ReAttBatcher(
        examples, p.reader.tokenizer, batch_size=settings.batch_size,
        n_context=reader.n_context, text_maxlength=reader.text_maxlength,
        target_maxlength=p.reader.target_length,
        kl_weight=self.training.kl_weight,
        retrieval_warmup_steps=self.training.retrieval_warmup_steps,
        seed=settings.seed, dataset=reader.dataset,
        passage_eos=reader.passage_eos)

  def batch(self, p: ReAttPrepared, step: int, rows: slice, params) -> dict:
    return self._batcher.batch(step, rows)

  # ---- the step ---------------------------------------------------------------

  def phase_starts(self, settings: Settings) -> list[int]:
    """The steps where a phase starts after the first: the end of the
    QA-only warm-up, then every ``ITERATION_STEPS``."""
    warmup = self.training.retrieval_warmup_steps
    starts = [warmup] if 0 < warmup < settings.train_steps else []
    return starts + phase_boundaries(settings.train_steps, warmup,
                                     self.training.iteration_steps)

  def phases(self, p: ReAttPrepared, optimizer: OptimizerSettings
             ) -> list[Phase]:
    settings = p.settings
    training, starts = self.training, self.phase_starts(settings)
    schedule = optimizer.schedule_fn(
        settings.train_steps,
        restarts=starts if training.restart_schedule else [],
        warmup_fraction=training.warmup_fraction)
    if settings.accumulation_steps > 1 and self.config.in_batch_negatives:
      tx = optimizer.make(schedule)
      phase = Phase("train", settings.train_steps,
                    make_state=lambda params, s: train_state(
                        params, s, opt_state=tx.init(params)),
                    step=make_grad_cache_step(
                        p.model, tx, seed=settings.seed,
                        accumulation_steps=settings.accumulation_steps),
                    learning_rate=schedule)
    else:
      phase = loss_phase(p.model, settings, optimizer, schedule)
    return [restart_adam_at(phase, starts if training.restart_optimizer
                            else [])]

  def log_fields(self, metrics: dict) -> dict:
    return {k: float(metrics[k]) for k in LOGGED}

  def progress_fields(self, record: dict) -> dict:
    out = self.reader.progress_fields(record)
    if "kl_loss" in record:
      out["kl"] = f"{record['kl_loss']:.3f}"
    return out

  # ---- evaluation and refresh -------------------------------------------------

  def evaluates(self, p: ReAttPrepared) -> bool:
    return self.reader.evaluates(p.reader)

  def evaluate(self, p: ReAttPrepared, ctx: Context, step: int, params
               ) -> dict:
    return self.reader.evaluate(p.reader, ctx, step, params)

  def refresh(self, p: ReAttPrepared, ctx: Context, step: int, params
              ) -> list[FidExample]:
    """Re-index with ``params``, re-retrieve, write the iteration file."""
    reader, model_dir = self.reader, ctx.settings.model_dir
    examples = refresh_close_documents(
        p.model, params, p.reader.tokenizer, p.reader.train_examples,
        self.training.retrieval_corpus, os.path.join(model_dir, "index"),
        n_context=reader.n_context, doc_maxlength=reader.text_maxlength,
        query_maxlength=self.config.query_maxlength or reader.text_maxlength,
        token_top_k=self.training.token_top_k,
        rerank_top_k=self.training.rerank_top_k,
        batch_size=self.training.index_batch_size,
        progress=ctx.settings.progress)
    path = iteration_file(model_dir, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_fid_examples(path, examples)
    ctx.log.write(step, {"refreshed_close_documents": len(examples)})
    return examples

  def start(self, p: ReAttPrepared, ctx: Context, step: int, state) -> None:
    """The close documents of the iteration ``step`` lies in."""
    done = [s for s in p.refresh_at if s <= step]
    examples = p.reader.train_examples
    if done:
      path = iteration_file(ctx.settings.model_dir, done[-1])
      if os.path.exists(path):
        examples = read_fid_examples(path, require_answers=True)
      elif done[-1] == step:
        examples = self.refresh(p, ctx, step, state["params"])
      else:
        raise InputError(path, "missing: the close documents of this "
                         "iteration; retrain from the previous one")
    self.use_examples(p, examples)

  def after_step(self, p: ReAttPrepared, ctx: Context, step: int, state
                 ) -> None:
    if step in p.refresh_at:
      ctx.save(step, state)
      self.use_examples(p, self.refresh(p, ctx, step, state["params"]))

  def log_record(self, step: int) -> dict:
    training = self.training
    return {"kl_weight": (training.kl_weight
                          if step > training.retrieval_warmup_steps else 0.0)}

  def close(self) -> None:
    if self._batcher is not None:
      self._batcher.close()
    self.reader.close()
