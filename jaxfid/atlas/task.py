"""Atlas (Izacard et al. 2022) for the one loop: a FiD reader and a
dual-encoder retriever trained together, retrieving from a passage index
held on the device mesh.

gin: ``gin/atlas/tiny.gin`` includes the FiD gin (whose ``FidTask``
becomes this task's ``reader``: TRAIN_DATA, EVAL_DATA, N_CONTEXT, lengths,
the reader's T5 config) and binds ``atlas = @AtlasConfig()`` (CORPUS,
RETRIEVER_LOSS, TEMPERATURE_GOLD, TEMPERATURE_SCORE, REFRESH_EVERY,
QUERY_SIDE_ONLY, INIT_RETRIEVER, ...; :mod:`jaxfid.atlas.config`).

A step: the step's questions are searched in the index with the current
query tower (:meth:`AtlasTask.batch`), the reader reads the N_CONTEXT hits,
and the loss is the reader's plus the retriever's
(:mod:`jaxfid.atlas.model`), trained by the loop's step (exact
accumulation, the non-finite guard; :mod:`jaxfid.atlas.step`).

The index (:mod:`jaxfid.atlas.index`) is built at the start and rebuilt at the
steps of REFRESH_EVERY (:meth:`AtlasConfig.refresh_steps`) with the current
passage tower (never with QUERY_SIDE_ONLY's frozen passage tower). Each build
is saved to ``MODEL_DIR/atlas_index/<step>``, and the train state is
checkpointed at that step before the rebuild, so a resumed run loads the index
of the last refresh before its step (re-sharded to its mesh) or, when a run was
stopped during a refresh, redoes that refresh from the restored state: it
retrieves what the uninterrupted run retrieved. Index directories no checkpoint
needs any more are removed.
"""
from __future__ import annotations

import dataclasses
import os
import shutil

import jax
import jax.numpy as jnp

from jaxfid.atlas import evaluation, prompts
from jaxfid.atlas.batches import AtlasBatcher
from jaxfid.atlas.checkpoint import is_atlas_dir, load_atlas, run_config_fields
from jaxfid.atlas.config import AtlasConfig
from jaxfid.atlas.index import load_index, read_meta, save_index
from jaxfid.atlas.model import READER, RETRIEVER, AtlasModel, untied
from jaxfid.atlas.retrieval import InLoopRetriever, read_passages
from jaxfid.atlas.step import atlas_optimizer, make_atlas_step
from jaxfid.core import paths
from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.model import (QUERY_TOWER, DualEncoder,
                                       DualEncoderConfig)
from jaxfid.reader.task import (ReaderPrepared, ReaderTask,
                                initial_reader_params)
from jaxfid.runtime import multihost
from jaxfid.t5.config import RUN_ONLY_FIELDS
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.training.task import (Compilable, Context, OptimizerSettings,
                                  Phase, Prepared, Settings, Task, train_state)

LOGGED = ("loss", "reader_loss", "retriever_loss", "token_accuracy",
          "grad_norm")
INDEX_DIR = "atlas_index"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AtlasPrepared(Prepared):
  """An Atlas run: the reader's data with the reader's half of the model,
  the corpus, the index's refresh steps and INIT_RETRIEVER's weights."""
  reader: ReaderPrepared
  passages: list = dataclasses.field(default_factory=list)
  refresh_at: list[int] = dataclasses.field(default_factory=list)
  init_retriever: dict | None = None


