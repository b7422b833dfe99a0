"""T5 configuration fields from and to the formats jaxfid reads and writes.

A configuration is a plain ``dict`` of :data:`FIELDS` (HF names), read from
a HF ``config.json`` of any transformers version
(:func:`config_from_hf_json`), inferred from T5X parameter shapes
(:func:`config_from_params`), or written as a HF ``config.json``
(:func:`hf_json_from_config`). jaxfid's gelu is the tanh approximation; a HF
configuration asking for the exact (erf) gelu is refused.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxfid.core.errors import InputError

FIELDS = (
    "vocab_size", "d_model", "d_kv", "d_ff", "num_heads", "num_layers",
    "num_decoder_layers", "feed_forward_proj", "tie_word_embeddings",
    "relative_attention_num_buckets", "relative_attention_max_distance",
    "layer_norm_epsilon", "dropout_rate")

FEED_FORWARD_PROJS = ("relu", "gelu", "gated-gelu", "gated-relu")

_INT_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads",
               "num_layers", "num_decoder_layers",
               "relative_attention_num_buckets",
               "relative_attention_max_distance")

# transformers' T5Config defaults, used for keys an old config.json lacks.
_HF_DEFAULTS = {
    "vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048,
    "num_heads": 8, "num_layers": 6, "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6,
    "dropout_rate": 0.1,
}

_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")

# T5X gin `mlp_activations` -> jaxfid feed_forward_proj.
_T5X_ACTIVATIONS = {
    ("relu",): "relu",
    ("gelu",): "gelu",
    ("gelu", "linear"): "gated-gelu",
    ("relu", "linear"): "gated-relu",
}


def is_gated(feed_forward_proj: str) -> bool:
  return feed_forward_proj.startswith("gated-")


def as_fields(config: Any) -> dict:
  """The :data:`FIELDS` of a config given as a mapping, dataclass or object."""
  if isinstance(config, Mapping):
    get = config.get
  else:
    get = lambda name: getattr(config, name, None)  # noqa: E731
  fields = {name: get(name) for name in FIELDS}
  missing = [name for name, value in fields.items() if value is None]
  if missing:
    raise ValueError(f"config lacks fields {missing}")
  if fields["feed_forward_proj"] not in FEED_FORWARD_PROJS:
    raise ValueError(f"feed_forward_proj must be one of {FEED_FORWARD_PROJS}, "
                     f"got {fields['feed_forward_proj']!r}")
  return fields


def _positive_int(cfg: Mapping, key: str, default, path) -> int:
  value = cfg.get(key, default)
  if value is None:
    value = default
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise InputError(path, f"{key} must be a positive integer, got {value!r}")
  return value


def _number(cfg: Mapping, key: str, default, path) -> float:
  value = cfg.get(key, default)
  if value is None:
    value = default
  if isinstance(value, bool) or not isinstance(value, (int, float)) or (
      value < 0):
    raise InputError(path, f"{key} must be a non-negative number, "
                     f"got {value!r}")
  return float(value)


def _hf_feed_forward_proj(cfg: Mapping, path) -> str:
  proj = cfg.get("feed_forward_proj") or "relu"
  if not isinstance(proj, str):
    raise InputError(path, f"feed_forward_proj must be a string, got {proj!r}")
  parts = proj.split("-")
  if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
    raise InputError(path, f"feed_forward_proj {proj!r} is not 'ACT' or "
                     "'gated-ACT'")
  gated = cfg.get("is_gated_act")
  if gated is None:
    gated = len(parts) == 2
  act = cfg.get("dense_act_fn")
  if act is None:
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
  if act == "relu":
    return "gated-relu" if gated else "relu"
  if act in _TANH_GELUS:
    return "gated-gelu" if gated else "gelu"
  if act == "gelu":
    raise InputError(path, f"activation 'gelu' (exact, erf) of "
                     f"feed_forward_proj {proj!r} is not supported: jaxfid's "
                     "gelu is the tanh approximation ('gelu_new')")
  raise InputError(path, f"activation {act!r} (feed_forward_proj {proj!r}) is "
                   f"not supported; jaxfid supports {FEED_FORWARD_PROJS}")


def config_from_hf_json(cfg: Mapping, path="config.json") -> dict:
  """jaxfid fields from a parsed HF T5 ``config.json`` (InputError for
  another model or an unsupported value); ``tie_word_embeddings`` as it says
  (transformers 5: ``scale_decoder_outputs``), reconciled by ``read_hf``."""
  if not isinstance(cfg, Mapping):
    raise InputError(path, "config.json must hold a JSON object")
  model_type = cfg.get("model_type")
  if model_type is not None and model_type not in ("t5", "mt5"):
    raise InputError(path, f"model_type {model_type!r} is not a T5 model "
                     "(expected 't5' or 'mt5')")
  fields = {key: _positive_int(cfg, key, _HF_DEFAULTS[key], path)
            for key in _INT_FIELDS if key != "num_decoder_layers"}
  fields["num_decoder_layers"] = _positive_int(
      cfg, "num_decoder_layers", fields["num_layers"], path)
  fields["feed_forward_proj"] = _hf_feed_forward_proj(cfg, path)
  if "scale_decoder_outputs" in cfg:  # transformers >= 5
    tied = cfg["scale_decoder_outputs"]
  else:
    tied = cfg.get("tie_word_embeddings", True)
  if not isinstance(tied, bool):
    raise InputError(path, f"tie_word_embeddings must be true or false, "
                     f"got {tied!r}")
  fields["tie_word_embeddings"] = tied
  fields["layer_norm_epsilon"] = _number(
      cfg, "layer_norm_epsilon", _HF_DEFAULTS["layer_norm_epsilon"], path)
  fields["dropout_rate"] = _number(cfg, "dropout_rate",
                                   _HF_DEFAULTS["dropout_rate"], path)
  return {name: fields[name] for name in FIELDS}


def hf_json_from_config(config: Any) -> dict:
  """A ``config.json`` that transformers 4 and 5 load as
  T5ForConditionalGeneration (``dense_act_fn`` pins the tanh gelu)."""
  f = as_fields(config)
  proj = f["feed_forward_proj"]
  act = proj.split("-")[-1]
  return {
      "architectures": ["T5ForConditionalGeneration"],
      "model_type": "t5",
      "vocab_size": f["vocab_size"],
      "d_model": f["d_model"],
      "d_kv": f["d_kv"],
      "d_ff": f["d_ff"],
      "num_heads": f["num_heads"],
      "num_layers": f["num_layers"],
      "num_decoder_layers": f["num_decoder_layers"],
      "feed_forward_proj": proj,
      "dense_act_fn": "gelu_new" if act == "gelu" else act,
      "is_gated_act": is_gated(proj),
      "relative_attention_num_buckets": f["relative_attention_num_buckets"],
      "relative_attention_max_distance": f["relative_attention_max_distance"],
      "layer_norm_epsilon": f["layer_norm_epsilon"],
      "dropout_rate": f["dropout_rate"],
      "tie_word_embeddings": bool(f["tie_word_embeddings"]),
      "scale_decoder_outputs": bool(f["tie_word_embeddings"]),
      "initializer_factor": 1.0,
      "is_encoder_decoder": True,
      "use_cache": True,
      "decoder_start_token_id": 0,
      "eos_token_id": 1,
      "pad_token_id": 0,
  }


def _layer_indices(flat: Mapping, stack: str, path) -> int:
  prefix = f"{stack}/layers_"
  indices = set()
  for name in flat:
    if name.startswith(prefix):
      index = name[len(prefix):].split("/", 1)[0]
      if not index.isdigit():
        raise InputError(path, f"unexpected parameter {name}")
      indices.add(int(index))
  if not indices:
    raise InputError(path, f"no {stack} layers ({prefix}0/...) in the "
                     "parameters")
  if indices != set(range(len(indices))):
    missing = sorted(set(range(max(indices) + 1)) - indices)
    raise InputError(path, f"{stack} layers are not numbered 0..N-1: "
                     f"missing {prefix}{missing[0]}")
  return len(indices)


def _shape(flat: Mapping, name: str, ndim: int, path) -> tuple:
  if name not in flat:
    raise InputError(path, f"missing parameter {name}")
  shape = tuple(flat[name].shape)
  if len(shape) < ndim:
    raise InputError(path, f"parameter {name} has shape {list(shape)}, "
                     f"expected {ndim} dimensions")
  return shape


def config_from_params(flat: Mapping, path="checkpoint", *,
                       activations: tuple[str, ...] | None = None,
                       dropout_rate: float | None = None) -> dict:
  """Fields of a T5X (jaxfid-named) parameter set from shapes, activations
  and dropout from ``config.gin`` when known (else T5.1.1's gated gelu or
  relu; 0.1). InputError for scanned layers, missing or mis-shaped
  parameters, or activations unlike the MLP's."""
  if any(name.startswith(("encoder/layers/", "decoder/layers/"))
         for name in flat):
    raise InputError(path, "scanned-layer T5X checkpoints (scalable_t5: "
                     "'encoder/layers/...', per-layer relative position "
                     "biases) are not supported; use an unscanned T5X "
                     "checkpoint (encoder/layers_0/...)")
  vocab, d_model = _shape(flat, "token_embedder/embedding", 2, path)
  heads, buckets = _shape(flat, "encoder/relpos_bias/rel_embedding", 2, path)
  query = _shape(flat, "encoder/layers_0/attention/query/kernel", 2, path)
  inner = 1
  for size in query[1:]:
    inner *= size
  if inner % heads:
    raise InputError(path, f"attention width {inner} is not a multiple of "
                     f"{heads} heads")
  gated = "encoder/layers_0/mlp/wi_0/kernel" in flat
  wi = "encoder/layers_0/mlp/wi_0/kernel" if gated else (
      "encoder/layers_0/mlp/wi/kernel")
  d_ff = _shape(flat, wi, 2, path)[1]
  if activations is None:
    proj = "gated-gelu" if gated else "relu"
  else:
    key = tuple(activations)
    if key not in _T5X_ACTIVATIONS:
      raise InputError(path, f"mlp_activations {key} are not supported; "
                       f"jaxfid supports {sorted(_T5X_ACTIVATIONS)}")
    proj = _T5X_ACTIVATIONS[key]
    if is_gated(proj) != gated:
      raise InputError(path, f"mlp_activations {key} do not match the MLP "
                       f"parameters ({'wi_0/wi_1' if gated else 'wi'})")
  return {
      "vocab_size": vocab,
      "d_model": d_model,
      "d_kv": inner // heads,
      "d_ff": d_ff,
      "num_heads": heads,
      "num_layers": _layer_indices(flat, "encoder", path),
      "num_decoder_layers": _layer_indices(flat, "decoder", path),
      "feed_forward_proj": proj,
      "tie_word_embeddings": "decoder/logits_dense/kernel" not in flat,
      "relative_attention_num_buckets": buckets,
      "relative_attention_max_distance": 128,
      "layer_norm_epsilon": 1e-6,
      "dropout_rate": 0.1 if dropout_rate is None else float(dropout_rate),
  }


def t5x_activations(feed_forward_proj: str) -> tuple[str, ...]:
  """T5X ``mlp_activations`` for a jaxfid ``feed_forward_proj``."""
  for activations, proj in _T5X_ACTIVATIONS.items():
    if proj == feed_forward_proj:
      return activations
  raise ValueError(f"unknown feed_forward_proj {feed_forward_proj!r}")


def replace(config: Any, **changes) -> dict:
  """``as_fields(config)`` with some fields changed."""
  fields = as_fields(config)
  unknown = set(changes) - set(FIELDS)
  if unknown:
    raise ValueError(f"unknown fields {sorted(unknown)}")
  fields.update(changes)
  return fields


__all__ = [
    "FIELDS", "FEED_FORWARD_PROJS", "as_fields", "config_from_hf_json",
    "hf_json_from_config", "config_from_params", "t5x_activations",
    "is_gated", "replace",
]
