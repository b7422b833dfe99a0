"""Atlas's retriever losses, from ``src/atlas.py`` (facebookresearch/atlas).

Letters: B questions, K retrieved passages per question, D embedding
width, T target tokens.

* The retriever's score of passage k for question b (``Atlas.forward``:
  ``retriever_score = einsum("id, ijd->ij", query_emb, passage_emb)``,
  then ``retriever_score / np.sqrt(query_emb.size(-1))``)::

    s[b, k] = q[b] . p[b, k] / sqrt(D)

* ``kldivloss`` (every objective but EMDR^2)::

    KLDivLoss()(log_softmax(s / temperature_score), softmax(gold / temperature_gold))

  ``KLDivLoss``'s default reduction 'mean' divides the summed pointwise
  terms ``t * (log t - log p)`` by the number of elements, B x K. Here the
  sum is divided by ``count`` (the *global* batch's B x K), so that the
  microbatch losses of gradient accumulation add up to the batch's.
  The gold scores come from the reader (:mod:`jaxfid.atlas.gold`) and are
  constants (``stop_gradient``), as Atlas computes them under
  ``torch.no_grad()``.

* ``logprob`` (EMDR^2)::

    loss = - sum_{b,t} m[b,t] logsumexp_k( log_softmax(s / temperature_score)[b,k]
                                          + log p_k(y[b,t]) ) / sum m

  with ``log p_k(y_t)`` the reader's log-probability of target token t
  given passage k alone, its logits divided by ``temperature_gold``
  (``log_softmax(gold_score / self.opt.temperature_gold)`` gathered at the
  labels), and m the non-padding targets; ``count`` again the global
  batch's target tokens.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def retriever_scores(q: Array, p: Array) -> Array:
  """float32 [B, K]: ``q`` [B, D] against its own passages ``p`` [B, K, D],
  divided by sqrt(D)."""
  q, p = q.astype(jnp.float32), p.astype(jnp.float32)
  d = q.shape[-1]
  return jnp.einsum("bd,bkd->bk", q, p) / jnp.sqrt(jnp.float32(d))  # [B, K]


def kl_loss(scores: Array, gold: Array, *, temperature_gold: float,
            temperature_score: float, count: Array | float) -> Array:
  """Atlas's ``kldivloss`` summed over [B, K] and divided by ``count``."""
  gold = jax.lax.stop_gradient(gold.astype(jnp.float32))
  target = jax.nn.softmax(gold / temperature_gold, axis=-1)            # [B, K]
  logp = jax.nn.log_softmax(scores / temperature_score, axis=-1)       # [B, K]
  pointwise = jax.scipy.special.xlogy(target, target) - target * logp  # [B, K]
  return jnp.sum(pointwise) / jnp.maximum(jnp.float32(count), 1.0)


def emdr_loss(scores: Array, token_logprobs: Array, target_mask: Array, *,
              temperature_score: float, count: Array | float) -> Array:
  """Atlas's ``logprob`` (EMDR^2); ``token_logprobs`` [B, K, T] are the
  reader's (temperature-scaled) log-probabilities of each target token
  given each passage alone, ``target_mask`` bool [B, T]."""
  token_logprobs = jax.lax.stop_gradient(token_logprobs.astype(jnp.float32))
  log_score = jax.nn.log_softmax(scores / temperature_score, axis=-1)  # [B, K]
  marginal = jax.nn.logsumexp(token_logprobs + log_score[..., None],
                              axis=1)                                  # [B, T]
  total = jnp.sum(jnp.where(target_mask, marginal, 0.0))
  return -total / jnp.maximum(jnp.float32(count), 1.0)
