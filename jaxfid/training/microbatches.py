"""Microbatches: the one split of a global batch, and GradCache over it.

Microbatch ``i`` of ``A`` holds rows ``i, i + A, ...``, so it stays spread
over every data-parallel device. :func:`grad_cache` is the two-pass gradient
cache (Gao et al. 2021) for a loss coupling the whole batch's rows: loss and
gradient equal the one-pass step's, with one microbatch's activation memory
and one more forward pass.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def split_microbatches(x: Array, n: int) -> Array:
  """[N, ...] -> [n, N/n, ...]: microbatch i holds rows i, i+n, i+2n, ..."""
  if x.shape[0] % n:
    raise ValueError(f"{x.shape[0]} rows do not split into {n} microbatches")
  x = x.reshape(x.shape[0] // n, n, *x.shape[1:])            # [N/n, n, ...]
  return jnp.swapaxes(x, 0, 1)                               # [n, N/n, ...]


def merge_microbatches(x: Array) -> Array:
  """The inverse of :func:`split_microbatches`: [n, N/n, ...] -> [N, ...]."""
  x = jnp.swapaxes(x, 0, 1)                                  # [N/n, n, ...]
  return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])    # [N, ...]


def split_batch(batch: Any, n: int) -> Any:
  """Every leaf of a batch pytree split by :func:`split_microbatches`."""
  return jax.tree.map(lambda x: split_microbatches(x, n), batch)


# encode(params, i, microbatch) -> (local, reps, aux)
Encode = Callable[[Any, Array, Any], tuple[Array, Any, Any]]
# couple(params, reps [whole batch], aux [A, ...]) -> (loss, metrics)
Couple = Callable[[Any, Any, Any], tuple[Array, dict]]


def grad_cache(encode: Encode, couple: Couple, params: Any, micro: Any,
               n: int, *, merge: Callable[[Any], Any] | None = None,
               split: Callable[[Any], Any] | None = None
               ) -> tuple[Array, Array, dict, Any, Any]:
  """The gradient of ``sum_i local_i + couple(reps of every microbatch)``:
  ``encode(params, i, microbatch) -> (local, reps, aux)`` (dropout keys
  from ``i``, the same in both passes), ``couple(params, reps, aux) ->
  (loss, metrics)`` over the merged ``reps`` and stacked ``aux`` [A, ...];
  ``merge`` / ``split`` join and part ``reps``. Returns ``(locals [A],
  coupled loss, its metrics, aux [A, ...], grads)``.
  """
  merge = merge or (lambda t: jax.tree.map(merge_microbatches, t))
  split = split or (lambda t: jax.tree.map(
      lambda x: split_microbatches(x, n), t))
  steps = jnp.arange(n)

  # Pass 1: every microbatch's representations, no gradients kept.
  def forward(_, xs):
    i, mb = xs
    return None, encode(params, i, mb)

  _, (local, reps, aux) = jax.lax.scan(forward, None, (steps, micro))
  (loss, metrics), (d_params, d_reps) = jax.value_and_grad(
      lambda w, r: couple(w, r, aux), argnums=(0, 1), has_aux=True)(
          params, merge(reps))
  d_reps = split(d_reps)

  # Pass 2: each microbatch again, back-propagating (1, its cached gradient).
  def backward(grads, xs):
    i, mb, d_reps_i = xs
    (local_i, _), vjp = jax.vjp(lambda w: encode(w, i, mb)[:2], params)
    (g,) = vjp((jnp.ones_like(local_i), d_reps_i))
    return jax.tree.map(jnp.add, grads, g), None

  grads, _ = jax.lax.scan(backward, d_params, (steps, micro, d_reps))
  return local, loss, metrics, aux, grads
