"""The distillation loss of a retriever trained from the reader (FiD-KD).

Per question, over its N passages::

  KL( softmax(gold / temperature_gold) || softmax(s / temperature_score) ),
  s = q . p / sqrt(d)   (``scale_by_sqrt_dim``; d the embedding size)

as the original computes it (FiD ``src/model.py``: ``Retriever.forward``
divides ``score`` by ``np.sqrt(question_output.size(-1))``;
``Retriever.kldivloss`` is ``torch.nn.KLDivLoss()(torch.log_softmax(score,
-1), torch.softmax(gold_score, -1))``; the temperatures are Atlas's
``kldivloss`` generalisation, 1 in FiD). The gold scores are constants: the
retriever learns through its own scores only.

``reduction``: ``'mean'`` is ``KLDivLoss``'s default -- the summed
pointwise terms ``t * (log t - log p)`` divided by the number of elements
(questions x passages; masked passages count in neither); ``'batchmean'``
divides by the number of questions (the KL per question).

With ``in_batch_negatives`` each question is scored against every passage
of the global batch (the other questions' passages as extra candidates of
the retriever's softmax, with no gold mass: they add nothing to the sum,
only to the normaliser), so ``'mean'`` still divides by the question's own
passages.
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

  Args:
    q: float32 [B, D] question embeddings.
    p: float32 [B*N, D] passage embeddings; question b's are rows b*N..b*N+N-1.
    passage_mask: bool [B*N]; False rows are no passages.
    gold: float32 [B*N] the reader's scores of those passages.
    temperature_gold / temperature_score: the two softmax temperatures.
    scale_by_sqrt_dim: divide q . p by sqrt(D) (FiD's retriever).
    reduction: 'mean' (KLDivLoss's default) or 'batchmean'.
    in_batch_negatives: also score every other question's passages.

  Returns:
    (loss, metrics): ``accuracy`` (the retriever ranks the reader's best
    passage first among the question's candidates), ``mean_rank`` (its rank).
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
