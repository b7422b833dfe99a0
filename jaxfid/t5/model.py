"""The FiD/T5 model: the network plus loss, decoding and scoring (t5x ``models.py``).

``EncoderDecoderModel`` holds the network's graph definition and config; every
method is a pure function of ``params`` (an ``nnx.State``) and arrays. Plain
T5 is P = 1: encoder inputs may be ``[B, L]`` or ``[B, P, L]``.
:meth:`EncoderDecoderModel.encode` is the hook a method with another encoder
overrides.

Letters: B batch, P passages, L passage length, T target length, V vocabulary.

Batches are dicts of int32 arrays:
  encoder_input_tokens  [B, P, L] or [B, L]   0 = padding
  decoder_input_tokens  [B, T]                targets shifted right, start id 0
  decoder_target_tokens [B, T]                ends with EOS (1), 0 = padding
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxfid.t5 import decoding
from jaxfid.t5 import passages as fid
from jaxfid.t5.config import T5Config
from jaxfid.t5.layers import fold
from jaxfid.t5.network import T5, StackOutput

Array = jax.Array
EOS_ID = 1
START_ID = 0


def shift_right(targets: Array) -> Array:
  """Decoder inputs from targets: prepend the start id 0, drop the last."""
  return jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]  # [B, T]


def decoder_inputs(batch: dict) -> Array:
  """int32 [B, T]: the batch's ``decoder_input_tokens``, else its targets
  shifted right (t5x's feature converters may leave them out)."""
  inputs = batch.get("decoder_input_tokens")
  return shift_right(batch["decoder_target_tokens"]) if inputs is None else inputs


def token_log_likelihood(logits: Array, targets: Array) -> Array:
  """float32 [B, T]: ``log p(target token)`` at every position (padding
  reads id 0), from teacher-forced logits [B, T, V]."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)     # [B, T, V]
  return jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]   # [B, T]


def sequence_log_likelihood(logits: Array, targets: Array) -> Array:
  """float32 [B]: the sum of ``log p(target token)`` over non-padding targets
  (EOS included), from teacher-forced logits [B, T, V]."""
  token = token_log_likelihood(logits, targets)                      # [B, T]
  return jnp.sum(jnp.where(targets > 0, token, 0.0), axis=-1)        # [B]


@jax.custom_vjp
def _token_nll(logits: Array, targets: Array) -> Array:
  """float32 [B, T]: ``logsumexp(logits) - logits[target]`` per token."""
  return _token_nll_fwd(logits, targets)[0]


def _token_nll_fwd(logits, targets):
  logits32 = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits32, axis=-1)                                       # [B, T]
  target_logit = jnp.take_along_axis(logits32, targets[..., None], axis=-1)[..., 0]  # [B, T]
  return lse - target_logit, (logits, lse, targets)


def _token_nll_bwd(res, g):
  # d nll / d logits = softmax - one_hot(target): one elementwise pass over
  # [B, T, V] (autodiff of log_softmax + take_along_axis makes XLA:CPU build
  # the one-hot by a scatter and walk the vocabulary three more times).
  logits, lse, targets = res
  vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  one_hot = (vocab == targets[..., None]).astype(jnp.float32)
  probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])     # [B, T, V]
  dlogits = ((probs - one_hot) * g[..., None]).astype(logits.dtype)  # [B, T, V]
  # Computed once: unfenced, XLA:CPU fuses this into both of its consumer
  # dots and recomputes it in a transposed order for the weight gradient.
  return jax.lax.optimization_barrier(dlogits), None


_token_nll.defvjp(_token_nll_fwd, _token_nll_bwd)


def cross_entropy(logits: Array, targets: Array,
                  normalizer: Array | None = None) -> tuple[Array, Array, Array]:
  """Token cross-entropy over non-padding targets (EOS included).

  Returns (loss, target tokens, token accuracy). The loss is the mean over
  the batch's target tokens, or the sum over ``normalizer``. A token is
  correct when its target's logit is the largest (ties count as correct).
  """
  nll = _token_nll(logits, targets)                                   # [B, T]
  weights = (targets > 0).astype(jnp.float32)
  n = jnp.sum(weights)
  denom = n if normalizer is None else normalizer
  loss = jnp.sum(nll * weights) / jnp.maximum(denom, 1.0)
  logits = jax.lax.stop_gradient(logits)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [B, T]
  correct = (target_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)
  acc = jnp.sum(correct * weights) / jnp.maximum(n, 1.0)
  return loss, n, acc


class EncoderDecoderModel:
  """Loss, decoding, target scores and passage scores over a T5 network's parameters.

  ``params`` everywhere is a nested dict of float32 arrays keyed by the T5X
  parameter names (``nnx.to_pure_dict`` of the network's state), so it
  checkpoints, shards and converts without NNX in the way.
  """

  def __init__(self, config: T5Config):
    self.config = config
    net = nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0)))
    self.graphdef, self._abstract_state = nnx.split(net)

  @classmethod
  def create(cls, config: T5Config, seed: int = 0) -> tuple["EncoderDecoderModel", dict]:
    """A model and freshly initialised float32 parameters."""
    model = cls(config)
    return model, model.init_params(seed)

  def init_params(self, seed: int = 0) -> dict:
    return nnx.to_pure_dict(nnx.state(T5(self.config, rngs=nnx.Rngs(seed))))

  def abstract_params(self) -> dict:
    """Shape-only parameters (``jax.ShapeDtypeStruct`` leaves)."""
    return nnx.to_pure_dict(self._abstract_state)

  def param_axes(self) -> dict:
    """Logical axis names of every parameter, same tree as the params."""
    return nnx.to_pure_dict(jax.tree.map(
        lambda v: v.get_metadata("logical_axes"), self._abstract_state,
        is_leaf=lambda v: isinstance(v, nnx.Variable)))

  def network(self, params: dict) -> T5:
    state = jax.tree.map(lambda x: x, self._abstract_state)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(self.graphdef, state)

  # ---- the encode hook ----------------------------------------------------

  def encode(self, net: T5, tokens: Array, passage_mask: Array | None = None,
             *, dropout_rng: Array | None = None, extras: Any = None
             ) -> StackOutput:
    """Encode [B, P, L] (or [B, L]) passages: ``hidden`` [B, P*L, D], ``mask`` [B, P*L].

    The one hook through which logits, loss, scores and decoding encode; a
    method with another encoder overrides only this.
    """
    return fid.encode_passages(net, tokens, passage_mask=passage_mask,
                               dropout_rng=dropout_rng, extras=extras)

  # ---- training ---------------------------------------------------------

  def logits(self, params, encoder_input_tokens: Array,
             decoder_input_tokens: Array, *, passage_mask: Array | None = None,
             dropout_rng: Array | None = None, extras: Any = None,
             **encoder_features) -> Array:
    """float32 [B, T, V]; deterministic unless ``dropout_rng`` is given.

    Dropout keys: encoder ``fold(rng, 0)``, decoder ``fold(rng, 1)``.
    ``encoder_features`` go to :meth:`encode` (ReAtt: ``question_length``).
    """
    net = self.network(params)
    enc = self.encode(net, encoder_input_tokens, passage_mask,
                      dropout_rng=fold(dropout_rng, 0), extras=extras,
                      **encoder_features)
    logits, _ = net.decode(enc.hidden, enc.mask, decoder_input_tokens,
                           dropout_rng=fold(dropout_rng, 1), extras=extras)
    return logits

  def loss(self, params, batch: dict, dropout_rng: Array | None = None,
           extras: Any = None, normalizer: Array | None = None
           ) -> tuple[Array, dict]:
    """Mean cross-entropy per target token (see ``cross_entropy``); metrics as aux."""
    targets = batch["decoder_target_tokens"]
    logits = self.logits(params, batch["encoder_input_tokens"],
                         decoder_inputs(batch),
                         passage_mask=batch.get("passage_mask"),
                         dropout_rng=dropout_rng, extras=extras)
    loss, n, acc = cross_entropy(logits, targets, normalizer)
    return loss, {"loss": loss, "num_target_tokens": n, "token_accuracy": acc}

  def score(self, params, batch: dict, extras: Any = None) -> Array:
    """float32 [B]: each example's target log-likelihood (t5x ``score_batch``).

    Teacher forcing without dropout; the sum of ``log p(target token)`` over
    the non-padding ``decoder_target_tokens`` (EOS included,
    :func:`sequence_log_likelihood`). Reads the loss's batch keys.
    """
    logits = self.logits(params, batch["encoder_input_tokens"],
                         decoder_inputs(batch),
                         passage_mask=batch.get("passage_mask"), extras=extras)
    return sequence_log_likelihood(logits, batch["decoder_target_tokens"])

  # ---- inference --------------------------------------------------------

  def _encode_and_cache(self, params, encoder_input_tokens, passage_mask,
                        max_decode_len, extras):
    net = self.network(params)
    enc = self.encode(net, encoder_input_tokens, passage_mask, extras=extras)
    cache = net.init_cache(enc.hidden, enc.mask, max_decode_len, extras)
    return net, cache

  def predict(self, params, encoder_input_tokens: Array, *,
              max_decode_len: int, num_beams: int = 1, alpha: float = 0.6,
              length_penalty_style: str = "t5x",
              early_stopping: decoding.EarlyStopping = decoding.EARLY_STOPPING,
              passage_mask: Array | None = None, extras: Any = None) -> Array:
    """Greedy (``num_beams=1``) or beam search; int32 [B, max_decode_len].

    Stops at EOS (kept) and pads with 0 after it; cross-attention keys/values
    are computed once, self-attention keys/values cached.
    """
    b = encoder_input_tokens.shape[0]
    net, cache = self._encode_and_cache(params, encoder_input_tokens,
                                        passage_mask, max_decode_len, extras)

    def tokens_to_logits(state):
      return net.decode_step(state.cur_token, state.cache, state.cur_index,
                             extras)

    if num_beams == 1:
      tokens, _ = decoding.greedy_decode(
          tokens_to_logits, cache, batch_size=b, max_decode_len=max_decode_len,
          eos_id=EOS_ID, start_id=START_ID)
      return tokens
    tokens, _ = decoding.beam_search(
        tokens_to_logits, cache, batch_size=b, num_beams=num_beams,
        max_decode_len=max_decode_len, alpha=alpha,
        length_penalty_style=length_penalty_style,
        early_stopping=early_stopping, eos_id=EOS_ID, start_id=START_ID)
    return tokens[:, 0]

  def passage_scores(self, params, encoder_input_tokens: Array, *,
                     passage_mask: Array | None = None,
                     mode: str = "probs") -> Array:
    """Cross-attention passage relevance float32 [B, P].

    See :func:`~jaxfid.t5.passages.first_position_scores`.
    """
    tokens = fid.as_passages(encoder_input_tokens)
    net = self.network(params)
    enc = self.encode(net, tokens, passage_mask)
    return fid.first_position_scores(net, enc.hidden, enc.mask,
                                     tokens.shape[1], mode)

  def answer_attention(self, params, encoder_input_tokens: Array,
                       answer_tokens: Array, *,
                       passage_mask: Array | None = None) -> Array:
    """The cross-attention of each answer token over every passage token,
    float32 [B, T, P*L] (averaged over heads and layers; each position sums
    to 1; see :func:`~jaxfid.t5.passages.answer_attention`).

    Teacher-forced on ``answer_tokens`` int32 [B, T] (e.g. :meth:`predict`'s
    output): position t is the attention while answer token t is predicted.
    """
    tokens = fid.as_passages(encoder_input_tokens)
    net = self.network(params)
    enc = self.encode(net, tokens, passage_mask)
    return fid.answer_attention(net, enc.hidden, enc.mask,
                                shift_right(answer_tokens))

  @functools.cached_property
  def jit_logits(self):
    return jax.jit(lambda p, e, d: self.logits(p, e, d))

  @functools.cached_property
  def jit_predict(self):
    return jax.jit(self.predict, static_argnames=(
        "max_decode_len", "num_beams", "alpha", "length_penalty_style",
        "early_stopping"))
