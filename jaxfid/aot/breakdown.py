"""Where a compiled step's HBM bytes and FLOPs go, read from its optimized HLO.

:func:`breakdown` takes the text of a compiled program
(``compiled.as_text()``: one chip's partitioned program, parsed by
:mod:`jaxfid.aot.hlo`) and counts, for
every *top-level* instruction (those of the entry computation, and of
``while`` bodies, ``call`` s and ``conditional`` branches reached from it;
not the instructions inside a fusion, which stay on chip):

* ``written``: the bytes of its output arrays that live in HBM (memory
  space 0; buffers the compiler placed in on-chip memory, annotated
  ``S(1)`` (TPU VMEM) in their layout, are counted apart as
  ``on_chip_written``; host memory, ``S(5)``, where remat offloads
  activations, as ``host`` (both ways));
* ``read``: the bytes of its operands that live in HBM, each operand once;
  a fusion parameter used only through slices (a ``dynamic-slice`` of a
  scanned layer's weights, say) counts the slices' bytes;
* ``scores``: the HBM bytes, written and read, of its attention-score
  arrays (below), whatever its group;
* ``flops``: 2 per multiply-add of every ``dot`` and ``convolution`` in it
  (a fusion's, too), as XLA's cost analysis counts them; a custom call's
  (a Pallas kernel's) are not counted, its bytes are (group ``other``).

Sizes are logical (elements x bytes per element), without the padding of
the TPU's tiles. Instructions that move no data count nothing (parameters,
constants, tuples, ``get-tuple-element``, ``bitcast``, the ``while`` itself);
an asynchronous pair counts its reads at ``-start`` and its writes at
``-done``. A ``while`` body counts as many times as the loop runs where
that is known (XLA's ``known_trip_count``, or a condition ``counter <
constant``: scanned layers, accumulation), else once
(``unknown_trip_loops``); a decoding loop that may stop early (``counter
< N and not done``) counts N times, its most (``loops_at_their_bound``);
each ``conditional`` branch counts once.

Each instruction falls in the first group it matches (:data:`GROUPS`):
``collectives`` (all-gather, reduce-scatter, all-reduce, all-to-all,
collective-permute); ``attention scores`` (an output with the dimensions of
an attention-score einsum's output, ``...->bhls`` in jaxfid's T5, in any
order: logits, probabilities, their gradients); ``dropout / RNG`` (outputs
of ``pred`` or ``u32``: masks and random bits, and ``rng`` instructions);
``layout copies`` (``copy``, ``transpose``, and fusions of nothing else;
``layout_copies_any_group`` counts them in every group, the copies of the
attention scores too);
``memory-space copies`` (``copy-start``/``copy-done``: HBM to on-chip
memory and back); ``matmuls`` (a dot or convolution); ``optimizer``
(instructions outside the gradient, where the program has one: no ``jvp(``
or ``transpose(`` in their ``op_name``: the update, gradient norms,
metrics); ``other``.
"""
from __future__ import annotations

import dataclasses
import math
import re

from jaxfid.aot import hlo

GROUPS = ("attention scores", "matmuls", "dropout / RNG", "layout copies",
          "memory-space copies", "collectives", "optimizer", "other")
HBM, HOST = 0, 5  # XLA's memory spaces (S(1): TPU VMEM; S(5): host)
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "collective-permute")
# the output spec of jaxfid's attention-score einsums (t5/layers.py)
SCORE_EINSUMS = ("->bhls",)
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple",
               "bitcast", "while", "call", "conditional", "after-all",
               "partition-id", "replica-id", "opt-barrier", "add-dependency"}
_SLICES = {"dynamic-slice", "slice", "gather"}
_LAYOUT = {"copy", "transpose", "bitcast", "reshape", "parameter"}


@dataclasses.dataclass(frozen=True)
class Row:
  """One top-level instruction's traffic over all its trips."""
  name: str
  opcode: str
  group: str
  shape: str
  trips: int
  written: float
  read: float
  flops: float
  on_chip_written: float
  op_name: str
  layout: bool = False  # a copy or transpose (whatever its group)
  host: float = 0.0  # bytes written to or read from host memory
  scores: float = 0.0  # HBM bytes of attention-score arrays, both ways


