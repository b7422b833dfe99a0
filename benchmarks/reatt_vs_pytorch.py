"""ReAtt trained by jaxfid and by a PyTorch reference, seed by seed.

Issue #27 item 9: after training, jaxfid's ReAtt retrieved a little worse
than a PyTorch reference ReAtt. ``tests/test_reatt_vs_reference.py`` shows
the two losses and gradients equal on one batch; this trains both on the
held-out word-pair world of ``reatt_candidates.py --heldout`` from the same
initial weights on the same batches and scores both alike:

* jaxfid: :func:`reatt_candidates.run` (the ``restart`` variant, jaxfid's
  default: a fresh Adam after the QA-only warm-up; or ``plain``);
* reference: an HF ``T5ForConditionalGeneration`` loaded from jaxfid's
  initial parameters (written with ``write_hf``), the head weights a torch
  tensor, the loss ``tests/reatt_reference.py::reatt_loss`` (after
  jzbjyb/FiD ``src/model.py``), ``torch.optim.Adam`` 3e-3 after
  ``clip_grad_norm_(1.0)``, a new Adam at the warm-up's end for
  ``restart``, the batches of the same ``ReAttBatcher``, the KL weight its
  ``kl_weight`` rows (alpha 8, 0 in the warm-up);
* both: the trained weights indexed by jaxfid's token index (the
  reference's read back from ``save_pretrained`` by ``jaxfid.load_t5``),
  R@1 and R@5 of the 32 held-out documents' questions over all 128.

Same seed, same world, same initial weights, same batches: a difference
per seed is the training's (float32 summation order on two frameworks
grows over 1,000 steps), not the draw's. One JSON line per run, then the
means and the per-seed differences.

  python benchmarks/reatt_vs_pytorch.py [--steps 1000] [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]

import numpy as np  # noqa: E402

import reatt_candidates as cand  # noqa: E402  (puts the repo and tests/ on the path)
import jaxfid  # noqa: E402
from jaxfid.checkpoints import names  # noqa: E402
from jaxfid.checkpoints.hf import write_hf  # noqa: E402
from jaxfid.reatt import model as reatt  # noqa: E402


def run_reference(variant: str, seed: int, steps: int, work: str,
                  losses: list) -> dict:
  """The PyTorch reference's run of ``cand.run(variant, seed, steps, work,
  heldout=True)``: the same world, initial weights, batches and scoring;
  ``losses`` receives every step's loss."""
  import torch
  import transformers
  from reatt_reference import reatt_loss
  restart, scale = cand.VARIANTS[variant][:2]
  if scale:
    raise ValueError(f"the reference has no learned score scale ({variant})")
  torch.manual_seed(seed)
  model, corpus, examples, tests = cand.setup(variant, seed, work,
                                              heldout=True)
  params = model.init_params(seed)
  start = os.path.join(work, f"init_{seed}")
  write_hf(start, model.config, {
      k: np.asarray(v) for k, v in names.flatten(reatt.t5_part(params)).items()},
      overwrite=True)
  hf = transformers.T5ForConditionalGeneration.from_pretrained(
      start, attn_implementation="eager").train()
  head_weights = torch.tensor(
      np.asarray(params[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS]),
      requires_grad=True)
  weights = [*hf.parameters(), head_weights]
  make_adam = lambda: torch.optim.Adam(weights, lr=3e-3)  # noqa: E731
  adam = make_adam()
  batcher = cand.batcher_for(variant, examples, seed)
  t0 = time.time()
  kl = float("nan")
  try:
    for s in range(steps):
      if restart and s == cand.WARMUP:
        adam = make_adam()
      batch = batcher.batch(s)
      targets = torch.tensor(batch["decoder_target_tokens"], dtype=torch.long)
      decoder_input = torch.nn.functional.pad(targets[:, :-1], (1, 0))
      out = reatt_loss(
          hf, torch.tensor(batch["encoder_input_tokens"], dtype=torch.long),
          torch.tensor(batch["question_length"], dtype=torch.long),
          decoder_input, targets, bi_encoder_layers=model.reatt.bi_encoder_layers,
          head_weights=head_weights, tau=model.reatt.head_temperature,
          kl_weight=float(batch["kl_weight"].sum()),
          position_bias=model.reatt.position_bias)
      adam.zero_grad()
      out["loss"].backward()
      torch.nn.utils.clip_grad_norm_(weights, 1.0)
      adam.step()
      kl = out["kl_loss"].item()
      losses.append(out["loss"].item())
  finally:
    batcher.close()
  seconds = time.time() - t0
  trained = os.path.join(work, f"trained_{seed}")
  hf.save_pretrained(trained, safe_serialization=True)
  loaded = jaxfid.load_t5(trained)
  back = reatt.add_head_weights(loaded.params, model.config.num_heads)
  back[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS] = head_weights.detach().numpy()
  r1, r5 = cand.recall(model, back, corpus, tests,
                       os.path.join(work, f"index_ref_{variant}_{seed}"))
  return {"trainer": "pytorch reference", "variant": variant, "seed": seed,
          "steps": steps, "R@1": r1, "R@5": r5, "kl_loss": round(kl, 4),
          "seconds": round(seconds, 1)}


def agreement(ours: list, theirs: list) -> dict:
  """How long the two runs' losses agree: the first step whose losses
  differ by more than 1e-3 relative (None: never) and the largest relative
  difference before it."""
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  rel = np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-12)
  apart = np.flatnonzero(rel > 1e-3)
  first = int(apart[0]) if apart.size else None
  before = rel[:first] if first is not None else rel
  return {"losses_agree_until_step": first,
          "max_relative_difference_before": float(before.max(initial=0.0))}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--variant", default="restart",
                      choices=["restart", "plain", "posbias", "qa_only"])
  args = parser.parse_args()
  import jax
  import torch
  print(json.dumps({"machine": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "device": str(jax.devices()[0]),
                    "jax": jax.__version__, "torch": torch.__version__}),
        flush=True)
  rows = []
  with tempfile.TemporaryDirectory() as work:
    for seed in args.seeds:
      ours, theirs = [], []
      mine = cand.run(args.variant, seed, args.steps, work, heldout=True,
                      losses=ours)
      rows.append({"trainer": "jaxfid", **{k: mine[k] for k in (
          "variant", "seed", "steps", "R@1", "R@5", "kl_loss", "seconds")}})
      print(json.dumps(rows[-1]), flush=True)
      rows.append(run_reference(args.variant, seed, args.steps, work, theirs))
      print(json.dumps(rows[-1]), flush=True)
      print(json.dumps({"seed": seed, **agreement(ours, theirs)}), flush=True)
  by = {t: [r for r in rows if r["trainer"] == t]
        for t in ("jaxfid", "pytorch reference")}
  for trainer, mine in by.items():
    print(json.dumps({"trainer": trainer, "seeds": len(mine),
                      "mean_R@1": round(np.mean([r["R@1"] for r in mine]), 3),
                      "mean_R@5": round(np.mean([r["R@5"] for r in mine]), 3)}))
  gaps = [j["R@5"] - r["R@5"] for j, r in zip(*by.values())]
  print(json.dumps({"R@5 jaxfid - reference, per seed": gaps,
                    "mean": round(float(np.mean(gaps)), 3)}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
