"""What every gin-driven command reads, and what each value may be.

:data:`TABLE` holds one row per parameter of each configurable the gin files
bind (``loop.train``, ``FidTask``, ``DualEncoderTask``, ``T5Config``,
``seqio_eval.evaluate``, the checkpoint evaluators), in the order of the gin
file that binds it; the macro a row checks is named in its comment. Choices
come from the code that consumes them (``optim.OPTIMIZERS``, ...). Config
dataclasses (ReAtt's and ReFusion's) need no row: their fields carry their
checks (:mod:`jaxfid.core.config`). :data:`COMMANDS` says
which configurables each command calls and which macros it reads itself.

:func:`check` validates a parsed run (see :mod:`jaxfid.core.gin_checks`):
unknown or unread bindings, wrong types, out-of-range values, bad choices and
missing REQUIRED values are one-line errors before anything is built or
written. ``tests/test_gin_validation.py`` checks that every parameter the
shipped gin files bind has a row here, and that each row agrees with the
parameter's annotation (type, and None only where the default is None).
"""
from __future__ import annotations

from jaxfid.commands import seqio_eval
from jaxfid.core import sharding
from jaxfid.core.gin_checks import (REFERENCE, Check, Reads, Table, flag,
                                    integer, number, text, validate)
from jaxfid.core.gin_files import ParsedGin
from jaxfid.dual_encoder import model as de_model
from jaxfid.dual_encoder.task import DualEncoderTask
from jaxfid.fid.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.fid.task import FidTask
from jaxfid.reatt import iterate as reatt_iterate
from jaxfid.reatt.task import ReAttTask
from jaxfid.refusion.checkpoint_eval import ReFusionCheckpointEvaluator
from jaxfid.refusion.task import ReFusionTask
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


def _fid_data(values) -> tuple[str, str] | None:
  if values["train_data"] and values["mixture_or_task_name"]:
    return ("train_data", "set TRAIN_DATA or MIXTURE_OR_TASK_NAME, not both")
  if not values["train_data"] and not values["mixture_or_task_name"]:
    return ("train_data", "required (or MIXTURE_OR_TASK_NAME)")
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

# gin/reatt/base.gin and gin/refusion/t5_base.gin: the tasks take config
# dataclasses (ReAttConfig, ReAttTraining; FusionConfig, ReFusionData,
# SearchConfig), whose checks come from their fields (jaxfid.core.config).
TABLE.add(ReAttTask, reader=Check(REFERENCE), reatt=Check(REFERENCE),
          training=Check(REFERENCE))
TABLE.add(ReFusionTask, model_config=Check(REFERENCE), data=Check(REFERENCE),
          fusion=Check(REFERENCE), search=Check(REFERENCE))

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

_TRAIN = Reads(roots=(launch.run,),
               macros={"MIXTURE_OR_TASK_NAME": None})  # train.run: seqio tasks
COMMANDS: dict[str, Reads] = {
    "train": _TRAIN,
    "demo": _TRAIN,
    "refusion seeds": _TRAIN,  # each seed is a `jaxfid train`
    "reatt iterate": Reads(roots=(launch.run,),
                           macros=dict.fromkeys(reatt_iterate.SETTINGS)),
    "eval": Reads(roots=(seqio_eval.evaluate,
                         *(seqio_eval.METHODS.get(name)
                           for name in seqio_eval.METHODS.names()))),
    "bench": Reads(
        roots=(t5_config.T5Config,),
        macros={"BATCH_SIZE": SIZE, "N_CONTEXT": SIZE,
                "TEXT_MAXLENGTH": SIZE, "ANSWER_MAXLENGTH": OPTIONAL_SIZE,
                "TARGET_MAXLENGTH": OPTIONAL_SIZE,
                "DECODE_MAXLENGTH": OPTIONAL_SIZE,
                "ACCUMULATION_STEPS": SIZE, "USE_HARDWARE_RNG": flag()},
        needs=("BATCH_SIZE", "N_CONTEXT", "TEXT_MAXLENGTH"),
        accepts=(launch.run,)),  # takes `jaxfid train`'s arguments
}


def check(parsed: ParsedGin, command: str) -> None:
  """Validates the parsed run for ``jaxfid <command>`` (a COMMANDS key);
  raises a one-line InputError for the first problem."""
  validate(parsed, COMMANDS[command], TABLE, f"`jaxfid {command}`")
