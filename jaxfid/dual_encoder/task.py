"""DPR/GTR-style training of the T5 dual encoder, a task of the one loop.

gin (``gin/retrieval/dual_encoder_*.gin``): ``METHOD =
@de_task.DualEncoderTask()`` with ``training`` (:class:`DualEncoderTrainConfig`),
``encoder`` (``DualEncoderConfig``) and ``model_config`` (``T5Config``); the
run's macros are the trainer's.

Each step embeds B questions, their positives and H hard negatives each
(:class:`~jaxfid.dual_encoder.data.PairBatcher`) and scores every question
against all B*(1+H) passages of the global batch
(:mod:`jaxfid.dual_encoder.step`). One shared encoder by default (GTR);
``shared=False`` gives questions their own tower (DPR). ``objective =
'distill'`` (``gin/retrieval/distill_*.gin``) trains from the reader's
scores instead (FiD-KD: :mod:`~jaxfid.dual_encoder.distill_data`,
:mod:`~jaxfid.dual_encoder.distill_loss`).

``MODEL_DIR`` holds ``jaxfid_config.json`` (``"method": "dual_encoder"``),
``spiece.model``, checkpoints, ``best/`` (best ``eval_top1``) and
``metrics.jsonl``; ``jaxfid index dense --checkpoint MODEL_DIR`` loads it.
Metrics: ``loss``, ``accuracy``, ``mean_rank``, ``grad_norm``; with eval
data ``eval_top1``/``eval_top5``.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxfid.checkpoints import matching
from jaxfid.core.config import Config, option
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.dual_encoder.checkpoint import (
    METHOD, dual_encoder_run_config, load_dual_encoder)
from jaxfid.dual_encoder.data import PairBatcher, read_pair_examples
from jaxfid.dual_encoder.distill_data import (ScoredBatcher,
                                              read_scored_examples)
from jaxfid.dual_encoder.distill_loss import distill_loss
from jaxfid.dual_encoder.evaluation import PairEvaluator
from jaxfid.dual_encoder.model import (
    QUERY_TOWER, T5_KEYS, DualEncoder, DualEncoderConfig)
from jaxfid.dual_encoder.step import make_contrastive_step
from jaxfid.t5.config import T5Config
from jaxfid.training.task import (Compilable, Context, OptimizerSettings,
                                  Phase, Prepared, Settings, Task, train_state)

# The T5Config fields an INIT_CHECKPOINT's encoder must share with the run.
ENCODER_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads",
                  "num_layers", "feed_forward_proj",
                  "relative_attention_num_buckets",
                  "relative_attention_max_distance", "layer_norm_epsilon")


def initial_dual_encoder_params(path: str, encoder: DualEncoder) -> dict:
  """INIT_CHECKPOINT's encoder (HF, GTR, jaxfid) for ``encoder``'s run.

  Raises InputError naming the encoder fields or the projection that differ.
  """
  loaded = load_dual_encoder(path)
  matching.check_init_config(path, encoder.config, loaded.encoder.config,
                             fields=ENCODER_FIELDS)
  got, want = loaded.encoder.settings, encoder.settings
  if (got.projection_dim, got.projection_bias) != (want.projection_dim,
                                                   want.projection_bias):
    raise InputError(path, f"INIT_CHECKPOINT's projection "
                     f"({got.projection_dim}, bias {got.projection_bias}) "
                     f"differs from the run's ({want.projection_dim}, bias "
                     f"{want.projection_bias}); set PROJECTION_DIM")
  p = loaded.params
  params = encoder.from_encoder_params({k: p[k] for k in T5_KEYS},
                                       p.get("projection"))
  if not encoder.settings.shared and QUERY_TOWER in p:
    params[QUERY_TOWER] = p[QUERY_TOWER]
  return params


@dataclasses.dataclass(frozen=True)
class DualEncoderTrainConfig(Config):
  """What a dual encoder trains and evaluates on.

  Attributes:
    train_data: FiD JSON from `jaxfid retrieve` (positive: the best-ranked
      passage with the answer; hard negatives: those without it) or DPR's
      biencoder training JSON.
    eval_data: pairs to evaluate top-1/top-5 on (the best checkpoint kept).
    hard_negatives: hard negatives per question (besides in-batch ones).
    temperature: the contrastive softmax's temperature.
    eval_max_examples: evaluate on the first N pairs; None: all.
    eval_batch_size: pairs per evaluation batch.
    objective: 'contrastive' (DPR: positives and negatives) or 'distill'
      (FiD-KD: KL to the reader's scores in TRAIN_DATA's ``ctxs[i].score``).
    n_context: distill: the N best passages of each question by the scored
      file's score (FiD's ``--n_context`` after its ``sort_data``).
    temperature_gold / temperature_score: distill: the softmax temperatures
      of the reader's and the retriever's scores.
    scale_by_sqrt_dim: distill: the retriever's score is q . p / sqrt(d).
    kl_reduction: distill: 'mean' (torch KLDivLoss's default, over
      questions x passages) or 'batchmean' (per question).
    in_batch_negatives: distill: the other questions' passages join each
      question's softmax as candidates without gold mass.
  """
  train_data: str = option()
  eval_data: str | None = option(None)
  hard_negatives: int = option(1, low=0)
  temperature: float = option(1.0, above=0)
  eval_max_examples: int | None = option(None, low=1)
  eval_batch_size: int = option(64, low=1)
  objective: str = option("contrastive", choices=("contrastive", "distill"))
  n_context: int = option(20, low=1)
  temperature_gold: float = option(1.0, above=0)
  temperature_score: float = option(1.0, above=0)
  scale_by_sqrt_dim: bool = option(True)
  kl_reduction: str = option("mean", choices=("mean", "batchmean"))
  in_batch_negatives: bool = option(False)

  @property
  def distill(self) -> bool:
    return self.objective == "distill"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DualEncoderPrepared(Prepared):
  """A dual-encoder run's batches and evaluation (``prepare_shapes``: the
  model alone)."""
  batcher: PairBatcher | ScoredBatcher | None = None
  eval_examples: list = dataclasses.field(default_factory=list)
  evaluator: PairEvaluator | None = None


class DualEncoderTask(Task, Compilable):
  """Train a dual encoder (see the module docstring)."""
  name = METHOD
  description = "train dual encoder"
  throughput_name = "questions_per_sec"
  best_metric = "eval_top1"

  def __init__(self, *, training: DualEncoderTrainConfig,
               encoder: DualEncoderConfig = DualEncoderConfig(),
               model_config: T5Config = T5Config()):
    self.training = training
    self.encoder = encoder
    self.model_config = model_config

  # ---- data and model ---------------------------------------------------

  def prepare(self, settings: Settings) -> DualEncoderPrepared:
    t = self.training
    eval_examples = (read_pair_examples(t.eval_data, limit=t.eval_max_examples)
                     if t.eval_data else [])
    tokenizer = load_tokenizer(settings.init_checkpoint)
    model = DualEncoder(self.model_config, self.encoder)
    s = model.settings
    lengths = dict(query_maxlength=s.query_maxlength,
                   passage_maxlength=s.passage_maxlength,
                   passage_format=s.passage_format, seed=settings.seed)
    if t.distill:
      batcher = ScoredBatcher(
          read_scored_examples(t.train_data, t.n_context), tokenizer,
          batch_size=settings.batch_size, n_context=t.n_context, **lengths)
    else:
      batcher = PairBatcher(
          read_pair_examples(t.train_data), tokenizer,
          batch_size=settings.batch_size, hard_negatives=t.hard_negatives,
          **lengths)
    return DualEncoderPrepared(
        settings=settings, model=model, vocabulary=tokenizer.path,
        batcher=batcher, eval_examples=eval_examples,
        evaluator=PairEvaluator(model, tokenizer, eval_examples,
                                batch_size=t.eval_batch_size))

  @classmethod
  def compile_bindings(cls, macro) -> dict:
    """A placeholder TRAIN_DATA where a gin file sized before its data
    exists leaves it unset; nothing reads it."""
    if macro("TRAIN_DATA") is None:
      return {"TRAIN_DATA": "(not read by bench compile)"}
    return {}

  def prepare_shapes(self, settings: Settings) -> DualEncoderPrepared:
    """The model from the configuration alone (nothing read)."""
    return DualEncoderPrepared(
        settings=settings, model=DualEncoder(self.model_config, self.encoder))

  def abstract_batch(self, p: DualEncoderPrepared, phase: int) -> dict:
    """The batcher's shapes: B questions, B*(1+H) passages (B*N and their
    gold scores when distilling)."""
    if phase != 0:
      raise ValueError(f"the dual encoder has one phase, not phase {phase}")
    s, b, t = p.model.settings, p.settings.batch_size, self.training
    passages = b * (t.n_context if t.distill else 1 + t.hard_negatives)
    gold = ({"gold_scores": jax.ShapeDtypeStruct((passages,), jnp.float32)}
            if t.distill else {})
    return {"query_tokens": jax.ShapeDtypeStruct((b, s.query_maxlength),
                                                 jnp.int32),
            "passage_tokens": jax.ShapeDtypeStruct(
                (passages, s.passage_maxlength), jnp.int32),
            "passage_mask": jax.ShapeDtypeStruct((passages,), jnp.bool_),
            **gold}

  def decode_program(self, p: DualEncoderPrepared, batch_size: int):
    """The encoding the evaluation and ``jaxfid index dense`` run: a batch
    of questions through the query tower and one of passages through the
    passage tower, ``(float32 [N, dim], float32 [N, dim])``."""
    model, s = p.model, p.model.settings

    def encode(params, batch):
      return (model.embed(params, batch["query_tokens"], tower="query"),
              model.embed(params, batch["passage_tokens"], tower="passage"))

    return encode, {
        "query_tokens": jax.ShapeDtypeStruct((batch_size, s.query_maxlength),
                                             jnp.int32),
        "passage_tokens": jax.ShapeDtypeStruct(
            (batch_size, s.passage_maxlength), jnp.int32)}

  def run_config(self, p: DualEncoderPrepared) -> dict:
    t = self.training
    if t.distill:
      return dual_encoder_run_config(
          p.model, train_data=t.train_data, objective=t.objective,
          **{k: getattr(t, k) for k in (
              "n_context", "temperature_gold", "temperature_score",
              "scale_by_sqrt_dim", "kl_reduction", "in_batch_negatives")})
    return dual_encoder_run_config(p.model, train_data=t.train_data,
                                   temperature=t.temperature,
                                   hard_negatives=t.hard_negatives)

  def loss_fn(self):
    """The loss of the embeddings: None (in-batch contrastive) or the
    distillation KL (:func:`distill_loss`)."""
    t = self.training
    if not t.distill:
      return None
    return lambda q, p, batch: distill_loss(
        q, p, batch["passage_mask"], batch["gold_scores"],
        temperature_gold=t.temperature_gold,
        temperature_score=t.temperature_score,
        scale_by_sqrt_dim=t.scale_by_sqrt_dim, reduction=t.kl_reduction,
        in_batch_negatives=t.in_batch_negatives)

  def batch(self, p: DualEncoderPrepared, step: int, rows: slice, params
            ) -> dict:
    return p.batcher.batch(step, rows)

  # ---- the step -------------------------------------------------------------

  def phases(self, p: DualEncoderPrepared, optimizer: OptimizerSettings
             ) -> list[Phase]:
    settings = p.settings
    schedule = optimizer.schedule_fn(settings.train_steps)
    tx = optimizer.make(schedule)
    return [Phase(
        "train", settings.train_steps,
        make_state=lambda params, s: train_state(params, s,
                                                 opt_state=tx.init(params)),
        step=make_contrastive_step(
            p.model, tx, seed=settings.seed,
            temperature=self.training.temperature,
            accumulation_steps=settings.accumulation_steps,
            loss_fn=self.loss_fn()),
        learning_rate=schedule)]

  def initial_params(self, p: DualEncoderPrepared, path: str) -> dict:
    return initial_dual_encoder_params(path, p.model)

  # ---- logs and evaluation ------------------------------------------------

  def log_fields(self, metrics: dict) -> dict:
    return {k: float(metrics[k])
            for k in ("loss", "accuracy", "mean_rank", "grad_norm")}

  def progress_fields(self, record: dict) -> dict:
    out = super().progress_fields(record)
    if "accuracy" in record:
      out["acc"] = f"{record['accuracy']:.3f}"
    if "eval_top1" in record:
      out["top1"] = f"{record['eval_top1']:.3f}"
    return out

  def evaluates(self, p: DualEncoderPrepared) -> bool:
    return bool(p.eval_examples)

  def evaluate(self, p: DualEncoderPrepared, ctx: Context, step: int, params
               ) -> dict:
    return p.evaluator(params, ctx.placement)
