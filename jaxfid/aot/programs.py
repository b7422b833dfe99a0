"""Ahead-of-time compilation of a run's programs for a TPU slice or GPUs.

``jaxfid bench compile`` compiles, from shapes alone, the very programs
``jaxfid train`` runs: the task is built from the same gin files, prepared
with ``prepare_shapes`` (no data, no checkpoint), laid out by the loop's own
:func:`~jaxfid.training.loop.layout` (``MESH`` over the slice's devices, the
logical-axis rules, each phase's train state and shardings) and each phase's
step is jitted by :func:`~jaxfid.training.loop.jit_step`, lowered with
abstract arguments and compiled by the TPU compiler
(:mod:`jaxfid.aot.topologies` gives the devices). ``--program decode``
compiles the task's prediction program at the evaluation batch size, the
parameters placed as in training and the batch over the data axes.

What a compiled executable says (:func:`report`), per chip:

* memory: ``argument_gb`` (parameters, optimizer state, batch shard),
  ``output_gb``, ``alias_gb`` (outputs written into donated arguments: the
  train state), ``temp_gb`` (activations, gradients, XLA's scratch) and
  ``per_chip_gb = argument + output - alias + temp + generated code`` (the
  compiled code is resident in HBM too; tens of MB). ``fits`` when that is
  at most the chip's HBM and the compiler did not run out of memory; a
  program it cannot fit is ``fits: false`` with what it needs per chip
  (``required_gb``, from its RESOURCE_EXHAUSTED message: the total it names,
  or the temporaries it names plus the arguments' shards) and the message
  (``compiler_message``), the arguments' shards as ``argument_gb``, the
  model FLOPs, and the other fields None;
* ``flops_per_chip`` and ``bytes_accessed_per_chip``: the compiler's cost
  analysis of the partitioned program (recomputation under remat included;
  a ``while`` loop's body, as in decoding, counts once); ``flops_source``
  ``'compiler'``. XLA:GPU compiled without a GPU has no cost analysis:
  there ``flops_per_chip`` is ``program_flops_per_chip`` (``flops_source``
  ``'program'``), ``bytes_accessed_per_chip`` None and the roofline its
  compute term alone;
* ``collectives``: how many all-gather, reduce-scatter, all-reduce,
  all-to-all and collective-permute instructions the optimized HLO holds
  (an async ``-start``/``-done`` pair counts once; XLA:TPU's reduce-scatter,
  a fusion of an all-reduce and a slice, counts as a reduce-scatter);
* ``model_flops_per_chip``: the matmul FLOPs of the program's jaxpr (2 per
  multiply-add; scans times their length, a decoding loop times its bound)
  divided over the chips, traced without remat by the caller
  (:func:`program_flops`), so recomputation is not counted;
  ``program_flops_per_chip``: the same count of the compiled program itself
  (its remat's recomputation included);
* ``roofline_step_s = max(F / peak bf16 FLOP/s, B / HBM bandwidth)`` with
  the chip's public figures, and ``examples_per_sec_at_roofline``. The
  compiler's cost analysis counts a ``while`` loop's body once (scanned
  layers: one layer; accumulation: one microbatch; decoding: one token),
  so ``F`` is the larger of its FLOPs and the program's, and ``B`` is its
  bytes times the same ratio (:func:`loop_trips`: 4 for four microbatches;
  1 for a program without a loop, whose matmul FLOPs are below the
  compiler's count). For a loop ``B`` is an estimate: it scales the work
  outside the loop as often as the loop's, and where that work holds most
  of the FLOPs (decoding after FiD's encoder) the loop's bytes are still
  undercounted and the roofline is optimistic;
* ``breakdown`` (when asked: ``--breakdown``): where the step's HBM bytes
  and matmul FLOPs go, per group of instructions and for the top ones,
  read from the optimized HLO by :mod:`jaxfid.aot.breakdown`.

All sizes are in GB of 10^9 bytes.
"""
from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any, Callable

import jax
import numpy as np

from jaxfid.aot import breakdown as breakdown_lib
from jaxfid.aot import topologies
from jaxfid.core.errors import InputError
from jaxfid.training import loop
from jaxfid.training import state as state_lib
from jaxfid.training.settings import OptimizerSettings
from jaxfid.training.task import Compilable, Prepared

