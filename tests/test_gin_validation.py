"""gin is validated before any work (issue #14): one line, exit 2, nothing made.

Every case runs the real command line in-process (``jaxfid.cli.main``) and
checks that stderr is exactly one line naming the macro or binding, the exit
status is 2 and MODEL_DIR (or the command's output) was not created. The
shipped gin files, with the bindings their comments document, must pass
(no false alarms), and the table of checks must cover every parameter they
bind and agree with the parameters' annotations. Nothing here trains.
"""
from __future__ import annotations

import dataclasses
import glob
import inspect
import os

import gin
import jax
import pytest

from jaxfid.cli import main
from jaxfid.commands import gin_flags, gin_specs
from jaxfid.core import sharding
from jaxfid.core.config import Config, field_check, field_checks
from jaxfid.core.gin_checks import REFERENCE, Walk
from jaxfid.training.settings import Settings

ROOT = gin_flags.SOURCE_ROOT
FID = ("gin/fid/tiny.gin", ["--gin.TRAIN_DATA='train.json'"])
REATT = ("gin/reatt/tiny.gin", ["--gin.TRAIN_DATA='train.json'"])
REFUSION = ("gin/refusion/tiny.gin", [
    "--gin.TASK='sst-2'", "--gin.DATA_DIR='k-shot/SST-2/16-13'",
    "--gin.RETRIEVAL_DB='db'"])
DUAL = ("gin/retrieval/dual_encoder_tiny.gin",
        ["--gin.TRAIN_DATA='train.json'"])
EVAL = ["--gin.CHECKPOINT_PATH='ckpt'", "--gin.MIXTURE_OR_TASK_NAME='task'"]


def _fails(capsys, argv, *needles) -> str:
  """Runs ``jaxfid argv``: exit 2 and one stderr line holding ``needles``."""
  assert main(argv) == 2
  captured = capsys.readouterr()
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1, captured.err
  for needle in needles:
    assert needle in lines[0], lines[0]
  assert not captured.out
  return lines[0]


def _train(tmp_path, method, *extra, model_dir=True):
  gin_file, required = method
  out = [f"--gin.MODEL_DIR='{tmp_path / 'run'}'"] if model_dir else []
  return ["train", f"--gin_file={gin_file}", *out, *required, *extra]


