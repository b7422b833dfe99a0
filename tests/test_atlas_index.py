"""jaxfid/atlas/index.py: the device-resident passage index sharded over the
mesh: exact top-k against numpy, built on device, saved and re-sharded."""
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
  assert index.rows % m.size == 0 and index.rows % 4 == 0 and index.rows >= 37
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