GB = 1e9
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "collective-permute")
_COLLECTIVE_OP = re.compile(
    r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
# a computation's first line: `%name (params) -> shape {` or `ENTRY %name ...`
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.-]+) ")
_REDUCE_SCATTER = "all-reduce-scatter"  # XLA:TPU's reduce-scatter fusions
# XLA:TPU's out-of-memory messages: "... Used 24.10G of 15.75G hbm ..." or
# "... the total memory required for HLO temporaries (16.00G) exceeds
# available HBM (15.75G)"; sizes in GiB (G), MiB (M), KiB (K) or bytes.
_OOM_USED = re.compile(r"Used\s+([\d.]+)\s*([KMGT]?)i?B?\s+of\s+([\d.]+)\s*"
                       r"([KMGT]?)i?B?\s+hbm", re.IGNORECASE)
_OOM_TEMPS = re.compile(r"required for HLO temporaries\s*\(([\d.]+)\s*"
                        r"([KMGT]?)i?B?\)", re.IGNORECASE)
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
# what report() says of a compiled program (a program the compiler could not
# fit has them all too, None where unknown)
REPORT_FIELDS = ("argument_gb", "output_gb", "alias_gb", "temp_gb",
                 "generated_code_gb", "per_chip_gb", "fits", "flops_per_chip",
                 "bytes_accessed_per_chip", "flops_source",
                 "model_flops_per_chip",
                 "program_flops_per_chip", "collectives",
                 "roofline_step_s", "examples_per_sec_at_roofline")


@dataclasses.dataclass(frozen=True)
class Target:
  """A slice to compile for: its topology and devices."""
  topology: topologies.Topology
  devices: list

  @classmethod
  def of(cls, topology: topologies.Topology) -> "Target":
    return cls(topology, topologies.devices(topology))

  @property
  def chip(self) -> topologies.Chip:
    return self.topology.chip

  @property
  def compiler_options(self) -> dict | None:
    """XLA options of this target's compiles (GPUs: :func:`jaxfid.aot.gpus.
    compiler_options`)."""
    return getattr(self.topology, "compiler_options", None)


class OutOfMemory(Exception):
  """The TPU compiler could not fit the program: it needs ``required_bytes``
  per chip, or (``temporaries_only``) that much for its temporaries."""

  def __init__(self, required_bytes: int | None, message: str,
               temporaries_only: bool = False):
    super().__init__(message)
    self.required_bytes = required_bytes
    self.message = message
    self.temporaries_only = temporaries_only
    self.argument_bytes: int | None = None  # the arguments' shards


def _bytes(value: str, unit: str) -> int:
  return int(float(value) * _UNITS[unit.upper()])


def out_of_memory(error: Exception) -> OutOfMemory | None:
  """The compiler's out-of-memory error as :class:`OutOfMemory`, else None.

  ``required_bytes``: what the program needs per chip ("Used X of Y hbm"),
  or, when the compiler names only its temporaries, those temporaries.
  """
  text = str(error)
  if ("RESOURCE_EXHAUSTED" not in text and "HbmOom" not in text
      and "Ran out of memory" not in text):
    return None
  line = next((l.strip() for l in text.splitlines() if l.strip()), text)
  used = _OOM_USED.search(text)
  if used:
    return OutOfMemory(_bytes(used.group(1), used.group(2)), line)
  temps = _OOM_TEMPS.search(text)
  if temps:
    return OutOfMemory(_bytes(temps.group(1), temps.group(2)), line,
                       temporaries_only=True)
  return OutOfMemory(None, line)


def count_collectives(hlo_text: str) -> dict[str, int]:
  """Collective instructions of an optimized HLO module, by kind.

  XLA:TPU writes a reduce-scatter as a fusion computation named
  ``all-reduce-scatter...`` whose body is an ``all-reduce`` and a slice of
  each chip's shard: its all-reduce counts as the reduce-scatter it is.
  """
  counts = dict.fromkeys(COLLECTIVES, 0)
  computation = ""
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      computation = header.group(1)
      continue
    for match in _COLLECTIVE_OP.finditer(line):
      kind = match.group(1)
      if kind == "all-reduce" and computation.startswith(_REDUCE_SCATTER):
        kind = "reduce-scatter"
      counts[kind] += 1
  return counts


