"""Beam search as a pure, jittable function: one shared loop, two update rules.

The model step is :mod:`jaxfid.t5.decoding`'s ``tokens_to_logits``, called on
``batch_size * num_beams`` rows (row ``b * num_beams + k``). Letters: B
batch, K beams, V vocabulary, L ``max_decode_len``.

Cache rule: at the start every array leaf whose leading dimension is
``batch_size`` is repeated K times along axis 0 (other leaves are shared;
``expand_cache_fn`` replaces this rule); after each step every leaf of the
returned cache whose leading dimension is ``batch_size * num_beams`` is
gathered with the surviving beams' parent rows.

The loop (:func:`_beam_loop`) takes the top 2K candidates of the float32
log-softmax scores, continues the best K that do not end, merges ending ones
into K "finished" slots sorted best first, and reorders the cache. The rule
(``length_penalty_style``) decides the penalty, which candidates finish,
when to stop and what to return:

``"t5x"`` (:class:`T5xUpdate`, t5x ``decoding.beam_search``): every EOS
candidate finishes with ``logprob / ((5 + length) / 6) ** alpha``; the loop
stops at ``max_decode_len`` or when no live beam can beat the worst finished
one; an example with nothing finished returns its live beams. Results are
best first; ``early_stopping`` and forced prompt decoding are not supported.

``"hf"`` (:class:`HfUpdate`, transformers' vectorised
``GenerationMixin._beam_search``, one EOS id, no logits processors): a
candidate ends on EOS or at ``max_decode_len``; only ending candidates within
the top K of the 2K finish, with ``sum_logprobs / length ** alpha``;
``early_stopping`` (True, False, "never") and HF's sticky per-example
"improvable" heuristic decide when to stop; length penalties are computed in
float64 and rounded to float32 once. Results differ from HF's only at exact
ties, with ``vocab_size < 2 * num_beams``, and in padding after EOS (0).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.t5.decoding_state import (PAD_ID, DecodingState, TokensToLogits,
                                      check_max_decode_len)

# HF's "-1e9" masking constant, as a float32 (exactly representable).
NEG_INF = np.float32(-1.0e9)

EarlyStopping = Union[bool, Literal["never"]]
# HF's ``early_stopping`` when a caller gives none: ``GenerationConfig``'s
# default, the one of ``beam_search`` and ``EncoderDecoderModel.predict``.
EARLY_STOPPING: EarlyStopping = False


# ------------------------------------------------------------------------------
# Beam helpers.
# ------------------------------------------------------------------------------


def flat_batch_beam_expand(x: jax.Array, num_beams: int) -> jax.Array:
  """[B, ...] -> [B * num_beams, ...], each row repeated ``num_beams`` times."""
  return jnp.repeat(x, num_beams, axis=0)


def expand_cache(cache: Any, batch_size: int, num_beams: int) -> Any:
  """Default cache expansion: repeats leaves with leading dim ``batch_size``."""
  def expand(x):
    if getattr(x, "ndim", 0) >= 1 and x.shape[0] == batch_size:
      return flat_batch_beam_expand(x, num_beams)
    return x
  return jax.tree_util.tree_map(expand, cache)


def gather_beams(x: jax.Array, beam_indices: jax.Array) -> jax.Array:
  """[B, K, ...] gathered by beam_indices [B, K'] -> [B, K', ...]."""
  batch = jnp.arange(x.shape[0])[:, None]
  return x[batch, beam_indices]


def gather_flat_cache(cache: Any, beam_indices: jax.Array) -> Any:
  """Reorders the flattened-beam cache by beam_indices [B, K] (parent beams).

  Leaves whose leading dimension is ``B * K`` are gathered along axis 0;
  the others are returned unchanged (shared across beams).
  """
  batch_size, num_beams = beam_indices.shape
  flat = (jnp.arange(batch_size, dtype=jnp.int32)[:, None] * num_beams
          + beam_indices.astype(jnp.int32)).reshape(-1)

  def gather(x):
    if getattr(x, "ndim", 0) >= 1 and x.shape[0] == batch_size * num_beams:
      return jnp.take(x, flat, axis=0)
    return x
  return jax.tree_util.tree_map(gather, cache)


def t5x_brevity_penalty(length, alpha: float):
  """t5x's brevity penalty ``((5 + length) / 6) ** alpha``."""
  return ((5.0 + length) / 6.0) ** alpha


