"""The FiD reader's options as one config value, and its lengths.

``gin/fid/base.gin`` binds ``FidTask.reader = @FidReaderConfig()``, each
field from its macro. ``TARGET_MAXLENGTH`` truncates training targets (None:
padded to the longest target of the training data, FiD's -1);
``DECODE_MAXLENGTH`` bounds generation (None: 49, FiD's
``generate(max_length=50)``); ``ANSWER_MAXLENGTH`` is the shorthand for both
(:class:`Lengths`). Decoding a trained reader (``eval``, ``predict``,
``serve``) reads one :class:`DecodeConfig`: the checkpoint's run config, then
the command line's or gin's values.
"""
from __future__ import annotations

import dataclasses

from typing import Any, Mapping

from jaxfid.core.config import Config, macro_of, option
from jaxfid.core.errors import InputError

DEFAULT_DECODE_MAXLENGTH = 49  # FiD's evaluate(): generate(max_length=50), whose
# length counts the decoder's start token (transformers 3.0.2): 49 new tokens


@dataclasses.dataclass(frozen=True)
class Lengths:
  """A reader's target and decoding lengths (module docstring)."""
  target_maxlength: int | None   # None: no truncation
  decode_maxlength: int

  @classmethod
  def resolve(cls, answer_maxlength: int | None = None,
              target_maxlength: int | None = None,
              decode_maxlength: int | None = None) -> "Lengths":
    """``answer_maxlength`` stands for whichever of the two is not given
    (each already checked by the config that holds it)."""
    target = answer_maxlength if target_maxlength is None else target_maxlength
    decode = next(v for v in (decode_maxlength, answer_maxlength,
                              DEFAULT_DECODE_MAXLENGTH) if v is not None)
    return cls(None if target is None else int(target), int(decode))

  @classmethod
  def of_run_config(cls, run: dict) -> "Lengths":
    """A run config's lengths; runs written before the split recorded one
    ``answer_maxlength`` for both."""
    if "decode_maxlength" in run:
      return cls.resolve(target_maxlength=run.get("target_maxlength"),
                         decode_maxlength=run["decode_maxlength"])
    return cls.resolve(answer_maxlength=run.get("answer_maxlength"))


@dataclasses.dataclass(frozen=True)
class FidReaderConfig(Config):
  """What a FiD reader trains and evaluates on, and how it reads.

  Attributes:
    train_data: FiD JSON/JSONL training examples (or MIXTURE_OR_TASK_NAME).
    eval_data: FiD JSON/JSONL evaluation examples (EM every EVAL_EVERY
      steps, the best checkpoint kept).
    mixture_or_task_name: a seqio task or mixture instead of TRAIN_DATA: its
      'train' split trains, its 'validation' split evaluates (`import tasks`
      registers them).
    dataset: answer casing of TRAIN_DATA ('trivia_qa' title-cases
      all-uppercase answers).
    n_context: passages per question.
    text_maxlength: tokens per passage (question, title and text).
    answer_maxlength: shorthand for TARGET_MAXLENGTH and DECODE_MAXLENGTH
      where they are not given.
    target_maxlength: tokens of a training target; None: no truncation
      (padded to the longest target of the training data, FiD's -1).
    decode_maxlength: tokens generated at evaluation; None: 49 (FiD's).
    passage_eos: passages end with EOS (FiD's readers: no; T5 / seqio: yes).
    eval_max_examples: evaluate on the first N examples; None: all.
    eval_batch_size: questions per evaluation batch.
    eval_beams: beam size of evaluation (1: greedy).
    first_phase_n_context: two-phase training: passages per question before
      the last FINAL_PHASE_STEPS steps; None: one phase.
    final_phase_steps: steps of the second phase (with N_CONTEXT passages).
  """
  train_data: str | None = option(None)
  eval_data: str | None = option(None)
  mixture_or_task_name: str | None = option(None)
  dataset: str = option("nq")
  n_context: int = option(100, low=1)
  text_maxlength: int = option(250, low=1)
  answer_maxlength: int | None = option(None, low=1)
  target_maxlength: int | None = option(None, low=1)
  decode_maxlength: int | None = option(None, low=1)
  passage_eos: bool = option(True)
  eval_max_examples: int | None = option(None, low=1)
  eval_batch_size: int = option(8, low=1)
  eval_beams: int = option(1, low=1)
  first_phase_n_context: int | None = option(None, low=1)
  final_phase_steps: int = option(1000, low=0)

  def __post_init__(self):
    super().__post_init__()
    if self.train_data and self.mixture_or_task_name:
      raise InputError("TRAIN_DATA", "set TRAIN_DATA or MIXTURE_OR_TASK_NAME, "
                       "not both")
    if not self.train_data and not self.mixture_or_task_name:
      raise InputError("TRAIN_DATA", "required (or MIXTURE_OR_TASK_NAME)")

  @property
  def lengths(self) -> Lengths:
    return Lengths.resolve(self.answer_maxlength, self.target_maxlength,
                           self.decode_maxlength)


