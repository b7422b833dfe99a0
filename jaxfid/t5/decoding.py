"""Greedy decoding, sampling and beam search as pure, jittable functions.

The model side supplies a callback and a cache::

  tokens_to_logits(DecodingState(cur_index, cur_token, cache))
      -> (logits float32 [N, vocab], new_cache)

``N`` is the batch (greedy, sampling) or ``batch * num_beams`` (beam search);
``cur_index`` is the int32 position being decoded (0 when ``cur_token`` is
the start id). Each decoder is one ``lax.while_loop`` with static shapes that
stops once nothing can change; keyword arguments are static. Outputs exclude
the start token and hold at most ``max_decode_len`` tokens, EOS included,
then 0. Beam search (:mod:`jaxfid.t5.beam`) is re-exported here.
"""
from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp

from jaxfid.t5.beam import (EARLY_STOPPING, NEG_INF, EarlyStopping,
                            beam_search, expand_cache, flat_batch_beam_expand,
                            gather_beams, gather_flat_cache, hf_length_penalty,
                            t5x_brevity_penalty)
from jaxfid.t5.decoding_state import (PAD_ID, DecodingState, TokensToLogits,
                                      check_max_decode_len)


# ------------------------------------------------------------------------------
# Greedy decoding and sampling.
# ------------------------------------------------------------------------------


@flax.struct.dataclass
class _StepState:
  cur_index: jax.Array  # int32 scalar
  cur_token: jax.Array  # int32 [B]
  sequences: jax.Array  # int32 [B, max_decode_len]
  lengths: jax.Array  # int32 [B], tokens emitted before ending (EOS included)
  ended: jax.Array  # bool [B]
  cache: Any


def _token_by_token(tokens_to_logits: TokensToLogits, cache: Any,
                    choose: Callable[[jax.Array, jax.Array], jax.Array], *,
                    batch_size: int, max_decode_len: int, eos_id: int,
                    start_id: int) -> tuple[jax.Array, jax.Array]:
  """One token per sequence per step; ``choose(logits, cur_index) -> ids``."""
  check_max_decode_len(max_decode_len)
  init = _StepState(
      cur_index=jnp.array(0, jnp.int32),
      cur_token=jnp.full((batch_size,), start_id, jnp.int32),
      sequences=jnp.full((batch_size, max_decode_len), PAD_ID, jnp.int32),
      lengths=jnp.zeros((batch_size,), jnp.int32),
      ended=jnp.zeros((batch_size,), jnp.bool_),
      cache=cache)

  def cond(s: _StepState):
    return (s.cur_index < max_decode_len) & ~jnp.all(s.ended)

  def body(s: _StepState) -> _StepState:
    logits, new_cache = tokens_to_logits(
        DecodingState(cur_index=s.cur_index, cur_token=s.cur_token,
                      cache=s.cache))
    token = choose(logits.astype(jnp.float32), s.cur_index).astype(jnp.int32)
    token = jnp.where(s.ended, PAD_ID, token)
    sequences = jax.lax.dynamic_update_slice(
        s.sequences, token[:, None], (0, s.cur_index))
    return _StepState(
        cur_index=s.cur_index + 1,
        cur_token=token,
        sequences=sequences,
        lengths=s.lengths + (~s.ended).astype(jnp.int32),
        ended=s.ended | (token == eos_id),
        cache=new_cache)

  final = jax.lax.while_loop(cond, body, init)
  return final.sequences, final.lengths


def _argmax(logits: jax.Array, cur_index: jax.Array) -> jax.Array:
  del cur_index
  return jnp.argmax(logits, axis=-1)


def greedy_decode(tokens_to_logits: TokensToLogits, cache: Any, *,
                  batch_size: int, max_decode_len: int, eos_id: int = 1,
                  start_id: int = 0) -> tuple[jax.Array, jax.Array]:
  """Greedy (argmax, first index on ties) decoding.

  Returns (tokens int32 [B, max_decode_len], lengths int32 [B]); ``lengths``
  counts tokens up to and including EOS (``max_decode_len`` without EOS).
  """
  return _token_by_token(tokens_to_logits, cache, _argmax,
                         batch_size=batch_size, max_decode_len=max_decode_len,
                         eos_id=eos_id, start_id=start_id)


def temperature_sample(tokens_to_logits: TokensToLogits, cache: Any,
                       rng: jax.Array, *, batch_size: int, max_decode_len: int,
                       temperature: float = 1.0, topk: int = 0,
                       eos_id: int = 1, start_id: int = 0
                       ) -> tuple[jax.Array, jax.Array]:
  """Ancestral sampling from ``softmax(logits / temperature)``.

  Step ``i`` uses ``fold_in(rng, i)``; temperature 0 is greedy; ``topk`` > 0
  samples among the ``topk`` largest logits (ties at the threshold kept).
  Returns what :func:`greedy_decode` returns.
  """
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}")
  if topk < 0:
    raise ValueError(f"topk must be >= 0, got {topk}")
  if temperature == 0:
    choose = _argmax
  else:
    def choose(logits, cur_index):
      logits = logits / temperature
      if topk:
        kth = jax.lax.top_k(logits, topk)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
      return jax.random.categorical(jax.random.fold_in(rng, cur_index), logits)
  return _token_by_token(tokens_to_logits, cache, choose,
                         batch_size=batch_size, max_decode_len=max_decode_len,
                         eos_id=eos_id, start_id=start_id)


__all__ = ["DecodingState", "TokensToLogits", "PAD_ID", "NEG_INF",
           "EarlyStopping", "EARLY_STOPPING", "greedy_decode",
           "temperature_sample", "beam_search", "expand_cache",
           "flat_batch_beam_expand", "gather_beams", "gather_flat_cache",
           "t5x_brevity_penalty", "hf_length_penalty"]
