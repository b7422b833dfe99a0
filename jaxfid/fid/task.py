"""The FiD reader's training task (Izacard & Grave 2020) for the one loop.

gin: ``gin/fid/*.gin`` bind ``METHOD = @FidTask()`` and its macros
(``TRAIN_DATA``, ``EVAL_DATA``, ``MIXTURE_OR_TASK_NAME``, ``N_CONTEXT``,
``TEXT_MAXLENGTH``, ``TARGET_MAXLENGTH``, ``DECODE_MAXLENGTH``,
``PASSAGE_EOS``, ``DATASET``, ...); the run's macros are the trainer's
(``gin/training.gin``).

Lengths. ``TARGET_MAXLENGTH`` truncates training targets (None: no
truncation, the original's ``answer_maxlength=-1``: targets are padded to
the longest target the training data can draw, computed once, so batches
keep one shape); ``DECODE_MAXLENGTH`` bounds generation at evaluation
(None: 50, the original's ``generate(max_length=50)``).
``ANSWER_MAXLENGTH`` is the shorthand the gin files point both at. A run
records them and ``PASSAGE_EOS`` (passages end with EOS) in its
``jaxfid_config.json``, which ``jaxfid predict`` / ``eval`` read back.

Data comes from FiD files (``TRAIN_DATA``/``EVAL_DATA``) or from a seqio
task or mixture (``MIXTURE_OR_TASK_NAME``: its ``train`` split trains, its
``validation`` split evaluates), read through the same Python preprocessing
(:mod:`jaxfid.fid.examples`). Two-phase training (the paper's): with
``first_phase_n_context`` set, steps before the last ``final_phase_steps``
use that many passages, the rest ``n_context``.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jaxfid.checkpoints import matching
from jaxfid.checkpoints.load import load_checkpoint
from jaxfid.core import console
from jaxfid.core.errors import InputError
from jaxfid.core.registry import Registry
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.fid import fido_uptrain
from jaxfid.fid.batches import FidBatcher
from jaxfid.fid.examples import FidExample, read_fid_examples
from jaxfid.fid.inputs import longest_target_length
from jaxfid.fid.predict import QaEvaluator
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.training.task import (Context, OptimizerSettings, Phase, Settings,
                                  Task, loss_phase)


class Component(NamedTuple):
  """One task of a seqio mixture, read into FiD examples."""
  task: str
  rate: float
  dataset: str            # 'nq', 'trivia_qa', ... (target casing)
  examples: list[FidExample]


DEFAULT_DECODE_MAXLENGTH = 50  # FiD's evaluate(): generate(max_length=50)


@dataclasses.dataclass(frozen=True)
class Lengths:
  """A reader's target and decoding lengths (module docstring)."""
  target_maxlength: int | None   # None: no truncation
  decode_maxlength: int

  @classmethod
  def resolve(cls, answer_maxlength: int | None = None,
              target_maxlength: int | None = None,
              decode_maxlength: int | None = None) -> "Lengths":
    """``answer_maxlength`` stands for whichever of the two is not given."""
    target = answer_maxlength if target_maxlength is None else target_maxlength
    decode = next(v for v in (decode_maxlength, answer_maxlength,
                              DEFAULT_DECODE_MAXLENGTH) if v is not None)
    for macro, value in (("TARGET_MAXLENGTH", target),
                         ("DECODE_MAXLENGTH", decode)):
      if value is not None and int(value) < 1:
        raise InputError(macro, f"must be at least 1 (or None), got {value}")
    return cls(None if target is None else int(target), int(decode))

  @classmethod
  def of_run_config(cls, run: dict) -> "Lengths":
    """A run config's lengths; runs written before the split recorded one
    ``answer_maxlength`` for both."""
    if "decode_maxlength" in run:
      return cls.resolve(target_maxlength=run.get("target_maxlength"),
                         decode_maxlength=run["decode_maxlength"])
    return cls.resolve(answer_maxlength=run.get("answer_maxlength"))


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