# ---- analytic FLOPs from a jaxpr ---------------------------------------------

def _dot_flops(eqn) -> float:
  lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
  (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
  rhs_free = [d for i, d in enumerate(rhs)
              if i not in rhs_contract and i not in rhs_batch]
  # [batch, lhs free, contract] x [batch, contract, rhs free]: 2 per MAC
  return 2.0 * float(np.prod(lhs)) * float(np.prod(rhs_free))


def _loop_bound(cond_jaxpr) -> int:
  """The iterations of a ``while`` whose condition compares its counter with
  a literal bound (decoding's ``cur_index < max_decode_len``); else 1."""
  for eqn in cond_jaxpr.eqns:
    if eqn.primitive.name in ("lt", "le"):
      for v in eqn.invars:
        value = getattr(v, "val", None)
        if value is not None and np.ndim(value) == 0:
          return int(value) + (eqn.primitive.name == "le")
  return 1


def _sub_jaxprs(value):
  """The jaxprs held by an equation parameter (a jaxpr or a tuple of them)."""
  if hasattr(value, "eqns"):
    yield value
  elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
    yield value.jaxpr
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _sub_jaxprs(v)


# cuDNN's fused attention (jax.nn.dot_product_attention's 'cudnn'), FLOPs
# per B*N*T*S*H: the forward's scores and weighted values (4, as the
# einsums'), the backward's four gradient matmuls (8, as the einsums'
# transposes; cuDNN also recomputes the scores there, not counted)
_CUDNN_ATTENTION = {"dot_product_attention_fwd": 4,
                    "dot_product_attention_fwd_wrapper": 4,
                    "dot_product_attention_bwd": 8,
                    "dot_product_attention_bwd_wrapper": 8}


def _cudnn_attention_flops(eqn) -> float:
  q, k = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
  if eqn.params["layout"] == 1:  # BNTH
    b, n, t, h = q
    s = k[2]
  else:  # BTNH
    b, t, n, h = q
    s = k[1]
  return float(_CUDNN_ATTENTION[eqn.primitive.name] * b * n * t * s * h)


def jaxpr_flops(jaxpr) -> float:
  """Matmul FLOPs of a jaxpr: every ``dot_general`` (2 per multiply-add),
  inside calls and loops too (a scan times its length, a ``while`` times its
  literal bound, a ``cond`` its costliest branch, a ``shard_map`` body times
  its shards, a Pallas kernel what it declares or its body times its
  grid, cuDNN's fused attention its matmuls)."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      total += _dot_flops(eqn)
    elif name in _CUDNN_ATTENTION:
      total += _cudnn_attention_flops(eqn)
    elif name == "pallas_call":
      cost = eqn.params.get("cost_estimate")
      total += (float(cost.flops) if cost is not None else
                jaxpr_flops(eqn.params["jaxpr"])
                * math.prod(eqn.params["grid_mapping"].grid))
    elif name == "shard_map":
      mesh = eqn.params["mesh"]
      shards = math.prod(mesh.shape[a] for a in
                         eqn.params.get("newly_manual_axes", mesh.axis_names))
      total += jaxpr_flops(eqn.params["jaxpr"]) * shards
    elif name == "cond":
      total += max(jaxpr_flops(b) for b in eqn.params["branches"])
    elif name == "while":
      total += (jaxpr_flops(eqn.params["body_jaxpr"])
                * _loop_bound(eqn.params["cond_jaxpr"].jaxpr))
    else:
      inner = sum(jaxpr_flops(j) for v in eqn.params.values()
                  for j in _sub_jaxprs(v))
      total += inner * (eqn.params["length"] if name == "scan" else 1)
  return total


def program_flops(fn: Callable, *abstract_args) -> float:
  """:func:`jaxpr_flops` of ``fn`` traced at the abstract arguments."""
  return jaxpr_flops(jax.make_jaxpr(fn)(*abstract_args))


def train_flops(task: Compilable, p: Prepared,
                optimizer: OptimizerSettings) -> list[float]:
  """Per phase, the matmul FLOPs of one train step over the global batch
  (``p`` from ``prepare_shapes``; trace it without remat to leave
  recomputation out)."""
  params = p.model.abstract_params()
  out = []
  for i, phase in enumerate(task.phases(p, optimizer)):
    state = jax.eval_shape(phase.make_state, params, 0)
    out.append(program_flops(phase.step, state, task.abstract_batch(p, i)))
  return out


# ---- compiling -------------------------------------------------------------

def _with_sharding(abstract: Any, sharding) -> Any:
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                     sharding=sharding),
                      abstract)


def shard_bytes(abstract_args: Any) -> int:
  """Bytes of one device's shards of abstract arguments with shardings."""
  total = 0
  for leaf in jax.tree.leaves(abstract_args):
    shape = leaf.sharding.shard_shape(leaf.shape)
    total += int(np.prod(shape, dtype=np.int64)) * leaf.dtype.itemsize
  return total


def _compile(jitted, mesh, *args, options: dict | None = None):
  """``(compiled or OutOfMemory, seconds, program FLOPs)``: traced, lowered
  and compiled inside the mesh (the activations' sharding constraints name
  its axes); the FLOPs are :func:`jaxpr_flops` of the traced program itself
  (its remat's recomputation included). When the compiler names only its
  temporaries, the arguments' shards are added to what it needs."""
  t0 = time.perf_counter()
  with jax.set_mesh(mesh):
    try:
      traced = jitted.trace(*args)
      lowered = traced.lower()
    except ValueError as e:  # a shape the mesh's axes do not divide
      raise InputError("MESH", f"{dict(mesh.shape)} cannot lay out the "
                       f"program: {str(e).splitlines()[0]}") from None
    try:
      compiled = lowered.compile(options)
    except Exception as e:  # pylint: disable=broad-except
      oom = out_of_memory(e)
      if oom is None:
        raise
      oom.argument_bytes = shard_bytes(args)
      if oom.temporaries_only and oom.required_bytes is not None:
        oom.required_bytes += oom.argument_bytes
      compiled = oom
  return compiled, time.perf_counter() - t0, jaxpr_flops(traced.jaxpr)


def loop_trips(compiler_flops: float, program_flops: float) -> float:
  """How many times the compiler's cost analysis undercounts the program:
  its matmul FLOPs over the compiler's FLOPs, at least 1 (module
  docstring)."""
  if compiler_flops <= 0:
    return 1.0
  return max(1.0, program_flops / compiler_flops)


def compiler_cost(compiled) -> tuple[float | None, float | None]:
  """The compiler's (FLOPs, bytes accessed) of an executable, or (None,
  None) where it has none (XLA:GPU compiled without a device:
  ``cost_analysis()`` is None)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  if not cost:
    return None, None
  return (float(cost.get("flops", 0.0)),
          float(cost.get("bytes accessed", 0.0)))


def report(compiled, *, target: Target, batch_size: int,
           model_flops: float | None, program_flops: float,
           breakdown: bool = False) -> dict:
  """The fields of a compiled program (module docstring); ``compiled`` may
  be the compiler's :class:`OutOfMemory`. ``program_flops``: the program's
  own matmul FLOPs over the global batch (:func:`jaxpr_flops`);
  ``breakdown`` adds where its bytes go (:mod:`jaxfid.aot.breakdown`; None
  for a program the compiler could not fit)."""
  chip, chips = target.chip, len(target.devices)
  out = {"chips": chips, "device_kind": target.devices[0].device_kind,
         "hbm_gb_per_chip": chip.hbm_bytes / GB}
  model = None if model_flops is None else model_flops / chips
  program = program_flops / chips
  if isinstance(compiled, OutOfMemory):  # every field, None where unknown
    required = (None if compiled.required_bytes is None
                else compiled.required_bytes / GB)
    out.update(dict.fromkeys(REPORT_FIELDS))
    out.update(argument_gb=compiled.argument_bytes / GB, fits=False,
               required_gb=required, compiler_message=compiled.message,
               model_flops_per_chip=model, program_flops_per_chip=program)
    if breakdown:
      out["breakdown"] = None
    return out
  memory = compiled.memory_analysis()
  argument = memory.argument_size_in_bytes / GB
  output = memory.output_size_in_bytes / GB
  alias = memory.alias_size_in_bytes / GB
  temp = memory.temp_size_in_bytes / GB
  code = memory.generated_code_size_in_bytes / GB
  per_chip = argument + output - alias + temp + code
  hlo = compiled.as_text()
  flops, accessed = compiler_cost(compiled)
  if chip.peak_bf16_flops is None:  # this host's CPU: no public peak
    source, roofline = "compiler", None
  elif flops is None:  # XLA:GPU without a device: the program's own count
    flops, source = program, "program"
    roofline = program / chip.peak_bf16_flops
  else:
    source = "compiler"
    # the compiler counts a loop's body once; the program's count, every
    # trip: its bytes are scaled by the same number of trips
    roofline = max(max(flops, program) / chip.peak_bf16_flops,
                   accessed * loop_trips(flops, program)
                   / chip.hbm_bytes_per_s)
  out.update(
      argument_gb=argument, output_gb=output, alias_gb=alias, temp_gb=temp,
      generated_code_gb=code, per_chip_gb=per_chip,
      fits=per_chip <= chip.hbm_bytes / GB,
      flops_per_chip=flops, bytes_accessed_per_chip=accessed,
      flops_source=source,
      model_flops_per_chip=model, program_flops_per_chip=program,
      collectives=count_collectives(hlo),
      roofline_step_s=roofline,
      examples_per_sec_at_roofline=(batch_size / roofline if roofline
                                    else None))
  if breakdown:
    out["breakdown"] = breakdown_lib.breakdown(hlo).as_json()
  return out


def _header(target: Target, mesh, program: str) -> dict:
  return {"topology": target.topology.name,
          "slices": target.topology.num_slices, "mesh": dict(mesh.shape),
          "program": program}


def _larger(a: dict, b: dict | None) -> dict:
  """The report that needs more per chip (one that does not fit first)."""
  if b is None:
    return a
  if a["fits"] != b["fits"]:
    return b if not b["fits"] else a
  key = "per_chip_gb" if a["fits"] else "required_gb"
  return a if (a.get(key) or 0) >= (b.get(key) or 0) else b


def compile_train(task: Compilable, p: Prepared,
                  optimizer: OptimizerSettings, target: Target,
                  model_flops: list[float] | None = None,
                  breakdown: bool = False) -> dict:
  """Compiles every phase's train step as the loop runs it; the report of
  the phase that needs the most memory per chip (named in ``phase``), with
  the compile time of all of them (``compile_s``)."""
  settings = p.settings
  plan = loop.layout(task, p, optimizer, devices=target.devices)
  place, best, seconds = plan.placement, None, 0.0
  for i, phase in enumerate(plan.phases):
    state = state_lib.abstract_with(plan.abstract_states[i], plan.shardings[i])
    batch = _with_sharding(task.abstract_batch(p, i), place.batch)
    compiled, took, flops = _compile(
        loop.jit_step(phase, plan.shardings[i], place), plan.mesh, state,
        batch, options=target.compiler_options)
    seconds += took
    fields = report(compiled, target=target, batch_size=settings.batch_size,
                    model_flops=None if model_flops is None
                    else model_flops[i], program_flops=flops,
                    breakdown=breakdown)
    best = _larger({**_header(target, plan.mesh, "train"),
                    "phase": phase.name, "batch_size": settings.batch_size,
                    **fields}, best)
  best["compile_s"] = seconds
  return best


def compile_decode(task: Compilable, p: Prepared,
                   optimizer: OptimizerSettings, target: Target,
                   batch_size: int, breakdown: bool = False) -> dict:
  """Compiles the task's prediction program as its evaluation runs it:
  parameters placed as in training, ``batch_size`` rows (rounded up over
  the data axes) sharded over the data axes, outputs replicated."""
  plan = loop.layout(task, p, optimizer, devices=target.devices)
  place = plan.placement
  rows = place.eval_batch_size(batch_size)
  fn, abstract_batch = task.decode_program(p, rows)
  params = state_lib.abstract_with(plan.abstract_params, place.params)
  batch = _with_sharding(abstract_batch, place.batch)
  jitted = jax.jit(fn, in_shardings=(place.params, place.batch),
                   out_shardings=place.replicated)
  compiled, seconds, flops = _compile(jitted, plan.mesh, params, batch,
                                      options=target.compiler_options)
  fields = report(compiled, target=target, batch_size=rows,
                  model_flops=flops, program_flops=flops, breakdown=breakdown)
  return {**_header(target, plan.mesh, "decode"), "batch_size": rows,
          **fields, "compile_s": seconds}
