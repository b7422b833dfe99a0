"""ReAtt's ahead-of-time hooks (``jaxfid bench compile``).

``abstract_batch`` is checked against a real ``prepare`` + ``batch`` (FiD
rows plus ``question_length`` and ``kl_weight``); the train step (plain
accumulation, and the GradCache step that keeps in-batch negatives global)
and the reader's decoding lower (fast tier) and compile (slow tier) on the
simulated CPU devices with the loop's shardings after ``prepare_shapes``
alone, with data files that do not exist.
"""
from __future__ import annotations

import pytest

from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader.batches import eval_batches
from jaxfid.reatt.model import ReAttConfig
from jaxfid.training.task import Context
from method_aot import (MISSING, assert_same_shapes, configured, lower_decode,
                        lower_phases)
from reatt_world import make_world, write_corpus, write_examples

GIN = "gin/reatt/tiny.gin"
SMALL = ["BATCH_SIZE = 4", "N_CONTEXT = 3", "TEXT_MAXLENGTH = 16",
         "ANSWER_MAXLENGTH = 4", "config.T5Config.num_decoder_layers = 1",
         "config.T5Config.d_model = 32", "config.T5Config.d_ff = 64",
         "MESH = 'data=2,model=2'", "loop.train.progress = False"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("aot_reatt")
  docs, examples = make_world(num_keys=12, n_context=3)
  write_corpus(d / "corpus.jsonl", docs)
  write_examples(d / "train.json", examples)
  return d


def test_abstract_batch_is_the_real_batch(data, tmp_path):
  task, settings, _ = configured(GIN, SMALL + [
      f"MODEL_DIR = '{tmp_path / 'm'}'",
      f"TRAIN_DATA = '{data / 'train.json'}'", "RETRIEVAL_WARMUP_STEPS = 1"])
  p = task.prepare(settings)
  task.start(p, Context(settings, None, None, None, None), 0, None)
  try:
    for step in (0, 1):   # the QA-only warm-up, then the KL term
      host = task.batch(p, step, slice(0, settings.batch_size), None)
      assert_same_shapes(task.abstract_batch(p, 0), host)
  finally:
    task.close()
  r = task.reader   # the evaluation's batches (QaEvaluator's)
  _, _, host = next(eval_batches(
      p.reader.eval_examples or task.examples, p.reader.tokenizer,
      batch_size=2,
      n_context=r.n_context, text_maxlength=r.text_maxlength,
      passage_eos=r.passage_eos))
  assert_same_shapes(task.decode_program(p, 2)[1], host)
  # prepare_shapes keeps the configured separator: the T5 vocabulary's
  assert p.model.reatt.separator_ids == ReAttConfig().separator_ids == tuple(
      Tokenizer().encode("title:"))


def _configured(extra):
  return configured(GIN, SMALL + list(extra) + [
      f"MODEL_DIR = '{MISSING}/m'", f"TRAIN_DATA = '{MISSING}/train.json'",
      f"EVAL_DATA = '{MISSING}/dev.json'",
      f"RETRIEVAL_CORPUS = '{MISSING}/corpus.jsonl'", "ITERATION_STEPS = 5"])


def test_lowers_from_the_configuration_alone():
  task, settings, optimizer = _configured([])
  p = task.prepare_shapes(settings)
  (train,) = lower_phases(task, p, optimizer)
  assert "kl_loss" in train.out_info[1]
  assert lower_decode(task, p, 2).out_info.shape == (2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    [], ["ACCUMULATION_STEPS = 2", "RELEVANCE_CHUNK = 3", "QUERY_MAXLENGTH = 8",
         "EVAL_BEAMS = 2"]], ids=["plain", "grad_cache_beams"])
def test_compiles_from_the_configuration_alone(extra):
  task, settings, optimizer = _configured(extra)
  p = task.prepare_shapes(settings)
  (train,) = lower_phases(task, p, optimizer)
  assert train.compile().memory_analysis() is not None
  decode = lower_decode(task, p, batch_size=2).compile()
  assert decode.out_info.shape == (2, 4)   # DECODE_MAXLENGTH tokens


def test_an_unknown_target_length_names_the_macro():
  task, settings, _ = _configured(["ANSWER_MAXLENGTH = None",
                                   "DECODE_MAXLENGTH = 4"])
  with pytest.raises(InputError, match="TARGET_MAXLENGTH"):
    task.prepare_shapes(settings)
