"""The T5 network: encoder, decoder and shared embedding (Flax NNX).

Einsum letters (see ``layers.py``): B batch, L encoder length, T decoder length,
D d_model, H heads, E head width, V vocabulary.

Hooks for the methods: ``Encoder.__call__(..., start, end, final_norm)`` runs
a layer range (ReAtt); ``output_hidden_states`` / ``output_attention_logits``
return per-layer states and pre-softmax logits (float32 [B, H, L, S]);
``extras`` reaches every projection (ReFusion). The residual stream
``[B, L, D]`` and logits ``[B, T, V]`` carry logical-axis sharding
constraints (no-op without a mesh). Parameter names follow T5X
(``encoder/layers_0/attention/query/kernel``).
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from jaxfid.core import sharding as ax
from jaxfid.t5 import layers, stack
from jaxfid.t5.config import T5Config
from jaxfid.t5.layers import dropout, fold

Array = jax.Array


@flax.struct.dataclass
class StackOutput:
  """What a stack returns. Optional fields are None unless requested."""
  hidden: Array                                   # [B, L, D]
  mask: Array | None = None                       # bool [B, L] (encoder)
  hidden_states: tuple[Array, ...] | None = None  # input of each layer + last
  attention_logits: tuple[Array, ...] | None = None        # [B, H, L, L]
  cross_attention_logits: tuple[Array, ...] | None = None  # [B, H, T, L]


class EncoderLayer(nnx.Module):
  """Pre-norm self-attention block and pre-norm feed-forward block."""

  def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
    self.pre_attention_layer_norm = layers.RMSNorm(config)
    self.attention = layers.Attention(config, rngs=rngs)
    self.pre_mlp_layer_norm = layers.RMSNorm(config)
    self.mlp = layers.MLP(config, rngs=rngs)
    self.dropout_rate = config.dropout_rate

  def __call__(self, x: Array, *, mask: Array, bias: Array,
               dropout_rng: Array | None = None, extras: Any = None,
               return_logits: bool = False):
    rate = self.dropout_rate
    h = self.pre_attention_layer_norm(x)
    att = self.attention(h, mask=mask, bias=bias, dropout_rng=fold(dropout_rng, 0),
                         extras=extras, return_logits=return_logits)
    x = x + dropout(att.out, rate, fold(dropout_rng, 1))
    h = self.pre_mlp_layer_norm(x)
    h = self.mlp(h, dropout_rng=fold(dropout_rng, 2), extras=extras)
    x = x + dropout(h, rate, fold(dropout_rng, 3))
    return ax.with_logical_constraint(x, layers.ACT_RESIDUAL), att.logits


class Encoder(nnx.Module):
  """Relative bias (computed once per call) + ``num_layers`` layers + norm."""

  def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
    self.config = config
    self.relpos_bias = layers.RelativePositionBias(config, bidirectional=True,
                                                   rngs=rngs)
    for i in range(config.num_layers):
      setattr(self, f"layers_{i}", EncoderLayer(config, rngs=rngs))
    self.encoder_norm = layers.RMSNorm(config)

  def layer(self, i: int) -> EncoderLayer:
    return getattr(self, f"layers_{i}")

  def __call__(self, x: Array, mask: Array, *, start: int = 0,
               end: int | None = None, final_norm: bool | None = None,
               dropout_rng: Array | None = None, extras: Any = None,
               output_hidden_states: bool = False,
               output_attention_logits: bool = False) -> StackOutput:
    """Run layers ``[start, end)`` on embedded inputs ``x`` [B, L, D].

    Args:
      mask: bool [B, L], True for real tokens.
      final_norm: apply the final RMS norm (and dropout); defaults to True
        exactly when ``end`` is the last layer.
    """
    cfg = self.config
    end = cfg.num_layers if end is None else end
    final_norm = (end == cfg.num_layers) if final_norm is None else final_norm
    length = x.shape[1]
    bias = self.relpos_bias(length, length)  # [1, H, L, L]
    attn_mask = mask[:, None, None, :]       # [B, 1, 1, L]

    def run(layer, h, rng):
      out, lg = layer(h, mask=attn_mask, bias=bias, dropout_rng=rng,
                      extras=extras, return_logits=output_attention_logits)
      return out, (h if output_hidden_states else None, lg)

    x, aux = stack.run_layers(
        [self.layer(i) for i in range(start, end)], x, run, rng=dropout_rng,
        first=start, remat=cfg.remat, scan=cfg.scan_layers and extras is None)
    states = [h for h, _ in aux]
    logits = [lg for _, lg in aux]
    if final_norm:
      x = self.encoder_norm(x)
      x = dropout(x, cfg.dropout_rate, fold(dropout_rng, cfg.num_layers))
    if output_hidden_states:
      states.append(x)
    return StackOutput(hidden=x, mask=mask,
                       hidden_states=tuple(states) if output_hidden_states else None,
                       attention_logits=tuple(logits) if output_attention_logits else None)


class DecoderLayer(nnx.Module):
  """Causal self-attention, cross-attention (optional: FiDO), feed-forward."""

  def __init__(self, config: T5Config, *, has_cross_attention: bool,
               rngs: nnx.Rngs):
    self.pre_self_attention_layer_norm = layers.RMSNorm(config)
    self.self_attention = layers.Attention(config, rngs=rngs)
    self.has_cross_attention = has_cross_attention
    if has_cross_attention:
      self.pre_cross_attention_layer_norm = layers.RMSNorm(config)
      self.encoder_decoder_attention = layers.Attention(
          config, rngs=rngs, multi_query=config.multi_query_cross_attention)
    self.pre_mlp_layer_norm = layers.RMSNorm(config)
    self.mlp = layers.MLP(config, rngs=rngs)
    self.dropout_rate = config.dropout_rate

  def __call__(self, x: Array, encoded: Array | None, *, self_mask: Array,
               self_bias: Array, cross_mask: Array,
               cache: dict | None = None, cur_index: Array | None = None,
               cross_kv: tuple[Array, Array] | None = None,
               dropout_rng: Array | None = None, extras: Any = None,
               return_logits: bool = False, self_causal: bool = False):
    """One layer; with ``cache`` it decodes a single position ``cur_index``.
    ``self_causal``: ``self_mask`` is the causal mask.

    Returns (x, new_cache, self_logits, cross_logits).
    """
    rate = self.dropout_rate
    h = self.pre_self_attention_layer_norm(x)
    new_cache = None
    if cache is None:
      att = self.self_attention(h, mask=self_mask, bias=self_bias,
                                dropout_rng=fold(dropout_rng, 0), extras=extras,
                                return_logits=return_logits,
                                causal=self_causal)
    else:
      k, v = self.self_attention.project_kv(h, extras)  # [B, 1, H, E]
      ck = jax.lax.dynamic_update_slice_in_dim(
          cache["k"], k.astype(cache["k"].dtype), cur_index, axis=1)  # [B, T, H, E]
      cv = jax.lax.dynamic_update_slice_in_dim(
          cache["v"], v.astype(cache["v"].dtype), cur_index, axis=1)  # [B, T, H, E]
      new_cache = {"k": ck, "v": cv}
      att = self.self_attention(h, kv=(ck, cv), mask=self_mask, bias=self_bias,
                                extras=extras, return_logits=return_logits)
    x = x + dropout(att.out, rate, fold(dropout_rng, 1))
    cross_logits = None
    if self.has_cross_attention:
      h = self.pre_cross_attention_layer_norm(x)
      cross = self.encoder_decoder_attention(
          h, encoded, kv=cross_kv, mask=cross_mask,
          dropout_rng=fold(dropout_rng, 2), extras=extras,
          return_logits=return_logits)
      x = x + dropout(cross.out, rate, fold(dropout_rng, 3))
      cross_logits = cross.logits
    h = self.pre_mlp_layer_norm(x)
    h = self.mlp(h, dropout_rng=fold(dropout_rng, 4), extras=extras)
    x = x + dropout(h, rate, fold(dropout_rng, 5))
    x = ax.with_logical_constraint(x, layers.ACT_RESIDUAL)
    return x, new_cache, att.logits, cross_logits


class Decoder(nnx.Module):
  """Causal relative bias + ``num_decoder_layers`` layers + norm + logits."""

  def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
    self.config = config
    self.relpos_bias = layers.RelativePositionBias(config, bidirectional=False,
                                                   rngs=rngs)
    for i in range(config.num_decoder_layers):
      setattr(self, f"layers_{i}", DecoderLayer(
          config, has_cross_attention=config.has_cross_attention(i), rngs=rngs))
    self.decoder_norm = layers.RMSNorm(config)
    if not config.tie_word_embeddings:
      self.logits_dense = layers.Dense(
          config.d_model, config.vocab_size, (ax.EMBED, ax.VOCAB),
          dtype=config.activation_dtype, stddev=config.d_model ** -0.5,
          rngs=rngs)

  def layer(self, i: int) -> DecoderLayer:
    return getattr(self, f"layers_{i}")

  def logits(self, x: Array, embedder: layers.Embed) -> Array:
    """float32 [B, T, V] from the final hidden states."""
    cfg = self.config
    if cfg.tie_word_embeddings:
      logits = embedder.attend(x * (cfg.d_model ** -0.5))  # [B, T, V]
    else:
      kernel = ax.gathered_for_use(
          self.logits_dense.kernel[...].astype(x.dtype), (ax.EMBED, ax.VOCAB))
      logits = jnp.einsum("btd,dv->btv", x, kernel,
                          preferred_element_type=jnp.float32)  # [B, T, V]
    return ax.with_logical_constraint(logits, layers.ACT_LOGITS)

  def __call__(self, x: Array, encoded: Array, encoder_mask: Array,
               embedder: layers.Embed, *, dropout_rng: Array | None = None,
               extras: Any = None, output_hidden_states: bool = False,
               output_attention_logits: bool = False):
    """Teacher-forced decoding of embedded targets ``x`` [B, T, D].

    Returns (logits float32 [B, T, V], StackOutput).
    """
    cfg = self.config
    t = x.shape[1]
    self_bias = self.relpos_bias(t, t)                          # [1, H, T, T]
    causal = jnp.tril(jnp.ones((t, t), jnp.bool_))[None, None]  # [1, 1, T, T]
    cross_mask = encoder_mask[:, None, None, :]                 # [B, 1, 1, L]

    def run(layer, h, rng):
      out, _, sl, cl = layer(h, encoded, self_mask=causal, self_bias=self_bias,
                             cross_mask=cross_mask, dropout_rng=rng,
                             extras=extras, return_logits=output_attention_logits,
                             self_causal=True)
      return out, (h if output_hidden_states else None, sl, cl)

    x, aux = stack.run_layers(
        [self.layer(i) for i in range(cfg.num_decoder_layers)], x, run,
        rng=dropout_rng, remat=cfg.remat,
        scan=cfg.scan_layers and extras is None)
    states = [h for h, _, _ in aux]
    self_logits = [sl for _, sl, _ in aux]
    cross_logits = [cl for _, _, cl in aux if cl is not None]
    x = self.decoder_norm(x)
    x = dropout(x, cfg.dropout_rate, fold(dropout_rng, cfg.num_decoder_layers))
    if output_hidden_states:
      states.append(x)
    out = StackOutput(
        hidden=x, hidden_states=tuple(states) if output_hidden_states else None,
        attention_logits=tuple(self_logits) if output_attention_logits else None,
        cross_attention_logits=(tuple(cross_logits) if output_attention_logits
                                else None))
    return self.logits(x, embedder), out

  def init_cache(self, encoded: Array, encoder_mask: Array,
                 max_decode_len: int, extras: Any = None) -> dict:
    """Decoding cache: empty self-attention K/V and cross-attention K/V.

    Every leaf has the batch as its leading axis (beam search repeats it).
    Cross-attention keys/values are computed here, once per input.
    """
    cfg = self.config
    b = encoded.shape[0]
    shape = (b, max_decode_len, cfg.num_heads, cfg.d_kv)
    cache = {"encoder_mask": encoder_mask}
    for i in range(cfg.num_decoder_layers):
      layer = self.layer(i)
      entry = {"k": jnp.zeros(shape, cfg.activation_dtype),
               "v": jnp.zeros(shape, cfg.activation_dtype)}
      if layer.has_cross_attention:
        k, v = layer.encoder_decoder_attention.project_kv(encoded, extras)
        entry["cross_k"], entry["cross_v"] = k, v  # [B, L, K, E]
      cache[f"layers_{i}"] = entry
    return cache

  def decode_step(self, x: Array, cache: dict, cur_index: Array,
                  embedder: layers.Embed, extras: Any = None):
    """One position: embedded token ``x`` [B, 1, D] -> (logits [B, V], cache)."""
    cfg = self.config
    max_len = cache["layers_0"]["k"].shape[1]
    full_bias = self.relpos_bias(max_len, max_len)  # [1, H, T, T]
    self_bias = jax.lax.dynamic_slice_in_dim(full_bias, cur_index, 1, axis=2)  # [1, H, 1, T]
    self_mask = (jnp.arange(max_len) <= cur_index)[None, None, None, :]       # [1, 1, 1, T]
    cross_mask = cache["encoder_mask"][:, None, None, :]                     # [B, 1, 1, L]
    new_cache = {"encoder_mask": cache["encoder_mask"]}
    for i in range(cfg.num_decoder_layers):
      layer = self.layer(i)
      entry = cache[f"layers_{i}"]
      cross_kv = ((entry["cross_k"], entry["cross_v"])
                  if layer.has_cross_attention else None)
      x, kv, _, _ = layer(x, None, self_mask=self_mask, self_bias=self_bias,
                          cross_mask=cross_mask, cache=entry,
                          cur_index=cur_index, cross_kv=cross_kv, extras=extras)
      new_cache[f"layers_{i}"] = {**entry, **kv}
    x = self.decoder_norm(x)
    return self.logits(x, embedder)[:, 0], new_cache  # [B, V]


class T5(nnx.Module):
  """The T5 encoder-decoder network."""

  def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
    self.config = config
    self.token_embedder = layers.Embed(config, rngs=rngs)
    self.encoder = Encoder(config, rngs=rngs)
    self.decoder = Decoder(config, rngs=rngs)

  def embed(self, tokens: Array, dropout_rng: Array | None = None) -> Array:
    x = self.token_embedder(tokens)  # [B, L, D]
    return dropout(x, self.config.dropout_rate, dropout_rng)

  def encode(self, tokens: Array, *, mask: Array | None = None,
             dropout_rng: Array | None = None, extras: Any = None,
             **stack_kwargs) -> StackOutput:
    """Encode int32 tokens [B, L] (0 = padding, masked) -> hidden [B, L, D]."""
    mask = (tokens != 0) if mask is None else mask
    x = self.embed(tokens, fold(dropout_rng, 0))
    return self.encoder(x, mask, dropout_rng=fold(dropout_rng, 1),
                        extras=extras, **stack_kwargs)

  def decode(self, encoded: Array, encoder_mask: Array,
             decoder_input_tokens: Array, *, dropout_rng: Array | None = None,
             extras: Any = None, **stack_kwargs):
    """Teacher-forced decoder -> (logits float32 [B, T, V], StackOutput)."""
    x = self.embed(decoder_input_tokens, fold(dropout_rng, 0))  # [B, T, D]
    return self.decoder(x, encoded, encoder_mask, self.token_embedder,
                        dropout_rng=fold(dropout_rng, 1), extras=extras,
                        **stack_kwargs)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               *, dropout_rng: Array | None = None, extras: Any = None) -> Array:
    """int32 [B, L], [B, T] -> float32 logits [B, T, V]."""
    enc = self.encode(encoder_input_tokens, dropout_rng=fold(dropout_rng, 0),
                      extras=extras)
    logits, _ = self.decode(enc.hidden, enc.mask, decoder_input_tokens,
                            dropout_rng=fold(dropout_rng, 1), extras=extras)
    return logits

  def init_cache(self, encoded: Array, encoder_mask: Array,
                 max_decode_len: int, extras: Any = None) -> dict:
    return self.decoder.init_cache(encoded, encoder_mask, max_decode_len,
                                   extras)

  def decode_step(self, tokens: Array, cache: dict, cur_index: Array,
                  extras: Any = None):
    """int32 [B] tokens at ``cur_index`` -> (logits float32 [B, V], cache)."""
    x = self.token_embedder(tokens[:, None])  # [B, 1, D]
    return self.decoder.decode_step(x, cache, cur_index, self.token_embedder,
                                    extras)


def abstract_t5(config: T5Config) -> T5:
  """The network with abstract (shape-only) parameters: no memory, no FLOPs."""
  return nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0)))


def count_params(model: nnx.Module) -> int:
  state = nnx.state(model, nnx.Param)
  return sum(int(x.size) for x in jax.tree.leaves(state))
