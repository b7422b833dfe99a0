"""Times, on this host's devices, the programs ``jaxfid bench compile`` sizes.

``train``: the run's train step exactly as ``jaxfid train`` jits it
(:func:`jaxfid.training.loop.layout` and ``jit_step``: the method's phase
step with its mesh, shardings, remat, scan and donation; what
``jaxfid bench compile --program train`` compiles), from fresh parameters,
on one synthetic batch of the shapes the run would feed (every passage full
length, random token ids), 1 step to compile and ``--steps`` timed ones.
``decode``: the task's prediction program (``--program decode``'s) at each
of ``--batch-sizes``; it stops when every row has ended, so each row says
how many tokens it decoded (``tokens_decoded``) of its bound, and its MFU
(the bound's FLOPs) is None when it stopped early. No data or checkpoint is read; the gin files and
``--gin.`` bindings are ``jaxfid train``'s.

MFU is the model's matmul FLOPs (the step traced without remat, as
``model_flops_per_chip``; decoding: the program's, every token counted) over
the step time and the card's dense bf16 peak (:data:`jaxfid.aot.gpus.CARDS`,
by the device kind; None for another device). Prints one JSON line per
program and writes them all to ``--json-out``.

``--attentions reference,cudnn`` runs each program once per attention
implementation (gin ``ATTENTION``; each row says which): on a GPU, cuDNN's
flash attention against the einsums, at the same batch. cuDNN takes no
attention dropout, so a train comparison binds ``DROPOUT_RATE=0.0``; the
train rows' first losses then agree to bfloat16 tolerance (``first_step_loss``: the loss of fresh parameters on the
batch), the decode rows' tokens are compared by ``tokens_sha1``.

  python benchmarks/gpu_step.py train --gin_file=gin/fid/base.gin \\
      --gin.TARGET_MAXLENGTH=20 --gin.SCAN_LAYERS=True --gin.BATCH_SIZE=16
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

import jax
import numpy as np

from jaxfid.aot import command, gpus, programs
from jaxfid.training import launch, loop
from jaxfid.training import state as state_lib


def synthetic(abstract, sharding, seed: int = 0):
  """Random token ids (2..999) for integer leaves, True/1 for the rest."""
  rng = np.random.default_rng(seed)

  def leaf(s):
    if np.issubdtype(s.dtype, np.integer):
      value = rng.integers(2, 1000, s.shape).astype(s.dtype)
    else:
      value = np.ones(s.shape, s.dtype)
    return jax.device_put(value, sharding)
  return jax.tree.map(leaf, abstract)


def _peak(devices: int) -> float | None:
  """The dense bf16 peak of ``devices`` of this host's card, if known."""
  kind = jax.devices()[0].device_kind
  card = next((c for c in gpus.CARDS.values() if c.device_kind == kind), None)
  return None if card is None else card.peak_bf16_flops * devices


def _timed(fn, steps: int, first_out: list | None = None
           ) -> tuple[float, float]:
  """(first call's seconds: compile and run, the mean of ``steps`` more);
  the first call's output is appended to ``first_out``."""
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn())
  first = time.perf_counter() - t0
  if first_out is not None:
    first_out.append(out)
  t0 = time.perf_counter()
  out = None
  for _ in range(steps):
    out = fn()
  jax.block_until_ready(out)
  return first, (time.perf_counter() - t0) / steps


def _row(program: str, batch: int, devices: int, flops: float, first: float,
         step: float, extra: dict) -> dict:
  peak = _peak(devices)
  return {"program": program, "batch_size": batch, "device":
          jax.devices()[0].device_kind, "devices": devices,
          "first_call_s": first, "step_time_s": step,
          "examples_per_sec": batch / step, "model_tflops": flops / 1e12,
          "mfu": None if peak is None else flops / step / peak, **extra}