@pytest.mark.parametrize("extra, needles", [
    # the cases
    (["--gin.TRAIN_STEPZ=5"],
     ["--gin.TRAIN_STEPZ=5: unknown macro TRAIN_STEPZ (did you mean "
      "TRAIN_STEPS?)"]),
    (["--gin.BATCH_SIZE='eight'"],
     ["BATCH_SIZE: must be an int >= 1, got 'eight' (str)"]),
    (["--gin.LEARNING_RATE='fast'"],
     ["LEARNING_RATE: must be a number >= 0, got 'fast' (str)"]),
    (["--gin.BATCH_SIZE=0"], ["BATCH_SIZE: must be an int >= 1, got 0"]),
    (["--gin.TRAIN_STEPS=-5"], ["TRAIN_STEPS: must be an int >= 1, got -5"]),
    # a run that would do nothing
    (["--gin.TRAIN_STEPS=0"], ["TRAIN_STEPS: must be an int >= 1, got 0"]),
    # ints are ints: not floats, strings or booleans; numbers are finite
    (["--gin.BATCH_SIZE=8.0"], ["BATCH_SIZE", "got 8.0 (float)"]),
    (["--gin.TRAIN_STEPS='5'"], ["TRAIN_STEPS", "got '5' (str)"]),
    (["--gin.LOG_EVERY=True"], ["LOG_EVERY", "got True (bool)"]),
    (["--gin.LEARNING_RATE=1e999"], ["LEARNING_RATE", "got inf"]),
    (["--gin.USE_HARDWARE_RNG=1"], ["USE_HARDWARE_RNG: must be True or "
                                    "False, got 1 (int)"]),
    (["--gin.MODEL_DIR=5"], ["MODEL_DIR: must be a string, got 5 (int)"]),
    (["--gin.INIT_CHECKPOINT=3"], ["INIT_CHECKPOINT: must be None or a "
                                   "string"]),
    (["--gin.BATCH_SIZE=None"], ["BATCH_SIZE: required (an int >= 1), got "
                                 "None"]),
    # ranges
    (["--gin.EVAL_EVERY=0"], ["EVAL_EVERY: must be an int >= 1, got 0"]),
    (["--gin.CHECKPOINT_EVERY=0"], ["CHECKPOINT_EVERY: must be an int >= 1"]),
    (["--gin.LOG_EVERY=-1"], ["LOG_EVERY: must be an int >= 1"]),
    (["--gin.KEEP_CHECKPOINTS=0"], ["KEEP_CHECKPOINTS: must be an int >= 1"]),
    (["--gin.WARMUP_STEPS=-1"], ["WARMUP_STEPS: must be an int >= 0"]),
    (["--gin.LEARNING_RATE=-1e-4"], ["LEARNING_RATE: must be a number >= 0"]),
    (["--gin.DROPOUT_RATE=1.0"], ["DROPOUT_RATE: must be a number in [0, 1)"]),
    (["--gin.ACCUMULATION_STEPS=0"], ["ACCUMULATION_STEPS: must be an int "
                                      ">= 1"]),
    (["--gin.ACCUMULATION_STEPS=3"], ["ACCUMULATION_STEPS: 3 does not divide "
                                      "BATCH_SIZE 8"]),
    (["--gin.MESH='dta=2'"], ["MESH: bad MESH 'dta=2'"]),
    (["--gin.MESH='data=-1,model=-1'"], ["MESH", "at most one axis"]),
    (["--gin.MESH='data=3'"], ["BATCH_SIZE: 8 is not divisible by the "
                               "data-parallel size 3"]),
    (["--gin.N_CONTEXT='4'"], ["N_CONTEXT: must be an int >= 1, got '4'"]),
    (["--gin.METHOD='fid'"], ["METHOD: must be a gin reference"]),
    # bindings of configurable parameters
    (["--gin.loop.train.progresz=False"],
     ["--gin.loop.train.progresz=False:", "doesn't have a parameter named "
      "'progresz' (did you mean progress?)"]),
    (["--gin.config.T5Config.d_model='big'"],
     ["T5Config.d_model: must be an int >= 1, got 'big'"]),
    (["--gin.config.T5Config.feed_forward_proj='swish'"],
     ["T5Config.feed_forward_proj: must be one of 'relu', 'gelu'"]),
    (["--gin.settings.Settings.train_steps=0"],
     ["Settings.train_steps: must be an int >= 1"]),
    # bindings nothing reads, and malformed ones
    (["--gin.CHECKPOINT_PATH='x'"],
     ["--gin.CHECKPOINT_PATH='x': nothing `jaxfid train` runs reads "
      "CHECKPOINT_PATH"]),
    (["--gin.fid_eval.FidCheckpointEvaluator.dtype='float32'"],
     ["`jaxfid train` never calls fid_eval.FidCheckpointEvaluator"]),
    (["--gin.BATCH_SIZE=eight"], ["--gin.BATCH_SIZE=eight:"]),
    # a string without gin's quotes (the shell took its own): say to quote
    (["--gin.EVAL_DATA=runs/x"],
     ["--gin.EVAL_DATA=runs/x: runs/x is not a gin value; a string needs "
      "gin's quotes inside the shell's: --gin.EVAL_DATA=\"'runs/x'\""]),
    (["--gin.EVAL_DATA=it's"], ["it's is not a gin value; a string needs "
                                "gin's quotes inside the shell's"]),
])
def test_fid_train_refuses_bad_gin(tmp_path, capsys, extra, needles):
  _fails(capsys, _train(tmp_path, FID, *extra), *needles)
  assert not os.listdir(tmp_path)


