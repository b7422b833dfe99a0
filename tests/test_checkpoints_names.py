"""The rename table and the configuration mappings of jaxfid.checkpoints."""
import numpy as np
import pytest
import transformers

from jaxfid.checkpoints import configs, names
from jaxfid.core.errors import InputError

V11 = dict(vocab_size=160, d_model=32, d_kv=8, d_ff=64, num_heads=3,
           num_layers=2, num_decoder_layers=3, feed_forward_proj="gated-gelu",
           tie_word_embeddings=False, relative_attention_num_buckets=32,
           relative_attention_max_distance=128, layer_norm_epsilon=1e-6,
           dropout_rate=0.1)
V10 = dict(V11, feed_forward_proj="relu", tie_word_embeddings=True,
           num_heads=4)


def test_renames_cover_every_hf_parameter_of_the_config():
  pytest.importorskip("torch")  # builds transformers' (PyTorch) T5
  for fields, version in ((V11, "gated-gelu"), (V10, "relu")):
    hf_config = transformers.T5Config(**{
        k: v for k, v in fields.items() if k != "tie_word_embeddings"},
        tie_word_embeddings=fields["tie_word_embeddings"])
    assert hf_config.feed_forward_proj == version
    model = transformers.T5ForConditionalGeneration(hf_config)
    hf_shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    table = names.renames(fields)
    shapes = names.param_shapes(fields)
    assert [r.path for r in table] == list(shapes)
    assert len({r.hf for r in table}) == len(table)
    for rename in table:
      assert names.hf_shape(rename, shapes[rename.path]) == hf_shapes[
          rename.hf], rename
    covered = {r.hf for r in table} | set(names.HF_EMBEDDING_COPIES)
    if fields["tie_word_embeddings"]:
      covered.add("lm_head.weight")
    assert covered == set(hf_shapes)


def test_param_shapes_follow_the_t5x_layout():
  shapes = names.param_shapes(V11)
  assert shapes["token_embedder/embedding"] == (160, 32)
  assert shapes["encoder/relpos_bias/rel_embedding"] == (3, 32)
  assert shapes["encoder/layers_1/attention/query/kernel"] == (32, 24)
  assert shapes["encoder/layers_1/attention/out/kernel"] == (24, 32)
  assert shapes["decoder/layers_2/encoder_decoder_attention/key/kernel"] == (
      32, 24)
  assert shapes["decoder/layers_0/mlp/wi_1/kernel"] == (32, 64)
  assert shapes["decoder/layers_0/mlp/wo/kernel"] == (64, 32)
  assert shapes["decoder/logits_dense/kernel"] == (32, 160)
  assert "encoder/layers_0/mlp/wi/kernel" not in shapes
  relu = names.param_shapes(V10)
  assert relu["encoder/layers_0/mlp/wi/kernel"] == (32, 64)
  assert "decoder/logits_dense/kernel" not in relu
  assert "decoder/layers_3/mlp/wo/kernel" not in relu
  assert names.count_parameters(V10) == sum(
      int(np.prod(s)) for s in relu.values())


def test_single_name_conversions_round_trip():
  for rename in names.renames(V11) + names.renames(V10):
    assert names.to_hf(rename.path) == rename
    assert names.from_hf(rename.hf) == rename
  assert names.from_hf("encoder.embed_tokens.weight") is None
  assert names.from_hf("encoder.block.1.layer.0.SelfAttention."
                       "relative_attention_bias.weight") is None
  with pytest.raises(KeyError):
    names.to_hf("encoder/layers_0/attention/bias")
  assert names.t5x_name("encoder/layers_0/attention/key/kernel") == (
      "target.encoder.layers_0.attention.key.kernel")


def test_fid_wrapper_names():
  hf = "encoder.block.3.layer.1.DenseReluDense.wi.weight"
  assert names.fid_wrapper_to_hf(
      "encoder.encoder.block.3.layer.1.DenseReluDense.wi.weight") == hf
  assert names.fid_wrapper_to_hf(
      "encoder.encoder.block.3.module.layer.1.DenseReluDense.wi.weight") == hf
  assert names.fid_wrapper_to_hf("encoder.encoder.final_layer_norm.weight") == (
      "encoder.final_layer_norm.weight")
  assert names.fid_wrapper_to_hf("encoder.encoder.embed_tokens.weight") == (
      "encoder.embed_tokens.weight")
  for unchanged in ("decoder.block.0.layer.0.SelfAttention.q.weight",
                    "shared.weight", "lm_head.weight"):
    assert names.fid_wrapper_to_hf(unchanged) == unchanged
  for rename in names.renames(V10):
    for use_checkpoint in (False, True):
      fid = names.hf_to_fid_wrapper(rename.hf, use_checkpoint)
      assert names.fid_wrapper_to_hf(fid) == rename.hf
      assert fid.startswith("encoder.encoder.") == rename.hf.startswith(
          "encoder.")
  assert names.hf_to_fid_wrapper(hf, True) == (
      "encoder.encoder.block.3.module.layer.1.DenseReluDense.wi.weight")


# transformers 5 writes this for an "untied" T5.1.1 (the flag moved).
V5_JSON = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 64, "d_kv": 8,
    "d_model": 32, "decoder_start_token_id": 0, "dense_act_fn": "gelu_new",
    "dropout_rate": 0.0, "eos_token_id": 1, "feed_forward_proj": "gated-gelu",
    "is_gated_act": True, "layer_norm_epsilon": 1e-6, "model_type": "t5",
    "num_decoder_layers": 3, "num_heads": 3, "num_layers": 2,
    "pad_token_id": 0, "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32, "scale_decoder_outputs": False,
    "tie_word_embeddings": True, "vocab_size": 160,
}
# The original FiD readers' config (transformers 3.0.2, t5-base sized).
FID_JSON = {
    "architectures": ["FiDT5"], "d_ff": 3072, "d_kv": 64, "d_model": 768,
    "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
    "initializer_factor": 1.0, "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512,
    "num_heads": 12, "num_layers": 12, "output_past": True, "pad_token_id": 0,
    "relative_attention_num_buckets": 32, "vocab_size": 32128,
}


