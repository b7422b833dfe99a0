"""ReAtt's train step with in-batch negatives under gradient accumulation.

Einsum letters / shapes: A microbatches, B questions of the global batch,
b = B/A questions per microbatch, P rows (documents) per question, L tokens
per row, Q question-token positions, H heads, E head width.

With in-batch negatives every question's retrieval distribution spans the
documents of the *whole* global batch, so plain accumulation (each
microbatch's loss on its own) would shrink the negatives to the
microbatch's: ``(B/A - 1) * P`` random documents instead of ``(B - 1) * P``.
The loss couples questions only through the retrieval scores and the KL
term (the QA loss and P_tgt are per question), so the step keeps every
negative with the two-pass GradCache scheme (Gao et al. 2021; the original
code's ``--accumulation_for_ibn``):

1. *pass 1*, without gradients: each microbatch's whole forward
   (:meth:`ReAttModel.forward`), keeping its layer-``B+1`` question queries
   [b, Q, H, E], document keys [b*P, L, H, E] and P_tgt [b, P];
2. the KL term over the whole batch from those (every question against
   every document) and its gradient with respect to the queries, the keys
   and the head weights;
3. *pass 2*: each microbatch's forward again, with the same dropout keys,
   and ``jax.vjp`` of (its QA loss, its queries, its keys) with cotangents
   (1, cached query gradient, cached key gradient): parameter gradients
   summed over microbatches, plus the head weights' from step 2.

Loss and gradient equal the A = 1 step's (up to float rounding; the same
function when dropout is off; tested), at the cost of one more forward pass.
Microbatch ``i`` holds questions ``i, i + A, i + 2A, ...`` (as the dual
encoder's GradCache), so every microbatch stays spread over the data axes.

Memory: pass 1 keeps, for the whole global batch, every document token's
key at layer ``B+1`` for every head, ``B*P*L*H*E`` values, and their
gradient of the same size: at the paper's 64 x 100 x 250 tokens with
T5-large's 16 x 64 heads that is 1.6e9 values, 3.3 GB each in bfloat16
(6.6 GB in float32), sharded over the data axes with the batch. The
question queries are ``B*Q*H*E`` (``QUERY_MAXLENGTH`` = Q bounds them).
Scoring every question against every document is the large intermediate:
``[B, H, Q, B*P, L]`` scores; ``RELEVANCE_CHUNK`` scores that many
documents at a time (``[B, H, Q, chunk, L]``, recomputed in the backward
pass) and ``QUERY_MAXLENGTH`` bounds Q, so gin/reatt/large.gin sets both
(256 and 64). Activations are those of one microbatch.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxfid.dual_encoder.step import merge_microbatches, split_microbatches
from jaxfid.reatt.model import PARAMS_KEY, ReAttModel
from jaxfid.t5.model import cross_entropy
from jaxfid.training.step import apply_gradients, target_tokens

Array = jax.Array


def _split_rows(x: Array, n: int, per: int) -> Array:
  """[B*P, ...] rows grouped by question -> [n, B/n*P, ...] (the question
  split of :func:`split_microbatches`)."""
  q = x.reshape(x.shape[0] // per, per, *x.shape[1:])         # [B, P, ...]
  q = split_microbatches(q, n)                                # [A, b, P, ...]
  return q.reshape(n, -1, *x.shape[1:])                       # [A, b*P, ...]


def _merge_rows(x: Array, per: int) -> Array:
  """The inverse of :func:`_split_rows`: [A, b*P, ...] -> [B*P, ...]."""
  a = x.shape[0]
  q = x.reshape(a, x.shape[1] // per, per, *x.shape[2:])      # [A, b, P, ...]
  q = merge_microbatches(q)                                   # [B, P, ...]
  return q.reshape(-1, *x.shape[2:])                          # [B*P, ...]


def grad_cache(model: ReAttModel, params: dict, batch: dict,
               dropout_rng: Array | None, normalizer: Array,
               accumulation_steps: int) -> tuple[Array, dict, dict]:
  """(loss, metrics, grads) of the whole batch in microbatches (GradCache).

  Args:
    model: a ReAtt model with in-batch negatives.
    batch: the global batch (``encoder_input_tokens`` [B, P, L], ...,
      ``kl_weight`` [B]).
    dropout_rng: the step's key; microbatch ``i`` uses ``fold_in(rng, i)``
      in both passes.
    normalizer: the global batch's target tokens.
    accumulation_steps: A, dividing B.
  """
  n = accumulation_steps
  per = batch["encoder_input_tokens"].shape[1]
  micro = jax.tree.map(lambda x: split_microbatches(x, n), batch)  # [A, b, ...]
  steps = jnp.arange(n)

  def key(i):
    return None if dropout_rng is None else jax.random.fold_in(dropout_rng, i)

  def forward(w, i, mb):
    enc, logits, target = model.forward(w, mb, key(i))
    qa, count, acc = cross_entropy(logits, mb["decoder_target_tokens"],
                                   normalizer)
    return (qa, enc.queries, enc.keys), (enc.query_mask, enc.key_mask,
                                         target, count, acc)

  # Pass 1: every question's queries, every document's keys, P_tgt.
  def pass_one(_, xs):
    i, mb = xs
    (_, q, k), (qm, km, target, _, _) = forward(params, i, mb)
    return None, (q, qm, k, km, target)

  _, (q, qm, k, km, target) = jax.lax.scan(pass_one, None, (steps, micro))
  q, qm, target = (merge_microbatches(x) for x in (q, qm, target))
  k, km = _merge_rows(k, per), _merge_rows(km, per)   # [B*P, L, H, E], [B*P, L]

  # The KL term of the whole batch and its gradient w.r.t. the cached
  # queries, keys and the head weights.
  def kl(head, q, k):
    return model.retrieval_loss({PARAMS_KEY: head}, q, qm, k, km, target,
                                batch.get("kl_weight"))

  (kl_term, kl_metrics), (d_head, dq, dk) = jax.value_and_grad(
      kl, argnums=(0, 1, 2), has_aux=True)(params[PARAMS_KEY], q, k)
  dq = split_microbatches(dq, n)                     # [A, b, Q, H, E]
  dk = _split_rows(dk, n, per)                       # [A, b*P, L, H, E]

  # Pass 2: each microbatch again; back-propagate (1, dq_i, dk_i).
  def pass_two(carry, xs):
    grads, qa_sum, count_sum, correct_sum = carry
    i, mb, dq_i, dk_i = xs
    (qa, _, _), vjp, (_, _, _, count, acc) = jax.vjp(
        lambda w: forward(w, i, mb), params, has_aux=True)
    (g,) = vjp((jnp.ones_like(qa), dq_i, dk_i))
    return (jax.tree.map(jnp.add, grads, g), qa_sum + qa, count_sum + count,
            correct_sum + acc * count), None

  zero = jnp.zeros((), jnp.float32)
  init = (jax.tree.map(jnp.zeros_like, params), zero, zero, zero)
  (grads, qa_loss, count, correct), _ = jax.lax.scan(
      pass_two, init, (steps, micro, dq, dk))
  grads = {**grads, PARAMS_KEY: jax.tree.map(jnp.add, grads[PARAMS_KEY],
                                             d_head)}
  loss = qa_loss + kl_term
  metrics = {"loss": loss, "qa_loss": qa_loss, "num_target_tokens": count,
             "token_accuracy": correct / jnp.maximum(count, 1.0),
             **kl_metrics}
  return loss, metrics, grads


def make_grad_cache_step(model: ReAttModel,
                         optimizer: optax.GradientTransformation, *,
                         seed: int, accumulation_steps: int):
  """``step(state, batch) -> (state, metrics)`` (pure; the loop jits it).

  :func:`grad_cache` over ``accumulation_steps`` microbatches, normalised by
  the global batch's target tokens; dropout keys ``fold_in(key(seed),
  step)`` as :func:`jaxfid.training.step.make_train_step`'s, and the same
  non-finite guard (:func:`jaxfid.training.step.apply_gradients`).
  """
  if not model.reatt.in_batch_negatives:
    raise ValueError("GradCache is for in-batch negatives; without them "
                     "plain accumulation is exact")
  base_key = jax.random.key(seed)

  def step(state, batch):
    rng = jax.random.fold_in(base_key, state["step"])
    loss, metrics, grads = grad_cache(model, state["params"], batch, rng,
                                      target_tokens(batch),
                                      accumulation_steps)
    return apply_gradients(optimizer, state, loss, grads, metrics)

  return step