def test_missing_required_values(tmp_path, capsys):
  _fails(capsys, _train(tmp_path, FID, model_dir=False),
         "MODEL_DIR: required: set it, e.g. --gin.MODEL_DIR=VALUE")
  _fails(capsys, ["train", "--gin_file=gin/fid/tiny.gin",
                  f"--gin.MODEL_DIR='{tmp_path / 'run'}'"],
         "TRAIN_DATA: required (or MIXTURE_OR_TASK_NAME)")
  _fails(capsys, _train(tmp_path, FID, "--gin.MIXTURE_OR_TASK_NAME='t'"),
         "TRAIN_DATA: set TRAIN_DATA or MIXTURE_OR_TASK_NAME, not both")
  _fails(capsys, _train(tmp_path, ("gin/retrieval/dual_encoder_tiny.gin", [])),
         "TRAIN_DATA: required: set it")
  _fails(capsys, _train(tmp_path, ("gin/refusion/tiny.gin",
                                   ["--gin.TASK='sst-2'"])),
         "DATA_DIR: required: set it")
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("method, extra, needle", [
    (FID, "OPTIMIZER='sgd'", "OPTIMIZER: must be one of 'adam', 'adamw', "
     "got 'sgd'"),
    (FID, "SCHEDULE='cos'", "SCHEDULE: must be one of 'constant', "
     "'linear', 'cosine'"),
    (FID, "DTYPE='float16'", "DTYPE: must be one of 'float32', 'bfloat16'"),
    (FID, "REMAT='some'", "REMAT: must be one of 'none', 'full', 'dots'"),
    (FID, "ON_NAN='ignore'", "ON_NAN: must be one of 'stop', 'skip'"),
    (REFUSION, "FUSION_SCHEME='original'", "FUSION_SCHEME: must be one of "
     "'reranker', 'ordered_mask'"),
    (REFUSION, "RETRIEVAL_MODE='online'", "RETRIEVAL_MODE: must be one of "
     "'input', 'hidden'"),
    (REFUSION, "FUSION_MODULES='keys'", "FUSION_MODULES: 'keys' is not a "
     "fusion module"),
    (REFUSION, "TASK='sst-9'", "TASK: unknown task 'sst-9'"),
    (DUAL, "PASSAGE_FORMAT='plain'", "PASSAGE_FORMAT: must be one of "
     "'title_text', 'fid'"),
    (DUAL, "POOLING='max'", "POOLING: must be one of 'mean', 'first'"),
])
def test_bad_choices(tmp_path, capsys, method, extra, needle):
  _fails(capsys, _train(tmp_path, method, f"--gin.{extra}"), needle)
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("method, extra, needle", [
    (FID, "TEXT_MAXLENGTH=64.0", "TEXT_MAXLENGTH: must be an int >= 1"),
    (FID, "EVAL_BEAMS=0", "EVAL_BEAMS: must be an int >= 1"),
    (FID, "EVAL_MAX_EXAMPLES=0", "EVAL_MAX_EXAMPLES: must be None or an "
     "int >= 1"),
    (REATT, "BI_ENCODER_LAYERS=1.0", "BI_ENCODER_LAYERS: must be an int >= 1, "
     "got 1.0 (float)"),
    (REATT, "KL_WEIGHT='8'", "KL_WEIGHT: must be a number >= 0, got '8'"),
    (REATT, "HEAD_TEMPERATURE=0", "HEAD_TEMPERATURE: must be a number > 0"),
    (REATT, "IN_BATCH_NEGATIVES='yes'", "IN_BATCH_NEGATIVES: must be True or "
     "False"),
    (REATT, "QUERY_MAXLENGTH=-1", "QUERY_MAXLENGTH: must be an int >= 0"),
    (REATT, "WARMUP_FRACTION=1.5", "WARMUP_FRACTION: must be None or a "
     "number in [0, 1]"),
    (REFUSION, "TOP_K='16'", "TOP_K: must be an int >= 1, got '16' (str)"),
    (REFUSION, "MAX_LENGTH=0", "MAX_LENGTH: must be an int >= 1"),
    (REFUSION, "SEARCH=1", "SEARCH: must be True or False, got 1 (int)"),
    (DUAL, "QUERY_MAXLENGTH=1", "QUERY_MAXLENGTH: must be an int >= 2"),
    (REFUSION, "MASK_EVAL_SAMPLES=0", "MASK_EVAL_SAMPLES: must be an int >= 1"),
    (REFUSION, "FUSED_NORM='l2'", "FUSED_NORM: must be one of 'auto', 'rms', "
     "'none', got 'l2'"),
    (REFUSION, "FUSION_LR_SCALE=0.0", "FUSION_LR_SCALE: must be a number > 0"),
    (REFUSION, "RETRIEVAL_DB=None", "RETRIEVAL_DB: required with fusion "
     "modules or CONCAT_NEIGHBOURS"),
    (REATT, "TOKEN_TOP_K=0", "TOKEN_TOP_K: must be an int >= 1, got 0"),
    (DUAL, "HARD_NEGATIVES=-1", "HARD_NEGATIVES: must be an int >= 0"),
    (DUAL, "TEMPERATURE=0.0", "TEMPERATURE: must be a number > 0"),
    (DUAL, "PROJECTION_DIM=0", "PROJECTION_DIM: must be None or an int >= 1"),
    (("gin/fid/fido_tiny.gin", FID[1]), "CROSS_ATTENTION_PERIOD=0",
     "CROSS_ATTENTION_PERIOD: must be an int >= 1"),
    (("gin/fid/two_phase.gin", FID[1]), "FIRST_PHASE_N_CONTEXT='10'",
     "FIRST_PHASE_N_CONTEXT: must be None or an int >= 1"),
])
def test_wrong_method_macros(tmp_path, capsys, method, extra, needle):
  _fails(capsys, _train(tmp_path, method, f"--gin.{extra}"), needle)
  assert not os.listdir(tmp_path)


