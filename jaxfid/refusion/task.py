"""ReFusion's training task (Wu et al., ICLR 2024) for the one loop.

gin binds ``METHOD = @ReFusionTask()`` with ``data = @ReFusionData()``,
``fusion = @FusionConfig()`` and ``search = @SearchConfig()``.
With ``search``, steps ``[0, TRAIN_STEPS)`` are the bi-level search
(:mod:`jaxfid.refusion.search`), whose argmax structure is written to
``MODEL_DIR/refusion_structure.json`` and, with ``retrain``, trained again
from the initial weights for ``TRAIN_STEPS`` more steps. Dev is scored every
``EVAL_EVERY`` steps; the last line has ``test_accuracy`` (and
``test_f1``/``test_mcc``), ``test_examples`` and ``flops_per_example``.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.checkpoints import matching
from jaxfid.checkpoints.load import load_checkpoint
from jaxfid.core.config import Config, option
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.refusion import batches as batch_lib
from jaxfid.refusion import fusion as fusion_lib
from jaxfid.refusion import lmbff
from jaxfid.refusion import neighbours as nb_lib
from jaxfid.refusion import search as search_lib
from jaxfid.refusion import template_sets
from jaxfid.refusion.data import (NeighbourVectors, database_width,
                                  encode_splits, read_splits)
from jaxfid.refusion.model import ReFusionModel
from jaxfid.refusion.scoring import SCORINGS, SplitScorer
from jaxfid.runtime import console
from jaxfid.t5.config import T5Config
from jaxfid.training.metrics_log import read_records
from jaxfid.training.task import (Compilable, Context, OptimizerSettings,
                                  Phase, Prepared, Settings, Task, train_state)

RETRIEVAL_MODES = ("input", "hidden", "layer")
# The modules whose input is the layer's hidden state (width d_model): those
# 'layer' retrieval can query with it.
LAYER_QUERY_MODULES = ("query", "key", "value")


def merge_backbone(params: dict, backbone: dict, source: str) -> dict:
  """``params`` with every parameter of ``backbone`` (a T5) put in its place;
  the fusion parameters, which the backbone lacks, stay as they are."""

  def merge(mine: dict, theirs: dict, path: str) -> dict:
    out = dict(mine)
    for key, value in theirs.items():
      where = f"{path}/{key}" if path else key
      if key not in mine:
        raise InputError(source, f"unexpected parameter {where}")
      out[key] = (merge(mine[key], value, where) if isinstance(value, dict)
                  else np.asarray(value, np.float32))
    return out

  return merge(params, jax.device_get(backbone), "")


def _task_problem(name: str) -> str | None:
  """Why TASK names no LM-BFF task (:func:`lmbff.get_task`), or None."""
  try:
    lmbff.get_task(name)
  except InputError as e:
    return e.reason
  return None


@dataclasses.dataclass(frozen=True)
class ReFusionData(Config):
  """What a ReFusion run reads: the task's examples and their neighbours.

  Attributes:
    task: ``TASK``, one of :data:`jaxfid.refusion.lmbff.TASK_NAMES`.
    data_dir: ``DATA_DIR``, LM-BFF's ``k-shot/<TASK>/16-<seed>``.
    templates: ``TEMPLATES``, ``'paper'`` (Table 5), ``'original'`` (the
      original code's RoBERTa templates) or ``'original_t5'`` (its T5
      script's instruction templates and label words).
    max_length: ``MAX_LENGTH``, tokens of an input.
    eval_batch_size: ``EVAL_BATCH_SIZE``, examples per scoring batch.
    retrieval_db: ``RETRIEVAL_DB``, the ``jaxfid index dense`` output (needed
      with fusion modules or ``concat_neighbours``).
    top_k: ``TOP_K``, neighbours per input sentence.
    concat_neighbours: ``CONCAT_NEIGHBOURS``, the baseline that appends the
      neighbour sentences to the input.
    neighbour_cache: ``NEIGHBOUR_CACHE``, the offline retrieval cache
      (default: in the database's directory).
    retrieval_mode: ``RETRIEVAL_MODE``, ``'input'`` (offline, from the text),
      ``'hidden'`` (per batch, from the mean-pooled encoder states) or
      ``'layer'`` (every fusion module searches the database with position 0
      of its own input).
    db_dim: ``DB_DIM``, the width of RETRIEVAL_DB's vectors (read from the
      database; needed by ``jaxfid bench compile`` in 'input' mode).
    scoring: ``SCORING``, ``'rank'`` (the label words' log-likelihoods) or
      ``'generate'`` (greedy decoding, exact match to a label word).
    generate_tokens: ``GENERATE_TOKENS``, ``'generate'``: new tokens decoded
      at most.
  """
  task: str = option(test=_task_problem)
  data_dir: str = option()
  templates: str = option("paper", choices=lmbff.TEMPLATE_SETS)
  max_length: int = option(128, low=1)
  eval_batch_size: int = option(32, low=1)
  retrieval_db: str | None = None
  top_k: int = option(64, low=1)
  concat_neighbours: bool = False
  neighbour_cache: str | None = None
  retrieval_mode: str = option("input", choices=RETRIEVAL_MODES)
  db_dim: int | None = option(None, low=1)
  scoring: str = option("rank", choices=SCORINGS)
  generate_tokens: int = option(2, low=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReFusionPrepared(Prepared):
  """A ReFusion run: the task, its label words' tokens [C, T], the fusion
  settings of the database (K, R), the encoded splits and their scorer
  (``prepare_shapes``: none; ``structure_model``, the structure compiled
  before a search has found one)."""
  spec: lmbff.TaskSpec
  label_tokens: np.ndarray
  fusion: fusion_lib.FusionConfig
  test_examples: int = 0
  arrays: dict | None = None
  neighbours: NeighbourVectors | None = None
  scorer: SplitScorer | None = None
  structure_model: ReFusionModel | None = None


class ReFusionTask(Task, Compilable):
  """Train (and search) ReFusion on one few-shot task (module docstring)."""
  name = "refusion"

  def __init__(self, *, data: ReFusionData,
               model_config: T5Config = T5Config(),
               fusion: fusion_lib.FusionConfig = fusion_lib.FusionConfig(),
               search: search_lib.SearchConfig = search_lib.SearchConfig()):
    self.check_configs(data=data, fusion=fusion)
    self.data, self.model_config = data, model_config
    self.fusion, self.search_config = fusion, search
    self.search = search.search and fusion.enabled
    self.hidden = data.retrieval_mode == "hidden" and fusion.enabled
    self.layer = data.retrieval_mode == "layer" and fusion.enabled
    # run-time state: the searched structure's model, set by phase_end (or
    # start, on a resume in the retraining); start's step and placement
    self._structure_model: ReFusionModel | None = None
    self._start_step = 0
    self._replicate = None

  @staticmethod
  def check_configs(*, data: ReFusionData, fusion: fusion_lib.FusionConfig,
                    **_) -> None:
    """The rule across the task's configs (gin validation runs it too)."""
    if (fusion.enabled or data.concat_neighbours) and not data.retrieval_db:
      raise InputError("RETRIEVAL_DB", "required with fusion modules or "
                       "CONCAT_NEIGHBOURS (build one with `jaxfid index "
                       "dense`)")
    if (fusion.enabled and data.retrieval_mode == "layer"
        and any(t.split(".")[1] not in LAYER_QUERY_MODULES
                for t in fusion.targets)):
      raise InputError("FUSION_MODULES", "RETRIEVAL_MODE 'layer' queries "
                       "with each module's input, the hidden state: only "
                       f"{', '.join(LAYER_QUERY_MODULES)} modules")

  # ---- data and model -------------------------------------------------------

  def prepare(self, settings: Settings) -> ReFusionPrepared:
    data, fused = self.data, self.fusion.enabled
    if self.hidden and settings.process_count > 1:
      raise InputError("RETRIEVAL_MODE", "'hidden' runs on one host")
    spec = lmbff.get_task(data.task, data.templates)
    splits = read_splits(spec, data.data_dir)
    tokenizer = load_tokenizer(settings.init_checkpoint)
    label_tokens = batch_lib.label_token_matrix(spec.label_words,
                                                tokenizer)       # [C, T]
    db_dim = database_width(
        data.retrieval_db, fused=fused, concat=data.concat_neighbours,
        db_dim=data.db_dim, mode=data.retrieval_mode,
        hidden_width=(self.model_config.d_model if self.hidden or self.layer
                      else None))
    arrays = encode_splits(
        spec, splits, tokenizer, label_tokens, max_length=data.max_length,
        retrieval_db=data.retrieval_db, top_k=data.top_k, fused=fused,
        hidden=self.hidden or self.layer,
        input_eos=template_sets.input_eos(data.templates),
        concat_neighbours=data.concat_neighbours,
        neighbour_cache=data.neighbour_cache, progress=settings.progress)
    fusion, model = self._model(db_dim, nb_lib.layer_database(
        data.retrieval_db) if self.layer else None)
    neighbours = NeighbourVectors(model, data.retrieval_db, top_k=data.top_k,
                                  hidden=self.hidden)
    return ReFusionPrepared(
        settings=settings, model=model, vocabulary=tokenizer.path, spec=spec,
        label_tokens=label_tokens, fusion=fusion,
        test_examples=len(splits["test"]), arrays=arrays,
        neighbours=neighbours,
        scorer=SplitScorer(spec.metric, label_tokens, arrays, neighbours,
                           data.eval_batch_size, scoring=data.scoring,
                           generate_tokens=data.generate_tokens, spec=spec,
                           tokenizer=tokenizer))

  def _model(self, db_dim: int, database: tuple | None = None
             ) -> tuple[fusion_lib.FusionConfig, ReFusionModel]:
    """The run's fusion settings (K, the database width R, the search) and
    model (holding the database in 'layer' retrieval)."""
    fusion = self.fusion.replace(top_k=self.data.top_k, db_dim=max(db_dim, 1),
                                 search=self.search)
    return fusion, ReFusionModel(self.model_config, fusion, database)

  # ---- ahead-of-time compilation ------------------------------------------

  @classmethod
  def compile_bindings(cls, macro) -> dict:
    """Placeholders for the paths a gin file sized before its data exists
    leaves unset (DATA_DIR, RETRIEVAL_DB); nothing reads them. TASK is
    never filled in: its label words are shapes of the program."""
    return {name: f"(not read by bench compile: {name})"
            for name in ("DATA_DIR", "RETRIEVAL_DB") if macro(name) is None}

  def prepare_shapes(self, settings: Settings) -> ReFusionPrepared:
    """The model and shapes from the configuration alone (reads no data).

    Before a search the structure is unknown: retrain and evaluation compile
    with ``FusionConfig.structure`` when given, else the ordered mask.
    """
    data, fused = self.data, self.fusion.enabled
    if self.layer:
      raise InputError("RETRIEVAL_MODE", "'layer' puts its database into "
                       "the programs: they are not compiled ahead of time")
    spec = lmbff.get_task(data.task, data.templates)
    label_tokens = batch_lib.label_token_matrix(spec.label_words,
                                                load_tokenizer())
    if not fused:
      db_dim = 0
    elif self.hidden:
      db_dim = self.model_config.d_model
      if data.db_dim not in (None, db_dim):
        raise InputError("DB_DIM", "RETRIEVAL_MODE 'hidden' queries the "
                         f"database with the model's {db_dim}-d hidden "
                         f"states, but DB_DIM is {data.db_dim}")
    elif data.db_dim is None:
      raise InputError("DB_DIM", "compiling fusion modules ahead of time "
                       "reads no RETRIEVAL_DB: set DB_DIM, the width of its "
                       "vectors")
    else:
      db_dim = data.db_dim
    fusion, model = self._model(db_dim)
    p = ReFusionPrepared(settings=settings, model=model, spec=spec,
                         label_tokens=label_tokens, fusion=fusion)
    if not self.search:
      return p
    structure = fusion.structure or ("ordered_mask",) * len(model.paths)
    return dataclasses.replace(p, structure_model=self.with_structure(
        p, structure))

  def _segments(self, p: ReFusionPrepared) -> int:
    """S, the neighbour segments of an example: one per input sentence
    ('input' retrieval), one pooled query ('hidden')."""
    return 2 if p.spec.pair and not (self.hidden or self.layer) else 1

  def _abstract_part(self, p: ReFusionPrepared, rows: int) -> dict:
    """One batch of ``rows`` examples (:func:`batch_lib.train_batch` after
    :class:`NeighbourVectors`): tokens [B, L], label word [B, T] and, with
    fusion modules, the neighbours' vectors [B, S, K, R]."""
    shape = jax.ShapeDtypeStruct
    part = {"encoder_input_tokens": shape((rows, self.data.max_length),
                                          jnp.int32),
            "decoder_target_tokens": shape(
                (rows, p.label_tokens.shape[1]), jnp.int32)}
    if p.fusion.enabled and not self.layer:
      f = p.fusion
      part["neighbours"] = shape((rows, self._segments(p), f.top_k,
                                  f.db_dim), jnp.float32)
    return part

  def abstract_batch(self, p: ReFusionPrepared, phase: int) -> dict:
    """:meth:`batch`'s global batch of phase ``phase``: the search's has a
    train and a dev batch (the architecture step's), the others a train
    batch only."""
    count = 1 + (self.search and self.search_config.retrain)
    if not 0 <= phase < count:
      raise ValueError(f"this run has {count} phase(s), not phase {phase}")
    out = {"train": self._abstract_part(p, p.settings.batch_size)}
    if self.search and phase == 0:
      out["dev"] = self._abstract_part(p, p.settings.batch_size)
    return out

  def decode_program(self, p: ReFusionPrepared, batch_size: int):
    """The final structure's classification (:class:`SplitScorer`'s
    program) on an evaluation batch (which keeps its gold label word,
    unused): every label word scored under teacher forcing, int32 [N] best
    classes, or with ``SCORING='generate'`` int32 [N, GENERATE_TOKENS]
    generated tokens."""
    model, labels = self.final_model(p), p.label_tokens      # [C, T]
    if self.data.scoring == "generate":
      tokens = self.data.generate_tokens
      return (lambda params, batch: model.generate(params, batch, tokens),
              self._abstract_part(p, batch_size))
    return (lambda params, batch: model.classify(params, batch, labels),
            self._abstract_part(p, batch_size))

  def run_config(self, p: ReFusionPrepared) -> dict:
    return {"method": self.name, "model": self.model_config.to_dict(),
            "fusion": p.fusion.to_dict(), "task": p.spec.name,
            "max_length": self.data.max_length,
            "label_words": list(p.spec.label_words),
            "templates": self.data.templates, "template": p.spec.template,
            "scoring": self.data.scoring,
            "retrieval_db": self.data.retrieval_db,
            "concat_neighbours": self.data.concat_neighbours,
            "search": self.search,
            "retrieval_mode": ("hidden" if self.hidden else
                               "layer" if self.layer else "input"),
            "retrain": self.search_config.retrain,
            "train_steps": p.settings.train_steps}

  def initial_params(self, p: ReFusionPrepared, path: str) -> dict:
    """INIT_CHECKPOINT's T5 backbone in fresh fusion parameters."""
    other, backbone, _ = load_checkpoint(path)
    matching.check_init_config(path, self.model_config, other.config)
    return merge_backbone(p.model.init_params(p.settings.seed), backbone,
                          path)

  def with_structure(self, p: ReFusionPrepared, structure) -> ReFusionModel:
    """The backbone with every fusion module fixed to its ``structure`` entry."""
    return p.model.with_fusion(dataclasses.replace(
        p.fusion, search=False, structure=tuple(structure)))

  def final_model(self, p: ReFusionPrepared) -> ReFusionModel:
    """The model the run's result is: the searched structure's, or the
    configured one."""
    if not self.search:
      return p.model
    model = self._structure_model or p.structure_model
    if model is None:
      path = os.path.join(p.settings.model_dir, search_lib.STRUCTURE_FILE)
      raise InputError(path, "missing: the search's structure was not "
                       "written; remove MODEL_DIR to search again")
    return model

  # ---- the steps --------------------------------------------------------------

  def phases(self, p: ReFusionPrepared, optimizer: OptimizerSettings
             ) -> list[Phase]:
    settings = p.settings
    steps = settings.train_steps
    schedule, model_opt, arch_opt = search_lib.optimizers(
        p.model.abstract_params(), optimizer, self.search_config, steps)

    def make_state(with_arch: bool):
      def make(params, step):
        arch = {"arch_opt_state": arch_opt.init(params)} if with_arch else {}
        return train_state(params, step, opt_state=model_opt.init(params),
                           **arch)
      return make

    def make_step(model: ReFusionModel, with_arch: bool):
      return search_lib.make_step(
          model, model_opt, arch_opt, seed=settings.seed, with_arch=with_arch,
          accumulation_steps=settings.accumulation_steps)

    phases = [Phase("search" if self.search else "train", steps,
                    make_state=make_state(self.search),
                    step=make_step(p.model, self.search),
                    learning_rate=schedule)]
    if self.search and self.search_config.retrain:
      # Traced when the retrain phase starts, after the search's phase_end
      # (or start(), on a resume) has fixed the structure.
      retrain_step = lambda state, batch: make_step(
          self.final_model(p), False)(state, batch)
      phases.append(Phase("retrain", 2 * steps, make_state=make_state(False),
                          step=retrain_step,
                          learning_rate=lambda s: schedule(s - steps),
                          fresh_params="initial"))
    return phases

  def start(self, p: ReFusionPrepared, ctx: Context, step: int, state
            ) -> None:
    self._start_step = step
    self._replicate = ctx.placement.replicate
    if self.search and step > ctx.settings.train_steps:  # in the retrain
      saved = search_lib.read_structure(ctx.settings.model_dir)
      if saved is not None:
        self._structure_model = self.with_structure(p, saved["structure"])
      self.final_model(p)  # InputError when it is missing

  def batch(self, p: ReFusionPrepared, step: int, rows: slice, params
            ) -> dict:
    s = p.settings
    train = batch_lib.train_batch(p.arrays["train"], step, s.batch_size,
                                  s.seed, rows)
    out = {"train": p.neighbours(params, train, self._replicate)}
    if self.search and step < s.train_steps:
      dev = batch_lib.train_batch(p.arrays["dev"], step, s.batch_size,
                                  s.seed + 1, rows)
      out["dev"] = p.neighbours(params, dev, self._replicate)
    return out

  def log_fields(self, metrics: dict) -> dict:
    out = super().log_fields(metrics)
    if "arch_loss" in metrics:
      out["arch_loss"] = float(metrics["arch_loss"])
    return out

  # ---- evaluation and the structure -------------------------------------------

  def evaluates(self, p: ReFusionPrepared) -> bool:
    return True

  def evaluate(self, p: ReFusionPrepared, ctx: Context, step: int, params
               ) -> dict:
    """Dev-set scores of the current discrete structure (and its counts)."""
    structure = None
    if not self.search:
      model = p.model
    elif step > ctx.settings.train_steps:  # retraining the fixed structure
      model = self.final_model(p)
    else:
      structure = p.model.discretize(params)
      model = self.with_structure(p, structure)
    scores = p.scorer(model, params, "dev", ctx.placement.replicate)
    record = {f"eval_{k}": v for k, v in scores.items()}
    if structure is not None:
      record.update({f"structure_{s}": structure.count(s)
                     for s in fusion_lib.SCHEMES})
    return record

  def phase_end(self, p: ReFusionPrepared, ctx: Context, phase: Phase,
                state) -> dict:
    """After the search: the argmax structure, written and logged once."""
    if phase.name != "search":
      return {}
    model_dir = ctx.settings.model_dir
    record = search_lib.structure_record(p.model, state["params"], phase.end)
    self._structure_model = self.with_structure(p, record["structure"])
    ran = self._start_step < phase.end
    if not ran and search_lib.read_structure(model_dir) is not None:
      return {}  # written (and logged) by the run that searched
    if ctx.settings.process_index == 0:
      search_lib.write_structure(model_dir, record)
    console.say("searched structure: " + ", ".join(
        f"{p}={s}" for p, s in zip(record["paths"], record["structure"])))
    return {"structure": search_lib.describe(record)}

  def finish(self, p: ReFusionPrepared, ctx: Context, step: int, state
             ) -> dict:
    """The test line: the final structure's scores and FLOPs per example."""
    model, params = self.final_model(p), state["params"]
    replicate = ctx.placement.replicate
    scores = p.scorer(model, params, "test", replicate)
    result = {f"test_{k}": v for k, v in scores.items()}
    result["test_examples"] = p.test_examples
    flops = p.scorer.flops(model, params, "test", replicate)
    if flops is not None:
      result["flops_per_example"] = flops
    return result

  def completed(self, ctx: Context, final_step: int) -> dict | None:
    """The recorded test line of a run that already finished."""
    found = [r for r in read_records(ctx.settings.model_dir)
             if r.get("step") == final_step and "test_accuracy" in r]
    return found[-1] if found else None

  def progress_fields(self, record: dict) -> dict:
    out = super().progress_fields(record)
    if "eval_accuracy" in record:
      out["acc"] = f"{record['eval_accuracy']:.3f}"
    return out
