"""Atlas's ahead-of-time hooks (``jaxfid bench compile``): ``abstract_batch``
is what a real ``prepare`` + ``start`` + ``batch`` gives (the reader's rows
plus the retriever's query and passage tokens), and the train step and the
reader's decoding lower with the loop's shardings after ``prepare_shapes``
alone, with data files that do not exist."""
from __future__ import annotations

import jax
import pytest

from jaxfid.core.errors import InputError
from jaxfid.training.task import Context
from method_aot import (MISSING, assert_same_shapes, configured, loop_placement,
                        lower_decode, lower_phases)
from reatt_world import make_world, write_corpus, write_examples

pytestmark = pytest.mark.slow
GIN = "gin/atlas/tiny.gin"
SMALL = ["BATCH_SIZE = 4", "N_CONTEXT = 3", "TEXT_MAXLENGTH = 16",
         "ANSWER_MAXLENGTH = 4", "QUERY_MAXLENGTH = 8", "PASSAGE_MAXLENGTH = 8",
         "INDEX_BATCH_SIZE = 8", "config.T5Config.num_decoder_layers = 1",
         "config.T5Config.d_model = 32", "config.T5Config.d_ff = 64",
         "MESH = 'data=2,model=2'", "loop.train.progress = False"]


class _Log:
  def write(self, step, record):
    del step, record


class _Checkpoints:
  def steps(self):
    return []


def test_abstract_batch_is_the_real_batch(tmp_path):
  docs, examples = make_world(num_keys=12, n_context=3)
  write_corpus(tmp_path / "corpus.jsonl", docs)
  write_examples(tmp_path / "train.json", examples)
  task, settings, _ = configured(GIN, SMALL + [
      f"MODEL_DIR = '{tmp_path / 'm'}'", f"CORPUS = '{tmp_path / 'corpus.jsonl'}'",
      f"TRAIN_DATA = '{tmp_path / 'train.json'}'"])
  p = task.prepare(settings)
  mesh, place = loop_placement(p)
  with jax.set_mesh(mesh):
    params = jax.jit(lambda: p.model.init_params(0),
                     out_shardings=place.params)()
    task.start(p, Context(settings, place, _Log(), _Checkpoints(), None), 0,
               {"params": params})
    host = task.batch(p, 0, slice(0, settings.batch_size), params)
  assert_same_shapes(task.abstract_batch(p, 0), host)
  task.close()


def test_the_step_and_decoding_lower_from_shapes_alone():
  task, settings, optimizer = configured(GIN, SMALL + [
      f"MODEL_DIR = '{MISSING}/m'", f"CORPUS = '{MISSING}/c.tsv'",
      f"TRAIN_DATA = '{MISSING}/t.json'"])
  p = task.prepare_shapes(settings)
  assert len(lower_phases(task, p, optimizer)) == 1
  assert lower_decode(task, p, 4) is not None
  task, settings, _ = configured(GIN, SMALL + [
      f"MODEL_DIR = '{MISSING}/m'", f"CORPUS = '{MISSING}/c.tsv'",
      f"TRAIN_DATA = '{MISSING}/t.json'", f"INIT_RETRIEVER = '{MISSING}/r'"])
  with pytest.raises(InputError, match="INIT_RETRIEVER"):
    task.prepare_shapes(settings)
