"""What every gin-driven command reads, and what each value may be.

:data:`TABLE` holds one row per parameter of each configurable the gin files
bind (``loop.train``, ``FidTask``, ``ReAttTask``, ``ReFusionTask``,
``DualEncoderTask``, ``T5Config``, ``seqio_eval.evaluate``, the checkpoint
evaluators), in the order of the gin file that binds it; the macro a row
checks is named in its comment. Choices come from the code that consumes
them (``optim.OPTIMIZERS``, ``fusion.SCHEMES``, ...). :data:`COMMANDS` says
which configurables each command calls and which macros it reads itself, as
the commands registered them (:mod:`jaxfid.commands.registry`).

:func:`check` validates a parsed run (see :mod:`jaxfid.core.gin_checks`):
unknown or unread bindings, wrong types, out-of-range values, bad choices and
missing REQUIRED values are one-line errors before anything is built or
written. ``tests/test_gin_validation.py`` checks that every parameter the
shipped gin files bind has a check (a row here or its field's), and that
each row agrees with the parameter's annotation (type, and None only where
the default is None).
"""
from __future__ import annotations

from collections.abc import Mapping

from jaxfid.commands import registry, seqio_eval
from jaxfid.core.errors import InputError
from jaxfid.core.gin_checks import (REFERENCE, Check, Reads, Table, flag,
                                    integer, number, text, validate)
from jaxfid.core.gin_files import ParsedGin
from jaxfid.fid.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.reatt.task import ReAttTask
from jaxfid.refusion import fusion, lmbff
from jaxfid.refusion import search as refusion_search
from jaxfid.refusion.checkpoint_eval import ReFusionCheckpointEvaluator
from jaxfid.refusion.task import RETRIEVAL_MODES, ReFusionTask
from jaxfid.t5 import config as t5_config
from jaxfid.training import launch


def _task_problem(name: str) -> str | None:
  try:
    lmbff.get_task(name)
  except InputError as e:
    return e.reason
  return None


def _fusion_problem(spec: str) -> str | None:
  try:
    fusion.parse_targets(spec)
  except ValueError as e:
    return str(e)
  return None


def _refusion_db(values) -> tuple[str, str] | None:
  if _fusion_problem(values["fusion_modules"]) is None and (
      fusion.parse_targets(values["fusion_modules"])
      or values["concat_neighbours"]) and not values["retrieval_db"]:
    return ("retrieval_db", "required with fusion modules or "
            "CONCAT_NEIGHBOURS (build one with `jaxfid index dense`)")
  return None


SIZE = integer(1)
OPTIONAL_SIZE = integer(1, optional=True)
STEPS = integer(0)
PATH = text()
OPTIONAL_PATH = text(optional=True)

TABLE = Table()

# gin/training.gin
TABLE.add(launch.run, train_fn=Check(REFERENCE),
          use_hardware_rng=flag())                      # USE_HARDWARE_RNG
# gin/evaluation.gin (`jaxfid eval`)
TABLE.add(
    seqio_eval.evaluate,
    checkpoint_path=PATH,                               # CHECKPOINT_PATH
    output_dir=PATH,                                    # EVAL_OUTPUT_DIR
    mixture_or_task_name=text(),                        # MIXTURE_OR_TASK_NAME (required here)
    split=text(),                                       # EVAL_SPLIT
    batch_size=SIZE,                                    # EVAL_BATCH_SIZE
    max_examples=OPTIONAL_SIZE,                         # EVAL_MAX_EXAMPLES
    progress=flag())
TABLE.add(
    FidCheckpointEvaluator,
    n_context=OPTIONAL_SIZE,                            # N_CONTEXT
    text_maxlength=OPTIONAL_SIZE,                       # TEXT_MAXLENGTH
    answer_maxlength=OPTIONAL_SIZE,                     # ANSWER_MAXLENGTH
    target_maxlength=OPTIONAL_SIZE,                     # TARGET_MAXLENGTH
    decode_maxlength=OPTIONAL_SIZE,                     # DECODE_MAXLENGTH
    num_beams=SIZE,                                     # EVAL_BEAMS
    alpha=number(0), dtype=text(t5_config.DTYPES, optional=True))
TABLE.add(ReFusionCheckpointEvaluator, neighbour_cache=OPTIONAL_PATH,
          progress=flag())

