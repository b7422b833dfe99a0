"""RERANK_K (Atlas's --retrieve_with_rerank, src/atlas.py
retrieve_with_rerank): a search over-retrieves RERANK_K candidates from a
stale index, embeds them again with the current passage tower and keeps the
best N by the fresh scores."""
import jax
import numpy as np
import pytest

from jaxfid.atlas.config import AtlasConfig
from jaxfid.atlas.model import RETRIEVER, AtlasModel
from jaxfid.atlas.retrieval import InLoopRetriever
from jaxfid.core import sharding as shd
from jaxfid.core.tokenization import Tokenizer
from jaxfid.dual_encoder.model import DualEncoder, DualEncoderConfig
from jaxfid.retrieval.store.corpus import Passage
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

pytestmark = pytest.mark.slow  # ~5 s of a core, compiling the tiny towers

WORDS = ("red", "green", "blue", "stone", "river", "cloud", "music", "bread")


@pytest.fixture(scope="module")
def setup():
  config = T5Config(vocab_size=32128, d_model=16, d_kv=4, d_ff=32,
                    num_heads=2, num_layers=1, num_decoder_layers=1,
                    dropout_rate=0.0, feed_forward_proj="gated-gelu")
  model = AtlasModel(EncoderDecoderModel(config), DualEncoder(
      config, DualEncoderConfig(query_maxlength=6, passage_maxlength=6)),
      AtlasConfig(corpus="-", rerank_k=9))
  rng = np.random.default_rng(0)
  passages = [Passage(f"d{i}", "", " ".join(rng.choice(WORDS, 3)))
              for i in range(30)]
  retriever = InLoopRetriever(model, passages, Tokenizer(),
                              shd.parse_mesh("data=2"), passage_maxlength=6,
                              query_maxlength=6, batch_size=4,
                              dtype="float32", rerank_k=9)
  stale, fresh = (jax.device_put({RETRIEVER: model.retriever.init_params(s)},
                                 retriever.replicated) for s in (1, 7))
  retriever.refresh(stale)  # the index of an earlier passage tower
  queries = retriever.query_tokens([" ".join(rng.choice(WORDS, 2))
                                    for _ in range(5)])
  return model, retriever, stale, fresh, queries


def test_the_hits_are_the_best_fresh_scores_of_the_over_retrieved(setup):
  model, retriever, _, fresh, queries = setup
  ids, scores = retriever.search(fresh, queries, 3)
  assert ids.shape == scores.shape == (5, 3)
  retriever.rerank_k = 0
  try:
    candidates, _ = retriever.search(fresh, queries, 9)   # the stale top 9
    plain, _ = retriever.search(fresh, queries, 3)
  finally:
    retriever.rerank_k = 9
  q = np.asarray(jax.jit(model.embed_queries)(fresh[RETRIEVER], queries))
  p = np.asarray(jax.jit(model.embed_passages)(
      fresh[RETRIEVER], retriever.tokens[candidates.reshape(-1)])
  ).reshape(5, 9, -1)                                 # q [5, D], p [5, 9, D]
  rescored = np.einsum("bd,bcd->bc", q, p)
  order = np.argsort(-rescored, axis=1, kind="stable")[:, :3]
  np.testing.assert_array_equal(ids,
                                np.take_along_axis(candidates, order, 1))
  np.testing.assert_allclose(scores, np.take_along_axis(rescored, order, 1),
                             rtol=1e-5, atol=1e-6)
  assert (ids != plain).any()   # the stale index's order is not kept


def test_rerank_k_below_k_rescores_k_candidates(setup):
  _, retriever, stale, _, queries = setup
  # with the index's own passage tower, re-scoring changes no order
  plain = InLoopRetriever(retriever.model, retriever.passages, Tokenizer(),
                          shd.parse_mesh("data=2"), passage_maxlength=6,
                          query_maxlength=6, batch_size=4, dtype="float32")
  plain.index = retriever.index
  ids, scores = retriever.search(stale, queries, 12)   # C = max(9, 12)
  want_ids, want_scores = plain.search(stale, queries, 12)
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