def hf_length_penalty(length, alpha: float):
  """HF's length normalisation ``length ** alpha`` (length counts EOS)."""
  return length ** alpha


def _lengths(max_decode_len: int) -> np.ndarray:
  """float64 generated lengths 0..max_decode_len + 1 (a penalty table's index)."""
  return np.arange(max_decode_len + 2, dtype=np.float64)


def _penalty_table(table: np.ndarray) -> np.ndarray:
  """float32 penalties indexed by generated length 0..max_decode_len + 1.

  Computed in float64 and rounded once (as HF divides a float32 tensor by a
  Python float). Index 0 is never used for scoring and set to 1.
  """
  table[0] = 1.0
  return table.astype(np.float32)


@flax.struct.dataclass
class BeamState:
  """The loop's carry."""
  cur_index: jax.Array  # int32 scalar: tokens generated so far
  live_scores: jax.Array  # f32 [B, K] accumulated log-probs, best first
  live_seqs: jax.Array  # int32 [B, K, 1 + L]; column 0 is the start id
  finished_scores: jax.Array  # f32 [B, K], best first
  finished_seqs: jax.Array  # int32 [B, K, 1 + L]
  finished_flags: jax.Array  # bool [B, K]: slot holds a finished sequence
  improvable: jax.Array  # bool [B]: HF's is_early_stop_heuristic_unsatisfied
  cache: Any  # leaves flattened to [B * K, ...] where batched