def test_config_from_hf_json_versions():
  fields = configs.config_from_hf_json(V5_JSON)
  assert fields == dict(V11, dropout_rate=0.0)
  old = configs.config_from_hf_json(FID_JSON)
  assert old["feed_forward_proj"] == "relu"
  assert old["tie_word_embeddings"] is True
  assert old["num_decoder_layers"] == 12
  assert old["relative_attention_max_distance"] == 128
  assert tuple(old) == configs.FIELDS
  v4 = dict(V5_JSON, tie_word_embeddings=False)
  del v4["scale_decoder_outputs"], v4["dense_act_fn"], v4["is_gated_act"]
  assert configs.config_from_hf_json(v4)["tie_word_embeddings"] is False
  assert configs.config_from_hf_json(
      dict(v4, feed_forward_proj="gated-relu"))["feed_forward_proj"] == (
          "gated-relu")
  mt5 = dict(v4, model_type="mt5")
  assert configs.config_from_hf_json(mt5)["feed_forward_proj"] == "gated-gelu"


def test_jaxfid_t5config_accepts_the_fields():
  config_module = pytest.importorskip("jaxfid.t5.config")
  config = config_module.T5Config(**configs.config_from_hf_json(V5_JSON))
  assert configs.as_fields(config) == dict(V11, dropout_rate=0.0)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "bart"}, "model_type 'bart' is not a T5 model"),
    ({"feed_forward_proj": "gated-silu", "dense_act_fn": "silu"},
     "activation 'silu'"),
    ({"feed_forward_proj": "gelu", "dense_act_fn": "gelu",
      "is_gated_act": False}, "exact"),
    ({"num_heads": "3"}, "num_heads must be a positive integer"),
    ({"d_model": 0}, "d_model must be a positive integer"),
    ({"scale_decoder_outputs": "yes"}, "tie_word_embeddings must be"),
    ({"dropout_rate": -1}, "dropout_rate must be a non-negative number"),
    ({"feed_forward_proj": "relu-gated"}, "is not 'ACT' or 'gated-ACT'"),
])
def test_bad_hf_configs(change, message):
  with pytest.raises(InputError) as e:
    configs.config_from_hf_json(dict(V5_JSON, **change), "model/config.json")
  assert str(e.value).startswith("model/config.json: ")
  assert message in str(e.value)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields", [V11, V10, dict(V10, feed_forward_proj=
                                                   "gated-relu"),
                                    dict(V11, feed_forward_proj="gelu")])
def test_hf_json_round_trip_and_transformers_reads_it(fields):
  cfg = configs.hf_json_from_config(fields)
  assert configs.config_from_hf_json(cfg) == fields
  hf = transformers.T5Config.from_dict(cfg)
  gated = fields["feed_forward_proj"].startswith("gated-")
  assert hf.is_gated_act == gated
  assert hf.dense_act_fn == ("relu" if "relu" in fields["feed_forward_proj"]
                             else "gelu_new")
  assert hf.scale_decoder_outputs == fields["tie_word_embeddings"]
  assert hf.num_decoder_layers == fields["num_decoder_layers"]
  assert hf.decoder_start_token_id == 0 and hf.eos_token_id == 1
  assert cfg["architectures"] == ["T5ForConditionalGeneration"]


def _params(fields):
  return {p: np.zeros(s, np.float32)
          for p, s in names.param_shapes(fields).items()}


def test_config_from_params():
  assert configs.config_from_params(_params(V11)) == V11
  assert configs.config_from_params(_params(V10)) == V10
  relu_gated = dict(V11, feed_forward_proj="gated-relu", dropout_rate=0.0)
  assert configs.config_from_params(
      _params(relu_gated), activations=("relu", "linear"),
      dropout_rate=0.0) == relu_gated


def test_config_from_params_errors():
  flat = _params(V11)
  with pytest.raises(InputError, match="mlp_activations .* do not match"):
    configs.config_from_params(flat, "ck", activations=("relu",))
  with pytest.raises(InputError, match="not supported"):
    configs.config_from_params(flat, "ck", activations=("silu", "linear"))
  scanned = {k: v for k, v in flat.items() if "layers_" not in k}
  scanned["encoder/layers/attention/query/kernel"] = np.zeros((32, 2, 24))
  with pytest.raises(InputError, match="scanned-layer T5X"):
    configs.config_from_params(scanned, "ck")
  gap = {k: v for k, v in flat.items() if "decoder/layers_1/" not in k}
  with pytest.raises(InputError, match="missing decoder/layers_1"):
    configs.config_from_params(gap, "ck")
  no_embedding = dict(flat)
  del no_embedding["token_embedder/embedding"]
  with pytest.raises(InputError) as e:
    configs.config_from_params(no_embedding, "ck/checkpoint")
  assert str(e.value) == ("ck/checkpoint: missing parameter "
                          "token_embedder/embedding")


def test_as_fields_and_describe():
  class Duck:
    pass
  duck = Duck()
  for key, value in V10.items():
    setattr(duck, key, value)
  assert configs.as_fields(duck) == V10
  with pytest.raises(ValueError, match="lacks fields"):
    configs.as_fields({"d_model": 3})
  line = names.describe(V11)
  assert "2+3 layers" in line and "gated-gelu" in line and "untied" in line
  assert f"{names.count_parameters(V11):,} parameters" in line
