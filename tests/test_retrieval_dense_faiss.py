"""FAISS indexes over embedding shards: exact equals brute force, sharded too.

Random vectors; the reference is numpy: top-k of ``X @ q`` (or of minus the
squared distance), ties impossible in practice.
"""
import faiss
import numpy as np
import pytest

from jaxfid.core.errors import InputError
from jaxfid.retrieval.dense.embedding_store import (
    EmbeddingStore, ShardWriter, shard_name)
from jaxfid.retrieval.dense.faiss_index import (
    ShardedIndex, build_faiss_index, merge_topk, order_ties, split_rows)
from jaxfid.retrieval.dense.index import hit_lists
from jaxfid.retrieval.hits import Hits


def _store(tmp_path, vectors, shard_size=37, dtype="float32"):
  writer = ShardWriter(tmp_path, len(vectors), vectors.shape[1], dtype=dtype,
                       shard_size=shard_size, source={"test": 1})
  for i in range(writer.num_shards):
    a, b = writer.shard_rows(i)
    writer.write(i, vectors[a:b])
  return EmbeddingStore(tmp_path)


def _brute_force(vectors, queries, k, metric="ip"):
  if metric == "ip":
    scores = queries @ vectors.T
  else:
    scores = -((queries[:, None, :] - vectors[None]) ** 2).sum(-1)
  rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, rows, axis=1), rows


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  return (rng.standard_normal((300, 24)).astype(np.float32),
          rng.standard_normal((17, 24)).astype(np.float32))


@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("shards", [1, 4])
def test_exact_index_equals_brute_force(tmp_path, data, metric, shards):
  vectors, queries = data
  store = _store(tmp_path, vectors)
  info = build_faiss_index(store, tmp_path, metric=metric,
                           index_shards=shards, progress=False)
  assert [p["file"] for p in info["parts"]] == [None] * shards
  assert not list(tmp_path.glob("faiss_*"))  # flat: nothing stored twice
  index = ShardedIndex.load(tmp_path, info, store)
  assert index.ntotal == 300 and len(index.parts) == shards
  scores, rows = index.search(queries, 10)
  want_scores, want_rows = _brute_force(vectors, queries, 10, metric)
  np.testing.assert_array_equal(rows, want_rows)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-4)


def test_top_k_larger_than_a_shard(tmp_path, data):
  vectors, queries = data
  store = _store(tmp_path, vectors[:20])
  info = build_faiss_index(store, tmp_path, index_shards=3, progress=False)
  scores, rows = ShardedIndex.load(tmp_path, info, store).search(queries, 25)
  want_scores, want_rows = _brute_force(vectors[:20], queries, 20)
  np.testing.assert_array_equal(rows[:, :20], want_rows)
  assert (rows[:, 20:] == -1).all() and np.isneginf(scores[:, 20:]).all()


def test_merge_breaks_ties_by_row():
  scores = [np.array([[1.0, 0.5]]), np.array([[1.0, 0.7]])]
  rows = [np.array([[7, 3]]), np.array([[2, -1]])]
  s, r = merge_topk(scores, rows, 4)
  assert r.tolist() == [[2, 7, 3, -1]]
  assert s[0, :3].tolist() == [1.0, 1.0, 0.5]


def test_one_part_orders_only_tied_queries():
  scores = np.array([[3.0, 2.0, 2.0, 2.0, 1.0], [5.0, 4.0, 3.0, 2.0, 1.0],
                     [9.0, 9.0, 8.0, 7.0, 0.0]], np.float32)
  rows = np.array([[4, 9, 1, 5, 0], [8, 6, 7, 5, 4], [3, 2, 1, -1, -1]])
  s, r = order_ties(scores, rows)
  assert r.tolist() == [[4, 1, 5, 9, 0], [8, 6, 7, 5, 4],
                        [2, 3, 1, -1, -1]]
  assert s[0].tolist() == [3.0, 2.0, 2.0, 2.0, 1.0]
  assert np.isneginf(s[2, 3:]).all() and s[2, :3].tolist() == [9, 9, 8]
  # an exact single-part index: FAISS's order, ties by row
  vectors = np.zeros((6, 4), np.float32)
  vectors[:, 0] = [1, 2, 2, 1, 2, 0]
  index = faiss.IndexFlatIP(4)
  index.add(vectors)
  d, i = ShardedIndex([(index, 0)]).search(np.eye(4, dtype=np.float32)[:1], 6)
  assert i.tolist() == [[1, 2, 4, 0, 3, 5]]