# ------------------------------------------------------------------------------
# The two update rules.
# ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class T5xUpdate:
  """t5x's rule (see the module docstring); ``early_stopping`` plays no part."""
  alpha: float
  max_decode_len: int

  def penalties(self) -> np.ndarray:
    return _penalty_table(t5x_brevity_penalty(_lengths(self.max_decode_len),
                                              self.alpha))

  def going(self, s: BeamState, penalty: jax.Array) -> jax.Array:
    """Whether some live beam can still beat the worst finished one."""
    best_live = s.live_scores[:, :1] / penalty[self.max_decode_len + 1]   # [B, 1]
    worst_finished = jnp.where(
        s.finished_flags, jnp.min(s.finished_scores, axis=1, keepdims=True),
        NEG_INF)                                                          # [B, K]
    return ~jnp.all(worst_finished > best_live)

  def ends(self, is_eos: jax.Array, length: jax.Array) -> jax.Array:
    """bool [B, 2K]: candidates that leave the live beams (EOS only)."""
    del length
    return is_eos

  def finishing(self, s: BeamState, is_eos: jax.Array, hits: jax.Array,
                new_scores: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(bool [B, 2K] candidates that may finish, their scores [B, 2K])."""
    del s, hits
    return is_eos, new_scores

  def improvable(self, s: BeamState, live_scores: jax.Array,
                 finished_scores: jax.Array, finished_flags: jax.Array,
                 length: jax.Array, penalty: jax.Array) -> jax.Array:
    del live_scores, finished_scores, finished_flags, length, penalty
    return s.improvable

  def result(self, final: BeamState) -> tuple[jax.Array, jax.Array]:
    """The finished set; an example with nothing finished: its live beams."""
    none = ~jnp.any(final.finished_flags, axis=1)                         # [B]
    tokens = jnp.where(none[:, None, None], final.live_seqs,
                       final.finished_seqs)                               # [B, K, 1 + L]
    scores = jnp.where(none[:, None], final.live_scores,
                       final.finished_scores)                             # [B, K]
    return tokens, scores


@dataclasses.dataclass(frozen=True)
class HfUpdate:
  """HF ``_beam_search``'s rule (see the module docstring)."""
  alpha: float
  max_decode_len: int
  early_stopping: EarlyStopping

  def penalties(self) -> np.ndarray:
    return _penalty_table(hf_length_penalty(
        np.maximum(_lengths(self.max_decode_len), 1.0), self.alpha))

  def going(self, s: BeamState, penalty: jax.Array) -> jax.Array:
    """``_beam_search_has_unfinished_sequences`` (less the length bound)."""
    del penalty
    going = jnp.any(s.improvable)
    if self.early_stopping is True:
      going &= ~jnp.all(s.finished_flags)
    return going

  def ends(self, is_eos: jax.Array, length: jax.Array) -> jax.Array:
    """bool [B, 2K]: EOS, or every candidate at the maximum length."""
    return is_eos | (length >= self.max_decode_len)

  def finishing(self, s: BeamState, is_eos: jax.Array, hits: jax.Array,
                new_scores: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``_update_finished_beams``: hits within the top K; -1e9 once full
    (``early_stopping is True``) or no longer improvable."""
    del is_eos
    k2 = hits.shape[1]
    in_top_k = jnp.arange(k2) < k2 // 2                                   # [2K]
    finishing = hits & in_top_k[None, :]                                  # [B, 2K]
    if self.early_stopping is True:
      full = jnp.all(s.finished_flags, axis=1, keepdims=True)             # [B, 1]
      new_scores = new_scores + full.astype(jnp.float32) * NEG_INF
    new_scores = new_scores + (~s.improvable[:, None]).astype(
        jnp.float32) * NEG_INF                                            # [B, 2K]
    return finishing, new_scores

  def improvable(self, s: BeamState, live_scores: jax.Array,
                 finished_scores: jax.Array, finished_flags: jax.Array,
                 length: jax.Array, penalty: jax.Array) -> jax.Array:
    """``_check_early_stop_heuristic``, sticky per example: bool [B]."""
    if self.early_stopping == "never" and self.alpha > 0.0:
      best_len_penalty = penalty[self.max_decode_len]
    else:
      best_len_penalty = penalty[length]
    best_possible = live_scores[:, 0] / best_len_penalty                  # [B]
    worst = jnp.where(finished_flags,
                      jnp.min(finished_scores, axis=1, keepdims=True),
                      NEG_INF)                                            # [B, K]
    return s.improvable & jnp.any(best_possible[:, None] > worst, axis=-1)

  def result(self, final: BeamState) -> tuple[jax.Array, jax.Array]:
    """The finished set (HF's ``sequences`` / ``sequences_scores``)."""
    return final.finished_seqs, final.finished_scores


UpdateRule = Union[T5xUpdate, HfUpdate]


# ------------------------------------------------------------------------------
# The shared loop.
# ------------------------------------------------------------------------------


def _beam_loop(tokens_to_logits: TokensToLogits, cache: Any,
               rule: UpdateRule, *, batch_size: int, num_beams: int,
               eos_id: int, start_id: int,
               expand_cache_fn: Callable[[Any, int], Any] | None
               ) -> tuple[jax.Array, jax.Array]:
  """The beam loop under ``rule``: (tokens [B, K, L], scores [B, K])."""
  max_decode_len = rule.max_decode_len
  k, k2 = num_beams, 2 * num_beams
  penalty = jnp.asarray(rule.penalties())                            # [L + 2]

  if expand_cache_fn is not None:
    flat_cache = expand_cache_fn(cache, num_beams)
  else:
    flat_cache = expand_cache(cache, batch_size, num_beams)
  seqs0 = jnp.full((batch_size, k, max_decode_len + 1), PAD_ID, jnp.int32)
  seqs0 = seqs0.at[:, :, 0].set(start_id)                            # [B, K, 1 + L]
  init = BeamState(
      cur_index=jnp.array(0, jnp.int32),
      live_scores=jnp.tile(
          jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32),
          (batch_size, 1)),
      live_seqs=seqs0,
      finished_scores=jnp.full((batch_size, k), NEG_INF, jnp.float32),
      finished_seqs=seqs0,
      finished_flags=jnp.zeros((batch_size, k), jnp.bool_),
      improvable=jnp.ones((batch_size,), jnp.bool_),
      cache=flat_cache)

  def cond(s: BeamState):
    return (s.cur_index < max_decode_len) & rule.going(s, penalty)

  def body(s: BeamState) -> BeamState:
    t = s.cur_index
    length = t + 1
    cur_token = jax.lax.dynamic_index_in_dim(
        s.live_seqs, t, axis=2, keepdims=False).reshape(-1)          # [B*K]
    logits, new_cache = tokens_to_logits(
        DecodingState(cur_index=t, cur_token=cur_token, cache=s.cache))
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B*K, V]
    vocab = log_probs.shape[-1]
    scores = (log_probs.reshape(batch_size, k, vocab)
              + s.live_scores[:, :, None]).reshape(batch_size, k * vocab)  # [B, K*V]

    # Top 2K candidates over (beam, token).
    topk_scores, topk_idx = jax.lax.top_k(scores, k2)                # [B, 2K]
    topk_parent = topk_idx // vocab
    topk_token = (topk_idx % vocab).astype(jnp.int32)
    topk_seqs = gather_beams(s.live_seqs, topk_parent)               # [B, 2K, 1 + L]
    topk_seqs = jax.lax.dynamic_update_slice(
        topk_seqs, topk_token[:, :, None], (0, 0, length))
    is_eos = topk_token == eos_id                                    # [B, 2K]
    hits = rule.ends(is_eos, length)

    # Live beams: the best K candidates that do not end here.
    live_candidates = topk_scores + hits.astype(jnp.float32) * NEG_INF
    live_scores, live_pick = jax.lax.top_k(live_candidates, k)       # [B, K]
    live_seqs = gather_beams(topk_seqs, live_pick)                   # [B, K, 1 + L]
    live_parent = gather_beams(topk_parent, live_pick)
    cache_next = gather_flat_cache(new_cache, live_parent)

    # Finished set: the best K of the old one and the finishing candidates.
    new_scores = topk_scores / penalty[length]                       # [B, 2K]
    finishing, new_scores = rule.finishing(s, is_eos, hits, new_scores)
    new_scores = new_scores + (~finishing).astype(jnp.float32) * NEG_INF
    merged_scores = jnp.concatenate([s.finished_scores, new_scores], axis=1)  # [B, 3K]
    finished_scores, pick = jax.lax.top_k(merged_scores, k)          # [B, K]
    finished_seqs = gather_beams(
        jnp.concatenate([s.finished_seqs, topk_seqs], axis=1), pick)
    finished_flags = gather_beams(
        jnp.concatenate([s.finished_flags, finishing], axis=1), pick)

    return BeamState(
        cur_index=length,
        live_scores=live_scores,
        live_seqs=live_seqs,
        finished_scores=finished_scores,
        finished_seqs=finished_seqs,
        finished_flags=finished_flags,
        improvable=rule.improvable(s, live_scores, finished_scores,
                                   finished_flags, length, penalty),
        cache=cache_next)

  tokens, scores = rule.result(jax.lax.while_loop(cond, body, init))
  return tokens[:, :, 1:], scores


def beam_search(tokens_to_logits: TokensToLogits, cache: Any, *,
                batch_size: int, num_beams: int, max_decode_len: int,
                alpha: float = 0.6,
                length_penalty_style: Literal["t5x", "hf"] = "t5x",
                eos_id: int = 1, start_id: int = 0,
                early_stopping: EarlyStopping = EARLY_STOPPING,
                expand_cache_fn: Callable[[Any, int], Any] | None = None
                ) -> tuple[jax.Array, jax.Array]:
  """Beam search (see the module docstring for both update rules).

  Args:
    tokens_to_logits: the model step; called on ``batch_size * num_beams``
      rows.
    cache: the initial, unexpanded cache (leading axis ``batch_size``).
    max_decode_len: maximum number of new tokens (EOS included).
    alpha: length-penalty exponent (t5x ``alpha`` / HF ``length_penalty``).
    length_penalty_style: "t5x" or "hf": the update rule.
    early_stopping: HF's (True, False or "never"); "hf" rule only.
    expand_cache_fn: optional ``(cache, num_beams) -> cache``.

  Returns:
    (tokens int32 [B, K, max_decode_len], scores float32 [B, K]), best first;
    tokens after EOS are 0.
  """
  check_max_decode_len(max_decode_len)
  if num_beams < 1:
    raise ValueError(f"num_beams must be >= 1, got {num_beams}")
  if length_penalty_style not in ("t5x", "hf"):
    raise ValueError("length_penalty_style must be 't5x' or 'hf', got "
                     f"{length_penalty_style!r}")
  if not (early_stopping is True or early_stopping is False
          or early_stopping == "never"):
    raise ValueError("early_stopping must be True, False or 'never', got "
                     f"{early_stopping!r}")
  if length_penalty_style == "t5x":
    rule = T5xUpdate(alpha, max_decode_len)
  else:
    rule = HfUpdate(alpha, max_decode_len, early_stopping)
  return _beam_loop(tokens_to_logits, cache, rule, batch_size=batch_size,
                    num_beams=num_beams, eos_id=eos_id, start_id=start_id,
                    expand_cache_fn=expand_cache_fn)
