"""Whether the fused attention kernel compiles for a TPU at given lengths and
heads, whatever ``fused_attention.supported`` says (issue #49).

Compiles, with libtpu (no TPU needed), the gradient of ``sum(ctx**2)`` for
the context ``ctx`` of ``jaxfid.t5.fused_attention.attention`` (its forward
and backward Mosaic kernels: relative-position bias ``[1, H, L, L]``, a key
mask, dropout 0.1) for 8 rows of ``L`` tokens per chip, ``H`` heads of 64,
bfloat16, all data parallel over ``--topology``. Prints ``supported()``'s
answer, its VMEM estimate, and whether the program compiled (its Mosaic
custom calls) or the compiler's error; the last line is one JSON object.

  python benchmarks/tpu_kernel_compiles.py --length 512 --heads 12 --topology v5p-8
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxfid.aot import topologies  # noqa: E402
from jaxfid.core import sharding as ax  # noqa: E402
from jaxfid.t5 import fused_attention  # noqa: E402

HEAD_DIM = 64
ROWS_PER_CHIP = 8


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--length", type=int, default=512)
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--topology", default="v5p-8")
  args = p.parse_args()
  devices = topologies.devices(topologies.parse(args.topology))
  mesh = ax.parse_mesh(f"data={len(devices)}", devices)
  b, l, h = ROWS_PER_CHIP * len(devices), args.length, args.heads

  def loss(q, k, v, bias):
    mask = jnp.ones((b, 1, 1, l), bool)  # [B, 1, 1, S]
    ctx = fused_attention.attention(q, k, v, bias=bias, mask=mask, rate=0.1,
                                    rng=jax.random.key(0), interpret=False)
    return jnp.sum(jnp.square(ctx.astype(jnp.float32)))

  qkv = jax.ShapeDtypeStruct((b, l, h, HEAD_DIM), jnp.bfloat16)  # [B, L, H, E]
  bias = jax.ShapeDtypeStruct((1, h, l, l), jnp.float32)         # [1, H, L, S]
  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
  report = {"topology": args.topology, "length": l, "heads": h,
            "supported": fused_attention.supported(
                qkv.shape, qkv.shape, bias.shape, (b, 1, 1, l)),
            "vmem_estimate_mib": fused_attention.vmem_estimate(h, l, l) / 2**20}
  start = time.time()
  with jax.set_mesh(mesh):
    try:
      hlo = step.trace(qkv, qkv, qkv, bias).lower().compile().as_text()
      report.update(compiled=True, kernels=hlo.count("tpu_custom_call"))
    except Exception as e:  # the compiler's error is the answer
      report.update(compiled=False, error=f"{type(e).__name__}: {str(e)[:300]}")
  report["compile_s"] = round(time.time() - start, 1)
  print(json.dumps(report))
  return 0


if __name__ == "__main__":
  sys.exit(main())
