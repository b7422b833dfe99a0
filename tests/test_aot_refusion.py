"""ReFusion's ahead-of-time hooks (``jaxfid bench compile``).

``abstract_batch`` of every phase (the search's train + dev batches, the
retrain's train batch) and ``decode_program``'s batch are checked against a
real ``prepare`` on the bundled 16-shot samples with a tiny dense database:
a single-sentence task, a sentence-pair task (two neighbour segments),
'hidden' retrieval (on-line, from the backbone's states) and the baseline
that appends the neighbours' text (no vectors). The search and
retrain steps and the rank classification lower (fast tier) and compile
(slow tier) with the loop's shardings after ``prepare_shapes`` alone, with
a data directory and a database that do not exist.
"""
from __future__ import annotations

import pathlib

import jax
import pytest

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.core.errors import InputError
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.index import build_dense_index
from jaxfid.refusion import batches as batch_lib
from jaxfid.training.task import Context
from method_aot import (MISSING, assert_same_shapes, configured, lower_decode,
                        lower_phases, loop_placement)

ROOT = pathlib.Path(__file__).resolve().parents[1]
LMBFF = ROOT / "tests" / "data" / "lmbff"
GIN = "gin/refusion/tiny.gin"
WIDTH = 16   # the database's vectors, and the model's d_model ('hidden')
SMALL = ["config.T5Config.d_model = 16", "config.T5Config.d_kv = 4",
         "config.T5Config.d_ff = 32", "config.T5Config.num_heads = 2",
         "config.T5Config.num_layers = 1",
         "config.T5Config.num_decoder_layers = 1", "TOP_K = 3",
         "MAX_LENGTH = 24", "BATCH_SIZE = 4", "TRAIN_STEPS = 4",
         "MESH = 'data=2,model=2'", "loop.train.progress = False"]
SENTENCES = ["a gorgeous , witty film", "the plot is a mess",
             "one of the best films of the year", "tedious and overlong",
             "stocks rose on tuesday", "the museum opens at nine"]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
  d = tmp_path_factory.mktemp("aot_refusion_db")
  (d / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=WIDTH,
                                 d_kv=4, d_ff=16, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  build_dense_index(None, d / "sentences.txt", d / "db",
                    encoder=load_dual_encoder(ckpt), progress=False)
  return d / "db"


def _real(tmp_path, db, task_name, data_dir, extra=()):
  task, settings, optimizer = configured(GIN, SMALL + list(extra) + [
      f"MODEL_DIR = '{tmp_path / 'm'}'", f"TASK = '{task_name}'",
      f"DATA_DIR = '{LMBFF / data_dir / '16-13'}'", f"RETRIEVAL_DB = '{db}'",
      f"NEIGHBOUR_CACHE = '{tmp_path / 'cache'}'"])
  return task, settings.replace(progress=False), optimizer


@pytest.mark.parametrize("task_name,data_dir,extra", [
    ("sst-2", "SST-2", ["RETRAIN = True"]),
    ("rte", "RTE", ["SEARCH = False"]),
    ("sst-2", "SST-2", ["RETRIEVAL_MODE = 'hidden'"]),
    ("sst-2", "SST-2", ["FUSION_MODULES = 'none'",
                        "CONCAT_NEIGHBOURS = True"])],
    ids=["search_retrain", "pair", "hidden", "concat_baseline"])
def test_abstract_batches_are_the_real_batches(db, tmp_path, task_name,
                                               data_dir, extra):
  task, settings, optimizer = _real(tmp_path, db, task_name, data_dir, extra)
  p = task.prepare(settings)
  _, place = loop_placement(p)
  params = p.model.init_params(0)
  (tmp_path / "m").mkdir()
  ctx = Context(settings, place, None, None, None)
  task.start(p, ctx, 0, None)
  phases = task.phases(p, optimizer)
  begin = 0
  for i, phase in enumerate(phases):   # each phase's first batch
    host = task.batch(p, begin, slice(0, settings.batch_size), params)
    assert_same_shapes(task.abstract_batch(p, i), host)
    task.phase_end(p, ctx, phase, {"params": params})  # a searched structure
    begin = phase.end
  with pytest.raises(ValueError):
    task.abstract_batch(p, len(phases))
  host, _ = next(batch_lib.eval_batches(p.arrays["dev"], 8))
  host = p.neighbours(params, host, place.replicate)
  _, abstract = task.decode_program(p, 8)
  assert_same_shapes(abstract, jax.device_get(host))


def test_db_dim_is_checked_against_the_database(db, tmp_path):
  task, settings, _ = _real(tmp_path, db, "sst-2", "SST-2", ["DB_DIM = 32"])
  with pytest.raises(InputError, match="holds 16-d vectors, but DB_DIM is 32"):
    task.prepare(settings)


def _configured(extra):
  return configured(GIN, SMALL + list(extra) + [
      f"MODEL_DIR = '{MISSING}/m'", "TASK = 'rte'",
      f"DATA_DIR = '{MISSING}/RTE'", f"RETRIEVAL_DB = '{MISSING}/db'"])


def test_lowers_from_the_configuration_alone():
  task, settings, optimizer = _configured([f"DB_DIM = {WIDTH}",
                                           "RETRAIN = True"])
  p = task.prepare_shapes(settings)
  search, retrain = lower_phases(task, p, optimizer)
  assert "arch_loss" in search.out_info[1]
  assert "arch_loss" not in retrain.out_info[1]
  assert lower_decode(task, p, 8).out_info.shape == (8,)


def test_an_unknown_database_width_names_the_macro():
  task, settings, _ = _configured([])
  with pytest.raises(InputError, match="DB_DIM"):
    task.prepare_shapes(settings)
  task, settings, _ = _configured(["RETRIEVAL_MODE = 'hidden'"])
  p = task.prepare_shapes(settings)   # 'hidden': the model's width
  assert task.abstract_batch(p, 0)["dev"]["neighbours"].shape == (
      4, 1, 3, WIDTH)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    [f"DB_DIM = {WIDTH}", "RETRAIN = True", "ACCUMULATION_STEPS = 2"],
    ["FUSION_MODULES = 'none'", "CONCAT_NEIGHBOURS = True"]],
    ids=["search_retrain", "plain_backbone"])
def test_compiles_from_the_configuration_alone(extra):
  task, settings, optimizer = _configured(extra)
  p = task.prepare_shapes(settings)
  for lowered in lower_phases(task, p, optimizer):
    assert lowered.compile().memory_analysis() is not None
  classify = lower_decode(task, p, 8).compile()
  assert classify.out_info.shape == (8,)
