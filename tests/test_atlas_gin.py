"""gin/atlas/base.gin and large.gin: the settings of Atlas's NQ recipe
(facebookresearch/atlas example_scripts/nq/train.sh), and the Atlas model
they build (the fast tier validates both files as every shipped gin file,
tests/test_gin_validation.py)."""
from __future__ import annotations

import jax
import pytest

from jaxfid.t5 import config as config_lib
from jaxfid.t5.network import abstract_t5, count_params
from method_aot import configured

REQUIRED = ["MODEL_DIR = 'x'", "TRAIN_DATA = 't.json'", "CORPUS = 'c.jsonl'"]
READERS = {"gin/atlas/base.gin": "t5_1_1_base",
           "gin/atlas/large.gin": "t5_1_1_large"}


@pytest.mark.parametrize("gin_file", sorted(READERS))
def test_the_nq_recipe(gin_file):
  task, settings, optimizer = configured(gin_file, REQUIRED)
  atlas, reader = task.atlas, task.reader
  assert (atlas.retriever_loss, atlas.temperature_gold,
          atlas.temperature_score, atlas.refresh_every,
          atlas.query_side_only, atlas.query_side_mode,
          atlas.passage_maxlength, atlas.index_batch_size, atlas.index_dtype,
          atlas.rerank_k) == (
              "pdist", 0.01, 0.01, "0-1000:500,1000-10000:2000", False,
              "frozen", 512, 512, "bfloat16", 0)
  assert (atlas.freeze_retriever_steps, atlas.retriever_learning_rate,
          atlas.prompt_format) == (0, None, "atlas")
  assert (reader.n_context, reader.text_maxlength, reader.passage_eos,
          reader.lengths.target_maxlength,
          reader.lengths.decode_maxlength) == (40, 512, True, 16, 127)
  assert (settings.train_steps, settings.batch_size, settings.eval_every,
          settings.checkpoint_every, settings.log_every) == (
              10000, 64, 500, 5000, 50)
  assert (optimizer.learning_rate, optimizer.optimizer, optimizer.schedule,
          optimizer.warmup_steps, optimizer.weight_decay,
          optimizer.clip_norm) == (4e-5, "adamw", "cosine", 100, 0.01, 1.0)
  want = config_lib.preset(READERS[gin_file])
  arch = ("d_model", "num_layers", "num_heads", "d_ff", "feed_forward_proj",
          "tie_word_embeddings", "vocab_size")
  assert ({k: getattr(reader.model_config, k) for k in arch}
          == {k: getattr(want, k) for k in arch})
  assert (reader.model_config.dropout_rate, reader.model_config.remat) == (
      0.1, "full")
  assert atlas.refresh_steps(settings.train_steps) == [0, 500] + list(
      range(1000, 10000, 2000))


@pytest.mark.slow  # traces the full-size reader and retriever (abstractly)
@pytest.mark.parametrize("gin_file", sorted(READERS))
def test_the_files_build_the_atlas_model(gin_file):
  task, settings, _ = configured(gin_file, REQUIRED)
  p = task.prepare_shapes(settings)
  reader = count_params(abstract_t5(config_lib.preset(READERS[gin_file])))
  n = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  params = p.model.abstract_params()
  assert n(params["reader"]) == reader
  # the retriever: the reader's T5 encoder (no INIT_RETRIEVER), one tower
  retriever = n(params["retriever"])
  assert 0.3 * reader < retriever < 0.6 * reader
  assert p.model.retriever.dim == task.reader.model_config.d_model
