"""BM25: hand-computed scores, Lucene's own scores, and bm25s's."""
import json
import math
import os

import numpy as np
import pytest

from jaxfid.retrieval.text.analysis import EnglishAnalyzer
from jaxfid.retrieval.bm25 import scoring, topk
from jaxfid.retrieval.bm25.scoring import (
    BM25Index, BM25Params, LENGTH_TABLE, byte4_to_int, int_to_byte4, top_k)
from jaxfid.retrieval.bm25.builder import BM25Builder, build_index

DATA = os.path.join(os.path.dirname(__file__), "data", "retrieval")
LUCENE = os.path.join(DATA, "lucene_reference")


def _read_trec(path):
  run = {}
  with open(path) as f:
    for line in f:
      qid, _, docid, _, score, _ = line.split()
      run.setdefault(qid, []).append((docid, score))
  return run


def test_hand_computed_three_documents():
  # N = 3, avgdl = 8/3, k1 = 0.9, b = 0.4; "cat" and "dog" have df = 2:
  # idf = ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln(1.6) = 0.4700036
  # K(dl=3) = 0.9 * (0.6 + 0.4 * 3 / (8/3)) = 0.945
  # K(dl=2) = 0.9 * (0.6 + 0.4 * 2 / (8/3)) = 0.81
  # "cat": d1 = idf * 1/(1 + 0.945) = 0.2416471
  #        d2 = idf * 2/(2 + 0.945) = 0.3191875
  # "cat dog": d2 = 0.3191875 + 0.2416471 = 0.5608346
  #            d3 = idf * 1/(1 + 0.81) = 0.2596705, d1 = 0.2416471
  index = build_index(["cat sat mat", "cat cat dog", "dog ran"])
  cat = dict(index.search("cat", 10))
  assert cat == pytest.approx({0: 0.2416471, 1: 0.3191875}, rel=1e-6)
  both = index.search("cat dog", 10)
  assert [row for row, _ in both] == [1, 2, 0]
  assert [s for _, s in both] == pytest.approx(
      [0.5608346, 0.2596705, 0.2416471], rel=1e-6)
  assert index.stats["avgdl"] == pytest.approx(8 / 3)
  assert index.search("unicorn", 10) == []
  assert index.search("the of and", 10) == []


def test_small_float_length_encoding():
  # exact below 24; 100 - 24 = 76 = 0b1001100 -> keep 4 bits 1001 -> 72
  assert list(int_to_byte4([0, 1, 23, 24, 100])) == [0, 1, 23, 24, 57]
  assert list(byte4_to_int([0, 23, 24, 57, 255])) == [0, 23, 24, 96,
                                                      2013265944]
  lengths = np.arange(0, 5000)
  decoded = byte4_to_int(int_to_byte4(lengths))
  assert np.all(decoded <= lengths)
  # the code is the largest table value not above the length (floor)
  assert np.array_equal(decoded, LENGTH_TABLE[
      np.searchsorted(LENGTH_TABLE, lengths, side="right") - 1])
  assert np.all(np.diff(LENGTH_TABLE) > 0)


@pytest.mark.parametrize("name, k1, b, k", [("edge", 1.2, 0.75, 10)])
def test_equals_lucene_on_edge_cases(name, k1, b, k):
  with open(os.path.join(LUCENE, f"{name}_corpus.tsv"), encoding="utf-8") as f:
    docs = [line.rstrip("\n").split("\t") for line in f]
  with open(os.path.join(LUCENE, f"{name}_queries.tsv"),
            encoding="utf-8") as f:
    queries = [line.rstrip("\n").split("\t") for line in f]
  expected = _read_trec(os.path.join(LUCENE, f"{name}.trec"))
  index = build_index([text for _, text in docs], BM25Params(k1, b))
  ids = np.array([d.encode() for d, _ in docs])
  rank = np.argsort(np.argsort(ids, kind="stable"))
  for qid, text in queries:
    got = [(docs[row][0], str(np.float32(s)))
           for row, s in index.search(text, k, rank)]
    assert got == expected.get(qid, []), qid
  # the document of stop words only does not count in N (Lucene's docCount)
  assert index.stats["num_nonempty_docs"] == len(docs) - 1


