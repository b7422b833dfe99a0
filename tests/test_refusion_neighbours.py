"""ReFusion's offline neighbours over a tiny sentence database.

A random tiny HF T5 (the real vocabulary) embeds 12 sentences into a dense
index (``jaxfid index dense`` on a ``.txt`` file); neighbours must equal brute
force over the stored embeddings, pairs retrieve per sentence, and a second
call with the same inputs is answered from the cache without embedding or
searching.
"""
import json

import numpy as np
import pytest

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.core.errors import InputError
from jaxfid.refusion import neighbours as nb
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.index import build_dense_index, open_dense_index
from jaxfid.retrieval.dense.index import DenseSearcher

SENTENCES = [
    "the film was a delight from start to finish",
    "a dull and lifeless script",
    "the actors clearly enjoyed themselves",
    "rain fell over the city all night",
    "stocks rose sharply on tuesday",
    "the recipe needs two eggs and flour",
    "a thrilling and moving story",
    "i would not watch it again",
    "the museum opens at nine",
    "his best performance in years",
    "the soundtrack is forgettable",
    "children will love the colourful animation",
]
QUERIES = ["a wonderful movie", "boring plot", "the weather was bad",
           "great acting", "what time does it open"]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
  d = tmp_path_factory.mktemp("refusion_db")
  (d / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=16,
                                 d_kv=4, d_ff=32, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  loaded = load_dual_encoder(ckpt)
  build_dense_index(None, d / "sentences.txt", d / "db", encoder=loaded,
                          shard_size=5, progress=False)
  return d / "db"


def _brute_force(db, texts, k):
  searcher = open_dense_index(db)
  q = searcher.embed_queries(texts)
  scores = q @ searcher.vectors(np.arange(len(SENTENCES))).T
  order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return order, np.take_along_axis(scores, order, axis=1)


def test_shapes_vectors_and_brute_force(db):
  got = nb.retrieve_neighbours(db, [[q] for q in QUERIES], 4, cache_dir=False)
  assert got.vectors.shape == (5, 1, 4, 16) and got.vectors.dtype == np.float32
  assert got.rows.shape == got.mask.shape == got.scores.shape == (5, 1, 4)
  assert got.rows.dtype == np.int64 and got.mask.dtype == bool
  assert got.mask.all() and len(got) == 5
  rows, scores = _brute_force(db, QUERIES, 4)
  np.testing.assert_array_equal(got.rows[:, 0], rows)
  np.testing.assert_allclose(got.scores[:, 0], scores, rtol=1e-5, atol=1e-6)
  searcher = open_dense_index(db)
  np.testing.assert_array_equal(
      got.vectors.reshape(-1, 16), searcher.vectors(got.rows.reshape(-1)))
  assert nb.db_width(db) == 16


def test_top_k_beyond_database_is_masked(db):
  got = nb.retrieve_neighbours(db, [[QUERIES[0]], [QUERIES[2]]], 15,
                               cache_dir=False)
  assert got.rows.shape == (2, 1, 15)
  assert (got.mask.sum(axis=-1) == 12).all() and got.mask[:, :, :12].all()
  assert (got.rows[:, :, 12:] == -1).all()
  assert not got.vectors[:, :, 12:].any() and not got.scores[:, :, 12:].any()
  assert sorted(got.rows[0, 0, :12].tolist()) == list(range(12))
  rows, _ = _brute_force(db, [QUERIES[0]], 12)
  np.testing.assert_array_equal(got.rows[0, 0, :12], rows[0])


def test_pairs_retrieve_per_segment_and_texts_concatenate(db):
  pairs = [[QUERIES[0], QUERIES[1]], [QUERIES[2], QUERIES[0]],
           [QUERIES[3], QUERIES[3]]]
  got = nb.retrieve_neighbours(db, pairs, 3, cache_dir=False)
  assert got.vectors.shape == (3, 2, 3, 16)
  single = nb.retrieve_neighbours(db, [[q] for q in QUERIES[:4]], 3,
                                  cache_dir=False)
  by_text = dict(zip(QUERIES[:4], single.rows[:, 0]))
  for example, rows in zip(pairs, got.rows):
    np.testing.assert_array_equal(rows[0], by_text[example[0]])
    np.testing.assert_array_equal(rows[1], by_text[example[1]])
  texts = nb.neighbour_texts(db, got.rows)
  assert texts[1] == ([SENTENCES[r] for r in by_text[QUERIES[2]]]
                      + [SENTENCES[r] for r in by_text[QUERIES[0]]])
  masked = got.rows.copy()
  masked[0, 0, 2] = -1  # a missing neighbour is skipped
  assert len(nb.neighbour_texts(db, masked)[0]) == 5
  assert nb.neighbour_texts(db, masked[:, 1]) == [t[3:] for t in texts]


def test_cache_is_reused_and_invalidated(db, tmp_path, monkeypatch):
  queries = [[q] for q in QUERIES[:3]]
  first = nb.retrieve_neighbours(db, queries, 3, cache_dir=tmp_path)
  files = list(tmp_path.glob("neighbours-*.npz"))
  assert len(files) == 1 and len(files[0].stem) == len("neighbours-") + 16
  assert not list(tmp_path.glob(".*"))  # no temporary file left

  def no_search(*args, **kwargs):
    raise AssertionError("searched although cached")

  monkeypatch.setattr(DenseSearcher, "embed_queries", no_search)
  monkeypatch.setattr(DenseSearcher, "search_vectors", no_search)
  again = nb.retrieve_neighbours(db, queries, 3, cache_dir=tmp_path)
  for field in ("vectors", "mask", "rows", "scores"):
    np.testing.assert_array_equal(getattr(again, field), getattr(first, field))
  edited = [["great acting!"]] + queries[1:]
  for changed, k in ((queries, 4), (queries[:2], 3), (edited, 3)):
    with pytest.raises(AssertionError, match="searched although cached"):
      nb.retrieve_neighbours(db, changed, k, cache_dir=tmp_path)
  monkeypatch.undo()
  # a damaged cache file is recomputed and replaced
  files[0].write_bytes(b"not a zip")
  fixed = nb.retrieve_neighbours(db, queries, 3, cache_dir=tmp_path)
  np.testing.assert_array_equal(fixed.rows, first.rows)
  with np.load(files[0]) as f:
    np.testing.assert_array_equal(f["rows"], first.rows)


def test_default_cache_lives_in_the_database(db, monkeypatch):
  queries = [["the museum"]]
  nb.retrieve_neighbours(db, queries, 2)
  assert len(list((db / nb.CACHE_SUBDIR).glob("neighbours-*.npz"))) == 1
  monkeypatch.setattr(DenseSearcher, "embed_queries",
                      lambda *a, **k: pytest.fail("searched although cached"))
  assert nb.retrieve_neighbours(db, queries, 2).rows.shape == (1, 1, 2)


def test_cache_key_follows_the_database(db, tmp_path):
  searcher = open_dense_index(db)
  key = nb.cache_key(searcher, [["a"]], 3)
  assert key == nb.cache_key(open_dense_index(db), [["a"]], 3)
  assert nb.cache_key(searcher, [["a"]], 4) != key
  searcher.meta = {**searcher.meta, "faiss": {**searcher.meta["faiss"],
                                              "factory": "HNSW32"}}
  assert nb.cache_key(searcher, [["a"]], 3) != key
  assert nb.cache_key(open_dense_index(db), [["a"]], 3,
                      {"nprobe": 8}) != key
  assert nb.cache_key(open_dense_index(db), [["a", ""]], 3) != key


def test_bad_input(db, tmp_path):
  with pytest.raises(InputError, match="top_k: must be positive, got 0"):
    nb.retrieve_neighbours(db, [["x"]], 0)
  with pytest.raises(InputError, match="example 1: 1 segments, but the first"):
    nb.retrieve_neighbours(db, [["a", "b"], ["c"]], 2, cache_dir=False)
  with pytest.raises(InputError, match="list of segment texts"):
    nb.retrieve_neighbours(db, ["a sentence"], 2, cache_dir=False)
  bm25 = tmp_path / "bm25"
  bm25.mkdir()
  (bm25 / "meta.json").write_text(json.dumps({"type": "bm25"}))
  with pytest.raises(InputError, match="a 'bm25' index, not a dense one"):
    nb.retrieve_neighbours(bm25, [["x"]], 2)
  with pytest.raises(InputError, match="not a dense one"):
    nb.db_width(bm25)
  with pytest.raises(InputError, match="no such index directory"):
    nb.neighbour_texts(tmp_path / "missing", np.zeros((1, 1, 1), np.int64))
  empty = nb.retrieve_neighbours(db, [], 3, cache_dir=False)
  assert empty.vectors.shape == (0, 0, 3, 16)
