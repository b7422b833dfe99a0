"""The reader's training task for the one loop: T5 reading retrieved passages.

:class:`ReaderTask` is FiD's training (Izacard & Grave 2020) and the reader
that ReAtt and Atlas build on (their tasks take one as ``reader``); the FiD
method's gin name for it is :class:`jaxfid.fid.task.FidTask`. gin binds two
config values: ``reader = @FidReaderConfig()`` (its macros ``TRAIN_DATA``,
``EVAL_DATA``, ``MIXTURE_OR_TASK_NAME``, ``N_CONTEXT``, ``TEXT_MAXLENGTH``,
``TARGET_MAXLENGTH``, ``DECODE_MAXLENGTH``, ``PASSAGE_EOS``, ``DATASET``,
...; :mod:`jaxfid.reader.config`, which also explains the lengths) and
``model_config = @T5Config()``; the run's macros are the trainer's
(``gin/training.gin``). A run records the reader's and model's config in
its ``jaxfid_config.json``, which ``jaxfid predict`` / ``eval`` / ``serve``
read back.

Data comes from FiD files (``TRAIN_DATA``/``EVAL_DATA``) or from a seqio
task or mixture (``MIXTURE_OR_TASK_NAME``: its ``train`` split trains, its
``validation`` split evaluates), read through the same Python preprocessing
(:mod:`jaxfid.reader.examples`). Two-phase training (the paper's): with
``first_phase_n_context`` set, steps before the last ``final_phase_steps``
use that many passages, the rest ``n_context``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxfid.checkpoints import fido_uptrain
from jaxfid.checkpoints import matching
from jaxfid.checkpoints.load import load_checkpoint
from jaxfid.core.errors import InputError
from jaxfid.core.registry import Registry
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.reader.batches import FidBatcher
from jaxfid.reader.config import FidReaderConfig
from jaxfid.reader.examples import FidExample, read_fid_examples
from jaxfid.reader.inputs import longest_target_length
from jaxfid.reader.predict import QaEvaluator, predict_program
from jaxfid.runtime import console
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.training.task import (Compilable, Context, OptimizerSettings,
                                  Phase, Prepared, Settings, Task, loss_phase)


class Component(NamedTuple):
  """One task of a seqio mixture, read into FiD examples."""
  task: str
  rate: float
  dataset: str            # 'nq', 'trivia_qa', ... (target casing)
  examples: list[FidExample]


# name -> fn(mixture_or_task_name, split) -> [Component, ...]; the ``tasks``
# package registers "seqio" when imported.
EXAMPLE_SOURCES: Registry = Registry(
    "example source", hint="MIXTURE_OR_TASK_NAME needs the seqio tasks: "
    "`import tasks` (installed with jaxfid[seqio])")
SEQIO = "seqio"


def read_mixture(name: str, split: str) -> list[Component]:
  """The components of seqio mixture or task ``name`` (split ``split``)."""
  components = EXAMPLE_SOURCES.get(SEQIO, "MIXTURE_OR_TASK_NAME")(name, split)
  if not any(c.examples for c in components):
    raise InputError("MIXTURE_OR_TASK_NAME", f"{name!r} has no examples in "
                     f"split {split!r}")
  return components


def initial_reader_params(path: str, config: T5Config) -> dict:
  """INIT_CHECKPOINT's parameters for a reader of ``config``.

  A checkpoint of the run's architecture loads as it is. A dense T5 (any
  format :func:`~jaxfid.checkpoints.load.load_checkpoint` reads) into a FiDO
  run that differs only in the FiDO switches is converted (FiDO's
  uptraining; one line on stderr says so). Anything else raises InputError
  naming the fields that differ.
  """
  other, params, _ = load_checkpoint(path)
  if fido_uptrain.can_uptrain(other.config, config):
    params = fido_uptrain.fido_params_from_dense(params, other.config, config,
                                                 source=path)
    console.say(f"INIT_CHECKPOINT {path}: dense T5 converted to FiDO "
                f"({fido_uptrain.describe(config)})")
    return params
  diff = config.architecture_differences(other.config)
  if fido_uptrain.is_dense(other.config):  # FiDO switches alone would convert
    diff = [f for f in diff if f not in fido_uptrain.FIDO_FIELDS] or diff
  if not set(diff) <= set(fido_uptrain.FIDO_FIELDS):
    hint = "list the matching gin/models file"
  elif fido_uptrain.is_dense(config):
    hint = "a FiDO checkpoint cannot start a dense run"
  else:
    hint = "only a dense T5 checkpoint is converted to FiDO"
  matching.check_init_config(path, config, other.config, fields=diff,
                             hint=hint)
  return params


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReaderPrepared(Prepared):
  """A reader run's data and model (``prepare_shapes``: the model and
  ``target_length`` alone). ``model`` and ``evaluator`` are None only in
  :meth:`ReaderTask.prepare_data`'s value, which ReAtt and Atlas complete
  with their model (:meth:`ReaderTask.with_model`)."""
  target_length: int              # T of the train batches' targets
  tokenizer: Any = None
  components: tuple[Component, ...] = ()
  eval_examples: tuple[FidExample, ...] = ()
  evaluator: QaEvaluator | None = None

  @property
  def train_examples(self) -> list[FidExample]:
    return [e for c in self.components for e in c.examples]


class ReaderTask(Task, Compilable):
  """Train a reader (see the module docstring)."""
  name = "fid"
  best_metric = "eval_em"

  def __init__(self, *, reader: FidReaderConfig,
               model_config: T5Config = T5Config()):
    self.reader = reader
    self.model_config = model_config
    self.lengths = reader.lengths
    self._batchers: dict[int, FidBatcher] = {}  # by N_CONTEXT, made lazily

  # What other code (ReAtt's task) reads of the reader's options.
  n_context = property(lambda self: self.reader.n_context)
  text_maxlength = property(lambda self: self.reader.text_maxlength)
  passage_eos = property(lambda self: self.reader.passage_eos)
  dataset = property(lambda self: self.reader.dataset)

  # ---- data ---------------------------------------------------------------

  def read_data(self) -> tuple[list[Component], list[FidExample]]:
    """(training components, evaluation examples)."""
    r = self.reader
    if r.mixture_or_task_name:
      train = read_mixture(r.mixture_or_task_name, "train")
      evals = [] if r.eval_data else [
          e for c in read_mixture(r.mixture_or_task_name, "validation")
          for e in c.examples]
    else:
      train = [Component(r.train_data, 1.0, r.dataset,
                         read_fid_examples(r.train_data,
                                           require_answers=True,
                                           n_context=r.n_context))]
      evals = []
    if r.eval_data:
      evals = read_fid_examples(r.eval_data, require_answers=True,
                                n_context=r.n_context)
    if r.eval_max_examples:
      evals = evals[:r.eval_max_examples]
    return train, evals

  def prepare(self, settings: Settings) -> ReaderPrepared:
    return self.with_model(self.prepare_data(settings),
                           EncoderDecoderModel(self.model_config))

  def prepare_data(self, settings: Settings) -> ReaderPrepared:
    """The data read and checked, and the run's tokenizer; no model yet."""
    components, eval_examples = self.read_data()
    tokenizer = load_tokenizer(settings.init_checkpoint)
    target_length = self.lengths.target_maxlength
    if target_length is None:
      target_length = max(
          longest_target_length(tokenizer, c.examples, c.dataset)
          for c in components)
      console.say(f"TARGET_MAXLENGTH None: targets padded to "
                  f"{target_length} tokens, the longest target of the "
                  "training data (EOS included); none is truncated")
    return ReaderPrepared(
        settings=settings, model=None, vocabulary=tokenizer.path,
        target_length=target_length, tokenizer=tokenizer,
        components=tuple(components), eval_examples=tuple(eval_examples))

  def with_model(self, p: ReaderPrepared, model) -> ReaderPrepared:
    """``p`` training and evaluating ``model`` (ReAtt gives its own)."""
    return dataclasses.replace(p, model=model, evaluator=QaEvaluator(
        model, p.tokenizer, list(p.eval_examples), n_context=self.n_context,
        text_maxlength=self.text_maxlength,
        answer_maxlength=self.lengths.decode_maxlength,
        num_beams=self.reader.eval_beams,
        batch_size=self.reader.eval_batch_size,
        progress=p.settings.progress, passage_eos=self.passage_eos))

  def run_config(self, p: ReaderPrepared) -> dict:
    """The run's reader config (``reader.to_dict()``: what
    :meth:`~jaxfid.reader.config.DecodeConfig.from_run_config` reads) and model
    config, with the lengths resolved; ``answer_maxlength`` is the decoding
    bound."""
    del p  # the configuration's alone
    return {**self.reader.to_dict(), "method": self.name,
            "model": self.model_config.to_dict(),
            "n_context": self.n_context, "text_maxlength": self.text_maxlength,
            "answer_maxlength": self.lengths.decode_maxlength,
            "target_maxlength": self.lengths.target_maxlength,
            "decode_maxlength": self.lengths.decode_maxlength,
            "passage_eos": self.passage_eos, "dataset": self.dataset}

  def n_context_at(self, p: ReaderPrepared, step: int) -> int:
    first = self.reader.first_phase_n_context
    if first and step < (p.settings.train_steps
                         - self.reader.final_phase_steps):
      return first
    return self.n_context

  def batcher(self, p: ReaderPrepared, n_context: int) -> FidBatcher:
    if n_context not in self._batchers:
      self._batchers[n_context] = FidBatcher(
          p.train_examples, p.tokenizer,
          batch_size=p.settings.batch_size, n_context=n_context,
          text_maxlength=self.text_maxlength,
          target_maxlength=p.target_length, seed=p.settings.seed,
          mixture=[(len(c.examples), c.rate, c.dataset)
                   for c in p.components], passage_eos=self.passage_eos)
    return self._batchers[n_context]

  def batch(self, p: ReaderPrepared, step: int, rows: slice, params) -> dict:
    return self.batcher(p, self.n_context_at(p, step)).batch(step, rows)

  # ---- the step -------------------------------------------------------------

  def phases(self, p: ReaderPrepared, optimizer: OptimizerSettings
             ) -> list[Phase]:
    settings = p.settings
    return [loss_phase(p.model, settings, optimizer,
                       optimizer.schedule_fn(settings.train_steps))]

  def initial_params(self, p: ReaderPrepared, path: str) -> dict:
    return initial_reader_params(path, self.model_config)

  # ---- ahead-of-time compilation (``jaxfid bench compile``) ----------------

  @classmethod
  def compile_bindings(cls, macro) -> dict:
    """Without TRAIN_DATA or MIXTURE_OR_TASK_NAME (a gin file sized before
    its data exists) a placeholder TRAIN_DATA lets the reader's config
    build; nothing reads it."""
    if macro("TRAIN_DATA") is None and macro("MIXTURE_OR_TASK_NAME") is None:
      return {"TRAIN_DATA": "(not read by bench compile)"}
    return {}

  def prepare_shapes(self, settings: Settings) -> ReaderPrepared:
    """The model; targets of TARGET_MAXLENGTH tokens, or (None: the data's
    longest, unknown without data) of the decoding bound, said on stderr."""
    target_length = self.lengths.target_maxlength
    if target_length is None:
      target_length = self.lengths.decode_maxlength
      console.say(f"TARGET_MAXLENGTH None: compiled with targets of "
                  f"{target_length} tokens (the decoding bound; the "
                  "data's longest target is not read); set TARGET_MAXLENGTH "
                  "to size the run's own")
    return ReaderPrepared(settings=settings,
                          model=EncoderDecoderModel(self.model_config),
                          target_length=target_length)

  def abstract_batch(self, p: ReaderPrepared, phase: int) -> dict:
    """The batcher's leaves: tokens [B, P, L] int32, passage mask [B, P]
    bool, targets [B, T] int32; P the larger of the two-phase counts (the
    step of N_CONTEXT or FIRST_PHASE_N_CONTEXT passages that needs more)."""
    del phase  # one phase; its passage count may change at a step
    b, length = p.settings.batch_size, self.text_maxlength
    n = max(self.n_context, self.reader.first_phase_n_context or 0)
    return {"encoder_input_tokens": jax.ShapeDtypeStruct((b, n, length),
                                                         jnp.int32),
            "passage_mask": jax.ShapeDtypeStruct((b, n), jnp.bool_),
            "decoder_target_tokens": jax.ShapeDtypeStruct(
                (b, p.target_length), jnp.int32)}

  def decode_program(self, p: ReaderPrepared, batch_size: int, model=None):
    """The evaluation's program: greedy or EVAL_BEAMS beam decoding of
    DECODE_MAXLENGTH tokens over N_CONTEXT passages, by ``model`` (default
    ``p``'s; ReAtt's task gives its own)."""
    fn = predict_program(model or p.model,
                         max_decode_len=self.lengths.decode_maxlength,
                         num_beams=self.reader.eval_beams)
    n, length = self.n_context, self.text_maxlength
    return fn, {"encoder_input_tokens": jax.ShapeDtypeStruct(
                    (batch_size, n, length), jnp.int32),
                "passage_mask": jax.ShapeDtypeStruct((batch_size, n),
                                                     jnp.bool_)}

  # ---- evaluation -------------------------------------------------------------

  def evaluates(self, p: ReaderPrepared) -> bool:
    return bool(p.eval_examples)

  def evaluate(self, p: ReaderPrepared, ctx: Context, step: int, params
               ) -> dict:
    return p.evaluator(ctx.settings.model_dir, step, params, ctx.placement)

  def progress_fields(self, record: dict) -> dict:
    out = super().progress_fields(record)
    if "eval_em" in record:
      out["em"] = f"{record['eval_em']:.3f}"
    return out

  def close(self) -> None:
    for b in self._batchers.values():
      b.close()