def test_equals_lucene_on_squad_sample():
  with open(os.path.join(DATA, "squad_sample", "paragraphs.jsonl"),
            encoding="utf-8") as f:
    docs = [json.loads(line) for line in f]
  with open(os.path.join(DATA, "squad_sample", "questions.jsonl"),
            encoding="utf-8") as f:
    questions = [json.loads(line) for line in f]
  index = build_index(d["title"] + "\n" + d["text"] for d in docs)
  expected = _read_trec(os.path.join(LUCENE, "squad_sample.trec"))
  ids = np.array([d["_id"].encode() for d in docs])
  rank = np.argsort(np.argsort(ids, kind="stable"))
  for q in questions:
    got = [(docs[row]["_id"], str(np.float32(s)))
           for row, s in index.search(q["question"], 5, rank)]
    assert got == expected[q["id"]], q["question"]
  # without Lucene's length quantisation, scores (and some rankings) differ
  exact = build_index((d["title"] + "\n" + d["text"] for d in docs),
                          BM25Params(lucene_norms=False))
  differ = sum(
      [str(np.float32(s)) for _, s in exact.search(q["question"], 5, rank)]
      != [s for _, s in expected[q["id"]]] for q in questions)
  assert differ > len(questions) // 2


def _random_corpus(seed, n_docs, max_len):
  rng = np.random.default_rng(seed)
  words = [f"w{i}x" for i in range(40)] + ["alpha", "beta", "gamma"]
  return [" ".join(rng.choice(words, size=rng.integers(1, max_len)))
          for _ in range(n_docs)], words


@pytest.mark.parametrize("lucene_norms, max_len", [(False, 80), (True, 23)])
def test_equals_bm25s_lucene_method(lucene_norms, max_len):
  bm25s = pytest.importorskip("bm25s")  # the `test` and `bench` extras
  texts, words = _random_corpus(1, 60, max_len)
  analyzer = EnglishAnalyzer()
  tokens = [analyzer.analyze(t) for t in texts]
  reference = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
  reference.index(tokens, show_progress=False)
  index = build_index(texts, BM25Params(lucene_norms=lucene_norms))
  rng = np.random.default_rng(2)
  for _ in range(25):
    query = " ".join(rng.choice(words, size=rng.integers(1, 5), replace=False))
    expected = reference.get_scores(analyzer.analyze(query))
    rows, scores = index.match(query)
    got = np.zeros(len(texts), np.float32)
    got[rows] = scores
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)


def test_save_load_round_trip(tmp_path):
  texts, _ = _random_corpus(3, 40, 50)
  index = build_index(texts)
  index.save(tmp_path)
  loaded = BM25Index.load(tmp_path)
  for query in ("w1x w2x", "alpha w3x w3x w3x", "gamma"):
    assert loaded.search(query, 7) == index.search(query, 7)


def test_bm25s_reads_a_saved_index(tmp_path):
  bm25s = pytest.importorskip("bm25s")  # the `test` and `bench` extras
  texts, _ = _random_corpus(3, 40, 50)
  index = build_index(texts)
  index.save(tmp_path)
  other = bm25s.BM25.load(tmp_path)
  terms = EnglishAnalyzer().analyze("w1x w2x")
  rows, scores = index.match("w1x w2x")
  np.testing.assert_allclose(other.get_scores(terms)[rows], scores, rtol=1e-6)


def test_repeated_query_terms_are_boosted():
  index = build_index(["apple pie", "apple apple tart", "pear"])
  once = dict(index.search("apple", 3))
  thrice = dict(index.search("apple apple apple", 3))
  for row in once:
    assert thrice[row] == pytest.approx(3 * once[row], rel=1e-6)


def test_top_k_breaks_ties_by_rank():
  docs = np.array([5, 3, 9, 1])
  scores = np.array([1.0, 2.0, 1.0, 1.0], np.float32)
  rank = np.array([0, 9, 0, 0, 0, 2, 0, 0, 0, 1])  # row -> id rank
  # tied at 1.0: rows 5, 9, 1 have id ranks 2, 1, 9
  assert [d for d, _ in top_k(docs, scores, 3, rank)] == [3, 9, 5]
  assert [d for d, _ in top_k(docs, scores, 2)] == [3, 1]
  assert top_k(docs, scores, 0) == []