@dataclasses.dataclass(frozen=True)
class DecodeConfig(Config):
  """How a trained reader decodes (``eval``, ``predict``, ``serve``): each
  field read from the run config under its name (or :data:`RUN_KEYS`'), a
  flag (``--field-name`` or :data:`FLAGS`') and bound in gin.

  Attributes:
    n_context: passages per question.
    text_maxlength: tokens per passage (question, title and text).
    decode_maxlength: maximum number of generated tokens (EOS included);
      None: the run's, else 49 (FiD's).
    target_maxlength: tokens of the targets that ``jaxfid eval`` scores;
      None: the run's, else decode_maxlength.
    num_beams: beam size (1: greedy); ``serve``: the default and the largest
      a request may ask for.
    alpha: beam search length penalty (t5x brevity penalty).
    batch_size: questions per batch (``predict``).
  """
  DOC_RANK = 1  # docs/configuration.md describes shared macros by the
  # training config's fields
  n_context: int = option(100, low=1)
  text_maxlength: int = option(250, low=1)
  decode_maxlength: int | None = option(None, low=1)
  target_maxlength: int | None = option(None, low=1)
  num_beams: int = option(1, low=1, macro="EVAL_BEAMS")
  alpha: float = option(0.6, low=0)
  batch_size: int = option(8, low=1, macro="EVAL_BATCH_SIZE")

  @property
  def decode_length(self) -> int:
    """The decoding bound."""
    return self.decode_maxlength or DEFAULT_DECODE_MAXLENGTH

  @property
  def target_length(self) -> int:
    """The length of scored targets."""
    return self.target_maxlength or self.decode_length

  @classmethod
  def from_run_config(cls, run: Mapping[str, Any] | None) -> "DecodeConfig":
    """The decoding a training run recorded (``jaxfid_config.json``; {} or
    None: the defaults). Runs that recorded one ``answer_maxlength`` decode
    that many tokens."""
    run = dict(run or {})
    fields = {name: run[RUN_KEYS.get(name, name)]
              for name in (f.name for f in dataclasses.fields(cls))
              if run.get(RUN_KEYS.get(name, name)) is not None}
    if "decode_maxlength" not in fields and run.get("answer_maxlength"):
      fields["decode_maxlength"] = run["answer_maxlength"]
    return cls(**fields)

  def override(self, given: "DecodeConfig | Mapping[str, Any] | None" = None,
               names: Mapping[str, str] | None = None) -> "DecodeConfig":
    """This config with ``given``'s values that are not None (a mapping or
    another DecodeConfig: gin's, the command line's). ``names``: the flag
    that gave each field, named by the error of a refused value."""
    if given is None:
      return self
    if isinstance(given, DecodeConfig):
      given = {f.name: getattr(given, f.name)
               for f in dataclasses.fields(given)}
    changes = {k: v for k, v in given.items() if v is not None}
    try:
      return self.replace(**changes)
    except InputError as e:
      for name in changes:
        if names and name in names and e.path == macro_of(type(self), name):
          raise InputError(names[name], e.reason) from None
      raise


# DecodeConfig fields recorded under another name in a run config
RUN_KEYS = {"num_beams": "eval_beams", "batch_size": "eval_batch_size"}
# DecodeConfig fields whose flags are not --field-name (the first is the name)
FLAGS = {"decode_maxlength": ("--decode-maxlength", "--answer-maxlength"),
         "num_beams": ("--beam-size",), "alpha": ("--length-penalty",)}
