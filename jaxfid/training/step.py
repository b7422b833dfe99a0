"""The train step: a pure function of (state, batch), jit-compiled with shardings.

The loss is the mean cross-entropy per target token over the whole global
batch: with ``accumulation_steps = A`` microbatch losses are token sums over
the whole batch's token count, so the gradient equals the full batch's.
Dropout keys are ``fold_in(key(seed), step)``. A non-finite loss or gradient
leaves params and optimizer state untouched.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from jaxfid.training.microbatches import split_batch

LossFn = Callable[..., tuple[jax.Array, dict]]


# Metrics that add up over microbatches (EncoderDecoderModel.loss's count).
ADDITIVE_METRICS = ("num_target_tokens",)


def target_tokens(batch: dict) -> jax.Array:
  """The default normalizer: the global batch's target tokens (not padding)."""
  return jnp.sum(batch["decoder_target_tokens"] > 0).astype(jnp.float32)


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                    *, seed: int, accumulation_steps: int = 1,
                    normalizer: Callable[[dict], jax.Array] = target_tokens,
                    additive: Sequence[str] = ADDITIVE_METRICS):
  """``train_step(state, batch) -> (state, metrics)`` of ``loss_fn(params,
  batch, dropout_rng, normalizer) -> (loss, metrics)`` (a sum over the
  whole batch's count); under accumulation ``additive`` metrics are summed
  over microbatches, others averaged."""
  base_key = jax.random.key(seed)

  def grads_of(params, batch, rng, normalizer):
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, metrics), grads = grad_fn(params, batch, rng, normalizer)
    return loss, metrics, grads

  def train_step(state, batch):
    params = state["params"]
    rng = jax.random.fold_in(base_key, state["step"])
    norm = normalizer(batch)
    if accumulation_steps == 1:
      loss, metrics, grads = grads_of(params, batch, rng, norm)
    else:
      micro = split_batch(batch, accumulation_steps)  # [A, B/A, ...]

      def body(carry, xs):
        i, mb = xs
        loss, metrics, grads = grads_of(params, mb, jax.random.fold_in(rng, i),
                                        norm)
        acc_loss, acc_metrics, acc_grads = carry
        return (acc_loss + loss,
                jax.tree.map(jnp.add, acc_metrics, metrics),
                jax.tree.map(jnp.add, acc_grads, grads)), None

      first_metrics = jax.eval_shape(
          lambda: grads_of(params, jax.tree.map(lambda x: x[0], micro), rng,
                           norm)[1])
      init = (jnp.zeros((), jnp.float32),
              jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), first_metrics),
              jax.tree.map(jnp.zeros_like, params))
      (loss, metrics, grads), _ = jax.lax.scan(
          body, init, (jnp.arange(accumulation_steps), micro))
      metrics = {k: v if k in additive else v / accumulation_steps
                 for k, v in metrics.items()}
    return apply_gradients(optimizer, state, loss, grads, metrics)

  return train_step


def apply_gradients(optimizer: optax.GradientTransformation, state: dict,
                    loss: jax.Array, grads, metrics: dict
                    ) -> tuple[dict, dict]:
  """The update every train step ends with: ``(new_state, metrics)`` with
  ``loss``, ``grad_norm`` and ``finite`` (1.0/0.0); a non-finite loss or
  gradient norm keeps the old params and optimizer state."""
  params = state["params"]
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, opt_state = optimizer.update(grads, state["opt_state"], params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jax.tree.map(
      lambda n, o: jnp.where(finite, n, o), new, old)
  new_state = {"step": state["step"] + 1,
               "params": keep(new_params, params),
               "opt_state": keep(opt_state, state["opt_state"])}
  metrics = dict(metrics, loss=loss, grad_norm=grad_norm,
                 finite=finite.astype(jnp.float32))
  return new_state, metrics
