"""T5X checkpoints (msgpack + TensorStore, orbax) load to the HF parameters.

The T5X files are written in the test (``write_t5x``, or by hand with flax
serialisation, TensorStore and orbax where a layout ``write_t5x`` does not
produce is needed) from a random HF checkpoint; reading them must give
exactly the parameters ``read_hf`` gives for that HF checkpoint.
"""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import serialization

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.checkpoints import detect_format, load_flat, read_hf, t5x, write_t5x
from jaxfid.checkpoints.t5x import read_t5x
from jaxfid.core.errors import InputError


@pytest.fixture(scope="module")
def v11(tmp_path_factory):
  hf = make_tiny_hf_checkpoint(tmp_path_factory.mktemp("v11") / "hf",
                               version="1.1", num_heads=3)
  return read_hf(hf)


@pytest.fixture(scope="module")
def v10(tmp_path_factory):
  hf = make_tiny_hf_checkpoint(tmp_path_factory.mktemp("v10") / "hf",
                               version="1.0")
  return read_hf(hf)


def _assert_same(a, b):
  assert set(a) == set(b)
  for name in a:
    assert b[name].dtype == np.float32
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _nest(flat):
  tree = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


@pytest.mark.parametrize("which", ["v11", "v10"])
def test_t5x_layout_loads_to_the_hf_parameters(which, request, tmp_path):
  fields, flat = request.getfixturevalue(which)
  ckpt = write_t5x(tmp_path / "model", fields, flat, step=1200,
                   inline_max_elements=64)
  assert ckpt == tmp_path / "model" / "checkpoint_1200"
  # The on-disk layout T5X's Checkpointer writes.
  contents = serialization.msgpack_restore((ckpt / "checkpoint").read_bytes())
  assert contents["version"] == 3
  target = contents["optimizer"]["target"]
  assert int(contents["optimizer"]["state"]["step"]) == 1200
  spec = target["encoder"]["layers_0"]["attention"]["query"]["kernel"]
  assert spec["driver"] == "zarr" and spec["kvstore"]["driver"] == "file"
  assert spec["kvstore"]["path"].startswith(
      "target.encoder.layers_0.attention.query.kernel")
  zarray = json.loads((ckpt / "target.encoder.layers_0.attention.query.kernel"
                       / ".zarray").read_text())
  assert zarray["compressor"]["id"] == "gzip"
  assert zarray["shape"] == list(flat["encoder/layers_0/attention/query/"
                                      "kernel"].shape)
  inline = target["encoder"]["encoder_norm"]["scale"]
  assert isinstance(inline, np.ndarray)  # small arrays inline in msgpack
  for path in (tmp_path / "model", ckpt, ckpt / "checkpoint"):
    got_fields, got = read_t5x(path)
    assert got_fields == fields
    _assert_same(flat, got)
  assert detect_format(tmp_path / "model") == "t5x"
  assert detect_format(ckpt) == "t5x"


def test_orbax_layout(v11, tmp_path):
  fields, flat = v11
  write_t5x(tmp_path / "model", fields, flat, step=7, use_orbax=True)
  assert detect_format(tmp_path / "model") == "t5x-orbax"
  got_fields, got = read_t5x(tmp_path / "model")
  assert got_fields == fields
  _assert_same(flat, got)
  # an orbax item directory inside the step directory
  item_tree = {"target": _nest(flat), "state": {"step": np.int32(3)}}
  step_dir = tmp_path / "items" / "checkpoint_3"
  ocp.PyTreeCheckpointer().save(str((step_dir / "state").resolve()),
                                item_tree)
  assert t5x.locate(tmp_path / "items") == (step_dir / "state", "orbax")
  _assert_same(flat, read_t5x(tmp_path / "items")[1])


