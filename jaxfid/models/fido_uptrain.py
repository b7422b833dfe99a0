"""Dense T5/FiD parameters -> FiDO parameters, the start of FiDO "uptraining".

FiDO (de Jong et al. 2022) does not pretrain its decoder from scratch: it
takes a standard T5 checkpoint, changes the decoder and continues training.
Its two changes alter the parameter tree (``jaxfid.models.t5``):

* layer-sparse cross-attention (``cross_attention_period = K``): decoder
  layers whose index i has ``(i + 1) % K != 0`` have no
  ``encoder_decoder_attention`` and no ``pre_cross_attention_layer_norm``;
  their dense weights are dropped;
* multi-query cross-attention: the cross-attention ``key``/``value`` kernels
  are ``[D, E]`` instead of ``[D, H*E]``; the H heads' projections are
  mean-pooled into one (the recipe of multi-query / grouped-query uptraining,
  Ainslie et al. 2023, which FiDO follows). Queries and outputs keep H heads.

Everything else is copied unchanged. The result is checked against the
FiDO model's abstract parameters (names and shapes) before it is returned.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxfid.models.config import T5Config
from jaxfid.models.loading import flatten, params_from_flat
from jaxfid.models.model import FiDModel

_CROSS = ("encoder_decoder_attention", "pre_cross_attention_layer_norm")


def _architecture(cfg: T5Config) -> T5Config:
  """The dense architecture of ``cfg`` with run-only fields normalised."""
  return dataclasses.replace(cfg, cross_attention_period=1,
                             multi_query_cross_attention=False,
                             dropout_rate=0.0, dtype="float32", remat="none")


def fido_params_from_dense(dense_params: dict, dense_config: T5Config,
                           fido_config: T5Config,
                           source: str = "dense checkpoint") -> dict:
  """FiDO ``fido_config``'s parameters from a dense model's.

  Args:
    dense_params: nested float32 params of a model with cross-attention in
      every decoder layer and multi-head cross-attention.
    dense_config: its configuration.
    fido_config: the target; same sizes, any ``cross_attention_period`` and
      ``multi_query_cross_attention``.
    source: named in errors (a path).

  Raises:
    ValueError: the configurations differ in anything but the FiDO switches,
      or ``dense_config`` is not dense.
    jaxfid.data.errors.InputError: the params do not fit the dense config.
  """
  if (dense_config.cross_attention_period != 1
      or dense_config.multi_query_cross_attention):
    raise ValueError("dense_config must have cross-attention in every layer "
                     "and multi-head cross-attention")
  if _architecture(dense_config) != _architecture(fido_config):
    diff = [f.name for f in dataclasses.fields(T5Config)
            if getattr(_architecture(dense_config), f.name)
            != getattr(_architecture(fido_config), f.name)]
    raise ValueError(f"dense and FiDO configs differ in {', '.join(diff)}")
  flat = flatten(params_from_flat(FiDModel(dense_config),
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
  return params_from_flat(FiDModel(fido_config), out, source)
