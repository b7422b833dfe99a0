"""Dense T5/FiD parameters -> FiDO parameters: FiDO "uptraining".

FiDO (de Jong et al. 2022) starts from a standard T5 checkpoint and changes
the decoder (``jaxfid.t5.network``): layer-sparse cross-attention
(``cross_attention_period = K``: layers with ``(i + 1) % K != 0`` lose
``encoder_decoder_attention`` and its layer norm, their weights dropped) and
multi-query cross-attention (``key``/``value`` kernels ``[D, E]``, the H
heads' projections mean-pooled, as Ainslie et al. 2023's uptraining).
Everything else is copied. The reader task applies it when INIT_CHECKPOINT is
dense and the run is FiDO of otherwise the same architecture
(:func:`can_uptrain`; run-only fields such as dropout, dtype or remat never
differ).
"""
from __future__ import annotations

import numpy as np

from jaxfid.checkpoints.load import params_from_flat
from jaxfid.checkpoints.names import flatten
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

# The FiDO switches: the T5Config fields an uptraining may change.
FIDO_FIELDS = ("cross_attention_period", "multi_query_cross_attention")
_CROSS = ("encoder_decoder_attention", "pre_cross_attention_layer_norm")


def is_dense(cfg: T5Config) -> bool:
  """Cross-attention in every decoder layer, with all key/value heads."""
  return cfg.cross_attention_period == 1 and not cfg.multi_query_cross_attention


def differing_fields(a: T5Config, b: T5Config) -> list[str]:
  """T5Config fields in which ``a`` and ``b`` differ (run-only ones ignored)."""
  return a.architecture_differences(b)


def can_uptrain(source: T5Config, target: T5Config) -> bool:
  """Whether :func:`fido_params_from_dense` turns ``source``'s params into
  ``target``'s: ``source`` dense, ``target`` not, the rest equal (run-only
  fields aside)."""
  return (is_dense(source) and not is_dense(target)
          and set(differing_fields(source, target)) <= set(FIDO_FIELDS))


def describe(cfg: T5Config) -> str:
  """One phrase for a FiDO decoder, e.g. 'cross-attention in decoder layers
  2, 4 of 4 (1-based), multi-query'."""
  kept = [str(i + 1) for i in range(cfg.num_decoder_layers)
          if cfg.has_cross_attention(i)]
  layers = ", ".join(kept) if kept else "none"
  return (f"cross-attention in decoder layers {layers} of "
          f"{cfg.num_decoder_layers} (1-based), "
          + ("multi-query" if cfg.multi_query_cross_attention
             else f"{cfg.num_heads} key/value heads"))


def fido_params_from_dense(dense_params: dict, dense_config: T5Config,
                           fido_config: T5Config,
                           source: str = "dense checkpoint") -> dict:
  """FiDO ``fido_config``'s parameters (nested float32 jax arrays, checked
  against its names and shapes) from ``dense_params`` of ``dense_config``
  (cross-attention in every decoder layer, multi-head). ValueError if the
  configs differ in more than the FiDO switches or ``dense_config`` is not
  dense; InputError (naming ``source``) if the params do not fit it."""
  if not is_dense(dense_config):
    raise ValueError("dense_config must have cross-attention in every layer "
                     "and multi-head cross-attention")
  diff = [f for f in differing_fields(dense_config, fido_config)
          if f not in FIDO_FIELDS]
  if diff:
    raise ValueError(f"dense and FiDO configs differ in {', '.join(diff)}")
  flat = flatten(params_from_flat(EncoderDecoderModel(dense_config),
                                  flatten(dense_params), source))
  h, e = fido_config.num_heads, fido_config.d_kv
  out = {}
  for name, value in flat.items():
    parts = name.split("/")
    if parts[0] == "decoder" and len(parts) > 2 and parts[2] in _CROSS:
      layer = int(parts[1][len("layers_"):])
      if not fido_config.has_cross_attention(layer):
        continue
      if (fido_config.multi_query_cross_attention and parts[2] == _CROSS[0]
          and parts[3] in ("key", "value")):
        kernel = np.asarray(value, np.float32)           # [D, H*E]
        value = kernel.reshape(kernel.shape[0], h, e).mean(axis=1)  # [D, E]
    out[name] = np.asarray(value, np.float32)
  return params_from_flat(EncoderDecoderModel(fido_config), out, source)