def test_spilled_chunks_equal_one_batch(tmp_path):
  texts, _ = _random_corpus(4, 50, 40)
  builder = BM25Builder(flush_tokens=37, spill_dir=tmp_path / "chunks")
  for t in texts:
    builder.add(t)
  small = builder.finish(directory=tmp_path / "index")
  assert not (tmp_path / "chunks").exists()
  small.save(tmp_path / "index")
  big = build_index(texts)
  assert BM25Index.load(tmp_path / "index").search("w1x w2x", 9) == (
      big.search("w1x w2x", 9))
  assert np.array_equal(small.indptr, big.indptr)
  assert np.array_equal(small.indices, big.indices)
  assert np.array_equal(small.data, big.data)
  assert math.isclose(small.stats["avgdl"], big.stats["avgdl"])


def test_indexed_terms_equal_the_analyzers():
  with open(os.path.join(LUCENE, "analysis.tsv"), encoding="utf-8") as f:
    texts = [line.split("\t")[0] for line in f][:200]
  texts += ["___ x_y John's ’s", "a" * 600 + "'s", ""]
  index = build_index(texts)
  analyzer = EnglishAnalyzer()
  columns = {col: term for term, col in index.vocab.items()}
  postings = [set() for _ in texts]
  for col in range(len(index.indptr) - 1):
    for row in index.indices[index.indptr[col]:index.indptr[col + 1]]:
      postings[row].add(columns[col])
  for text, terms in zip(texts, postings):
    assert terms == set(analyzer.analyze(text)), text
  total = sum(len(analyzer.analyze(t)) for t in texts)
  assert index.stats["sum_total_term_freq"] == total


def test_dense_candidate_search_equals_exhaustive_ranking():
  texts, words = _random_corpus(5, 400, 30)
  index = build_index(texts)
  rank = np.random.default_rng(6).permutation(len(texts))
  rng = np.random.default_rng(7)
  dense_queries = 0
  for _ in range(60):
    query = " ".join(rng.choice(words[:12], size=rng.integers(2, 7)))
    docs, scores = index.match(query)  # every matching row, exact scores
    postings = sum(int(index.indptr[c + 1] - index.indptr[c])
                   for c in index.query_terms(query)[0])
    dense_queries += postings >= 0.125 * len(texts)
    for k in (1, 5, 50):
      assert index.search(query, k, rank) == top_k(docs, scores, k, rank)
  assert dense_queries > 30


def _zipf_corpus(seed, n_docs, vocab=300):
  rng = np.random.default_rng(seed)
  words = [f"t{i}q" for i in range(vocab)]
  p = 1.0 / np.arange(1, vocab + 1)
  p /= p.sum()
  texts = [" ".join(rng.choice(words, size=rng.integers(3, 60), p=p))
           for _ in range(n_docs)]
  texts += [texts[5]] * 7 + [texts[9]] * 5  # equal scores: ties
  return texts, words, p


@pytest.mark.parametrize("impacts", [True, False])
@pytest.mark.parametrize("lucene_norms, expand_all, add_all", [
    (True, 0, 0), (False, 0, 0), (True, 10**9, 0), (True, 0, 10**9),
    (False, 0, 10**9)])
