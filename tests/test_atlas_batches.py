"""jaxfid/atlas: the refresh schedule and the batches of retrieved passages
(no model, no device)."""
import numpy as np
import pytest

from jaxfid.atlas.batches import AtlasBatcher, with_retrieved
from jaxfid.atlas.config import AtlasConfig
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer, encode_padded
from jaxfid.reader.examples import FidExample
from jaxfid.retrieval.store.corpus import Passage


def test_the_refresh_schedule():
  assert AtlasConfig(corpus="c").refresh_steps(10) == [0]
  assert AtlasConfig(corpus="c", refresh_every=4).refresh_steps(10) == [0, 4, 8]
  assert AtlasConfig(corpus="c", refresh_every=5).refresh_steps(10) == [0, 5]
  assert AtlasConfig(corpus="c", refresh_every=4,
                     query_side_only=True).refresh_steps(10) == [0]
  with pytest.raises(InputError, match="RETRIEVER_LOSS"):
    AtlasConfig(corpus="c", retriever_loss="emdr")


def _batcher():
  tok = Tokenizer()
  passages = [Passage(f"p{i}", f"title {i}", f"text number {i}")
              for i in range(6)]
  examples = [FidExample(question=f"question {i}", answers=(f"a{i}",),
                         ctxs=(), id=str(i)) for i in range(5)]
  return AtlasBatcher(
      examples, passages, encode_padded(tok, [p.text for p in passages], 8),
      encode_padded(tok, [e.question for e in examples], 6), tok,
      batch_size=4, n_context=2, text_maxlength=16, target_maxlength=4,
      seed=3, prompt_format="fid")


def test_rows_are_the_retrieved_passages_in_order_and_split_by_rows():
  batcher = _batcher()
  ids = np.array([[5, 1], [0, 2], [3, 4], [1, 0]])
  scores = -np.arange(8.0).reshape(4, 2)
  whole = batcher.batch(7, slice(0, 4), ids, scores)
  assert whole["encoder_input_tokens"].shape == (4, 2, 16)
  assert whole["passage_tokens"].shape == (4, 2, 8)
  np.testing.assert_array_equal(whole["passage_tokens"],
                                batcher.passage_tokens[ids])
  chosen = batcher.indices(7)
  np.testing.assert_array_equal(whole["query_tokens"],
                                batcher.query_tokens[chosen])
  text = batcher.tokenizer.decode(whole["encoder_input_tokens"][0, 0].tolist())
  assert text.startswith(f"question: question {chosen[0]} title: title 5")
  halves = [batcher.batch(7, slice(a, a + 2), ids, scores) for a in (0, 2)]
  for key, value in whole.items():
    np.testing.assert_array_equal(
        value, np.concatenate([h[key] for h in halves]))


def test_with_retrieved_replaces_the_passages():
  passages = [Passage("x", "T", "body"), Passage("y", "U", "other")]
  example = with_retrieved(FidExample(question="q", answers=("a",)),
                           passages, [1, 0], [2.0, 1.0])
  assert [(c.id, c.title, c.score) for c in example.ctxs] == [
      ("y", "U", 2.0), ("x", "T", 1.0)]