def initial_fid_params(path: str, config: T5Config) -> dict:
  """INIT_CHECKPOINT's parameters for a FiD run of ``config``.

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


class FidTask(Task):
  """Train a FiD reader (see the module docstring)."""
  name = "fid"
  best_metric = "eval_em"

  def __init__(self, *, model_config: T5Config = T5Config(),
               train_data: str | None = None, eval_data: str | None = None,
               mixture_or_task_name: str | None = None, dataset: str = "nq",
               n_context: int = 100, text_maxlength: int = 250,
               answer_maxlength: int | None = None,
               target_maxlength: int | None = None,
               decode_maxlength: int | None = None,
               passage_eos: bool = True, eval_batch_size: int = 8,
               eval_max_examples: int | None = None, eval_beams: int = 1,
               first_phase_n_context: int | None = None,
               final_phase_steps: int = 1000):
    self.model_config = model_config
    self.train_data, self.eval_data = train_data, eval_data
    self.mixture_or_task_name = mixture_or_task_name
    self.dataset = dataset
    self.n_context, self.text_maxlength = n_context, text_maxlength
    self.lengths = Lengths.resolve(answer_maxlength, target_maxlength,
                                   decode_maxlength)
    self.passage_eos = bool(passage_eos)
    self.target_length = self.lengths.target_maxlength  # set by prepare_data
    self.eval_batch_size, self.eval_max_examples = (eval_batch_size,
                                                    eval_max_examples)
    self.eval_beams = eval_beams
    self.first_phase_n_context = first_phase_n_context
    self.final_phase_steps = final_phase_steps
    self._batchers: dict[int, FidBatcher] = {}

  # ---- data ---------------------------------------------------------------

  def read_data(self) -> tuple[list[Component], list[FidExample]]:
    """(training components, evaluation examples), checked."""
    if self.mixture_or_task_name:
      if self.train_data:
        raise InputError("TRAIN_DATA", "set TRAIN_DATA or "
                         "MIXTURE_OR_TASK_NAME, not both")
      train = read_mixture(self.mixture_or_task_name, "train")
      evals = [] if self.eval_data else [
          e for c in read_mixture(self.mixture_or_task_name, "validation")
          for e in c.examples]
    elif self.train_data:
      train = [Component(self.train_data, 1.0, self.dataset,
                         read_fid_examples(self.train_data,
                                           require_answers=True,
                                           n_context=self.n_context))]
      evals = []
    else:
      raise InputError("TRAIN_DATA", "required (or MIXTURE_OR_TASK_NAME)")
    if self.eval_data:
      evals = read_fid_examples(self.eval_data, require_answers=True,
                                n_context=self.n_context)
    if self.eval_max_examples:
      evals = evals[:self.eval_max_examples]
    return train, evals

  def prepare(self, settings: Settings) -> None:
    self.prepare_data(settings)
    self.use_model(EncoderDecoderModel(self.model_config))

  def prepare_data(self, settings: Settings) -> None:
    """Read and check the data; the run's tokenizer."""
    self.settings = settings
    self.components, self.eval_examples = self.read_data()
    self.tokenizer = load_tokenizer(settings.init_checkpoint)
    self.vocabulary = self.tokenizer.path
    if self.lengths.target_maxlength is None:
      self.target_length = max(
          longest_target_length(self.tokenizer, c.examples, c.dataset)
          for c in self.components)
      console.say(f"TARGET_MAXLENGTH None: targets padded to "
                    f"{self.target_length} tokens, the longest target of the "
                    "training data (EOS included); none is truncated")

  def use_model(self, model) -> None:
    """Train and evaluate ``model`` (ReAtt gives its own)."""
    self.model = model
    self.evaluator = QaEvaluator(
        model, self.tokenizer, self.eval_examples, n_context=self.n_context,
        text_maxlength=self.text_maxlength,
        answer_maxlength=self.lengths.decode_maxlength,
        num_beams=self.eval_beams, batch_size=self.eval_batch_size,
        progress=self.settings.progress, passage_eos=self.passage_eos)

  def run_config(self) -> dict:
    """The run's reader settings; ``answer_maxlength`` (the decoding bound)
    is kept for readers of older run configs."""
    return {"method": self.name, "model": self.model_config.to_dict(),
            "n_context": self.n_context, "text_maxlength": self.text_maxlength,
            "answer_maxlength": self.lengths.decode_maxlength,
            "target_maxlength": self.lengths.target_maxlength,
            "decode_maxlength": self.lengths.decode_maxlength,
            "passage_eos": self.passage_eos, "dataset": self.dataset}

  def n_context_at(self, step: int) -> int:
    if (self.first_phase_n_context and
        step < self.settings.train_steps - self.final_phase_steps):
      return self.first_phase_n_context
    return self.n_context

  def train_examples(self) -> list[FidExample]:
    return [e for c in self.components for e in c.examples]

  def batcher(self, n_context: int) -> FidBatcher:
    if n_context not in self._batchers:
      self._batchers[n_context] = FidBatcher(
          self.train_examples(), self.tokenizer,
          batch_size=self.settings.batch_size, n_context=n_context,
          text_maxlength=self.text_maxlength,
          target_maxlength=self.target_length, seed=self.settings.seed,
          mixture=[(len(c.examples), c.rate, c.dataset)
                   for c in self.components], passage_eos=self.passage_eos)
    return self._batchers[n_context]

  def batch(self, step: int, rows: slice, params) -> dict:
    return self.batcher(self.n_context_at(step)).batch(step, rows)

  # ---- the step -------------------------------------------------------------

  def phases(self, settings: Settings, optimizer: OptimizerSettings
             ) -> list[Phase]:
    return [loss_phase(self.model, settings, optimizer,
                       optimizer.schedule_fn(settings.train_steps))]

  def initial_params(self, path: str) -> dict:
    return initial_fid_params(path, self.model_config)

  # ---- evaluation -------------------------------------------------------------

  def evaluates(self) -> bool:
    return bool(self.eval_examples)

  def evaluate(self, ctx: Context, step: int, params) -> dict:
    return self.evaluator(ctx.settings.model_dir, step, params,
                          ctx.placement)

  def progress_fields(self, record: dict) -> dict:
    out = super().progress_fields(record)
    if "eval_em" in record:
      out["em"] = f"{record['eval_em']:.3f}"
    return out

  def close(self) -> None:
    for b in self._batchers.values():
      b.close()