def test_a_macro_of_another_method_is_unknown(tmp_path, capsys):
  _fails(capsys, _train(tmp_path, DUAL, "--gin.N_CONTEXT=4"),
         "unknown macro N_CONTEXT")


def test_eval_refuses_bad_gin(tmp_path, capsys):
  out = f"--gin.EVAL_OUTPUT_DIR='{tmp_path / 'ev'}'"
  base = ["eval", "--gin_file=gin/fid/tiny.gin", out]
  _fails(capsys, base + EVAL[1:],
         "CHECKPOINT_PATH: required: set it, e.g. --gin.CHECKPOINT_PATH=VALUE")
  _fails(capsys, base + EVAL[:1], "MIXTURE_OR_TASK_NAME: required")
  _fails(capsys, base + EVAL + ["--gin.EVAL_BATCH_SIZE=0"],
         "EVAL_BATCH_SIZE: must be an int >= 1, got 0")
  _fails(capsys, base + EVAL + ["--gin.N_CONTEXT=0"],
         "N_CONTEXT: must be an int >= 1, got 0")
  _fails(capsys, base + EVAL + ["--gin.TRAIN_STEPS=5"],
         "nothing `jaxfid eval` runs reads TRAIN_STEPS")
  _fails(capsys, base + EVAL + ["--gin.config.T5Config.d_model=8"],
         "`jaxfid eval` never calls config.T5Config")
  _fails(capsys, ["eval", "--gin_file=gin/fid/tiny.gin"] + EVAL,
         "EVAL_OUTPUT_DIR: required")
  assert not os.listdir(tmp_path)


def test_bench_refuses_bad_gin(capsys):
  tiny = ["--gin_file=gin/fid/tiny.gin"]
  _fails(capsys, ["bench", "train", *tiny, "--gin.N_CONTEXT=2.0"],
         "N_CONTEXT: must be an int >= 1, got 2.0 (float)")
  _fails(capsys, ["bench", "train", *tiny, "--gin.REMAT='all'"],
         "REMAT: must be one of")
  _fails(capsys, ["bench", "train", *tiny, "--gin.CHECKPOINT_PATH='x'"],
         "nothing `jaxfid bench` runs reads CHECKPOINT_PATH")
  _fails(capsys, ["bench", "train", "--gin_file=gin/refusion/tiny.gin"],
         "N_CONTEXT: `jaxfid bench` reads it but the gin files do not "
         "define it")


def test_reatt_iterate_refuses_bad_gin(tmp_path, capsys):
  argv = ["reatt", "iterate", "--gin_file=gin/reatt/tiny.gin",
          f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
          "--gin.TRAIN_DATA='train.json'", "--corpus", "c.jsonl",
          "--queries", "q.jsonl", "--iterations", "1",
          "--steps-per-iteration", "2"]
  _fails(capsys, argv + ["--gin.TOKEN_TOP_K=0"],
         "TOKEN_TOP_K: must be an int >= 1, got 0")
  _fails(capsys, argv + ["--gin.RETRIEVAL_CORPS='c'"],
         "unknown macro RETRIEVAL_CORPS (did you mean RETRIEVAL_CORPUS?)")
  assert not os.listdir(tmp_path)


