"""Tiny random HF T5 checkpoints (and original-FiD ones) for reference tests.

:func:`make_tiny_hf_checkpoint` builds a random float32
``transformers.T5ForConditionalGeneration`` (every weight random, layer norms
included, which HF would initialise to 1) and saves it with
``save_pretrained(safe_serialization=True)``. Versions:

* ``'1.0'``: relu MLP, tied output (``lm_head`` = ``shared``, decoder output
  scaled by ``d_model**-0.5``);
* ``'1.1'``: gated-gelu MLP, untied output without scaling. transformers 5
  always ties ``lm_head`` to ``shared`` on construction (``tie_word_embeddings
  =False`` only drops the scaling), so the untied reference gets its own
  random ``lm_head.weight`` written into the saved files afterwards; loading
  it with ``from_pretrained`` then keeps the two apart (tests check this).

Helpers write the other layouts from a saved checkpoint: torch
``pytorch_model.bin`` (optionally sharded with an index), and the original FiD
readers' layout (transformers 3.0.2 ``FiDT5``: ``encoder.encoder.`` prefix,
optional ``.module.`` of its checkpoint wrapper, an old-style config.json and
the first decoder block's cross-attention position table of that version).

Without PyTorch (``make test-latest``) :func:`make_tiny_hf_checkpoint` writes
the same files from numpy (same names, shapes, layout and config.json; other
random values), so the tests that only need a checkpoint still run; the
helpers that run or rewrite the torch model skip the calling test
(``pytest.importorskip``).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

try:
  import torch
  import transformers
except ImportError:  # no PyTorch: the PyTorch-reference tests skip
  torch = transformers = None


def require_torch():
  """``(torch, transformers)``, or skips the calling test: the PyTorch
  reference is optional (the ``torch`` extra)."""
  return (pytest.importorskip("torch"), pytest.importorskip("transformers"))

TINY = dict(vocab_size=160, d_model=32, d_kv=8, num_heads=4, d_ff=64,
            num_layers=2, num_decoder_layers=3,
            relative_attention_num_buckets=32,
            relative_attention_max_distance=128)


def _randomise(model, generator) -> None:
  with torch.no_grad():
    for name, param in model.named_parameters():
      noise = torch.randn(param.shape, generator=generator)
      if "layer_norm" in name:
        param.copy_(1.0 + 0.2 * noise)
      elif name == "shared.weight" or "relative_attention_bias" in name:
        param.copy_(noise)
      else:  # nn.Linear [out, in]
        param.copy_(noise * param.shape[1] ** -0.5)


def _add_lm_head(directory: Path, lm_head: np.ndarray) -> None:
  """Adds an own lm_head.weight to a saved (single or sharded) checkpoint."""
  from safetensors.numpy import load_file, save_file
  index = directory / "model.safetensors.index.json"
  if index.is_file():
    save_file({"lm_head.weight": lm_head},
              str(directory / "lm_head.safetensors"), metadata={"format": "pt"})
    content = json.loads(index.read_text())
    content["weight_map"]["lm_head.weight"] = "lm_head.safetensors"
    index.write_text(json.dumps(content, indent=2))
  else:
    file = directory / "model.safetensors"
    tensors = load_file(str(file))
    tensors["lm_head.weight"] = lm_head
    save_file(tensors, str(file), metadata={"format": "pt"})


def make_tiny_hf_checkpoint(directory, *, version: str = "1.1",
                            tied: bool | None = None, seed: int = 0,
                            max_shard_size: str | None = None,
                            **size_overrides) -> Path:
  """Saves a random tiny T5ForConditionalGeneration; returns the directory.

  Args:
    directory: output directory.
    version: '1.0' (relu) or '1.1' (gated-gelu).
    tied: output tying; default tied for 1.0, untied for 1.1.
    seed: torch seed of the random weights.
    max_shard_size: passed to ``save_pretrained`` (e.g. '20KB') for a sharded
      checkpoint with ``model.safetensors.index.json``.
    **size_overrides: HF T5Config sizes replacing :data:`TINY`.
  """
  if version not in ("1.0", "1.1"):
    raise ValueError(f"version must be '1.0' or '1.1', got {version!r}")
  tied = (version == "1.0") if tied is None else tied
  sizes = {**TINY, **size_overrides}
  if torch is None:
    if max_shard_size:
      pytest.skip("a sharded reference checkpoint needs torch")
    return _numpy_checkpoint(Path(directory), version=version, tied=tied,
                             seed=seed, sizes=sizes)
  config = transformers.T5Config(
      **sizes, feed_forward_proj="relu" if version == "1.0" else "gated-gelu",
      tie_word_embeddings=tied, decoder_start_token_id=0, dropout_rate=0.1)
  generator = torch.Generator().manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(config).eval()
  _randomise(model, generator)
  directory = Path(directory)
  kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
  model.save_pretrained(directory, safe_serialization=True, **kwargs)
  if not tied:
    shape = (sizes["vocab_size"], sizes["d_model"])
    lm_head = torch.randn(shape, generator=generator) * sizes["d_model"] ** -0.5
    _add_lm_head(directory, lm_head.numpy())
    config_path = directory / "config.json"
    content = json.loads(config_path.read_text())
    content["tie_word_embeddings"] = False
    content["scale_decoder_outputs"] = False
    config_path.write_text(json.dumps(content, indent=2))
  return directory


def hf_parameter_shapes(sizes: dict, version: str,
                        tied: bool) -> dict[str, tuple[int, ...]]:
  """``{name: shape}`` of the tensors ``save_pretrained`` writes for a T5 of
  ``sizes`` (HF's ``[out, in]`` layout; no tied copies; ``lm_head.weight``
  only when untied)."""
  d, f = sizes["d_model"], sizes["d_ff"]
  inner = sizes["num_heads"] * sizes["d_kv"]
  buckets = sizes["relative_attention_num_buckets"]
  mlp = ("wi_0", "wi_1") if version == "1.1" else ("wi",)
  shapes = {"shared.weight": (sizes["vocab_size"], d)}
  for stack, layers in (("encoder", sizes["num_layers"]),
                        ("decoder", sizes["num_decoder_layers"])):
    attentions = (["SelfAttention", "EncDecAttention"] if stack == "decoder"
                  else ["SelfAttention"])
    for i in range(layers):
      block = f"{stack}.block.{i}.layer"
      for j, attention in enumerate(attentions):
        for proj in "qkv":
          shapes[f"{block}.{j}.{attention}.{proj}.weight"] = (inner, d)
        shapes[f"{block}.{j}.{attention}.o.weight"] = (d, inner)
        if i == 0 and attention == "SelfAttention":
          shapes[f"{block}.{j}.{attention}.relative_attention_bias.weight"] = (
              buckets, sizes["num_heads"])
        shapes[f"{block}.{j}.layer_norm.weight"] = (d,)
      j = len(attentions)
      for wi in mlp:
        shapes[f"{block}.{j}.DenseReluDense.{wi}.weight"] = (f, d)
      shapes[f"{block}.{j}.DenseReluDense.wo.weight"] = (d, f)
      shapes[f"{block}.{j}.layer_norm.weight"] = (d,)
    shapes[f"{stack}.final_layer_norm.weight"] = (d,)
  if not tied:
    shapes["lm_head.weight"] = (sizes["vocab_size"], d)
  return shapes


def _numpy_checkpoint(directory: Path, *, version: str, tied: bool,
                      seed: int, sizes: dict) -> Path:
  """:func:`make_tiny_hf_checkpoint` without torch: the files
  ``save_pretrained`` writes (config.json as transformers 5 writes it), with
  weights drawn as :func:`_randomise` draws them, from numpy."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  tensors = {}
  for name, shape in hf_parameter_shapes(sizes, version, tied).items():
    noise = rng.standard_normal(shape).astype(np.float32)
    if "layer_norm" in name:
      tensors[name] = 1.0 + 0.2 * noise
    elif name == "shared.weight" or "relative_attention_bias" in name:
      tensors[name] = noise
    else:
      tensors[name] = noise * np.float32(shape[1] ** -0.5)
  directory.mkdir(parents=True, exist_ok=True)
  save_file(tensors, str(directory / "model.safetensors"),
            metadata={"format": "pt"})
  gated = version == "1.1"
  config = {
      "architectures": ["T5ForConditionalGeneration"],
      "classifier_dropout": 0.0, **sizes,
      "decoder_start_token_id": 0,
      "dense_act_fn": "gelu_new" if gated else "relu",
      "dropout_rate": 0.1, "dtype": "float32", "eos_token_id": 1,
      "feed_forward_proj": "gated-gelu" if gated else "relu",
      "initializer_factor": 1.0, "is_decoder": False,
      "is_encoder_decoder": True, "is_gated_act": gated,
      "layer_norm_epsilon": 1e-06, "model_type": "t5", "pad_token_id": 0,
      "scale_decoder_outputs": tied, "tie_word_embeddings": tied,
      "use_cache": True,
  }
  (directory / "config.json").write_text(
      json.dumps(dict(sorted(config.items())), indent=2))
  return directory