class AtlasTask(Task, Compilable):
  """Train Atlas (see the module docstring).

  Args:
    reader: FiD's task: data, lengths, the reader's T5 config, QA
      evaluation.
    atlas: the retriever's objective, the index and its refresh.
  """
  name = "atlas"
  description = "train atlas"
  best_metric = "eval_em"

  def __init__(self, *, reader: ReaderTask, atlas: AtlasConfig):
    self.reader, self.atlas = reader, atlas
    # made by start: the index, the train batches, the eval questions
    self.retriever: InLoopRetriever | None = None
    self.batcher: AtlasBatcher | None = None
    self.eval_queries = None

  # ---- data and model ---------------------------------------------------------

  def prepare(self, settings: Settings) -> AtlasPrepared:
    if paths.is_url(settings.model_dir):
      raise InputError("MODEL_DIR", "Atlas keeps its index in "
                       "MODEL_DIR/atlas_index and needs a local MODEL_DIR")
    reader, atlas = self.reader, self.atlas
    data = reader.prepare_data(settings)
    passages = read_passages(atlas.corpus)
    k = self._check_retrieved()
    need = max(k, atlas.eval_recall_k if reader.evaluates(data) else 0)
    if len(passages) < need:
      raise InputError("CORPUS", f"{len(passages)} passages; retrieval "
                       f"needs at least {need} (N_CONTEXT or "
                       f"RETRIEVER_N_CONTEXT, and eval_recall@"
                       f"{atlas.eval_recall_k})")
    if 0 < atlas.rerank_k < k:
      raise InputError("RERANK_K", f"{atlas.rerank_k} candidates to re-rank, "
                       f"fewer than the {k} retrieved")
    retriever, init_retriever = self._make_retriever()
    model = AtlasModel(EncoderDecoderModel(reader.model_config), retriever,
                       atlas, reader.n_context)
    fmt = atlas.prompt_format
    if fmt == "atlas" and reader.lengths.target_maxlength is None:
      # the sentinel before every answer
      data = dataclasses.replace(data, target_length=data.target_length + 1)
    reader_p = reader.with_model(data, model.reader)
    reader_p.evaluator.answer_text = lambda text: prompts.answer(text, fmt)
    return AtlasPrepared(
        settings=settings, model=model, vocabulary=data.vocabulary,
        reader=reader_p, passages=passages,
        refresh_at=atlas.refresh_steps(settings.train_steps),
        init_retriever=init_retriever)

  def _check_retrieved(self) -> int:
    """Passages retrieved per question (RETRIEVER_N_CONTEXT, at least
    N_CONTEXT; default N_CONTEXT)."""
    n, k = self.reader.n_context, self.atlas.retrieved(self.reader.n_context)
    if k < n:
      raise InputError("RETRIEVER_N_CONTEXT", f"{k} is below N_CONTEXT {n}: "
                       "the reader reads the first N_CONTEXT of them")
    return k

  def _make_retriever(self) -> tuple[DualEncoder, dict | None]:
    """The retriever and INIT_RETRIEVER's weights (for
    :meth:`initial_params` / :meth:`start`; None without it): its
    architecture (the run's DROPOUT_RATE, DTYPE,
    REMAT, ...: ``RUN_ONLY_FIELDS``), else the reader's T5 config;
    separate towers with QUERY_SIDE_ONLY in QUERY_SIDE_MODE 'frozen', one
    shared tower otherwise (Atlas's Contriever)."""
    atlas = self.atlas
    lengths = dict(query_maxlength=atlas.query_maxlength,
                   passage_maxlength=atlas.passage_maxlength)
    shared = not atlas.separate_towers
    if not atlas.init_retriever:
      return DualEncoder(self.reader.model_config,
                         DualEncoderConfig(shared=shared, **lengths)), None
    loaded = load_dual_encoder(atlas.init_retriever)
    settings = loaded.encoder.settings.replace(**lengths)
    params = loaded.params
    if settings.shared and not shared:  # the query tower starts as a copy
      params = untied({**params, QUERY_TOWER: None})
      settings = settings.replace(shared=False)
    elif shared and not settings.shared:
      raise InputError("INIT_RETRIEVER", "has separate query and passage "
                       "towers; train it with QUERY_SIDE_ONLY = True and "
                       "QUERY_SIDE_MODE = 'frozen'")
    run = self.reader.model_config  # the run's dropout, dtype, remat, ...
    config = loaded.encoder.config.replace(
        **{f: getattr(run, f) for f in RUN_ONLY_FIELDS})
    return DualEncoder(config, settings), params

  def run_config(self, p: AtlasPrepared) -> dict:
    return {**self.reader.run_config(p.reader), **run_config_fields(p.model)}

  def initial_params(self, p: AtlasPrepared, path: str) -> dict:
    """INIT_CHECKPOINT: an Atlas MODEL_DIR (reader and retriever), or any
    T5 checkpoint for the reader (the retriever: INIT_RETRIEVER's, else
    random from SEED)."""
    if is_atlas_dir(path):
      _, params = load_atlas(path)
      return params
    retriever = (p.init_retriever if p.init_retriever is not None
                 else untied(p.model.retriever.init_params(
                     p.settings.seed + 1)))
    return {READER: initial_reader_params(path, self.reader.model_config),
            RETRIEVER: retriever}

  # ---- ahead-of-time compilation (``jaxfid bench compile``) ----------------

  @classmethod
  def compile_bindings(cls, macro) -> dict:
    """Placeholders for TRAIN_DATA (the reader's) and CORPUS where a gin file
    sized before its data exists leaves them unset; nothing reads them."""
    out = ReaderTask.compile_bindings(macro)
    if macro("CORPUS") is None:
      out["CORPUS"] = "(not read by bench compile)"
    return out

  def prepare_shapes(self, settings: Settings) -> AtlasPrepared:
    """The model from the configuration alone: no data, corpus or
    checkpoint is read (INIT_RETRIEVER's architecture would be: leave it
    unset to compile)."""
    if self.atlas.init_retriever:
      raise InputError("INIT_RETRIEVER", "compiling ahead of time reads no "
                       "checkpoint: leave it unset (the retriever then has "
                       "the reader's T5 config)")
    reader = self.reader.prepare_shapes(settings)
    self._check_retrieved()
    model = AtlasModel(reader.model, self._make_retriever()[0], self.atlas,
                       self.reader.n_context)
    return AtlasPrepared(settings=settings, model=model, reader=reader)

  def abstract_batch(self, p: AtlasPrepared, phase: int) -> dict:
    """The reader's batch (rows [B, K, L], mask [B, K], targets [B, T]; K
    the passages retrieved) plus the retriever's ``query_tokens`` [B, Q] and
    ``passage_tokens`` [B, K, P]. The in-loop search is a program of its
    own, not compiled here."""
    if phase != 0:
      raise ValueError(f"Atlas trains in one phase, not phase {phase}")
    atlas = self.atlas
    b, k = p.settings.batch_size, atlas.retrieved(self.reader.n_context)
    reader = self.reader.abstract_batch(p.reader, phase)
    rows = reader["encoder_input_tokens"]
    return {**reader,
            "encoder_input_tokens": jax.ShapeDtypeStruct(
                (b, k, rows.shape[2]), rows.dtype),
            "passage_mask": jax.ShapeDtypeStruct((b, k), jnp.bool_),
            "query_tokens": jax.ShapeDtypeStruct((b, atlas.query_maxlength),
                                                 jnp.int32),
            "passage_tokens": jax.ShapeDtypeStruct(
                (b, k, atlas.passage_maxlength), jnp.int32)}

  def decode_program(self, p: AtlasPrepared, batch_size: int):
    """The reader's evaluation program over the Atlas parameter tree."""
    fn, batch = self.reader.decode_program(p.reader, batch_size,
                                           model=p.model.reader)
    return (lambda params, b: fn(params[READER], b)), batch

  # ---- the step ---------------------------------------------------------------

  def phases(self, p: AtlasPrepared, optimizer: OptimizerSettings
             ) -> list[Phase]:
    settings = p.settings
    schedule = optimizer.schedule_fn(settings.train_steps)
    tx = atlas_optimizer(optimizer, self.atlas, settings.train_steps)
    return [Phase("train", settings.train_steps,
                  make_state=lambda params, s: train_state(
                      params, s, opt_state=tx.init(params)),
                  step=make_atlas_step(
                      p.model, tx, seed=settings.seed,
                      accumulation_steps=settings.accumulation_steps),
                  learning_rate=schedule)]

  def batch(self, p: AtlasPrepared, step: int, rows: slice, params) -> dict:
    """Rows ``rows`` of step ``step``: the whole batch's questions searched
    with ``params`` (every process alike), then this process's rows."""
    questions = self.batcher.query_tokens[self.batcher.indices(step)]
    ids, scores = self.retriever.search(
        params, questions, self.atlas.retrieved(self.reader.n_context))
    return self.batcher.batch(step, rows, ids, scores)

  def log_fields(self, metrics: dict) -> dict:
    return {k: float(metrics[k]) for k in LOGGED}

  def progress_fields(self, record: dict) -> dict:
    out = self.reader.progress_fields(record)
    if "eval_recall@5" in record:
      out["r@5"] = f"{record['eval_recall@5']:.3f}"
    return out

  # ---- the index --------------------------------------------------------------

  def _index_dir(self, ctx: Context, step: int) -> str:
    return os.path.join(ctx.settings.model_dir, INDEX_DIR, str(step))

  def start(self, p: AtlasPrepared, ctx: Context, step: int, state) -> None:
    """The retriever and its index: the index of the last refresh at or
    before ``step`` (loaded, or rebuilt when that refresh was cut short);
    on a fresh run without INIT_CHECKPOINT, INIT_RETRIEVER's weights."""
    reader, atlas = self.reader, self.atlas
    mesh = ctx.placement.mesh
    self.retriever = InLoopRetriever(
        p.model, p.passages, p.reader.tokenizer, mesh,
        passage_maxlength=atlas.passage_maxlength,
        query_maxlength=atlas.query_maxlength,
        batch_size=atlas.index_batch_size, dtype=atlas.index_dtype,
        rerank_k=atlas.rerank_k)
    examples = p.reader.train_examples
    self.batcher = AtlasBatcher(
        examples, p.passages, self.retriever.tokens,
        self.retriever.query_tokens([e.question for e in examples]),
        p.reader.tokenizer, batch_size=ctx.settings.batch_size,
        n_context=atlas.retrieved(reader.n_context),
        text_maxlength=reader.text_maxlength,
        target_maxlength=p.reader.target_length, seed=ctx.settings.seed,
        dataset=reader.dataset, passage_eos=reader.passage_eos,
        prompt_format=atlas.prompt_format)
    self.eval_queries = (self.retriever.query_tokens(
        [e.question for e in p.reader.eval_examples]) if self.evaluates(p)
        else None)
    if (step == 0 and p.init_retriever is not None
        and not ctx.settings.init_checkpoint):
      # restored on this process's first device: placed from there by every
      # process (jax.device_put cannot reach other processes' devices)
      state["params"] = {**state["params"], RETRIEVER: multihost.put(
          p.init_retriever, ctx.placement.params[RETRIEVER])}
    last = max(s for s in p.refresh_at if s <= step)
    directory = self._index_dir(ctx, last)
    meta = read_meta(directory)
    if meta is not None:
      if meta["num_passages"] != len(p.passages):
        raise InputError(directory, f"holds {meta['num_passages']} passages, "
                         f"CORPUS {len(p.passages)}: another corpus")
      self.retriever.index = load_index(directory, mesh,
                                        atlas.index_batch_size)
    elif last == step:
      self.refresh(p, ctx, step, state)
    else:
      raise InputError(directory, f"missing: the index of step {last}, "
                       f"which the checkpoint of step {step} was trained "
                       "with")

  def refresh(self, p: AtlasPrepared, ctx: Context, step: int, state
              ) -> None:
    """Rebuild the index with the current passage tower; save it."""
    self.retriever.refresh(state["params"], progress=ctx.settings.progress)
    corpus = self.atlas.corpus
    save_index(self.retriever.index, self._index_dir(ctx, step), step=step,
               corpus=corpus if paths.is_url(corpus) else
               os.path.abspath(corpus))
    ctx.log.write(step, {"index_refreshed": len(p.passages)})
    self._prune(p, ctx, step)

  def _prune(self, p: AtlasPrepared, ctx: Context, step: int) -> None:
    """Remove the index directories no checkpoint (nor ``step``) needs."""
    root = os.path.join(ctx.settings.model_dir, INDEX_DIR)
    if jax.process_index() != 0 or not os.path.isdir(root):
      return
    needed = {max(s for s in p.refresh_at if s <= c)
              for c in [*ctx.checkpoints.steps(), step]}
    for name in os.listdir(root):
      if name.isdigit() and int(name) not in needed:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)

  def after_step(self, p: AtlasPrepared, ctx: Context, step: int, state
                 ) -> None:
    if step in p.refresh_at:
      ctx.save(step, state)
      self.refresh(p, ctx, step, state)

  # ---- evaluation ---------------------------------------------------------------

  def evaluates(self, p: AtlasPrepared) -> bool:
    return self.reader.evaluates(p.reader)

  def evaluate(self, p: AtlasPrepared, ctx: Context, step: int, params
               ) -> dict:
    return evaluation.evaluate(
        self.retriever, p.reader.evaluator, p.reader.eval_examples,
        self.eval_queries, n_context=self.reader.n_context,
        recall_k=self.atlas.eval_recall_k, model_dir=ctx.settings.model_dir,
        step=step, params=params, placement=ctx.placement,
        prompt_format=self.atlas.prompt_format)

  def close(self) -> None:
    self.reader.close()