def test_refusion_seeds_refuses_bad_gin_before_any_seed(tmp_path, capsys):
  runs = tmp_path / "runs"
  argv = ["refusion", "seeds", "--data-root", str(tmp_path / "k-shot"),
          "--task", "sst-2", "--model-dir-root", str(runs), "--seeds", "13",
          "--gin_file=gin/refusion/tiny.gin", "--gin.RETRIEVAL_DB='db'"]
  _fails(capsys, argv + ["--gin.TOP_K='many'"],
         "TOP_K: must be an int >= 1, got 'many'")
  _fails(capsys, argv + ["--gin.TOPK=3"], "unknown macro TOPK")
  _fails(capsys, argv + ["--gin.RETRIEVAL_DB=None"],
         "RETRIEVAL_DB: required with fusion modules")
  assert not runs.exists()


def test_demo_refuses_bad_flags_before_writing(tmp_path, capsys):
  out = tmp_path / "demo"
  _fails(capsys, ["demo", "--output", str(out), "--steps", "0"],
         "--steps: must be an int >= 1, got 0")
  _fails(capsys, ["demo", "--output", str(out), "--batch-size", "-1"],
         "--batch-size: must be an int >= 1")
  assert not out.exists()


# ---- no false alarms: the shipped gin files with their documented bindings

def _files(*patterns):
  return sorted(os.path.relpath(p, ROOT) for pattern in patterns
                for p in glob.glob(os.path.join(ROOT, "gin", pattern)))


RUN_FILES = _files("fid/*.gin", "reatt/*.gin", "refusion/*.gin",
                   "retrieval/*.gin", "atlas/*.gin")
MODEL_FILES = _files("models/*.gin")
REQUIRED = {"fid": ["TRAIN_DATA='train.json'"],
            "reatt": ["TRAIN_DATA='train.json'"],
            "refusion": ["TASK='sst-2'", "DATA_DIR='k-shot/SST-2/16-13'",
                         "RETRIEVAL_DB='db'"],
            "retrieval": ["TRAIN_DATA='train.json'"],
            "atlas": ["TRAIN_DATA='train.json'", "CORPUS='corpus.tsv'"]}


def _passes(files, bindings, command):
  gin_flags.parse_checked(files, bindings, [], command,
                          gin_specs.COMMANDS[command])
  gin.clear_config()


def test_found_the_shipped_gin_files():
  assert len(RUN_FILES) >= 12 and len(MODEL_FILES) >= 10


@pytest.mark.parametrize("gin_file", RUN_FILES)
def test_shipped_gin_files_pass(gin_file):
  required = REQUIRED[gin_file.split("/")[1]]
  _passes([gin_file], ["MODEL_DIR='runs/x'", *required], "train")
  _passes([gin_file], [b.replace("--gin.", "") for b in EVAL]
          + ["EVAL_OUTPUT_DIR='ev'"], "eval")
  if "/refusion/" in gin_file:
    _passes([gin_file], ["MODEL_DIR='runs/x'", *required], "refusion seeds")
  if "/fid/" in gin_file:
    _passes([gin_file], ["MIXTURE_OR_TASK_NAME='trivia_qa_fid'",
                         "MODEL_DIR='runs/x'"], "train")
    _passes([gin_file], [], "bench")
    _passes([gin_file], ["MODEL_DIR='runs/x'", *required,
                         "loop.train.progress=False"], "bench")
  if "/reatt/" in gin_file:
    _passes([gin_file], ["MODEL_DIR='runs/x'", *required], "reatt iterate")


@pytest.mark.parametrize("model_file", MODEL_FILES)
def test_model_files_pass_after_a_run_file(model_file):
  _passes(["gin/fid/base.gin", model_file],
          ["MODEL_DIR='runs/x'", "TRAIN_DATA='t.json'"], "train")