def load_reference_model(directory):
  """``from_pretrained`` in eval mode; fails on missing or unexpected keys."""
  require_torch()
  model, info = transformers.T5ForConditionalGeneration.from_pretrained(
      directory, output_loading_info=True)
  bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
  if bad or info.get("error_msgs"):
    raise AssertionError(f"{directory} did not load cleanly: {info}")
  return model.eval()


def random_inputs(vocab_size: int, *, batch: int = 2, enc_len: int = 9,
                  dec_len: int = 6, seed: int = 0):
  """Random ``(input_ids, attention_mask, decoder_input_ids)`` int64 arrays."""
  rng = np.random.default_rng(seed)
  input_ids = rng.integers(2, vocab_size, size=(batch, enc_len))
  mask = np.ones_like(input_ids)
  mask[0, enc_len - 3:] = 0  # some padding in the first example
  input_ids[mask == 0] = 0
  decoder_input_ids = rng.integers(2, vocab_size, size=(batch, dec_len))
  decoder_input_ids[:, 0] = 0
  return input_ids, mask, decoder_input_ids


def reference_logits(model, input_ids, attention_mask,
                     decoder_input_ids) -> np.ndarray:
  """float32 logits [batch, dec_len, vocab] of a torch T5 model."""
  require_torch()
  with torch.no_grad():
    out = model(input_ids=torch.as_tensor(input_ids),
                attention_mask=torch.as_tensor(attention_mask),
                decoder_input_ids=torch.as_tensor(decoder_input_ids))
  return out.logits.float().numpy()


