"""The reader's passage scores that train Atlas's retriever (``gold_score``).

Letters: B questions, K passages, L tokens per passage, S = K*L encoder
tokens, T target tokens, H heads, V vocabulary.

Every function here is the reader in evaluation mode (no dropout) and
without gradient, as Atlas's ``eval_score``, ``perplexity_score``,
``loop_score`` and ``emdr_score`` run (``self.reader.eval()`` under
``torch.no_grad()``). ``tokens`` are the reader's rows [B, K, L] of the
retrieved passages, ``targets`` [B, T] the target tokens as the batches
write them (under PROMPT_FORMAT 'atlas' the sentinel ``<extra_id_0>``, the
answer, EOS: every one counts, as in Atlas's labels; 0 = padding, Atlas's
``-100`` labels). The token likelihoods are the reader's own scoring
(:meth:`~jaxfid.t5.model.EncoderDecoderModel.score`, whose
:func:`~jaxfid.t5.model.sequence_log_likelihood` and
:func:`~jaxfid.t5.model.token_log_likelihood` eval and predict use).

* :func:`adist_gold` -- attention distillation: the ``normssum`` key of
  Atlas's ``FiD.get_crossattention_scores`` (``src/fid.py:162-163,191``),
  which its ``adist`` / ``evalnormsum`` evidently means (the released code
  looks up ``normsum``, ``src/atlas.py:641``, and raises KeyError)
  (``aggregate_value`` with the
  ``normalized_score_storage`` of ``cross_attention_forward``): per decoder
  layer, target position t and encoder token s, the post-softmax
  cross-attention times the norm of that token's value vector, averaged
  over heads; summed over layers, over the non-padding target positions
  and over the passage's tokens; divided by ``256 x layers x targets``
  (Atlas's ``ntokens_sum``, with its constant 256).
* :func:`pdist_gold` -- perplexity distillation, ``ppmean``: each passage
  alone (one passage per encoder input), minus the mean token negative
  log-likelihood of the target.
* :func:`loop_gold` -- leave-one-out, ``loop``: the encoder states once,
  then for each passage the decoder with that passage masked out of the
  cross-attention; the mean token loss of the target (higher: the
  passage mattered more).
* :func:`emdr_token_logprobs` -- EMDR^2's ``emdr_score`` + the gather of
  ``logprob``: each passage alone, ``log_softmax(logits /
  temperature_gold)`` at the target tokens, [B, K, T].
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxfid.t5.model import (EncoderDecoderModel, sequence_log_likelihood,
                             shift_right, token_log_likelihood)

Array = jax.Array
ATLAS_NTOKENS = 256  # the constant of Atlas's `ntokens_sum` (fid.py)


def _alone(tokens: Array, passage_mask: Array, targets: Array) -> dict:
  """The batch of each passage alone: rows [B*K, 1, L], mask [B*K, 1], the
  targets repeated per passage [B*K, T] (``repeat_interleave``)."""
  b, k, l = tokens.shape
  return {"encoder_input_tokens": tokens.reshape(b * k, 1, l),   # [B*K, 1, L]
          "passage_mask": passage_mask.reshape(b * k, 1),         # [B*K, 1]
          "decoder_target_tokens": jnp.repeat(targets, k, axis=0)}  # [B*K, T]


def _count(targets: Array) -> Array:
  """float32 [N]: the non-padding targets of each row (at least 1)."""
  return jnp.maximum(jnp.sum(targets > 0, -1), 1).astype(jnp.float32)


def pdist_gold(reader: EncoderDecoderModel, params, tokens: Array,
               passage_mask: Array, targets: Array) -> Array:
  """float32 [B, K]: ``-mean NLL`` of the target given each passage alone
  (the reader's :meth:`score` over the non-padding targets)."""
  params = jax.lax.stop_gradient(params)
  b, k, _ = tokens.shape
  alone = _alone(tokens, passage_mask, targets)
  log_likelihood = reader.score(params, alone)                      # [B*K]
  mean = log_likelihood / _count(alone["decoder_target_tokens"])
  return mean.reshape(b, k)


def emdr_token_logprobs(reader: EncoderDecoderModel, params, tokens: Array,
                        passage_mask: Array, targets: Array, *,
                        temperature_gold: float) -> Array:
  """float32 [B, K, T]: ``log_softmax(logits / temperature_gold)`` at each
  target token, given each passage alone (padding targets read token 0,
  as Atlas's ``repeated_labels[... == IGNORE_INDEX] = 0``)."""
  params = jax.lax.stop_gradient(params)
  b, k, _ = tokens.shape
  alone = _alone(tokens, passage_mask, targets)
  repeated = alone["decoder_target_tokens"]                         # [B*K, T]
  logits = reader.logits(params, alone["encoder_input_tokens"],
                         shift_right(repeated),
                         passage_mask=alone["passage_mask"])        # [B*K, T, V]
  logp = token_log_likelihood(logits.astype(jnp.float32) / temperature_gold,
                              repeated)                             # [B*K, T]
  return logp.reshape(b, k, -1)                                     # [B, K, T]


def loop_gold(reader: EncoderDecoderModel, params, tokens: Array,
              passage_mask: Array, targets: Array) -> Array:
  """float32 [B, K]: the target's mean token loss with passage k left out."""
  params = jax.lax.stop_gradient(params)
  b, k, l = tokens.shape
  net = reader.network(params)
  enc = reader.encode(net, tokens, passage_mask)                    # [B, S, D]
  inputs = shift_right(targets)

  def without(i):
    out = (jnp.arange(k) != i)[None, :, None]                       # [1, K, 1]
    mask = enc.mask.reshape(b, k, l) & out                          # [B, K, L]
    logits, _ = net.decode(enc.hidden, mask.reshape(b, k * l), inputs)
    return -sequence_log_likelihood(logits, targets) / _count(targets)  # [B]

  return jax.lax.map(without, jnp.arange(k)).T                      # [B, K]


def adist_gold(reader: EncoderDecoderModel, params, tokens: Array,
               passage_mask: Array, targets: Array) -> Array:
  """float32 [B, K]: Atlas's ``normssum`` (module docstring)."""
  params = jax.lax.stop_gradient(params)
  b, k, l = tokens.shape
  net = reader.network(params)
  enc = reader.encode(net, tokens, passage_mask)                    # [B, S, D]
  _, dec = net.decode(enc.hidden, enc.mask, shift_right(targets),
                      output_attention_logits=True)
  cfg = reader.config
  layers = [net.decoder.layer(i) for i in range(cfg.num_decoder_layers)
            if cfg.has_cross_attention(i)]
  total = jnp.zeros((b, targets.shape[1], k * l), jnp.float32)      # [B, T, S]
  for layer, logits in zip(layers, dec.cross_attention_logits):
    _, v = layer.encoder_decoder_attention.project_kv(enc.hidden)   # [B, S, Hk, E]
    norm = jnp.linalg.norm(v.astype(jnp.float32), axis=-1)          # [B, S, Hk]
    probs = jax.nn.softmax(logits, axis=-1)                         # [B, H, T, S]
    weighted = probs * jnp.transpose(norm, (0, 2, 1))[:, :, None, :]  # [B, H, T, S]
    total = total + jnp.mean(weighted, axis=1)                      # [B, T, S]
  target_mask = targets > 0                                         # [B, T]
  total = jnp.where(target_mask[:, :, None] & enc.mask[:, None, :], total, 0.0)
  per_passage = jnp.sum(total.reshape(b, -1, k, l), axis=(1, 3))    # [B, K]
  n_targets = jnp.sum(target_mask, axis=-1, keepdims=True)          # [B, 1]
  return per_passage / (ATLAS_NTOKENS * len(layers)
                        * jnp.maximum(n_targets, 1))