def test_readme_and_test_bindings_pass():
  _passes(["gin/reatt/large.gin"], [
      "MODEL_DIR='runs/reatt'", "TRAIN_DATA='nq/train_bm25.json'",
      "EVAL_DATA='nq/dev.json'", "INIT_CHECKPOINT='t5-large-lm-adapt'",
      "RETRIEVAL_CORPUS='psgs_w100.tsv'"], "train")
  _passes(["gin/refusion/t5_base.gin"], [
      "MODEL_DIR='x'", "TASK='sst-2'", "DATA_DIR='d'", "RETRIEVAL_DB='db'",
      "FUSION_MODULES='none'", "CONCAT_NEIGHBOURS=True", "MAX_LENGTH=512"],
          "train")
  _passes(["gin/fid/tiny.gin"], [
      "MODEL_DIR='x'", "TRAIN_DATA='t'", "LEARNING_RATE=0.0",
      "MESH='data=-1,model=4'", "BATCH_SIZE=8", "ON_NAN='skip'",
      "USE_HARDWARE_RNG=True", "loop.train.progress=False",
      "config.T5Config.d_model=32", "CLIP_NORM=None"], "train")


# ---- the checks agree with what they describe

def _shipped_parameters():
  """(configurable, param) of every value the shipped files bind, as the
  commands reach them."""
  found = set()
  for gin_file in RUN_FILES + MODEL_FILES:
    files = (["gin/fid/fido_base.gin", gin_file] if "models/" in gin_file
             else [gin_file])
    gin_flags.parse_gin(files, [])
    try:
      for reads in gin_specs.COMMANDS.values():
        found |= {(obj, param) for obj, param, _ in Walk(reads.roots).values}
    finally:
      gin.clear_config()
  return found


def test_every_shipped_parameter_has_a_check():
  missing = sorted(f"{getattr(obj, '__qualname__', obj)}.{param}"
                   for obj, param in _shipped_parameters()
                   if gin_specs.TABLE.check(obj, param) is None)
  assert not missing


KINDS = {int: "int", float: "float", str: "str", bool: "bool"}


def test_checks_agree_with_annotations():
  for obj, checks in gin_specs.TABLE.checks.items():
    params = inspect.signature(obj).parameters
    for name, check in checks.items():
      assert name in params, (obj, name)
      annotation = str(params[name].annotation)
      default = params[name].default
      if check.optional:  # None only where the parameter takes None
        assert default is None or "None" in annotation.split(" | "), (
            obj, name)
      if check.kind is not REFERENCE:
        assert KINDS[check.kind] in annotation.split(" | "), (obj, name)
      if default not in (None, inspect.Parameter.empty) and (
          check.kind is not REFERENCE):
        assert check.problem(default) is None, (obj, name, default)


def test_config_defaults_pass_their_checks():
  """Every config dataclass the shipped files bind: each field's default
  passes the field's own check, and every field of a gin-bound type has a
  check."""
  configs = {obj for obj, _ in _shipped_parameters()
             if isinstance(obj, type) and issubclass(obj, Config)}
  assert {c.__name__ for c in configs} >= {
      "Settings", "OptimizerSettings", "T5Config", "FidReaderConfig",
      "DualEncoderConfig", "DualEncoderTrainConfig"}
  for cls in configs:
    checks = field_checks(cls)
    for f in dataclasses.fields(cls):
      annotation = str(f.type)
      if any(k in annotation.split(" | ") for k in KINDS.values()):
        assert f.name in checks, (cls, f.name)
      if f.default is not dataclasses.MISSING and f.name in checks:
        assert checks[f.name].problem(f.default) is None, (cls, f.name)


@pytest.mark.parametrize("spec", [
    "", "data=1", "data=2,model=2", "fsdp=8", "data=-1,model=4", " data = 2 ",
    "data=2,data=4", "dta=2", "data=0", "data=-2", "data=x", "data",
    "data=-1,model=-1", "data=2,,model=2", "=2"])
def test_mesh_grammar_is_parse_meshs(spec):
  devices = jax.devices()[:8]
  assert len(devices) == 8
  try:
    sharding.parse_mesh(spec, devices)
    parsed = True
  except ValueError:
    parsed = False
  assert (field_check(Settings, "mesh").problem(spec) is None) == parsed, spec