def test_hit_lists_are_the_pairs_without_the_missing_rows():
  scores = np.array([[3.0, 2.5, 1.0], [9.0, 8.0, -np.inf]], np.float32)
  rows = np.array([[4, 9, 1], [2, 7, -1]])
  found = hit_lists(scores, rows)
  assert all(isinstance(h, Hits) for h in found)
  assert found[0] == [(4, 3.0), (9, 2.5), (1, 1.0)]
  assert found[1] == [(2, 9.0), (7, 8.0)] and len(found[1]) == 2
  assert found[0] != [(4, 3.0), (9, 2.5)] and found[0] != [(4, 3.0)] * 3
  assert list(found[1]) == [(2, 9.0), (7, 8.0)]
  assert type(found[0][0][0]) is int and type(found[0][0][1]) is float
  assert found[0][1] == (9, 2.5) and found[0][-1] == (1, 1.0)
  assert found[0][:2] == Hits([4, 9], [3.0, 2.5]) and not Hits([], [])
  assert [row for row, _ in found[0]] == [4, 9, 1]
  assert hit_lists(scores[:, :0], rows[:, :0]) == [[], []]
  with pytest.raises(ValueError):
    Hits([1, 2], [0.5])


def test_split_rows_covers_everything():
  assert split_rows(10, 3) == [(0, 3), (3, 7), (7, 10)]
  parts = split_rows(2, 4)
  assert len(parts) == 4 and parts[0][0] == 0 and parts[-1][1] == 2
  assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_ivf_flat_with_all_lists_is_exact_and_sharded(tmp_path, data):
  vectors, queries = data
  store = _store(tmp_path, vectors)
  info = build_faiss_index(store, tmp_path, factory="IVF4,Flat",
                           index_shards=2, progress=False)
  assert [p["file"] for p in info["parts"]] == ["faiss_00000.index",
                                                "faiss_00001.index"]
  index = ShardedIndex.load(tmp_path, info)
  index.set_options("test", nprobe=4)
  _, rows = index.search(queries, 10)
  np.testing.assert_array_equal(rows, _brute_force(vectors, queries, 10)[1])
  index.set_options("test", nprobe=1)  # fewer lists: a different answer
  assert not np.array_equal(index.search(queries, 10)[1], rows)
  with pytest.raises(InputError, match="nprobe needs a number"):
    index.set_options("test", nprobe="many")


def test_factory_strings_build(tmp_path):
  rng = np.random.default_rng(1)
  vectors = rng.standard_normal((3000, 32)).astype(np.float32)
  queries = vectors[:50] + 0.01 * rng.standard_normal((50, 32)).astype(
      np.float32)
  store = _store(tmp_path, vectors, shard_size=1000)
  want = _brute_force(vectors, queries, 10)[1]
  hnsw = tmp_path / "hnsw"
  hnsw.mkdir()
  info = build_faiss_index(store, hnsw, factory="HNSW32", progress=False)
  index = ShardedIndex.load(hnsw, info, mmap=False)
  index.set_options("test", ef_search=128)
  _, rows = index.search(queries, 10)
  recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, want)])
  assert recall > 0.9
  pq = tmp_path / "pq"
  pq.mkdir()
  info = build_faiss_index(store, pq, factory="IVF16,PQ8np", train_size=2000,
                           progress=False)
  assert info["train_size"] == 2000
  index = ShardedIndex.load(pq, info)
  index.set_options("test", nprobe=16)
  _, rows = index.search(queries, 10)
  assert (rows >= 0).all()
  assert np.mean(rows[:, 0] == np.arange(50)) > 0.8  # the query's own vector
  with pytest.raises(InputError, match="does not apply"):
    ShardedIndex.load(hnsw, build_faiss_index(
        store, hnsw, factory="HNSW8", progress=False)).set_options(
            "test", nprobe=2)


def test_bad_factory_is_an_input_error(tmp_path, data):
  store = _store(tmp_path, data[0])
  with pytest.raises(InputError, match="FAISS cannot build 'IVFoops'"):
    build_faiss_index(store, tmp_path, factory="IVFoops", progress=False)


def test_embedding_store_rows_and_float16(tmp_path, data):
  vectors = data[0]
  store = _store(tmp_path, vectors, shard_size=64, dtype="float16")
  assert store.num_shards == 5 and len(store) == 300
  assert (tmp_path / shard_name(4)).is_file()
  rows = [299, 0, 64, 65, 130, 3]
  np.testing.assert_allclose(store[rows], vectors[rows], atol=1e-2)
  assert store[rows].dtype == np.float32
  np.testing.assert_array_equal(store.rows(60, 140), store[np.arange(60, 140)])
  assert store.sample(10).shape == (10, 24)
  with pytest.raises(IndexError):
    store[[300]]


def test_shard_writer_keeps_only_matching_shards(tmp_path, data):
  vectors = data[0]
  _store(tmp_path, vectors)
  same = ShardWriter(tmp_path, 300, 24, shard_size=37, source={"test": 1})
  assert same.missing() == []
  (tmp_path / shard_name(2)).unlink()
  assert ShardWriter(tmp_path, 300, 24, shard_size=37,
                     source={"test": 1}).missing() == [2]
  other = ShardWriter(tmp_path, 300, 24, shard_size=37, source={"test": 2})
  assert other.missing() == list(range(other.num_shards))
  assert not list(tmp_path.glob("embeddings_*.npy"))
