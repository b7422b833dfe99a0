"""DPR/GTR-style training of the T5 dual encoder, a task of the one loop.

gin: ``gin/retrieval/dual_encoder_*.gin`` bind ``METHOD =
@de_task.DualEncoderTask()`` and its macros (``TRAIN_DATA``, ``EVAL_DATA``,
``HARD_NEGATIVES``, ``QUERY_MAXLENGTH``, ``PASSAGE_MAXLENGTH``, ``POOLING``,
``TEMPERATURE``, ...); the run's macros are the trainer's
(``gin/training.gin``), so SIGTERM checkpoints, step-for-step resume,
``ACCUMULATION_STEPS``, ``MESH`` and multi-host batches work as for every
method.

Each step embeds B questions and, for each, its positive passage and H hard
negatives (:class:`~jaxfid.dual_encoder.data.PairBatcher`), and scores every
question against all B*(1+H) passages of the global batch
(:mod:`jaxfid.dual_encoder.step`; with accumulation, GradCache keeps the
negatives global and the gradient exact). Questions and passages share one
encoder by default (GTR); ``shared=False`` gives questions their own tower
(DPR).

``MODEL_DIR`` is a jaxfid model directory: ``jaxfid_config.json``
(``"method": "dual_encoder"``, the T5 config without decoder layers, the
pooling and towers), ``spiece.model``, ``checkpoints/<step>/``, ``best/``
(the parameters with the best ``eval_top1`` when EVAL_DATA is given) and
``metrics.jsonl``. Its encoder is what ``jaxfid index dense --checkpoint
MODEL_DIR`` loads (:func:`~jaxfid.dual_encoder.checkpoint.load_dual_encoder`).

Metrics: ``loss``, ``accuracy`` (the positive scores highest among the
batch's passages), ``mean_rank``, ``grad_norm``; with eval data,
``eval_top1``/``eval_top5`` (:mod:`jaxfid.dual_encoder.evaluation`).
"""
from __future__ import annotations

from jaxfid.checkpoints import matching
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.dual_encoder.checkpoint import (
    METHOD, dual_encoder_run_config, load_dual_encoder)
from jaxfid.dual_encoder.data import PairBatcher, read_pair_examples
from jaxfid.dual_encoder.evaluation import PairEvaluator
from jaxfid.dual_encoder.model import (
    QUERY_TOWER, T5_KEYS, DualEncoder, DualEncoderConfig)
from jaxfid.dual_encoder.step import make_contrastive_step
from jaxfid.t5.config import T5Config
from jaxfid.training.task import (Context, OptimizerSettings, Phase, Settings,
                                  Task, train_state)

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


class DualEncoderTask(Task):
  """Train a dual encoder (see the module docstring)."""
  name = METHOD
  description = "train dual encoder"
  throughput_name = "questions_per_sec"
  best_metric = "eval_top1"

  def __init__(self, *, model_config: T5Config = T5Config(),
               train_data: str | None = None, eval_data: str | None = None,
               hard_negatives: int = 1, query_maxlength: int = 64,
               passage_maxlength: int = 256,
               passage_format: str = "title_text", pooling: str = "mean",
               normalize: bool = False, projection_dim: int | None = None,
               shared: bool = True, temperature: float = 1.0,
               eval_max_examples: int | None = None,
               eval_batch_size: int = 64):
    self.model_config = model_config
    self.train_data, self.eval_data = train_data, eval_data
    self.hard_negatives = hard_negatives
    self.encoder_settings = dict(
        pooling=pooling, normalize=normalize, projection_dim=projection_dim,
        shared=shared, query_maxlength=query_maxlength,
        passage_maxlength=passage_maxlength, passage_format=passage_format)
    self.temperature = temperature
    self.eval_max_examples = eval_max_examples
    self.eval_batch_size = eval_batch_size

  # ---- data and model ---------------------------------------------------

  def prepare(self, settings: Settings) -> None:
    if not self.train_data:
      raise InputError("TRAIN_DATA", "required")
    if self.temperature <= 0:
      raise InputError("TEMPERATURE", f"must be positive, got "
                       f"{self.temperature}")
    try:
      encoder_settings = DualEncoderConfig(**self.encoder_settings)
    except ValueError as e:
      raise InputError("gin", str(e)) from None
    self.settings = settings
    examples = read_pair_examples(self.train_data)
    self.eval_examples = (
        read_pair_examples(self.eval_data, limit=self.eval_max_examples)
        if self.eval_data else [])
    self.tokenizer = load_tokenizer(settings.init_checkpoint)
    self.vocabulary = self.tokenizer.path
    self.model = DualEncoder(self.model_config, encoder_settings)
    s = self.model.settings
    self.batcher = PairBatcher(
        examples, self.tokenizer, batch_size=settings.batch_size,
        hard_negatives=self.hard_negatives,
        query_maxlength=s.query_maxlength,
        passage_maxlength=s.passage_maxlength,
        passage_format=s.passage_format, seed=settings.seed)
    self.evaluator = PairEvaluator(self.model, self.tokenizer,
                                   self.eval_examples,
                                   batch_size=self.eval_batch_size)

  def run_config(self) -> dict:
    return dual_encoder_run_config(self.model, train_data=self.train_data,
                                   temperature=self.temperature,
                                   hard_negatives=self.hard_negatives)

  def batch(self, step: int, rows: slice, params) -> dict:
    return self.batcher.batch(step, rows)

  # ---- the step -------------------------------------------------------------

  def phases(self, settings: Settings, optimizer: OptimizerSettings
             ) -> list[Phase]:
    schedule = optimizer.schedule_fn(settings.train_steps)
    tx = optimizer.make(schedule)
    return [Phase(
        "train", settings.train_steps,
        make_state=lambda p, s: train_state(p, s, opt_state=tx.init(p)),
        step=make_contrastive_step(
            self.model, tx, seed=settings.seed, temperature=self.temperature,
            accumulation_steps=settings.accumulation_steps),
        learning_rate=schedule)]

  def initial_params(self, path: str) -> dict:
    return initial_dual_encoder_params(path, self.model)

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

  def evaluates(self) -> bool:
    return bool(self.eval_examples)

  def evaluate(self, ctx: Context, step: int, params) -> dict:
    return self.evaluator(params, ctx.placement)
