"""jaxfid.methods: every plug-in registered; a missing one is a clear error."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.load import load_checkpoint
import jaxfid.cli  # registers the shared commands; imports jaxfid.methods
from jaxfid.commands import bench, gin_specs, registry, seqio_eval
from jaxfid.core.errors import InputError
from jaxfid.core.registry import Registry
from jaxfid.dual_encoder.checkpoint import dual_encoder_run_config
from jaxfid.dual_encoder.model import DualEncoder, DualEncoderConfig
import jaxfid.methods
from jaxfid.reader.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.refusion.checkpoint_eval import ReFusionCheckpointEvaluator
from jaxfid.retrieval import search
from jaxfid.retrieval.search import open_index
from jaxfid.t5.config import preset


def test_every_plugin_is_registered():
  assert jaxfid.methods.INDEX_TYPES.names() == [
      "atlas", "bm25", "dense", "reatt"]
  # the one index type with a device search (jaxfid retrieve --device)
  assert search.DEVICE_SEARCH == {"atlas"}
  assert search.INDEX_TYPES.get("atlas").__module__ == (
      "jaxfid.atlas.index_search")
  assert jaxfid.methods.METHOD_LOADERS.names() == [
      "atlas", "dual_encoder", "fid", "reatt", "refusion"]


# what each method's plugin registers: commands (with the gin reads of its
# gin-driven subcommands), `jaxfid index` types, `jaxfid eval` evaluators
PLUGINS = {
    "fid": ({"predict": (), "plot": (), "demo": ("demo",)}, (),
            FidCheckpointEvaluator),
    "dual_encoder": ({}, ("dense",), None),
    "reatt": ({"reatt": ("reatt iterate",)}, ("reatt",),
              FidCheckpointEvaluator),
    "refusion": ({"refusion": ("refusion seeds",)}, (),
                 ReFusionCheckpointEvaluator),
    "atlas": ({}, (), FidCheckpointEvaluator),
}
# plug-ins that are not methods of their own: commands only
TOOLS = {"distill": {"distill": ("distill iterate",)},
         "serving": {"serve": ()}}
SHARED = {"convert": (), "train": ("train",), "eval": ("eval",),
          "index": (), "retrieve": (), "corpus": (), "eval-retrieval": (),
          "bench": ("bench", "bench compile")}
# `jaxfid bench`'s modes: the shared one and each method's (module prefix)
BENCH_MODES = {"compile": "jaxfid.aot.", "train": "jaxfid.fid.",
               "decode": "jaxfid.fid."}


@pytest.mark.parametrize("method", sorted(PLUGINS))
def test_each_method_registers_what_it_offers(method):
  commands, index_types, evaluator = PLUGINS[method]
  plugin = f"jaxfid.{method}.plugin"
  for name, gin_commands in commands.items():
    command = registry.COMMANDS.get(name)
    assert command.add_parser.__module__.startswith(f"jaxfid.{method}.")
    assert sorted(command.gin) == list(gin_commands)
  for name in index_types:
    assert registry.INDEX_COMMANDS.get(name).__module__ == (
        f"jaxfid.{method}.commands")
  if evaluator is None:
    assert method not in seqio_eval.METHODS
  else:
    assert seqio_eval.METHODS.get(method) is evaluator
  assert method in jaxfid.methods.METHOD_LOADERS
  assert __import__(plugin, fromlist=["METHOD"]).METHOD == method


@pytest.mark.parametrize("package", sorted(TOOLS))
def test_each_tool_registers_its_commands(package):
  for name, gin_commands in TOOLS[package].items():
    command = registry.COMMANDS.get(name)
    assert command.add_parser.__module__.startswith(f"jaxfid.{package}.")
    assert sorted(command.gin) == list(gin_commands)
  assert package not in jaxfid.methods.METHOD_LOADERS


def test_the_registered_commands_are_the_methods_and_the_shared_ones():
  methods = {n for c, _, _ in PLUGINS.values() for n in c}
  methods |= {n for c in TOOLS.values() for n in c}
  assert {c.name for c in registry.commands()} == methods | set(SHARED)
  for name, gin_commands in SHARED.items():
    command = registry.COMMANDS.get(name)
    assert command.add_parser.__module__.startswith("jaxfid.commands.")
    assert sorted(command.gin) == list(gin_commands)
  # `jaxfid --help`'s order, and the CPU malloc tuning of the model commands
  assert [c.name for c in registry.commands()] == [
      "convert", "predict", "train", "eval", "index", "retrieve", "corpus",
      "eval-retrieval", "plot", "bench", "demo", "serve", "reatt", "distill",
      "refusion"]
  assert jaxfid.cli.MODEL_COMMANDS == {
      "train", "predict", "eval", "bench", "demo", "reatt", "distill",
      "refusion", "serve"}
  assert [n for n, _ in registry.INDEX_COMMANDS.items()] == ["dense", "reatt"]
  assert set(gin_specs.COMMANDS) == {
      "train", "eval", "bench", "bench compile", "demo", "reatt iterate",
      "distill iterate", "refusion seeds"}
  assert sorted(bench.MODES.names()) == sorted(BENCH_MODES)
  for name, module in BENCH_MODES.items():
    assert bench.MODES.get(name).run.__module__.startswith(module)
  assert set(gin_specs.COMMANDS["eval"].roots) == {
      seqio_eval.evaluate, FidCheckpointEvaluator, ReFusionCheckpointEvaluator}


def test_a_command_name_or_place_is_registered_once():
  train = registry.COMMANDS.get("train")
  assert registry.register_command(train) is train  # the same one again
  with pytest.raises(ValueError, match="clashes with the registered 'train'"):
    registry.register_command(registry.Command("train", train.add_parser, 999))
  with pytest.raises(ValueError, match=r"'x' \(order 30\) clashes"):
    registry.register_command(registry.Command("x", train.add_parser, 30))
  assert "x" not in registry.COMMANDS


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
      "(known: atlas, bm25, dense, reatt); import jaxfid.methods, which "
      "registers every index type")
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
