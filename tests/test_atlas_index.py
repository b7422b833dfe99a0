"""jaxfid/atlas/index.py: the device-resident passage index sharded over the
mesh: exact top-k against numpy, built on device, saved and re-sharded."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.atlas.index import PassageIndex, load_index, read_meta, save_index
from jaxfid.core import sharding as shd


def _exact(vectors, queries, k):
  scores = queries @ vectors.T
  order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, order, 1), order


@pytest.mark.parametrize("mesh", ["", "data=2,model=4", "data=1"])
def test_sharded_search_is_the_exact_top_k(mesh):
  rng = np.random.default_rng(0)
  vectors = rng.standard_normal((37, 8)).astype(np.float32)
  queries = rng.standard_normal((5, 8)).astype(np.float32)
  m = shd.parse_mesh(mesh)
  index = PassageIndex(m, 37, 8, "float32", batch_size=4)
  # J steps of b' <= B passages a device, padding under one row a device a step
  assert index.rows == m.size * index.steps * index.local_batch
  assert index.local_batch <= 4 and 0 <= index.rows - 37 < m.size * index.steps
  index.set_rows(vectors)
  if m.size == 8:
    assert len(index.embeddings.addressable_shards) == 8
    assert index.embeddings.addressable_shards[0].data.shape == (
        index.rows // 8, 8)
  scores, ids = index.search(jnp.asarray(queries), 7)
  want_scores, want_ids = _exact(vectors, queries, 7)
  np.testing.assert_array_equal(np.asarray(ids), want_ids)
  np.testing.assert_allclose(np.asarray(scores), want_scores, rtol=1e-5)


def test_build_embeds_every_row_on_device_and_bfloat16_keeps_the_ranking():
  rng = np.random.default_rng(1)
  table = rng.standard_normal((50, 6)).astype(np.float32)
  tokens = rng.integers(0, 50, (23, 3)).astype(np.int32)
  embed = lambda p, t: jnp.take(p, t, axis=0).sum(1)  # [b, P] -> [b, D]
  index = PassageIndex(shd.parse_mesh(""), 23, 6, "bfloat16", batch_size=8)
  index.build(embed, jnp.asarray(table), tokens)
  want = table[tokens].sum(1)
  got = index.host_rows().astype(np.float32)
  np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
  queries = rng.standard_normal((4, 6)).astype(np.float32)
  _, ids = index.search(jnp.asarray(queries), 3)
  bf = np.asarray(jnp.asarray(want, jnp.bfloat16).astype(jnp.float32))
  q = np.asarray(jnp.asarray(queries, jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_array_equal(np.asarray(ids), _exact(bf, q, 3)[1])


def _mlp_embed(p, t):                               # [b, P] -> [b, D]
  h = jnp.take(p["table"], t, axis=0).sum(1)                     # [b, E]
  return jnp.tanh(h @ p["w1"]) @ p["w2"]                          # [b, D]


def _mlp_params(rng, e=8, h=64, d=6):
  return {"table": jnp.asarray(rng.standard_normal((40, e)), jnp.float32),
          "w1": jnp.asarray(rng.standard_normal((e, h)), jnp.float32),
          "w2": jnp.asarray(rng.standard_normal((h, d)), jnp.float32)}


def test_a_build_on_8_devices_equals_the_build_on_one():
  """int8: the embeddings, their quantisation and both writes (codes and
  scales) bit for bit; the other dtypes write as the codes do."""
  rng = np.random.default_rng(7)
  params = _mlp_params(rng)
  tokens = rng.integers(0, 40, (37, 3)).astype(np.int32)
  queries = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)
  built = {}
  for mesh in ("data=1", ""):
    index = PassageIndex(shd.parse_mesh(mesh), 37, 6, "int8", batch_size=3)
    done = []
    index.build(_mlp_embed, params, tokens, done.append)
    assert len(done) == index.steps and sum(done) == 37
    built[mesh] = index
  one = built["data=1"]
  assert (one.steps, one.local_batch) == (13, 3)
  assert (built[""].steps, built[""].local_batch) == (2, 3)  # 48 rows
  index = built[""]
  np.testing.assert_array_equal(index.host_rows(), one.host_rows())
  np.testing.assert_array_equal(index.host_scales(), one.host_scales())
  for a, b in zip(index.search(queries, 5), one.search(queries, 5)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_each_device_embeds_only_its_own_rows():
  """Per device a build on 8 devices costs 1/8 of the build on one (the
  write program given replicated tokens ran every passage on every
  device), and the write into the shards moves nothing between devices."""
  rng = np.random.default_rng(8)
  params = _mlp_params(rng)
  tokens = rng.integers(0, 40, (128, 3)).astype(np.int32)
  flops = {}
  for mesh in ("data=1", ""):
    index = PassageIndex(shd.parse_mesh(mesh), 128, 6, "bfloat16",
                         batch_size=8)
    compiled = index.write_program(_mlp_embed).lower(
        index.zeros(), params, index.step_tokens(tokens, 0),
        np.int32(0)).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops[mesh] = cost["flops"] * index.steps            # per device
    hlo = compiled.as_text()
    for collective in ("all-gather", "all-reduce", "all-to-all",
                       "collective-permute", "reduce-scatter"):
      assert collective not in hlo, (mesh, collective)
  assert 0.1 < flops[""] / flops["data=1"] < 0.15, flops


def test_a_saved_index_reloads_exactly_on_another_device_count(tmp_path):
  rng = np.random.default_rng(2)
  vectors = rng.standard_normal((19, 4)).astype(np.float32)
  index = PassageIndex(shd.parse_mesh(""), 19, 4, "bfloat16", batch_size=2)
  index.set_rows(vectors)
  assert read_meta(str(tmp_path / "ix")) is None
  save_index(index, str(tmp_path / "ix"), step=3)
  assert read_meta(str(tmp_path / "ix"))["step"] == 3
  small = load_index(str(tmp_path / "ix"), shd.parse_mesh("data=2"))
  assert small.shards == 2
  np.testing.assert_array_equal(small.host_rows().view(np.uint16),
                                index.host_rows().view(np.uint16))
  queries = jnp.asarray(rng.standard_normal((3, 4)), jnp.float32)
  for a, b in zip(small.search(queries, 5), index.search(queries, 5)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- int8 storage ---------------------------------------------------------------


def _quantize_reference(x):
  """Symmetric per-row int8 in numpy: codes round(x / s), s = max|x| / 127."""
  x = np.asarray(x, np.float32)
  scales = np.abs(x).max(1) / np.float32(127)
  safe = np.where(scales > 0, scales, np.float32(1))
  codes = np.clip(np.round(x / safe[:, None]), -127, 127).astype(np.int8)
  return codes, scales.astype(np.float32)


@pytest.mark.parametrize("mesh", ["", "data=2"])
def test_int8_search_is_the_exact_top_k_of_the_quantised_rows(mesh):
  rng = np.random.default_rng(3)
  vectors = rng.standard_normal((41, 8)).astype(np.float32)
  vectors[5] = 0.0                                    # a zero row: scale 0
  queries = rng.standard_normal((6, 8)).astype(np.float32)
  m = shd.parse_mesh(mesh)
  index = PassageIndex(m, 41, 8, "int8", batch_size=4)
  index.set_rows(vectors)
  codes, scales = _quantize_reference(vectors)
  assert scales[5] == 0 and not codes[5].any()
  np.testing.assert_array_equal(index.host_rows(), codes)
  np.testing.assert_allclose(index.host_scales(), scales, rtol=1e-6)
  assert index.embeddings.dtype == jnp.int8
  assert tuple(index.scales.sharding.spec) == tuple(
      index.embeddings.sharding.spec)[:1]
  assert index.device_bytes() == index.rows // m.size * (8 + 4)
  scores, ids = index.search(jnp.asarray(queries), 9)
  want_scores, want_ids = _exact(codes.astype(np.float32) * scales[:, None],
                                 queries, 9)
  np.testing.assert_array_equal(np.asarray(ids), want_ids)
  np.testing.assert_allclose(np.asarray(scores), want_scores, rtol=1e-5,
                             atol=1e-6)


def test_int8_keeps_the_float_top_k_of_random_vectors():
  rng = np.random.default_rng(4)
  vectors = rng.standard_normal((2000, 64)).astype(np.float32)
  queries = rng.standard_normal((32, 64)).astype(np.float32)
  index = PassageIndex(shd.parse_mesh(""), 2000, 64, "int8", batch_size=8)
  index.set_rows(vectors)
  _, ids = index.search(jnp.asarray(queries), 10)
  want = _exact(vectors, queries, 10)[1]
  recall = np.mean([len(set(a) & set(b)) / 10
                    for a, b in zip(np.asarray(ids), want)])
  assert recall >= 0.95, recall


def test_int8_build_quantises_on_device():
  rng = np.random.default_rng(5)
  table = rng.standard_normal((30, 6)).astype(np.float32)
  tokens = rng.integers(0, 30, (13, 3)).astype(np.int32)
  embed = lambda p, t: jnp.take(p, t, axis=0).sum(1)  # [b, P] -> [b, D]
  index = PassageIndex(shd.parse_mesh(""), 13, 6, "int8", batch_size=4)
  index.build(embed, jnp.asarray(table), tokens)
  codes, scales = _quantize_reference(table[tokens].sum(1))
  np.testing.assert_allclose(index.host_scales(), scales, rtol=1e-6)
  assert np.abs(index.host_rows().astype(int) - codes).max() <= 1


def test_a_saved_int8_index_is_a_quarter_of_float32_and_reshards(tmp_path):
  rng = np.random.default_rng(6)
  vectors = rng.standard_normal((53, 32)).astype(np.float32)
  queries = jnp.asarray(rng.standard_normal((4, 32)), jnp.float32)
  sizes = {}
  for dtype in ("float32", "bfloat16", "int8"):
    index = PassageIndex(shd.parse_mesh(""), 53, 32, dtype, batch_size=2)
    assert index.shards == 8
    index.set_rows(vectors)
    save_index(index, str(tmp_path / dtype), step=1)
    sizes[dtype] = sum(f.stat().st_size for f in (tmp_path / dtype).iterdir()
                       if f.name != "meta.json")
  # the codes (53 x 32 bytes) and scales (53 x 4): D + 4 bytes a row
  assert sizes["int8"] - 2 * 128 == 53 * (32 + 4)       # two .npy headers
  assert sizes["float32"] - 128 == 53 * 32 * 4
  assert sizes["bfloat16"] - 128 == 53 * 32 * 2
  assert read_meta(str(tmp_path / "int8"))["dtype"] == "int8"
  hits = index.search(queries, 6)
  for mesh in ("data=2", "data=1"):
    loaded = load_index(str(tmp_path / "int8"), shd.parse_mesh(mesh))
    assert loaded.shards == int(mesh[-1]) and loaded.quantized
    np.testing.assert_array_equal(loaded.host_rows(), index.host_rows())
    np.testing.assert_array_equal(loaded.host_scales(), index.host_scales())
    scores, ids = loaded.search(queries, 6)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(hits[1]))
    # the same products, summed in another order on another shard shape
    np.testing.assert_allclose(np.asarray(scores), np.asarray(hits[0]),
                               rtol=1e-6)


# ---- blocked search ---------------------------------------------------------


@pytest.mark.parametrize("dtype,k", [("float32", 20), ("int8", 5)])
def test_a_blocked_search_gives_the_hits_and_ties_of_one_top_k(dtype, k):
  """R/S = 52 rows a device: 7 blocks of 8 (k=5; the last starts at 44, its
  rows 44..47 scored already) or 3 of k=20 (the last starts at 32), against
  one block of 52."""
  rng = np.random.default_rng(9)
  vectors = rng.integers(-2, 3, (103, 4)).astype(np.float32)  # many ties
  queries = jnp.asarray(rng.integers(-2, 3, (6, 4)), jnp.float32)
  m = shd.parse_mesh("data=2")
  whole = PassageIndex(m, 103, 4, dtype, batch_size=4)
  blocked = PassageIndex(m, 103, 4, dtype, batch_size=4, search_block=8)
  assert whole.local_rows == 52 and whole.search_block >= 52
  for index in (whole, blocked):
    index.set_rows(vectors)
  scores, ids = (np.asarray(a) for a in blocked.search(queries, k))
  want_scores, want_ids = (np.asarray(a) for a in whole.search(queries, k))
  assert (np.diff(want_scores, axis=1) == 0).any()        # ties among the hits
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_array_equal(scores, want_scores)
  if dtype == "float32":  # ties to the lower id, as numpy's stable sort
    np.testing.assert_array_equal(ids, _exact(vectors, np.asarray(queries),
                                              k)[1])


def test_a_blocked_search_holds_a_block_of_scores_not_the_shards():
  """int8: [Q, R/S] float32 scores (4 MiB here) and a float32 copy of the
  codes unblocked; blocks of 1,024 rows hold about an eighth of the scores
  (and a block's copy)."""
  m = shd.parse_mesh("data=2")
  temp = {}
  for block in (32768, 1024):
    index = PassageIndex(m, 32768, 16, "int8", search_block=block)
    args = (jax.ShapeDtypeStruct((64, 16), jnp.float32,
                                 sharding=index.replicated),
            jax.ShapeDtypeStruct((index.rows, 16), jnp.int8,
                                 sharding=index.sharding),
            jax.ShapeDtypeStruct((index.rows,), jnp.float32,
                                 sharding=index.row_sharding))
    compiled = index.search_program(10).lower(*args).compile()
    temp[block] = compiled.memory_analysis().temp_size_in_bytes
  scores = 64 * 16384 * 4                                # [Q, R/S] float32
  assert temp[32768] >= scores and temp[1024] < scores / 6, temp