def train(run: command.Run, base: dict, steps: int) -> dict:
  built = run.build(base)
  flops = command.train_model_flops(run, base)[0]
  task, p, settings = built.task, built.prepared, built.settings
  with launch.prng_context(built.hardware_rng):
    plan = loop.layout(task, p, built.optimizer)
    place, phase = plan.placement, plan.phases[0]
    with jax.set_mesh(plan.mesh):
      params = jax.jit(lambda: p.model.init_params(settings.seed),
                       out_shardings=place.params)()
      state = [state_lib.fresh_state(phase.make_state, params, 0,
                                     plan.shardings[0])]
      del params
      batch = synthetic(task.abstract_batch(p, 0), place.batch)
      step = loop.jit_step(phase, plan.shardings[0], place)

      def one():
        state[0], metrics = step(state[0], batch)
        return metrics
      first_metrics = []
      first, per_step = _timed(one, steps, first_metrics)
      loss = float(jax.device_get(one()["loss"]))
      first_loss = float(jax.device_get(first_metrics[0]["loss"]))
  return _row("train", settings.batch_size, plan.mesh.size, flops, first,
              per_step,
              {"remat": built.remat, "scan_layers": built.scan_layers,
               "loss": loss, "first_step_loss": first_loss})


def decode(run: command.Run, base: dict, batch_size: int, steps: int) -> dict:
  built = run.build(base)
  task, p, settings = built.task, built.prepared, built.settings
  with launch.prng_context(built.hardware_rng):
    plan = loop.layout(task, p, built.optimizer)
    place = plan.placement
    rows = place.eval_batch_size(batch_size)
    fn, abstract = task.decode_program(p, rows)
    flops = programs.program_flops(fn, plan.abstract_params, abstract)
    with jax.set_mesh(plan.mesh):
      params = jax.jit(lambda: p.model.init_params(settings.seed),
                       out_shardings=place.params)()
      batch = synthetic(abstract, place.batch)
      jitted = jax.jit(fn, in_shardings=(place.params, place.batch),
                       out_shardings=place.replicated)
      first, per_step = _timed(lambda: jitted(params, batch), steps)
      tokens = np.asarray(jax.device_get(jitted(params, batch)))
  # decoding stops when every row has ended (EOS, then padding 0): the
  # tokens it ran, out of its bound (random weights end where they end)
  ran = int((tokens != 0).any(axis=0).sum())
  row = _row("decode", rows, plan.mesh.size, flops, first, per_step,
             {"scan_layers": built.scan_layers, "tokens_decoded": ran,
              "decode_maxlength": int(tokens.shape[1]),
              "tokens_sha1": hashlib.sha1(tokens.tobytes()).hexdigest()})
  if ran < tokens.shape[1]:  # the FLOPs count every token of the bound
    row["mfu"] = None
  return row


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("program", choices=("train", "decode"))
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--batch-sizes", default="1,16",
                 help="decode: the batch sizes, comma-separated")
  p.add_argument("--json-out", default=None)
  p.add_argument("--attentions", default=None,
                 help="run once per ATTENTION, comma-separated "
                      "(e.g. reference,cudnn)")
  p.add_argument("--gin_file", action="append", default=[])
  args, rest = p.parse_known_args(argv)
  bindings = [a.removeprefix("--gin.") for a in rest
              if a.startswith("--gin.")]
  unknown = [a for a in rest if not a.startswith("--gin.")]
  if unknown:
    p.error(f"unknown arguments: {' '.join(unknown)}")
  rows = []
  for attention in (args.attentions.split(",") if args.attentions
                    else [None]):
    extra = () if attention is None else (f"ATTENTION='{attention}'",)
    run = command.Run(tuple(args.gin_file), (*bindings, *extra), ())
    base = run.placeholders()
    run.check(base)
    found = ([train(run, base, args.steps)] if args.program == "train" else
             [decode(run, base, int(b), args.steps)
              for b in args.batch_sizes.split(",")])
    for row in found:
      if attention is not None:
        row["attention"] = attention
      print(json.dumps(row), flush=True)
    rows += found
  if args.json_out:
    with open(args.json_out, "w", encoding="utf-8") as f:
      f.write("".join(json.dumps(r) + "\n" for r in rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
