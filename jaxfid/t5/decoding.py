"""Greedy decoding, sampling and beam search as pure, jittable functions.

The model side supplies a callback and a cache::

  tokens_to_logits(DecodingState(cur_index, cur_token, cache))
      -> (logits float32 [N, vocab], new_cache)

where ``N`` is the batch (greedy) or ``batch * num_beams`` (beam search, beams
of one example adjacent: row ``b * num_beams + k``), ``cur_index`` is the
int32 scalar position being decoded (0 for the first step, when ``cur_token``
is the decoder start id) and ``cache`` is any pytree of arrays. Each decoder
runs one ``jax.lax.while_loop`` with static shapes and stops the whole loop as
soon as nothing can change any more (every sequence ended for greedy and
sampling; every example's result frozen for beam search). They are plain
traceable functions: wrap them, together with the encoder, in one ``jax.jit``
(all keyword arguments are static Python values).

Outputs never contain the start token. A sequence holds at most
``max_decode_len`` new tokens, EOS included; everything after EOS is 0.

Cache handling in beam search (explicit rule)
  * Expansion: by default every array leaf whose leading dimension equals
    ``batch_size`` is repeated ``num_beams`` times along axis 0
    (``flat_batch_beam_expand``: rows ``b*K .. b*K+K-1`` are copies of row
    ``b``); every other leaf (scalars such as a cache index, or anything whose
    leading axis is not the batch) is passed through unchanged and shared by
    all beams. A caller whose cache breaks this rule passes
    ``expand_cache_fn(cache, num_beams) -> cache`` to do the expansion itself.
  * Reordering: after each step every array leaf of the *returned* cache whose
    leading dimension equals ``batch_size * num_beams`` is gathered along that
    axis with the surviving beams' parent rows (``gather_flat_cache``); other
    leaves are left alone. So a leaf meant to be shared must not have leading
    dimension ``batch_size * num_beams``.

Two beam-search variants (``length_penalty_style``), mirroring two references.
Both take the top ``2 * num_beams`` candidates (over beams x vocabulary) of the
accumulated float32 log-softmax scores each step, continue the best
``num_beams`` candidates that do not end in EOS, and keep a "finished" set of
``num_beams`` slots sorted best first.

``"t5x"`` -- t5x ``decoding.beam_search``:
  * every EOS candidate among the 2K enters the finished set with score
    ``logprob / ((5 + length) / 6) ** alpha`` (length counts generated tokens,
    EOS included);
  * the loop ends at ``max_decode_len`` or when, for every example, all
    finished slots are full and the worst finished score beats the best live
    log-prob divided by the penalty at length ``max_decode_len + 1`` (t5x's
    bound, kept exactly; for ``alpha >= 0`` it is a safe bound, so stopping
    there changes no result);
  * live sequences that reach ``max_decode_len`` are *not* finished; an example
    with no finished sequence at all returns its live beams and raw log-probs;
  * ``early_stopping`` is ignored. Masking uses -1e9 instead of t5x's -1e7,
    results are sorted best first (t5x returns worst first), and t5x's
    forced decoding of prompt tokens (``inputs``) is not supported.

``"hf"`` -- HF transformers 5.x ``GenerationMixin._beam_search`` (the
vectorised implementation, read from transformers 5.24.0) with one EOS id and
no logits processors. Correspondence (HF name -> here): ``cur_len - 1`` (T5's
decoder prompt is the start token) -> ``cur_index``; ``running_beam_scores`` ->
``live_scores``; ``beam_scores`` / ``sequences`` / ``is_sent_finished`` ->
``finished_scores`` / ``finished_seqs`` / ``finished_flags``;
``is_early_stop_heuristic_unsatisfied`` -> ``improvable``;
``max_length - decoder_prompt_len`` (= ``max_new_tokens``) ->
``max_decode_len``; the -1e9 constants are HF's. Per step:
  * ``_get_top_k_continuations``: top 2K of ``log_softmax + live_scores``;
  * stopping criteria: a candidate "hits" if its token is EOS or its length
    reaches ``max_decode_len`` (``MaxLengthCriteria``; so at the last step
    every candidate hits);
  * ``_get_running_beams_for_next_iteration``: top K of
    ``topk_scores - 1e9 * hits``;
  * ``_update_finished_beams``: only hitting candidates ranked within the top
    K of the 2K may finish, with score ``sum_logprobs / length ** alpha``;
    -1e9 is added when the example's slots are all full and
    ``early_stopping is True``, when the previous step's heuristic said no
    improvement is possible, and for non-finishing candidates; then the top K
    of (old finished ++ new) are kept;
  * ``_check_early_stop_heuristic`` (with ``cur_len`` already incremented):
    ``best = live_scores[:, 0] / L ** alpha`` with ``L = max_decode_len`` when
    ``early_stopping == "never"`` and ``alpha > 0``, else the current length;
    ``improvable &= any(best > where(finished_flags, min(finished_scores),
    -1e9))`` -- sticky per example;
  * ``_beam_search_has_unfinished_sequences``: continue while
    ``any(improvable)`` and not (``early_stopping is True`` and every slot of
    every example finished) and the last step was not the maximum length.
  The result is the finished set (HF's ``sequences`` / ``sequences_scores``;
  ``num_return_sequences=n`` is ``[:, :n]``), best first. Length penalties
  are computed in float64 and rounded to float32 once, like HF's
  Python-scalar division of a float32 tensor.
  Known deviations, all confined to exact ties or dead beams: ``lax.top_k``
  breaks ties by lower index while ``torch.topk`` gives no guarantee; with
  ``vocab_size < 2 * num_beams`` the first step selects some of the
  initial -1e9 "dead" beams, whose near-equal scores are ties; and HF pads
  ended beams with EOS (its fill value is ``pad_token_id or eos``) where this
  module pads with 0. With ``num_beams=1`` this equals greedy decoding unless
  ``early_stopping == "never"`` and ``alpha > 0`` (then a longer sequence may
  win). ``tests/test_decoding.py`` compares tokens and scores with
  ``model.generate`` on a tiny random torch T5.
"""
from __future__ import annotations

