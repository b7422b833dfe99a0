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
shipped gin files bind has a row here, and that each row agrees with the
parameter's annotation (type, and None only where the default is None).
"""
from __future__ import annotations

from collections.abc import Mapping

from jaxfid.commands import registry, seqio_eval
from jaxfid.core import sharding
from jaxfid.core.errors import InputError
from jaxfid.core.gin_checks import (REFERENCE, Check, Reads, Table, flag,
                                    integer, number, text, validate)
from jaxfid.core.gin_files import ParsedGin
from jaxfid.dual_encoder import model as de_model
from jaxfid.dual_encoder.task import DualEncoderTask
from jaxfid.fid.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.fid.task import FidTask
from jaxfid.reatt.task import ReAttTask
from jaxfid.refusion import fusion, lmbff
from jaxfid.refusion import search as refusion_search
from jaxfid.refusion.checkpoint_eval import ReFusionCheckpointEvaluator
from jaxfid.refusion.task import RETRIEVAL_MODES, ReFusionTask
from jaxfid.t5 import config as t5_config
from jaxfid.training import launch, loop, optim

DTYPES = ("float32", "bfloat16")
REMATS = ("none", "full", "dots")


def mesh_problem(spec: str) -> str | None:
  """Why a MESH string cannot be parsed, without asking for devices.

  The grammar of :func:`jaxfid.core.sharding.parse_mesh`: '' or
  ``axis=size,...`` with axes from MESH_AXES, sizes >= 1 and at most one -1
  (the remaining devices). Whether the devices exist is known only later.
  """
  if not spec.strip():
    return None
  sizes = {}
  for part in spec.split(","):
    name, _, value = part.partition("=")
    name, value = name.strip(), value.strip()
    try:
      size = int(value)
    except ValueError:
      size = 0
    if name not in sharding.MESH_AXES or (size < 1 and size != -1):
      return (f"bad MESH {spec!r}: expected e.g. 'data=4,model=2' with axes "
              f"from {sharding.MESH_AXES} and sizes >= 1 (or one -1)")
    sizes[name] = size
  if list(sizes.values()).count(-1) > 1:
    return f"bad MESH {spec!r}: at most one axis may be -1"
  return None


def _mesh_data_parallel(spec: str) -> int | None:
  """data * fsdp of a valid MESH, when the string fixes them (else None)."""
  if not spec.strip():
    return None
  sizes = {n.strip(): int(v) for n, _, v in (p.partition("=")
                                              for p in spec.split(","))}
  data, fsdp = sizes.get("data", 1), sizes.get("fsdp", 1)
  return None if -1 in (data, fsdp) else data * fsdp


def _batch_splits(values) -> tuple[str, str] | None:
  """BATCH_SIZE splits into ACCUMULATION_STEPS microbatches over MESH."""
  batch, steps = values["batch_size"], values["accumulation_steps"]
  if batch % steps:
    return ("accumulation_steps", f"{steps} does not divide BATCH_SIZE "
            f"{batch} (each step splits its batch into ACCUMULATION_STEPS "
            "microbatches)")
  parallel = _mesh_data_parallel(values["mesh"])
  if parallel and batch % (parallel * steps):
    return ("batch_size", f"{batch} is not divisible by the data-parallel "
            f"size {parallel} of MESH {values['mesh']!r} times "
            f"ACCUMULATION_STEPS {steps}")
  return None


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


def _fid_data(values) -> tuple[str, str] | None:
  if values["train_data"] and values["mixture_or_task_name"]:
    return ("train_data", "set TRAIN_DATA or MIXTURE_OR_TASK_NAME, not both")
  if not values["train_data"] and not values["mixture_or_task_name"]:
    return ("train_data", "required (or MIXTURE_OR_TASK_NAME)")
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
TABLE.add(
    loop.train, _batch_splits,
    task=Check(REFERENCE),                              # METHOD
    model_dir=PATH,                                     # MODEL_DIR
    init_checkpoint=OPTIONAL_PATH,                      # INIT_CHECKPOINT
    train_steps=SIZE,                                   # TRAIN_STEPS
    batch_size=SIZE,                                    # BATCH_SIZE
    learning_rate=number(0),                            # LEARNING_RATE (0: frozen)
    optimizer=text(optim.OPTIMIZERS),                   # OPTIMIZER
    schedule=text(optim.SCHEDULES),                     # SCHEDULE
    warmup_steps=STEPS,                                 # WARMUP_STEPS
    weight_decay=number(0),                             # WEIGHT_DECAY
    clip_norm=number(0, optional=True),                 # CLIP_NORM (0/None: off)
    accumulation_steps=SIZE,                            # ACCUMULATION_STEPS
    eval_every=SIZE,                                    # EVAL_EVERY
    checkpoint_every=SIZE,                              # CHECKPOINT_EVERY
    keep_checkpoints=SIZE,                              # KEEP_CHECKPOINTS
    log_every=SIZE,                                     # LOG_EVERY
    seed=integer(),                                     # SEED
    mesh=text(test=mesh_problem),                       # MESH
    on_nan=text(loop.ON_NAN_CHOICES),                   # ON_NAN
    progress=flag())
TABLE.add(
    t5_config.T5Config,
    dropout_rate=number(0, below=1),                    # DROPOUT_RATE
    dtype=text(DTYPES),                                 # DTYPE
    remat=text(REMATS),                                 # REMAT
    scan_layers=flag(),                                 # SCAN_LAYERS
    # gin/models/*.gin
    vocab_size=SIZE, d_model=SIZE, d_kv=SIZE, d_ff=SIZE, num_heads=SIZE,
    num_layers=SIZE, num_decoder_layers=STEPS,
    feed_forward_proj=text(t5_config.FEED_FORWARD_PROJS),
    tie_word_embeddings=flag(), relative_attention_num_buckets=SIZE,
    relative_attention_max_distance=SIZE,
    layer_norm_epsilon=number(above=0),
    # gin/fid/fido_*.gin
    cross_attention_period=SIZE,                        # CROSS_ATTENTION_PERIOD
    multi_query_cross_attention=flag())                 # MULTI_QUERY_CROSS_ATTENTION

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
    alpha=number(0), dtype=text(DTYPES, optional=True))
TABLE.add(ReFusionCheckpointEvaluator, neighbour_cache=OPTIONAL_PATH,
          progress=flag())

# gin/fid/base.gin, two_phase.gin
TABLE.add(
    FidTask, _fid_data,
    model_config=Check(REFERENCE),
    train_data=OPTIONAL_PATH,                           # TRAIN_DATA
    eval_data=OPTIONAL_PATH,                            # EVAL_DATA
    mixture_or_task_name=text(optional=True),           # MIXTURE_OR_TASK_NAME
    dataset=text(),                                     # DATASET
    n_context=SIZE,                                     # N_CONTEXT
    text_maxlength=SIZE,                                # TEXT_MAXLENGTH
    answer_maxlength=OPTIONAL_SIZE,                     # ANSWER_MAXLENGTH
    target_maxlength=OPTIONAL_SIZE,                     # TARGET_MAXLENGTH (None: whole)
    decode_maxlength=OPTIONAL_SIZE,                     # DECODE_MAXLENGTH (None: 50)
    passage_eos=flag(),                                 # PASSAGE_EOS
    eval_max_examples=OPTIONAL_SIZE,                    # EVAL_MAX_EXAMPLES
    eval_batch_size=SIZE,                               # EVAL_BATCH_SIZE
    eval_beams=SIZE,                                    # EVAL_BEAMS
    first_phase_n_context=OPTIONAL_SIZE,                # FIRST_PHASE_N_CONTEXT
    final_phase_steps=STEPS)                            # FINAL_PHASE_STEPS

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

# gin/retrieval/dual_encoder_base.gin
TABLE.add(
    DualEncoderTask,
    model_config=Check(REFERENCE),
    train_data=PATH,                                    # TRAIN_DATA
    eval_data=OPTIONAL_PATH,                            # EVAL_DATA
    hard_negatives=STEPS,                               # HARD_NEGATIVES
    query_maxlength=SIZE,                               # QUERY_MAXLENGTH
    passage_maxlength=SIZE,                             # PASSAGE_MAXLENGTH
    passage_format=text(de_model.PASSAGE_FORMATS),      # PASSAGE_FORMAT
    pooling=text(de_model.POOLINGS),                    # POOLING
    normalize=flag(),                                   # NORMALIZE
    projection_dim=OPTIONAL_SIZE,                       # PROJECTION_DIM
    shared=flag(),                                      # SHARED
    temperature=number(above=0),                        # TEMPERATURE
    eval_max_examples=OPTIONAL_SIZE,                    # EVAL_MAX_EXAMPLES
    eval_batch_size=SIZE)                               # EVAL_BATCH_SIZE

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
