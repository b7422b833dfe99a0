"""FLOPs per example of ReFusion against its baselines (the paper's Table 4 idea).

Counts, with XLA's cost analysis of the compiled scoring function
(``ReFusionModel.label_scores``: the encoder once, the decoder over every
label word), the floating-point operations per example of:

  * the plain prompt-tuned backbone on ``--max-length`` tokens;
  * retrieval concatenation: the k neighbour sentences appended, the input
    grown to ``--concat-length`` tokens (the paper's CA-512);
  * ReFusion with fusion in the chosen modules of every encoder layer, one
    scheme fixed (reranker, ordered mask) and the integrator's mixture of both
    (the search), with k neighbours of width ``--db-dim``.

Nothing is allocated: parameters and batches are abstract shapes, so full
sizes run on a CPU. Prints a table, the hardware, and last a JSON line.

  python benchmarks/refusion_flops.py --size t5_base --top-k 64 --classes 2
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxfid.t5.config import preset
from jaxfid.refusion import fusion as fusion_lib  # noqa: E402
from jaxfid.refusion.model import ReFusionModel  # noqa: E402


def flops(model: ReFusionModel, length: int, classes: int, label_length: int,
          batch: int, top_k: int, db_dim: int) -> float:
  params = model.abstract_params()
  b = {"encoder_input_tokens": jax.ShapeDtypeStruct((batch, length), jnp.int32)}
  if model.fusion.enabled:
    b["neighbours"] = jax.ShapeDtypeStruct((batch, 1, top_k, db_dim), jnp.float32)
  labels = jax.ShapeDtypeStruct((classes, label_length), jnp.int32)
  cost = jax.jit(model.label_scores).lower(params, b, labels).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost["flops"]) / batch


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="t5_base")
  p.add_argument("--top-k", type=int, default=64)
  p.add_argument("--db-dim", type=int, default=768)
  p.add_argument("--modules", default="key,value")
  p.add_argument("--max-length", type=int, default=128)
  p.add_argument("--concat-length", type=int, default=512)
  p.add_argument("--classes", type=int, default=2)
  p.add_argument("--label-length", type=int, default=2)
  p.add_argument("--batch", type=int, default=8)
  args = p.parse_args()

  cfg = dataclasses.replace(preset(args.size), dtype="bfloat16", dropout_rate=0.0)
  runs = {
      "backbone": (fusion_lib.FusionConfig(modules="none"), args.max_length),
      "concatenation": (fusion_lib.FusionConfig(modules="none"), args.concat_length),
  }
  for name, search, scheme in (("refusion_reranker", False, "reranker"),
                               ("refusion_ordered_mask", False, "ordered_mask"),
                               ("refusion_search", True, "reranker")):
    runs[name] = (fusion_lib.FusionConfig(
        modules=args.modules, top_k=args.top_k, db_dim=args.db_dim, search=search,
        scheme=scheme), args.max_length)
  results = {}
  for name, (fusion, length) in runs.items():
    results[name] = flops(ReFusionModel(cfg, fusion), length, args.classes,
                          args.label_length, args.batch, args.top_k, args.db_dim)
  base = results["backbone"]
  print(f"{'variant':24s} {'tokens':>6s} {'GFLOPs/example':>15s} {'x backbone':>10s}")
  for name, value in results.items():
    print(f"{name:24s} {runs[name][1]:6d} {value / 1e9:15.3f} {value / base:10.3f}")
  hardware = f"{platform.processor() or platform.machine()}, jax {jax.__version__} ({jax.default_backend()})"
  print(f"hardware: {hardware}")
  print(json.dumps({"size": args.size, "top_k": args.top_k, "db_dim": args.db_dim,
                    "modules": args.modules, "classes": args.classes,
                    "flops_per_example": results, "hardware": hardware}))


if __name__ == "__main__":
  main()