def test_orbax_sharded_arrays_load_on_another_topology(v11, tmp_path):
  """Arrays saved sharded over 8 devices load in a 1-device process."""
  fields, flat = v11
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
  assert mesh.size == 8

  def place(array):
    spec = jax.sharding.PartitionSpec("x" if array.shape[0] % 8 == 0 else None)
    return jax.device_put(array, jax.sharding.NamedSharding(mesh, spec))

  tree = {"target": _nest({k: place(v) for k, v in flat.items()}),
          "state": {"step": np.int32(1)}}
  ocp.PyTreeCheckpointer().save(str((tmp_path / "checkpoint_1").resolve()),
                                tree)
  script = ("import sys, numpy as np\n"
            "from jaxfid.checkpoints import read_t5x\n"
            "fields, flat = read_t5x(sys.argv[1])\n"
            "np.savez(sys.argv[2], **{k.replace('/', '|'): v "
            "for k, v in flat.items()})\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=os.pathsep.join(sys.path))
  subprocess.run([sys.executable, "-c", script, str(tmp_path / "checkpoint_1"),
                  str(tmp_path / "out.npz")], check=True, env=env,
                 timeout=120)
  with np.load(tmp_path / "out.npz") as out:
    _assert_same(flat, {k.replace("|", "/"): out[k] for k in out.files})


def test_latest_step_is_read(v10, tmp_path):
  fields, flat = v10
  older = dict(flat)
  older["encoder/encoder_norm/scale"] = flat["encoder/encoder_norm/scale"] + 1
  write_t5x(tmp_path / "model", fields, older, step=900)
  write_t5x(tmp_path / "model", fields, flat, step=10000)
  write_t5x(tmp_path / "model", fields, older, step=2000)
  (tmp_path / "model" / "checkpoint_99999.tmp-123").mkdir()  # unfinished
  assert [s for s, _ in t5x.step_dirs(tmp_path / "model")] == [900, 2000,
                                                              10000]
  _assert_same(flat, read_t5x(tmp_path / "model")[1])
  with pytest.raises(InputError, match="already exists"):
    write_t5x(tmp_path / "model", fields, flat, step=900)


def test_gin_activations_and_dropout(v11, tmp_path):
  fields, flat = v11
  relu = dict(fields, feed_forward_proj="gated-relu", dropout_rate=0.0)
  write_t5x(tmp_path / "model", relu, flat)
  assert "('relu', 'linear')" in (tmp_path / "model" / "config.gin").read_text()
  assert read_t5x(tmp_path / "model")[0] == relu
  # a T5X-style gin with macros
  (tmp_path / "model" / "config.gin").write_text(
      "# Macros:\n# mlp_activations = ('silu',)\nDROPOUT_RATE = 0.25\n"
      "MLP_ACTIVATIONS = ['relu', 'linear']\n"
      "network.T5Config.mlp_activations = %MLP_ACTIVATIONS\n")
  assert read_t5x(tmp_path / "model")[0] == dict(relu, dropout_rate=0.25)
  (tmp_path / "model" / "config.gin").unlink()  # T5.1.1 defaults without gin
  assert read_t5x(tmp_path / "model")[0] == dict(fields, dropout_rate=0.1)


def _write_msgpack_checkpoint(ckpt_dir, target):
  ckpt_dir.mkdir(parents=True)
  (ckpt_dir / "checkpoint").write_bytes(serialization.msgpack_serialize(
      {"version": 3, "optimizer": {"target": target,
                                   "state": {"step": np.int32(1)}}}))


def test_three_dimensional_attention_kernels(v11, tmp_path):
  fields, flat = v11
  heads, d_kv = fields["num_heads"], fields["d_kv"]
  stored = {}
  for path, array in flat.items():
    if path.endswith(("query/kernel", "key/kernel", "value/kernel")):
      array = array.reshape(array.shape[0], heads, d_kv)
    elif path.endswith("out/kernel"):
      array = array.reshape(heads, d_kv, array.shape[1])
    stored[path] = array
  _write_msgpack_checkpoint(tmp_path / "checkpoint_1", _nest(stored))
  got_fields, got = read_t5x(tmp_path / "checkpoint_1")
  assert got_fields == fields
  _assert_same(flat, got)


def test_old_orbax_placeholder_leaves(v10, tmp_path):
  """Older orbax aggregate files name each array's zarr directory."""
  import tensorstore as ts
  fields, flat = v10
  ckpt = tmp_path / "checkpoint_2"
  leaves = {}
  for path, array in flat.items():
    if array.ndim == 2:
      name = "target." + path.replace("/", ".")
      store = ts.open({"driver": "zarr", "kvstore": {
          "driver": "file", "path": str(ckpt / name)}, "metadata": {
              "shape": list(array.shape), "dtype": "<f4"}},
                      create=True).result()
      store.write(array).result()
      leaves[path] = "PLACEHOLDER://" + name
    else:
      leaves[path] = array
  (ckpt / "checkpoint").write_bytes(serialization.msgpack_serialize(
      {"target": _nest(leaves), "state": {"step": 2}}))
  got_fields, got = read_t5x(tmp_path)
  assert got_fields == fields
  _assert_same(flat, got)


@pytest.mark.parametrize("case", ["scanned", "missing-array", "shape",
                                  "scale-shape",
                                  "unexpected", "no-target", "tf", "garbage",
                                  "empty"])
def test_bad_t5x_checkpoints(case, v11, tmp_path):
  fields, flat = v11
  ckpt = tmp_path / "checkpoint_5"
  file = ckpt / "checkpoint"
  expect = [str(file)]
  if case == "scanned":
    scanned = {k: v for k, v in flat.items() if "/layers_" not in k}
    scanned["encoder/layers/attention/query/kernel"] = np.zeros((32, 2, 24),
                                                                np.float32)
    _write_msgpack_checkpoint(ckpt, _nest(scanned))
    expect += ["scanned-layer T5X checkpoints", "not supported"]
  elif case == "missing-array":
    write_t5x(tmp_path, fields, flat, step=5)
    array_dir = ckpt / "target.decoder.layers_1.mlp.wo.kernel"
    for child in array_dir.iterdir():
      child.unlink()
    array_dir.rmdir()
    expect = [str(array_dir), "missing TensorStore array for parameter "
              "decoder/layers_1/mlp/wo/kernel"]
  elif case == "shape":
    bad = dict(flat)
    bad["decoder/layers_1/mlp/wo/kernel"] = np.zeros((63, 32), np.float32)
    _write_msgpack_checkpoint(ckpt, _nest(bad))
    expect += ["parameter target/decoder/layers_1/mlp/wo/kernel has shape "
               "[63, 32], expected [64, 32]"]
  elif case == "scale-shape":
    bad = dict(flat)
    bad["encoder/encoder_norm/scale"] = np.zeros((31,), np.float32)
    _write_msgpack_checkpoint(ckpt, _nest(bad))
    expect += ["parameter target/encoder/encoder_norm/scale has shape [31], "
               "expected [32]"]
  elif case == "unexpected":
    bad = dict(flat)
    bad["decoder/layers_1/mlp/wo/bias"] = np.zeros((32,), np.float32)
    _write_msgpack_checkpoint(ckpt, _nest(bad))
    expect += ["unexpected parameter target/decoder/layers_1/mlp/wo/bias"]
  elif case == "no-target":
    _write_msgpack_checkpoint(ckpt, {"something": np.zeros(3)})
    expect += ["no model parameters"]
  elif case == "tf":
    ckpt.mkdir()
    file.write_text('model_checkpoint_path: "model.ckpt-1000000"\n')
    expect += ["TensorFlow checkpoint"]
  elif case == "garbage":
    ckpt.mkdir()
    file.write_bytes(b"\xc1\x00\x01 not msgpack")
    expect += ["not a T5X msgpack checkpoint"]
  elif case == "empty":
    ckpt.mkdir()
    expect = [str(ckpt), "not a T5X checkpoint"]
  with pytest.raises(InputError) as e:
    read_t5x(ckpt)
  text = str(e.value)
  assert "\n" not in text
  assert text.startswith(expect[0]), text
  for part in expect:
    assert part in text, (part, text)


def test_load_flat_finds_spiece(v10, tmp_path):
  fields, flat = v10
  write_t5x(tmp_path / "model", fields, flat, step=3)
  assert load_flat(tmp_path / "model")[2] is None
  (tmp_path / "model" / "spiece.model").write_bytes(b"x")
  got_fields, got, spiece = load_flat(tmp_path / "model" / "checkpoint_3")
  assert spiece == tmp_path / "model" / "spiece.model"
  assert got_fields == fields
  _assert_same(flat, got)