@dataclasses.dataclass(frozen=True)
class Breakdown:
  """The rows of a program; loops whose trip count is unknown, and loops
  counted at their bound."""
  rows: tuple[Row, ...]
  unknown_trip_loops: int
  loops_at_their_bound: int = 0

  def groups(self) -> list[dict]:
    """Per group (:data:`GROUPS` order): instructions, bytes and FLOPs."""
    out = []
    for group in GROUPS:
      rows = [r for r in self.rows if r.group == group]
      out.append({"group": group, "instructions": sum(r.trips for r in rows),
                  "written": sum(r.written for r in rows),
                  "read": sum(r.read for r in rows),
                  "flops": sum(r.flops for r in rows)})
    return out

  def top(self, n: int = 15) -> list[dict]:
    """The ``n`` source ops that move the most HBM bytes (written + read):
    rows of the same group, opcode, largest output and ``op_name`` (one op
    in every layer) summed, with their count and one instruction's name."""
    alike: dict[tuple, dict] = {}
    for r in self.rows:
      key = (r.group, r.opcode, r.shape, r.op_name)
      if key not in alike:
        alike[key] = {"name": r.name, "opcode": r.opcode, "group": r.group,
                      "shape": r.shape, "count": 0, "written": 0.0,
                      "read": 0.0, "flops": 0.0, "op_name": r.op_name}
      a = alike[key]
      a["count"] += r.trips
      a["written"] += r.written
      a["read"] += r.read
      a["flops"] += r.flops
    return sorted(alike.values(),
                  key=lambda a: -(a["written"] + a["read"]))[:n]

  def as_json(self, top: int = 15) -> dict:
    """The report's ``breakdown`` field, sizes in GB of 10^9 bytes."""
    gb = 1e9
    written = sum(r.written for r in self.rows)
    copies = [r for r in self.rows if r.layout]
    return {
        "counted": "per chip; HBM bytes written (outputs) and read "
                   "(operands) by top-level instructions, loop bodies "
                   "times their trips; logical sizes",
        "written_gb": written / gb,
        "read_gb": sum(r.read for r in self.rows) / gb,
        "on_chip_written_gb": sum(r.on_chip_written for r in self.rows) / gb,
        "host_gb": sum(r.host for r in self.rows) / gb,
        "attention_scores_any_group_gb": sum(r.scores for r in self.rows) / gb,
        "flops": sum(r.flops for r in self.rows),
        "unknown_trip_loops": self.unknown_trip_loops,
        "loops_at_their_bound": self.loops_at_their_bound,
        "layout_copies_any_group": {
            "instructions": sum(r.trips for r in copies),
            "written_gb": sum(r.written for r in copies) / gb,
            "read_gb": sum(r.read for r in copies) / gb},
        "groups": [{"group": g["group"], "instructions": g["instructions"],
                    "written_gb": g["written"] / gb, "read_gb": g["read"] / gb,
                    "share_of_written": g["written"] / written if written
                    else 0.0, "flops": g["flops"]} for g in self.groups()],
        "top": [{**{k: v for k, v in a.items()
                    if k not in ("written", "read")},
                 "written_gb": a["written"] / gb, "read_gb": a["read"] / gb}
                for a in self.top(top)]}

# ---- grouping ----------------------------------------------------------------
def _has_dot(comp: hlo.Computation, module: dict[str, hlo.Computation]) -> bool:
  return any(i.opcode in ("dot", "convolution")
             or (i.opcode == "fusion" and any(
                 _has_dot(c, module) for c in hlo.fused(i, module)))
             for i in comp.instructions.values())


def score_dims(module: dict[str, hlo.Computation],
               einsums: tuple[str, ...] = SCORE_EINSUMS) -> set[tuple]:
  """The sorted dims of every attention-score einsum's output: its dots in
  the forward pass or remat's recomputation of it (a dot of the gradient,
  ``transpose(...)`` outside a ``rematted_computation``, is the einsum's
  transpose: its output is a query's or key's gradient)."""
  out = set()
  for comp in module.values():
    for inst in comp.instructions.values():
      forward = ("transpose(" not in inst.op_name
                 or "rematted_computation" in inst.op_name)
      if (inst.opcode in ("dot", "convolution") and inst.outputs and forward
          and any(e in inst.op_name for e in einsums)):
        out.add(tuple(sorted(d for d in inst.outputs[0].dims if d > 1)))
  return out


