"""Dense T5/FiD parameters -> FiDO parameters: FiDO "uptraining".

FiDO (de Jong et al. 2022) does not pretrain its decoder from scratch: it
takes a standard T5 checkpoint, changes the decoder and continues training.
Its two changes alter the parameter tree (``jaxfid.t5.network``):

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

The trainer (``jaxfid.fid.trainer.load_initial_params``) applies the
conversion when INIT_CHECKPOINT is dense and the run is FiDO of otherwise the
same architecture (:func:`can_uptrain`); :func:`differing_fields` names what
differs otherwise. Fields that only affect a run (dropout, activation dtype,
rematerialisation) never count as differences.
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
  """Whether :func:`fido_params_from_dense` turns ``source``'s params into ``target``'s.

  True iff ``source`` is dense, ``target`` is not, and they agree in
  everything but the FiDO switches (and run-only fields).
  """
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
  """FiDO ``fido_config``'s parameters from a dense model's.

  Args:
    dense_params: nested params (numpy or jax arrays, any float dtype) of a
      model with cross-attention in every decoder layer and multi-head
      cross-attention.
    dense_config: its configuration.
    fido_config: the target; same sizes, any ``cross_attention_period`` and
      ``multi_query_cross_attention``.
    source: named in errors (a path).

  Returns:
    Nested float32 jax arrays with the FiDO model's names and shapes.

  Raises:
    ValueError: the configurations differ in anything but the FiDO switches,
      or ``dense_config`` is not dense.
    jaxfid.core.errors.InputError: the params do not fit the dense config.
  """
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
