"""The distillation loss of a retriever trained from the reader (FiD-KD).

Per question, over its N passages::

  KL( softmax(gold / temperature_gold) || softmax(s / temperature_score) ),
  s = q . p / sqrt(d)   (``scale_by_sqrt_dim``; d the embedding size)

as FiD's ``Retriever``; gold scores are constants. ``reduction='mean'``
divides the summed terms by questions x passages (``KLDivLoss``'s default),
``'batchmean'`` by questions. With ``in_batch_negatives`` other questions'
passages join the softmax with no gold mass.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
NEG = -1e9


def distill_loss(q: Array, p: Array, passage_mask: Array, gold: Array, *,
                 temperature_gold: float = 1.0,
                 temperature_score: float = 1.0,
                 scale_by_sqrt_dim: bool = True, reduction: str = "mean",
                 in_batch_negatives: bool = False) -> tuple[Array, dict]:
  """KL of the retriever's passage distribution from the reader's.

  ``q`` float32 [B, D]; ``p`` float32 [B*N, D] (question b's rows b*N..);
  ``passage_mask`` bool [B*N]; ``gold`` float32 [B*N]. Returns (loss, metrics)
  with ``accuracy`` (the reader's best passage ranked first) and
  ``mean_rank``.
  """
  b, d = q.shape
  n = p.shape[0] // b
  own = jnp.arange(b * n) // n == jnp.arange(b)[:, None]     # [B, B*N]
  valid = own & passage_mask[None, :]                         # [B, B*N]
  if in_batch_negatives:
    scores = jnp.einsum("qd,pd->qp", q, p)                    # [B, B*N]
    candidate = jnp.broadcast_to(passage_mask[None, :], scores.shape)
    mine = valid
  else:
    scores = jnp.einsum("bnd,bd->bn", p.reshape(b, n, d), q)  # [B, N]
    candidate = mine = passage_mask.reshape(b, n)             # [B, N]
  if scale_by_sqrt_dim:
    scores = scores / jnp.sqrt(jnp.float32(d))
  logp = jax.nn.log_softmax(
      jnp.where(candidate, scores / temperature_score, NEG), axis=-1)
  # the reader's scores, laid out like `scores`: zero mass off `mine`
  g = gold.reshape(b, n)                                      # [B, N]
  if in_batch_negatives:
    g = jnp.where(own, jnp.tile(g, (1, b)), 0.0)              # [B, B*N]
  g = jax.lax.stop_gradient(g)
  target = jax.nn.softmax(jnp.where(mine, g / temperature_gold, NEG), axis=-1)
  target = jnp.where(mine, target, 0.0)
  pointwise = jnp.where(
      mine, jax.scipy.special.xlogy(target, target) - target * logp, 0.0)
  count = (jnp.sum(mine) if reduction == "mean" else
           jnp.sum(jnp.any(mine, axis=-1)))
  loss = jnp.sum(pointwise) / jnp.maximum(count, 1).astype(jnp.float32)
  best = jnp.argmax(jnp.where(mine, g, -jnp.inf), axis=-1)   # [B]
  best_score = jnp.take_along_axis(scores, best[:, None], axis=1)  # [B, 1]
  rank = 1 + jnp.sum(candidate & (scores > best_score), axis=1)     # [B]
  has = jnp.any(mine, axis=-1).astype(jnp.float32)
  questions = jnp.maximum(jnp.sum(has), 1.0)
  return loss, {
      "accuracy": jnp.sum((rank == 1) * has) / questions,
      "mean_rank": jnp.sum(rank * has) / questions}