from typing import Any, Callable, Literal, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

PAD_ID = 0
# HF's "-1e9" masking constant, as a float32 (exactly representable).
NEG_INF = np.float32(-1.0e9)

EarlyStopping = Union[bool, Literal["never"]]


@flax.struct.dataclass
class DecodingState:
  """What ``tokens_to_logits`` sees at one decoding step.

  Attributes:
    cur_index: int32 scalar, the position being decoded (0 on the first step).
    cur_token: int32 [N], the token at ``cur_index`` (the start id at step 0).
    cache: the caller's pytree, as returned by the previous call.
  """
  cur_index: jax.Array
  cur_token: jax.Array
  cache: Any


TokensToLogits = Callable[[DecodingState], tuple[jax.Array, Any]]


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


def _penalty_table(style: str, alpha: float, max_decode_len: int) -> np.ndarray:
  """float32 penalties indexed by generated length 0..max_decode_len + 1.

  Computed in float64 and rounded once (as HF divides a float32 tensor by a
  Python float). Index 0 is never used for scoring and set to 1.
  """
  lengths = np.arange(max_decode_len + 2, dtype=np.float64)
  if style == "t5x":
    table = t5x_brevity_penalty(lengths, alpha)
  else:
    table = hf_length_penalty(np.maximum(lengths, 1.0), alpha)
  table[0] = 1.0
  return table.astype(np.float32)


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
  _check_len(max_decode_len)
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

  Args:
    tokens_to_logits: the model step (see module docstring).
    cache: the initial cache, leading axis ``batch_size`` where batched.
    batch_size: B.
    max_decode_len: maximum number of new tokens (EOS included).
    eos_id: end-of-sequence id; after it the sequence emits ``PAD_ID`` (0).
    start_id: decoder start token fed at step 0.

  Returns:
    (tokens int32 [B, max_decode_len], lengths int32 [B]) where ``lengths``
    counts the generated tokens up to and including EOS (``max_decode_len``
    when no EOS was produced).
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

  Args:
    tokens_to_logits, cache, batch_size, max_decode_len, eos_id, start_id: as
      for ``greedy_decode``.
    rng: a JAX PRNG key; step ``i`` uses ``fold_in(rng, i)``.
    temperature: >= 0; 0 means greedy.
    topk: if > 0, sample only among the ``topk`` largest logits (ties at the
      threshold are kept).

  Returns:
    (tokens int32 [B, max_decode_len], lengths int32 [B]) as greedy_decode.
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


