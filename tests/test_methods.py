"""jaxfid.methods: every plug-in registered; a missing one is a clear error."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

import jaxfid.methods
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.load import load_checkpoint
from jaxfid.core.errors import InputError
from jaxfid.core.registry import Registry
from jaxfid.dual_encoder.checkpoint import dual_encoder_run_config
from jaxfid.dual_encoder.model import DualEncoder, DualEncoderConfig
from jaxfid.retrieval.search import open_index
from jaxfid.t5.config import preset


def test_every_plugin_is_registered():
  assert jaxfid.methods.INDEX_TYPES.names() == ["bm25", "dense", "reatt"]
  assert jaxfid.methods.METHOD_LOADERS.names() == [
      "dual_encoder", "fid", "reatt", "refusion"]


def test_an_unregistered_name_says_what_to_import(tmp_path):
  registry = Registry("widget", "import jaxfid.widgets")
  with pytest.raises(InputError, match=r"no widget 'x' is registered "
                     r"\(known: none\); import jaxfid.widgets"):
    registry.get("x")
  (tmp_path / "index").mkdir()
  (tmp_path / "index" / "meta.json").write_text('{"type": "sparse-2030"}')
  with pytest.raises(InputError) as e:
    open_index(tmp_path / "index")
  assert str(e.value) == (
      f"{tmp_path / 'index'}: no index type 'sparse-2030' is registered "
      "(known: bm25, dense, reatt); import jaxfid.methods, which registers "
      "every index type")
  checkpointing.write_run_config(tmp_path / "run", {"method": "rag-2030"})
  with pytest.raises(InputError, match="jaxfid_config.json: no MODEL_DIR "
                     "loader for method 'rag-2030' is registered"):
    load_checkpoint(tmp_path / "run")


def test_a_dual_encoder_model_dir_loads_as_its_t5(tmp_path):
  encoder = DualEncoder(preset("tiny", dropout_rate=0.0), DualEncoderConfig())
  params = encoder.init_params(0)
  model_dir = str(tmp_path / "dual")
  checkpointing.write_run_config(model_dir, dual_encoder_run_config(encoder))
  assert json.loads((tmp_path / "dual" / "jaxfid_config.json").read_text())[
      "method"] == "dual_encoder"
  ckpts = checkpointing.RunCheckpoints(model_dir)
  ckpts.save(1, {"step": jnp.ones((), jnp.int32), "params": params})
  ckpts.close()
  model, loaded, _ = load_checkpoint(model_dir)
  assert model.config.num_decoder_layers == 0
  np.testing.assert_array_equal(
      loaded["encoder"]["encoder_norm"]["scale"],
      params["encoder"]["encoder_norm"]["scale"])
