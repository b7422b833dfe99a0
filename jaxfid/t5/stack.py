"""Running a stack of layers: a Python loop, or one ``lax.scan`` (``scan_layers``).

With ``T5Config.scan_layers`` a stack of alike layers (equal NNX graph
definitions) runs as one ``lax.scan`` over parameters stacked inside the
jitted function (``[N, ...]``; the stored layout is unchanged), so XLA
compiles one layer; other stacks fall back to the loop. Both give layer i the
dropout key ``fold(rng, i)`` and compute the same function.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxfid.t5 import layers as layers_lib
from jaxfid.t5.layers import fold

Array = jax.Array
# fn(layer, x, rng) -> (x, aux): one layer on the residual stream x; aux is
# any pytree (None leaves allowed) that the caller wants back per layer.
LayerFn = Callable[[nnx.Module, Array, Array | None], tuple[Array, Any]]


def alike(modules: Sequence[nnx.Module]) -> bool:
  """Whether the modules share one graph definition (structure + statics)."""
  first = nnx.graphdef(modules[0])
  return all(nnx.graphdef(m) == first for m in modules[1:])


def run_layers(modules: Sequence[nnx.Module], x: Array, fn: LayerFn, *,
               rng: Array | None, first: int = 0, remat: str = "none",
               scan: bool = False) -> tuple[Array, list]:
  """Apply ``fn`` layer by layer; returns (x, [aux of each layer]).

  Layer ``j`` of ``modules`` is layer ``first + j`` of its stack and gets
  the dropout key ``fold(rng, first + j)``. ``remat`` (a ``T5Config.remat``
  value other than 'none') checkpoints each layer. ``scan``: one ``lax.scan`` when the
  layers are alike and there are at least two, else the loop.
  """
  if scan and len(modules) > 1 and alike(modules):
    return _scanned(modules, x, fn, rng=rng, first=first, remat=remat)
  run = fn if remat == "none" else nnx.remat(
      fn, policy=layers_lib.remat_policy(remat))
  aux = []
  for j, module in enumerate(modules):
    x, out = run(module, x, fold(rng, first + j))
    aux.append(out)
  return x, aux


def _scanned(modules, x, fn, *, rng, first, remat):
  graphdef = nnx.graphdef(modules[0])
  states = [nnx.state(m) for m in modules]
  stacked = jax.tree.map(lambda *p: jnp.stack(p), *states)  # each leaf [N, ...]
  indices = first + jnp.arange(len(modules), dtype=jnp.int32)  # [N]

  def body(h, xs):
    state, index = xs
    return fn(nnx.merge(graphdef, state), h, fold(rng, index))

  if remat != "none":
    body = jax.checkpoint(body, policy=layers_lib.remat_policy(remat),
                          prevent_cse=False)
  x, stacked_aux = jax.lax.scan(body, x, (stacked, indices))
  aux = [jax.tree.map(lambda a, j=j: a[j], stacked_aux)  # [N, ...] -> [...]
         for j in range(len(modules))]
  return x, aux