# ------------------------------------------------------------------------------
# Beam search.
# ------------------------------------------------------------------------------


@flax.struct.dataclass
class _BeamState:
  cur_index: jax.Array  # int32 scalar: tokens generated so far
  live_scores: jax.Array  # f32 [B, K] accumulated log-probs, best first
  live_seqs: jax.Array  # int32 [B, K, 1 + L]; column 0 is the start id
  finished_scores: jax.Array  # f32 [B, K], best first
  finished_seqs: jax.Array  # int32 [B, K, 1 + L]
  finished_flags: jax.Array  # bool [B, K]: slot holds a finished sequence
  improvable: jax.Array  # bool [B]: HF's is_early_stop_heuristic_unsatisfied
  cache: Any  # leaves flattened to [B * K, ...] where batched


def beam_search(tokens_to_logits: TokensToLogits, cache: Any, *,
                batch_size: int, num_beams: int, max_decode_len: int,
                alpha: float = 0.6,
                length_penalty_style: Literal["t5x", "hf"] = "t5x",
                eos_id: int = 1, start_id: int = 0,
                early_stopping: EarlyStopping = False,
                expand_cache_fn: Callable[[Any, int], Any] | None = None
                ) -> tuple[jax.Array, jax.Array]:
  """Beam search (see the module docstring for both variants).

  Args:
    tokens_to_logits: the model step; called on ``batch_size * num_beams``
      rows.
    cache: the initial, unexpanded cache (leading axis ``batch_size``).
    batch_size: B.
    num_beams: K.
    max_decode_len: maximum number of new tokens (EOS included).
    alpha: length-penalty exponent (t5x ``alpha`` / HF ``length_penalty``), a
      Python float.
    length_penalty_style: "t5x" or "hf".
    eos_id: end-of-sequence id.
    start_id: decoder start token fed at step 0.
    early_stopping: HF's ``early_stopping`` (True, False or "never"); only used
      by the "hf" style.
    expand_cache_fn: optional ``(cache, num_beams) -> cache`` replacing the
      default expansion rule.

  Returns:
    (tokens int32 [B, K, max_decode_len], scores float32 [B, K]), sorted best
    first; tokens after EOS are 0.
  """
  _check_len(max_decode_len)
  if num_beams < 1:
    raise ValueError(f"num_beams must be >= 1, got {num_beams}")
  if length_penalty_style not in ("t5x", "hf"):
    raise ValueError("length_penalty_style must be 't5x' or 'hf', got "
                     f"{length_penalty_style!r}")
  if not (early_stopping is True or early_stopping is False
          or early_stopping == "never"):
    raise ValueError("early_stopping must be True, False or 'never', got "
                     f"{early_stopping!r}")
  hf = length_penalty_style == "hf"
  k, k2 = num_beams, 2 * num_beams
  penalty = jnp.asarray(
      _penalty_table(length_penalty_style, alpha, max_decode_len))

  if expand_cache_fn is not None:
    flat_cache = expand_cache_fn(cache, num_beams)
  else:
    flat_cache = expand_cache(cache, batch_size, num_beams)
  seqs0 = jnp.full((batch_size, k, max_decode_len + 1), PAD_ID, jnp.int32)
  seqs0 = seqs0.at[:, :, 0].set(start_id)
  init = _BeamState(
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

  def cond(s: _BeamState):
    not_at_end = s.cur_index < max_decode_len
    if hf:
      going = jnp.any(s.improvable)
      if early_stopping is True:
        going &= ~jnp.all(s.finished_flags)
      return not_at_end & going
    # t5x: stop when no live beam can beat the worst finished one anywhere.
    best_live = s.live_scores[:, :1] / penalty[max_decode_len + 1]
    worst_finished = jnp.where(
        s.finished_flags, jnp.min(s.finished_scores, axis=1, keepdims=True),
        NEG_INF)
    return not_at_end & ~jnp.all(worst_finished > best_live)

  def body(s: _BeamState) -> _BeamState:
    t = s.cur_index
    length = t + 1
    cur_token = jax.lax.dynamic_index_in_dim(
        s.live_seqs, t, axis=2, keepdims=False).reshape(-1)
    logits, new_cache = tokens_to_logits(
        DecodingState(cur_index=t, cur_token=cur_token, cache=s.cache))
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    vocab = log_probs.shape[-1]
    scores = (log_probs.reshape(batch_size, k, vocab)
              + s.live_scores[:, :, None]).reshape(batch_size, k * vocab)

    # Top 2K candidates over (beam, token).
    topk_scores, topk_idx = jax.lax.top_k(scores, k2)
    topk_parent = topk_idx // vocab
    topk_token = (topk_idx % vocab).astype(jnp.int32)
    topk_seqs = gather_beams(s.live_seqs, topk_parent)
    topk_seqs = jax.lax.dynamic_update_slice(
        topk_seqs, topk_token[:, :, None], (0, 0, length))
    is_eos = topk_token == eos_id
    hits = is_eos | (length >= max_decode_len) if hf else is_eos

    # Live beams: the best K candidates that do not end here.
    live_candidates = topk_scores + hits.astype(jnp.float32) * NEG_INF
    live_scores, live_pick = jax.lax.top_k(live_candidates, k)
    live_seqs = gather_beams(topk_seqs, live_pick)
    live_parent = gather_beams(topk_parent, live_pick)
    cache_next = gather_flat_cache(new_cache, live_parent)

    # Finished set.
    new_scores = topk_scores / penalty[length]
    if hf:
      in_top_k = jnp.arange(k2) < k
      finishing = hits & in_top_k[None, :]
      if early_stopping is True:
        full = jnp.all(s.finished_flags, axis=1, keepdims=True)
        new_scores = new_scores + full.astype(jnp.float32) * NEG_INF
      new_scores = new_scores + (~s.improvable[:, None]).astype(
          jnp.float32) * NEG_INF
    else:
      finishing = is_eos
    new_scores = new_scores + (~finishing).astype(jnp.float32) * NEG_INF
    merged_scores = jnp.concatenate([s.finished_scores, new_scores], axis=1)
    finished_scores, pick = jax.lax.top_k(merged_scores, k)
    finished_seqs = gather_beams(
        jnp.concatenate([s.finished_seqs, topk_seqs], axis=1), pick)
    finished_flags = gather_beams(
        jnp.concatenate([s.finished_flags, finishing], axis=1), pick)

    improvable = s.improvable
    if hf:
      if early_stopping == "never" and alpha > 0.0:
        best_len_penalty = penalty[max_decode_len]
      else:
        best_len_penalty = penalty[length]
      best_possible = live_scores[:, 0] / best_len_penalty
      worst = jnp.where(finished_flags,
                        jnp.min(finished_scores, axis=1, keepdims=True),
                        NEG_INF)
      improvable = improvable & jnp.any(best_possible[:, None] > worst,
                                        axis=-1)
    return _BeamState(
        cur_index=length,
        live_scores=live_scores,
        live_seqs=live_seqs,
        finished_scores=finished_scores,
        finished_seqs=finished_seqs,
        finished_flags=finished_flags,
        improvable=improvable,
        cache=cache_next)

  final = jax.lax.while_loop(cond, body, init)
  tokens, scores = final.finished_seqs, final.finished_scores
  if not hf:
    # t5x: an example with nothing finished returns its live beams.
    none = ~jnp.any(final.finished_flags, axis=1)
    tokens = jnp.where(none[:, None, None], final.live_seqs, tokens)
    scores = jnp.where(none[:, None], final.live_scores, scores)
  return tokens[:, :, 1:], scores


def _check_len(max_decode_len: int) -> None:
  if max_decode_len < 1:
    raise ValueError(f"max_decode_len must be >= 1, got {max_decode_len}")