def _is_layout(inst: hlo.Instruction,
               module: dict[str, hlo.Computation]) -> bool:
  """A copy or transpose, or a fusion of nothing else."""
  fused = hlo.fused(inst, module)
  return inst.opcode in ("copy", "transpose") or (
      inst.opcode == "fusion" and bool(fused) and all(
          i.opcode in _LAYOUT for c in fused for i in c.instructions.values()))


def _group(inst: hlo.Instruction, module: dict[str, hlo.Computation],
           scores: set[tuple], has_gradient: bool) -> str:
  base = inst.opcode.removesuffix("-start").removesuffix("-done")
  fused = hlo.fused(inst, module)
  if base in COLLECTIVES or any(  # XLA:TPU's reduce-scatter; async wrappers
      c.name.startswith("all-reduce-scatter") or (base == "async" and any(
          i.opcode in COLLECTIVES for i in c.instructions.values()))
      for c in fused):
    return "collectives"
  if any(tuple(sorted(d for d in a.dims if d > 1)) in scores
         for a in inst.outputs):
    return "attention scores"
  if (base in ("rng", "rng-bit-generator", "rng-get-and-update-state")
      or any(a.dtype in ("pred", "u32") and math.prod(a.dims) > 1
             for a in inst.outputs)):
    return "dropout / RNG"
  if base == "copy" and inst.opcode != "copy":
    return "memory-space copies"
  if _is_layout(inst, module):
    return "layout copies"
  if inst.opcode in ("dot", "convolution") or (
      inst.opcode == "fusion" and any(_has_dot(c, module) for c in fused)):
    return "matmuls"
  if has_gradient and inst.op_name and "jvp(" not in inst.op_name and \
      "transpose(" not in inst.op_name:
    return "optimizer"
  return "other"


# ---- traffic -----------------------------------------------------------------

def _in(arrays: list[hlo.Array], *spaces: int) -> float:
  """Bytes of the arrays in these memory spaces."""
  return sum(a.bytes for a in arrays if a.memory_space in spaces)


def _operands(inst: hlo.Instruction, comp: hlo.Computation,
              module: dict[str, hlo.Computation]) -> list[hlo.Array]:
  """The arrays an instruction reads, each operand once (a slice, or a
  fusion parameter used only through slices: the slices)."""
  if inst.opcode.endswith("-done") or inst.opcode in _NO_TRAFFIC:
    return []
  base = inst.opcode.removesuffix("-start")
  if base in _SLICES and inst.operands:  # reads its slice of operand 0
    source = comp.instructions.get(inst.operands[0])
    space = source.outputs[0].memory_space if source and source.outputs else 0
    # slice-start's output: ((operand), slice, context)
    sliced = inst.outputs[1:2] if inst.opcode.endswith("-start") \
        else inst.outputs[:1]
    return [dataclasses.replace(a, memory_space=space) for a in sliced]
  params: dict[int, list[hlo.Array]] = {}
  if inst.opcode == "fusion" and inst.called and inst.called[0] in module:
    fused = module[inst.called[0]]
    users = fused.users()
    for p in fused.instructions.values():
      if p.opcode != "parameter":
        continue
      used = users.get(p.name, [])
      if p.argument.isdigit() and used and all(
          u.opcode in _SLICES and u.operands[0] == p.name for u in used):
        params[int(p.argument)] = [a for u in used for a in u.outputs]
  out, seen = [], set()
  for i, name in enumerate(inst.operands):
    operand = comp.instructions.get(name)
    if operand is None or name in seen:
      continue
    seen.add(name)
    arrays = operand.outputs
    if i in params:
      space = arrays[0].memory_space if arrays else 0
      arrays = [dataclasses.replace(a, memory_space=space)
                for a in params[i]]
    out += arrays
  return out