def write_torch_bin(hf_dir, out_dir, *, shards: int = 1) -> Path:
  """Rewrites a checkpoint as ``pytorch_model.bin`` (+ index when sharded).

  The state dict is the model's own, so it holds the tied copies
  (``encoder/decoder.embed_tokens``, and ``lm_head`` when tied) as
  transformers 4 wrote them.
  """
  require_torch()
  model = load_reference_model(hf_dir)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "config.json").write_text((Path(hf_dir) / "config.json")
                                       .read_text())
  state = model.state_dict()
  if shards == 1:
    torch.save(state, out_dir / "pytorch_model.bin")
    return out_dir
  names = list(state)
  weight_map = {}
  for i in range(shards):
    file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
    part = names[i::shards]
    torch.save({n: state[n] for n in part}, out_dir / file)
    weight_map.update({n: file for n in part})
  (out_dir / "pytorch_model.bin.index.json").write_text(json.dumps(
      {"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
  return out_dir


def make_fid_wrapper_checkpoint(hf_dir, out_dir, *,
                                use_checkpoint: bool = False,
                                seed: int = 1) -> Path:
  """Writes ``hf_dir``'s model in the original FiD readers' layout.

  transformers 3.0.2 ``FiDT5`` state dict (``encoder.encoder.block.{i}``,
  with ``.module.`` when ``use_checkpoint``; embeddings and ``lm_head`` all
  present) as ``pytorch_model.bin``, plus a config.json with only the fields
  of that version (``num_decoder_layers`` / ``feed_forward_proj`` /
  ``tie_word_embeddings`` only where the model needs them).
  """
  from jaxfid.checkpoints.names import hf_to_fid_wrapper
  require_torch()
  model = load_reference_model(hf_dir)
  cfg = model.config
  state = {}
  for name, tensor in model.state_dict().items():
    state[hf_to_fid_wrapper(name, use_checkpoint)] = tensor
  generator = torch.Generator().manual_seed(seed)
  state["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias"
        ".weight"] = torch.randn(
            (cfg.relative_attention_num_buckets, cfg.num_heads),
            generator=generator)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  torch.save(state, out_dir / "pytorch_model.bin")
  old = {
      "architectures": ["FiDT5"], "d_ff": cfg.d_ff, "d_kv": cfg.d_kv,
      "d_model": cfg.d_model, "decoder_start_token_id": 0,
      "dropout_rate": cfg.dropout_rate, "eos_token_id": 1,
      "initializer_factor": 1.0, "is_encoder_decoder": True,
      "layer_norm_epsilon": cfg.layer_norm_epsilon, "model_type": "t5",
      "n_positions": 512, "num_heads": cfg.num_heads,
      "num_layers": cfg.num_layers, "output_past": True, "pad_token_id": 0,
      "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
      "vocab_size": cfg.vocab_size,
  }
  if cfg.num_decoder_layers != cfg.num_layers:
    old["num_decoder_layers"] = cfg.num_decoder_layers
  if cfg.feed_forward_proj != "relu":
    old["feed_forward_proj"] = cfg.feed_forward_proj
  if not cfg.scale_decoder_outputs:
    old["tie_word_embeddings"] = False
  (out_dir / "config.json").write_text(json.dumps(old, indent=2))
  return out_dir
