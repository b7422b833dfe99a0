"""The T5 configuration: one frozen dataclass, passed whole, with size presets.

Field names are HF ``T5Config``'s, so a ``config.json`` maps onto it directly
(see ``jaxfid.checkpoints``). Presets follow the published T5 (v1.0) and T5.1.1
sizes; ``gin/models/*.gin`` select them for a run.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxfid.core.config import Config, option

FEED_FORWARD_PROJS = ("relu", "gelu", "gated-gelu", "gated-relu")
DTYPES = ("float32", "bfloat16")
REMATS = ("none", "full", "dots", "save_out_proj_with_context")
PASSAGE_ENCODINGS = ("flatten", "vmap")
ATTENTIONS = ("auto", "reference", "pallas", "cudnn")  # jaxfid.t5.attention_ops
# Fields a run sets for itself: they change no parameter.
RUN_ONLY_FIELDS = ("dropout_rate", "dtype", "remat", "scan_layers",
                   "passage_encoding", "attention")


@dataclasses.dataclass(frozen=True)
class T5Config(Config):
  """Sizes and switches of a T5 encoder-decoder (each checked on
  construction: InputError naming the field's macro).

  Attributes:
    vocab_size: rows of the (shared) token embedding (32128 for T5).
    d_model: width of the residual stream D.
    d_kv: width of one attention head E; ``num_heads * d_kv`` may differ from
      ``d_model``.
    d_ff: hidden width of the feed-forward block F.
    num_heads: attention heads H.
    num_layers: encoder layers.
    num_decoder_layers: decoder layers.
    feed_forward_proj: 'relu' (T5 v1.0), 'gated-gelu' (T5.1.1), 'gelu',
      'gated-relu'.
    tie_word_embeddings: output logits use the shared embedding (scaled by
      ``d_model**-0.5``); otherwise an untied ``logits_dense`` without scaling.
    relative_attention_num_buckets / relative_attention_max_distance: the
      relative position buckets.
    layer_norm_epsilon: RMS norm epsilon.
    dropout_rate: dropout on embeddings, sublayer outputs, attention weights
      and the feed-forward hidden layer (as HF/T5).
    dtype: activation dtype ('float32' or 'bfloat16'); parameters are always
      float32, logits and softmax always float32.
    remat: gradient checkpointing of each layer: 'none', 'full' (keep each
      layer's input, recompute the rest), 'dots' (save matmul outputs
      without batch dims) or 'save_out_proj_with_context' (also keep each
      attention's context and output projection, MaxText's 'context' and
      'out_proj': the backward pass recomputes the q/k/v projections and
      the MLP but not the fused kernel's forward; the einsum attention's
      gradient recomputes its scores).
    scan_layers: run each stack's alike layers as one ``lax.scan`` over
      their stacked parameters (``jaxfid.t5.stack``): XLA compiles one layer
      instead of all of them; the parameters and their names do not change.
    passage_encoding: how FiD's encoder runs over the passages of
      ``[B, P, L]`` (``jaxfid.t5.passages``): 'flatten' (one encoder call on
      ``[B*P, L]``) or 'vmap' (``jax.vmap`` over the passage axis, a dropout
      key per passage); equal outputs and gradients without dropout.
      'flatten' is the default: the same TPU roofline, and the vmapped train
      step with remat and dropout does not compile for TPU (docs/fidelity.md).
    attention: how attention is computed (``jaxfid.t5.attention_ops``):
      'reference' (einsums; the float32 logits and weights go through HBM),
      'pallas' (a fused Pallas kernel keeping them on chip where it applies:
      at most 1024 keys, a key padding mask, not a causal one, no logits
      asked for, e.g. FiD's encoder; the reference elsewhere; interpreted
      off TPU), 'cudnn' (cuDNN's flash attention on GPU where it applies:
      bfloat16/float16, no attention dropout, the relative bias with a key
      padding mask, or the causal mask; the reference elsewhere, off GPU
      and with vmapped passages), or 'auto': 'pallas' on TPU, 'cudnn' on
      GPU, 'reference' elsewhere and with vmapped passages.
    cross_attention_period: FiDO layer-sparse cross-attention: decoder layer i
      (0-based) has cross-attention iff ``(i + 1) % period == 0``; 1 = every
      layer (standard T5).
    multi_query_cross_attention: FiDO multi-query cross-attention (one key and
      one value head shared by all query heads).
  """
  vocab_size: int = option(32128, low=1)
  d_model: int = option(512, low=1)
  d_kv: int = option(64, low=1)
  d_ff: int = option(2048, low=1)
  num_heads: int = option(8, low=1)
  num_layers: int = option(6, low=1)
  num_decoder_layers: int = option(6, low=0)
  feed_forward_proj: str = option("relu", choices=FEED_FORWARD_PROJS)
  tie_word_embeddings: bool = option(True)
  relative_attention_num_buckets: int = option(32, low=1)
  relative_attention_max_distance: int = option(128, low=1)
  layer_norm_epsilon: float = option(1e-6, above=0)
  dropout_rate: float = option(0.1, low=0, below=1)
  dtype: str = option("float32", choices=DTYPES)
  remat: str = option("none", choices=REMATS)
  scan_layers: bool = option(False)
  passage_encoding: str = option("flatten", choices=PASSAGE_ENCODINGS)
  attention: str = option("auto", choices=ATTENTIONS)
  cross_attention_period: int = option(1, low=1)
  multi_query_cross_attention: bool = option(False)

  @property
  def is_gated(self) -> bool:
    return self.feed_forward_proj.startswith("gated-")

  @property
  def activation(self) -> str:
    return self.feed_forward_proj.split("-")[-1]

  @property
  def activation_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def inner_dim(self) -> int:
    return self.num_heads * self.d_kv

  def has_cross_attention(self, decoder_layer: int) -> bool:
    return (decoder_layer + 1) % self.cross_attention_period == 0

  def architecture_differences(self, other: "T5Config") -> list[str]:
    """Fields (in declaration order, run-only ones left out) that differ."""
    return [f.name for f in dataclasses.fields(self)
            if f.name not in RUN_ONLY_FIELDS
            and getattr(self, f.name) != getattr(other, f.name)]


def _v1_0(d_model, d_ff, d_kv, num_heads, num_layers) -> T5Config:
  return T5Config(d_model=d_model, d_ff=d_ff, d_kv=d_kv, num_heads=num_heads,
                  num_layers=num_layers, num_decoder_layers=num_layers,
                  feed_forward_proj="relu", tie_word_embeddings=True)


def _v1_1(d_model, d_ff, d_kv, num_heads, num_layers) -> T5Config:
  return T5Config(d_model=d_model, d_ff=d_ff, d_kv=d_kv, num_heads=num_heads,
                  num_layers=num_layers, num_decoder_layers=num_layers,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False)


PRESETS: dict[str, T5Config] = {
    "t5_small": _v1_0(512, 2048, 64, 8, 6),
    "t5_base": _v1_0(768, 3072, 64, 12, 12),
    "t5_large": _v1_0(1024, 4096, 64, 16, 24),
    "t5_3b": _v1_0(1024, 16384, 128, 32, 24),
    "t5_11b": _v1_0(1024, 65536, 128, 128, 24),
    "t5_1_1_small": _v1_1(512, 1024, 64, 6, 8),
    "t5_1_1_base": _v1_1(768, 2048, 64, 12, 12),
    "t5_1_1_large": _v1_1(1024, 2816, 64, 16, 24),
    "t5_1_1_xl": _v1_1(2048, 5120, 64, 32, 24),
    "t5_1_1_xxl": _v1_1(4096, 10240, 64, 64, 24),
    # CPU-sized model for tests and the demo (gin/fid/tiny.gin).
    "tiny": T5Config(d_model=64, d_ff=128, d_kv=16, num_heads=4, num_layers=2,
                     num_decoder_layers=2, feed_forward_proj="gated-gelu",
                     tie_word_embeddings=False),
}


def preset(name: str, **overrides) -> T5Config:
  """A named preset (``PRESETS`` keys; '-' and '.' accepted for '_')."""
  key = name.replace("-", "_").replace(".", "_")
  if key not in PRESETS:
    raise ValueError(f"unknown T5 preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[key].replace(**overrides)