def breakdown(hlo_text: str,
              einsums: tuple[str, ...] = SCORE_EINSUMS) -> Breakdown:
  """The :class:`Breakdown` of an optimized HLO module's text (module
  docstring)."""
  module = hlo.parse_module(hlo_text)
  entry = next((c for c in module.values() if c.is_entry), None)
  if entry is None:
    raise ValueError("the HLO text has no ENTRY computation")
  scores = score_dims(module, einsums)
  has_gradient = any("jvp(" in i.op_name for c in module.values()
                     for i in c.instructions.values())
  rows: list[Row] = []
  unknown = bounded = 0

  def visit(comp: hlo.Computation, trips: int) -> None:
    nonlocal unknown, bounded
    for inst in comp.instructions.values():
      if inst.opcode == "while":
        n, exact = hlo.loop_trips(inst, comp, module)
        unknown += n is None
        bounded += n is not None and not exact
        for name in inst.called:
          if name in module:
            visit(module[name], trips * (n or 1))
        continue
      if inst.opcode in ("call", "conditional"):
        for name in inst.called:
          if name in module:
            visit(module[name], trips)
        continue
      if inst.opcode in _NO_TRAFFIC:
        continue
      start = inst.opcode.endswith("-start")
      outputs = [] if start else inst.outputs
      flops = hlo.instruction_flops(inst, comp, module)
      main = max(inst.outputs, key=lambda a: a.bytes, default=None)
      read = _operands(inst, comp, module)
      score = [a for a in outputs + read if a.memory_space == HBM
               and tuple(sorted(d for d in a.dims if d > 1)) in scores]
      rows.append(Row(
          inst.name, inst.opcode, _group(inst, module, scores, has_gradient),
          str(main) if main else "", trips, _in(outputs, HBM) * trips,
          _in(read, HBM) * trips, flops * trips,
          (sum(a.bytes for a in outputs) - _in(outputs, HBM, HOST)) * trips,
          _short(inst.op_name), _is_layout(inst, module),
          _in(outputs + read, HOST) * trips, _in(score, HBM) * trips))

  visit(entry, 1)
  return Breakdown(tuple(rows), unknown, bounded)


def _short(op_name: str) -> str:
  """``op_name`` without the outermost ``jit(...)/`` of the program."""
  return re.sub(r"^jit\([\w.]+\)/", "", op_name).replace("\\'", "'")


def _size(gb: float) -> str:
  for unit, scale in (("GB", 1.0), ("MB", 1e-3), ("kB", 1e-6)):
    if abs(gb) >= scale:
      return f"{gb / scale:.2f} {unit}"
  return f"{gb * 1e9:.0f} B"


def table(result: dict) -> str:
  """A readable table of a report's ``breakdown`` field (stderr)."""
  lines = [f"where the bytes go, per chip (HBM; loop bodies times their "
           f"trips): {_size(result['written_gb'])} written, "
           f"{_size(result['read_gb'])} read; matmuls "
           f"{result['flops'] / 1e12:.3g} TFLOP"]
  lines.append(f"attention-score arrays, any instruction: "
               f"{_size(result['attention_scores_any_group_gb'])} (written + "
               f"read); to or from host memory: {_size(result['host_gb'])}")
  if result.get("loops_at_their_bound"):
    lines.append(f"({result['loops_at_their_bound']} loop(s) that may stop "
                 "early counted at their bound)")
  if result["unknown_trip_loops"]:
    lines.append(f"({result['unknown_trip_loops']} loop(s) of unknown trip "
                 "count counted once)")
  lines.append(f"{'group':<20}{'instr':>7}{'written':>11}{'share':>7}"
               f"{'read':>11}{'TFLOP':>8}")
  for g in result["groups"]:
    lines.append(f"{g['group']:<20}{g['instructions']:>7}"
                 f"{_size(g['written_gb']):>11}{g['share_of_written']:>7.0%}"
                 f"{_size(g['read_gb']):>11} {g['flops'] / 1e12:>7.3g}")
  c = result["layout_copies_any_group"]
  lines.append(f"{'(copies, any group)':<20}{c['instructions']:>7}"
               f"{_size(c['written_gb']):>11}{'':>7}{_size(c['read_gb']):>11}")
  lines.append(f"{'top source ops':<20}{'count':>7}{'written':>11}"
               f"{'read':>11}  group, shape, source op")
  for r in result["top"]:
    lines.append(f"{r['name'][:20]:<20}{r['count']:>7}"
                 f"{_size(r['written_gb']):>11}{_size(r['read_gb']):>11}  "
                 f"{r['group']}, {r['shape']}, {r['op_name'][:60]}")
  return "\n".join(lines)