# gin/reatt/base.gin
TABLE.add(
    ReAttTask,
    reader=Check(REFERENCE),
    bi_encoder_layers=SIZE,                             # BI_ENCODER_LAYERS
    kl_weight=number(0),                                # KL_WEIGHT
    head_temperature=number(above=0),                   # HEAD_TEMPERATURE
    in_batch_negatives=flag(),                          # IN_BATCH_NEGATIVES
    retrieval_warmup_steps=STEPS,                       # RETRIEVAL_WARMUP_STEPS
    relevance_chunk=STEPS,                              # RELEVANCE_CHUNK (0: all)
    query_maxlength=STEPS,                              # QUERY_MAXLENGTH (0: the row)
    retrieval_corpus=OPTIONAL_PATH,                     # RETRIEVAL_CORPUS
    iteration_steps=STEPS,                              # ITERATION_STEPS (0: no refresh)
    token_top_k=SIZE,                                   # TOKEN_TOP_K
    index_batch_size=SIZE,                              # INDEX_BATCH_SIZE
    warmup_fraction=number(0, 1, optional=True),        # WARMUP_FRACTION
    restart_schedule=flag())                            # RESTART_SCHEDULE

# gin/refusion/t5_base.gin
TABLE.add(
    ReFusionTask, _refusion_db,
    model_config=Check(REFERENCE),
    task=text(test=_task_problem),                      # TASK
    data_dir=PATH,                                      # DATA_DIR
    retrieval_db=OPTIONAL_PATH,                         # RETRIEVAL_DB
    top_k=SIZE,                                         # TOP_K
    fusion_modules=text(test=_fusion_problem),          # FUSION_MODULES
    search=flag(),                                      # SEARCH
    fusion_scheme=text(fusion.SCHEMES[1:]),             # FUSION_SCHEME
    retrain=flag(),                                     # RETRAIN
    concat_neighbours=flag(),                           # CONCAT_NEIGHBOURS
    neighbour_cache=OPTIONAL_PATH,                      # NEIGHBOUR_CACHE
    retrieval_mode=text(RETRIEVAL_MODES),               # RETRIEVAL_MODE
    mask_temperature=number(above=0),                   # MASK_TEMPERATURE
    max_length=SIZE,                                    # MAX_LENGTH
    arch_learning_rate=number(0),                       # ARCH_LEARNING_RATE
    eval_batch_size=SIZE,                               # EVAL_BATCH_SIZE
    fusion_init=text(fusion.INITS),                     # FUSION_INIT
    mask_sampler=text(fusion.SAMPLERS),                 # MASK_SAMPLER
    mask_eval_samples=SIZE,                             # MASK_EVAL_SAMPLES
    fused_norm=text(fusion.FUSED_NORMS),                # FUSED_NORM
    fusion_lr_scale=number(above=0),                    # FUSION_LR_SCALE
    arch_optimizer=text(refusion_search.ARCH_OPTIMIZERS),  # ARCH_OPTIMIZER
    arch_weight_decay=number(0),                        # ARCH_WEIGHT_DECAY
    arch_warmup_steps=STEPS,                            # ARCH_WARMUP_STEPS
    templates=text(lmbff.TEMPLATE_SETS))                # TEMPLATES

# What the shared gin commands read; a method's commands register their own
# (jaxfid.commands.registry.Command.gin), and COMMANDS collects them all.
TRAIN_READS = Reads(roots=(launch.run,),
                    macros={"MIXTURE_OR_TASK_NAME": None})  # train.run: seqio tasks


def eval_reads() -> Reads:
  """``jaxfid eval``: :func:`seqio_eval.evaluate` and every registered
  method's evaluator (:data:`seqio_eval.METHODS`)."""
  evaluators = dict.fromkeys(cls for _, cls in seqio_eval.METHODS.items())
  return Reads(roots=(seqio_eval.evaluate, *evaluators))


class _RegisteredReads(Mapping[str, Reads]):
  """``{"train": Reads, "reatt iterate": Reads, ...}``: the gin reads of the
  registered commands (:func:`jaxfid.commands.registry.gin_reads`), looked
  up when asked (the methods register theirs after this module loads)."""

  def __getitem__(self, command: str) -> Reads:
    return registry.gin_reads()[command]

  def __iter__(self):
    return iter(registry.gin_reads())

  def __len__(self) -> int:
    return len(registry.gin_reads())


COMMANDS: Mapping[str, Reads] = _RegisteredReads()


def check(parsed: ParsedGin, command: str, reads: Reads) -> None:
  """Validates the parsed run for ``jaxfid <command>``, which reads
  ``reads``; raises a one-line InputError for the first problem."""
  validate(parsed, reads, TABLE, f"`jaxfid {command}`")