def test_pruned_search_equals_exhaustive_top_k(monkeypatch, lucene_norms,
                                               expand_all, add_all, impacts):
  """Every path of the top k, with uint16 impact sums and float32 sums."""
  monkeypatch.setattr(scoring, "_EXHAUSTIVE_POSTINGS", 0)
  monkeypatch.setattr(topk, "EXPAND_ALL_POSTINGS", expand_all)
  monkeypatch.setattr(topk, "ADD_ALL_RATIO", add_all)
  texts, words, p = _zipf_corpus(11, 3000)
  index = build_index(texts, BM25Params(lucene_norms=lucene_norms))
  assert index.impacts is not None
  if not impacts:  # an index saved before impacts
    index.impacts = index.impact_step = None
  rank = np.random.default_rng(12).permutation(len(texts))
  rng = np.random.default_rng(13)
  pruned = 0
  calls = []
  real = topk.pruned_top_k
  kinds = set()

  def spy(terms, k, space, step):
    kinds.add(topk.Sums.choose(terms, space, step).acc.dtype)
    docs, scores = real(terms, k, space, step)
    calls.append(len(docs))
    return docs, scores

  monkeypatch.setattr(scoring, "pruned_top_k", spy)
  for i in range(88):
    # common and rare words, sometimes repeated (boosted); every 11th query
    # longer than MAX_IMPACT_TERMS words
    size = rng.integers(2, 8) if i % 11 else rng.integers(17, 25)
    query = " ".join(rng.choice(words, size=size, p=p ** 0.3
                                / (p ** 0.3).sum()))
    docs, scores = index.match(query)
    for k in (1, 10, 100):
      calls.clear()
      got = index.search(query, k, rank)
      assert got == top_k(docs, scores, k, rank), (query, k)
      pruned += bool(calls) and calls[-1] < len(docs) // 2
  assert pruned > 100  # most searches scored well under half the matches
  # long queries (boosts summing to more than MAX_IMPACT_TERMS) sum floats
  assert kinds == ({np.dtype(np.uint16), np.dtype(np.float32)} if impacts
                   else {np.dtype(np.float32)})
  space = index._workspaces.get(index.num_docs)
  assert not space.acc.any() and not space.acc16.any()
  assert not space.mark.any()


@pytest.mark.parametrize("kernel", [True, False])
def test_scatter_add_is_add_at_bit_for_bit(monkeypatch, kernel):
  """The compiled scatter (or its fallback) adds each term's postings as
  ``np.add.at`` does, to the bit, over several terms in turn; rows of
  another dtype take the fallback."""
  if not kernel:
    monkeypatch.setattr(topk, "_csc_matvec", None)
  rng = np.random.default_rng(0)
  n = 5000
  acc, expected = np.zeros(n, np.float32), np.zeros(n, np.float32)
  for size, dtype in [(3000, np.int32), (40, np.int32), (1, np.int32),
                      (0, np.int32), (700, np.int64)]:
    rows = np.sort(rng.choice(n, size, replace=False)).astype(dtype)
    values = (rng.random(size) * 7).astype(np.float32) * np.float32(3)
    topk.scatter_add(acc, rows, values)
    np.add.at(expected, rows, values)
  assert acc.tobytes() == expected.tobytes()
  assert (topk._csc_matvec is not None) == kernel
  np.testing.assert_array_equal(topk.gather(acc, rows[::-1]),
                                acc[rows[::-1]])


def test_impacts_bound_the_scores_and_old_indexes_search_without(tmp_path):
  """impact * step <= score < (impact + 1) * step for every posting, at most
  IMPACT_MAX; an index saved before impacts searches with float32 sums and
  returns the same hits."""
  texts, words, p = _zipf_corpus(4, 2000)
  index = build_index(texts)
  index.save(tmp_path)
  loaded = BM25Index.load(tmp_path)
  step, impacts = loaded.impact_step, np.asarray(loaded.impacts)
  np.testing.assert_array_equal(impacts, index.impacts)
  data = np.asarray(loaded.data, np.float64)
  assert impacts.max() <= topk.IMPACT_MAX and impacts.max() >= 4000
  assert np.all(impacts * step <= data) and np.all(data < (impacts + 1) * step)
  (tmp_path / "impacts.csc.index.npy").unlink()
  old = BM25Index.load(tmp_path)
  assert old.impacts is None and old.impact_step is None
  rng = np.random.default_rng(5)
  for _ in range(30):
    query = " ".join(rng.choice(words[:40], size=rng.integers(2, 6)))
    assert old.search(query, 10) == loaded.search(query, 10)


def test_upper_bounds_stored_and_recomputed(tmp_path):
  texts, _, _ = _zipf_corpus(3, 200)
  index = build_index(texts)
  expected = np.array([index.data[a:b].max() for a, b in
                       zip(index.indptr[:-1], index.indptr[1:])])
  np.testing.assert_array_equal(index.upper_bounds(), expected)
  index.save(tmp_path)
  assert np.array_equal(np.load(tmp_path / "max_scores.npy"), expected)
  (tmp_path / "max_scores.npy").unlink()  # an index saved before them
  np.testing.assert_array_equal(BM25Index.load(tmp_path).upper_bounds(),
                                expected)
