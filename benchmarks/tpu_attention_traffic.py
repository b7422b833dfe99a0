"""HBM traffic of T5's attention core on a TPU, by the TPU compiler, with and
without dropout on the attention weights (issue #49).

Compiles, for ``v5e:2x2`` with libtpu (no TPU needed), the gradient of the
score path of ``jaxfid/t5/layers.py``'s ``Attention.__call__`` under
``jax.checkpoint`` (remat's recomputation and the backward pass; XLA drops
the forward, whose value the gradient does not use): float32
logits of ``blhe,bshe->bhls``, the relative-position bias and the padding
mask, the softmax, dropout on the weights, and the context einsum, for
``--passages-per-chip`` passages of 250 tokens, 12 heads of 64 (FiD-base).
Prints, per dropout kind, the compiler's bytes accessed and
``jaxfid.aot.breakdown``'s counts; the last line is one JSON object.

  python benchmarks/tpu_attention_traffic.py [--passages-per-chip 400]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxfid.aot import breakdown, topologies  # noqa: E402
from jaxfid.t5 import layers  # noqa: E402

DROPOUTS = ("none", "hash", "threefry", "rbg")
RATE = 0.1


def attention_grad(dropout: str):
  """The gradient of the attention core wrt q, k and v, rematerialized."""
  def loss(q, k, v, bias, mask):
    logits = jnp.einsum("blhe,bshe->bhls", q, k,
                        preferred_element_type=jnp.float32)  # [B, H, L, S]
    logits = jnp.where(mask, logits + bias, layers.NEG_INF)
    weights = jax.nn.softmax(logits, axis=-1)  # float32 [B, H, L, S]
    if dropout == "hash":  # jaxfid's dropout (layers.dropout_keep)
      weights = layers.dropout(weights, RATE, jax.random.key(0))
    elif dropout in ("threefry", "rbg"):  # jax.random's bits
      key = jax.random.key(0, impl="unsafe_rbg" if dropout == "rbg" else None)
      keep = jax.random.bernoulli(key, 1.0 - RATE, weights.shape)
      weights = jnp.where(keep, weights / (1.0 - RATE), 0)
    ctx = jnp.einsum("bhls,bshe->blhe", weights.astype(jnp.bfloat16),
                     v)  # [B, L, H, E]
    return jnp.sum(jnp.square(ctx.astype(jnp.float32)))
  return jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2)))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--passages-per-chip", type=int, default=400)
  p.add_argument("--dropout", default=",".join(DROPOUTS),
                 help=f"comma-separated, of {DROPOUTS}")
  args = p.parse_args(argv)
  if not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")
  devices = topologies.devices(topologies.parse("v5e:2x2"))
  mesh = Mesh(np.array(devices), ("data",))
  length, heads, head_dim = 250, 12, 64
  batch = args.passages_per_chip * len(devices)
  rows = NamedSharding(mesh, P("data"))
  qkv = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.bfloat16,
                             sharding=rows)
  bias = jax.ShapeDtypeStruct((1, heads, length, length), jnp.float32,
                              sharding=NamedSharding(mesh, P()))
  mask = jax.ShapeDtypeStruct((batch, 1, 1, length), jnp.bool_, sharding=rows)
  out = []
  for dropout in args.dropout.split(","):
    compiled = attention_grad(dropout).lower(qkv, qkv, qkv, bias,
                                             mask).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    b = breakdown.breakdown(compiled.as_text()).as_json()
    row = {"dropout": dropout,
           "bytes_accessed_gb": float(cost["bytes accessed"]) / 1e9,
           "written_read_gb": b["written_gb"] + b["read_gb"],
           "score_arrays_gb": b["attention_scores_any_group_gb"],
           "layout_copies": b["layout_copies_any_group"]}
    print(f"dropout {dropout:<9} bytes accessed {row['bytes_accessed_gb']:7.2f}"
          f" GB; score arrays {row['score_arrays_gb']:6.2f} GB; copies "
          f"{row['layout_copies']['written_gb']:.2f} GB written",
          file=sys.stderr)
    out.append(row)
  print(json.dumps({"passages_per_chip": args.passages_per_chip,
                    "topology": "v5e:2x2", "rows": out}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
