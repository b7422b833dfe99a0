"""Where a compiled step's HBM bytes and FLOPs go, read from its optimized HLO.

:func:`breakdown` takes the text of a compiled program
(``compiled.as_text()``: one chip's partitioned program) and counts, for
every *top-level* instruction (those of the entry computation, and of
``while`` bodies, ``call`` s and ``conditional`` branches reached from it;
not the instructions inside a fusion, which stay on chip):

* ``written``: the bytes of its output arrays that live in HBM (memory
  space 0; buffers the compiler placed in on-chip memory, annotated
  ``S(n)`` in their layout, are counted apart as ``on_chip_written``);
* ``read``: the bytes of its operands that live in HBM, each operand once;
  a fusion parameter used only through slices (a ``dynamic-slice`` of a
  scanned layer's weights, say) counts the slices' bytes;
* ``flops``: 2 per multiply-add of every ``dot`` and ``convolution`` in it
  (a fusion's, too), as XLA's cost analysis counts them.

Sizes are logical (elements x bytes per element), without the padding of
the TPU's tiles. Instructions that move no data count nothing (parameters,
constants, tuples, ``get-tuple-element``, ``bitcast``, the ``while`` itself);
an asynchronous pair counts its reads at ``-start`` and its writes at
``-done``. A ``while`` body counts as many times as the loop runs where
that is known (XLA's ``known_trip_count``, or a condition ``counter <
constant``: scanned layers, accumulation), else once
(``unknown_trip_loops``); each ``conditional`` branch counts once.

Each instruction falls in the first group it matches (:data:`GROUPS`):
``collectives`` (all-gather, reduce-scatter, all-reduce, all-to-all,
collective-permute); ``attention scores`` (an output with the dimensions of
an attention-score einsum's output, ``...->bhls`` in jaxfid's T5, in any
order: logits, probabilities, their gradients); ``dropout / RNG`` (outputs
of ``pred`` or ``u32``: masks and random bits, and ``rng`` instructions);
``layout copies`` (``copy``, ``transpose``, and fusions of nothing else);
``memory-space copies`` (``copy-start``/``copy-done``: HBM to on-chip
memory and back); ``matmuls`` (a dot or convolution); ``optimizer``
(instructions outside the gradient, where the program has one: no ``jvp(``
or ``transpose(`` in their ``op_name``: the update, gradient norms,
metrics); ``other``.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re

GROUPS = ("attention scores", "matmuls", "dropout / RNG", "layout copies",
          "memory-space copies", "collectives", "optimizer", "other")
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "collective-permute")
# the output spec of jaxfid's attention-score einsums (t5/layers.py)
SCORE_EINSUMS = ("->bhls",)
_ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
               "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
               "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5}
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple",
               "bitcast", "while", "call", "conditional", "after-all",
               "partition-id", "replica-id", "opt-barrier", "add-dependency"}
_SLICES = {"dynamic-slice", "slice", "gather"}
_LAYOUT = {"copy", "transpose", "bitcast", "reshape", "parameter"}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.-]+)\s")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][\w-]*)\(")
_OPERAND = re.compile(r"%([\w.-]+)")
_CALLED = re.compile(r"\b(calls|body|condition|to_apply)=%([\w.-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_DIMS_ATTR = re.compile(r"\b(lhs_contracting_dims|lhs_batch_dims)=\{([\d,]*)\}")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_GROUP_COUNT = re.compile(r"\b(feature_group_count|batch_group_count)=(\d+)")


@dataclasses.dataclass(frozen=True)
class Array:
  """One array of a shape: element type, logical dims, memory space."""
  dtype: str
  dims: tuple[int, ...]
  memory_space: int

  @property
  def bytes(self) -> float:
    size = _ITEM_BYTES.get(self.dtype, 1 if self.dtype.startswith("f8") else 0)
    return math.prod(self.dims) * size

  def __str__(self) -> str:
    return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass
class Instruction:
  """An HLO instruction as the breakdown reads it."""
  name: str
  opcode: str
  outputs: list[Array]
  operands: list[str]
  called: list[str]
  attributes: str
  op_name: str
  argument: str = ""  # the text between the opcode's parentheses


@dataclasses.dataclass
class Computation:
  name: str
  instructions: dict[str, Instruction]
  is_entry: bool = False
  root: str = ""

  def users(self) -> dict[str, list[Instruction]]:
    out = collections.defaultdict(list)
    for inst in self.instructions.values():
      for operand in inst.operands:
        out[operand].append(inst)
    return out


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


@dataclasses.dataclass(frozen=True)
class Breakdown:
  """The rows of a program, and loops whose trip count is unknown."""
  rows: tuple[Row, ...]
  unknown_trip_loops: int

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

  def top(self, n: int = 15) -> list[Row]:
    """The ``n`` rows that move the most HBM bytes (written + read)."""
    return sorted(self.rows, key=lambda r: -(r.written + r.read))[:n]

  def as_json(self, top: int = 15) -> dict:
    """The report's ``breakdown`` field, sizes in GB of 10^9 bytes."""
    gb = 1e9
    written = sum(r.written for r in self.rows)
    return {
        "counted": "per chip; HBM bytes written (outputs) and read "
                   "(operands) by top-level instructions, loop bodies "
                   "times their trips; logical sizes",
        "written_gb": written / gb,
        "read_gb": sum(r.read for r in self.rows) / gb,
        "on_chip_written_gb": sum(r.on_chip_written for r in self.rows) / gb,
        "flops": sum(r.flops for r in self.rows),
        "unknown_trip_loops": self.unknown_trip_loops,
        "groups": [{"group": g["group"], "instructions": g["instructions"],
                    "written_gb": g["written"] / gb, "read_gb": g["read"] / gb,
                    "share_of_written": g["written"] / written if written
                    else 0.0, "flops": g["flops"]} for g in self.groups()],
        "top": [{"name": r.name, "opcode": r.opcode, "group": r.group,
                 "shape": r.shape, "trips": r.trips,
                 "written_gb": r.written / gb, "read_gb": r.read / gb,
                 "flops": r.flops, "op_name": r.op_name}
                for r in self.top(top)]}


# ---- parsing -----------------------------------------------------------------

def _close(text: str, start: int) -> int:
  """The index just past the bracket group opening at ``text[start]``."""
  pairs = {"(": ")", "{": "}", "[": "]"}
  stack, i, quoted = [], start, False
  while i < len(text):
    c = text[i]
    if c == '"' and text[i - 1] != "\\":
      quoted = not quoted
    elif not quoted:
      if c in pairs:
        stack.append(pairs[c])
      elif stack and c == stack[-1]:
        stack.pop()
        if not stack:
          return i + 1
    i += 1
  return len(text)


def parse_arrays(shape: str) -> list[Array]:
  """The arrays of a shape string (a tuple's, flattened)."""
  out = []
  for m in _ARRAY.finditer(shape):
    if m.group(1) not in _ITEM_BYTES and not m.group(1).startswith("f8"):
      continue
    dims = tuple(int(d) for d in m.group(2).split(",") if d)
    space = re.search(r"S\((\d+)\)", m.group(3) or "")
    out.append(Array(m.group(1), dims, int(space.group(1)) if space else 0))
  return out


def _instruction(line: str) -> Instruction | None:
  head = _INSTRUCTION.match(line)
  if not head:
    return None
  rest = head.end()
  if line[rest] == "(":  # a tuple shape
    end = _close(line, rest)
  else:
    end = line.find(" ", rest)
  shape = line[rest:end]
  op = _OPCODE.match(line, end)
  if not op:
    return None
  close = _close(line, op.end() - 1)
  argument = line[op.end():close - 1]
  operands = _OPERAND.findall(argument)
  attributes = line[close:]
  called = [m.group(2) for m in _CALLED.finditer(attributes)]
  for m in _BRANCHES.finditer(attributes):
    called += _OPERAND.findall(m.group(1))
  name = _OP_NAME.search(attributes)
  return Instruction(head.group(1), op.group(1), parse_arrays(shape),
                     operands, called, attributes,
                     name.group(1) if name else "", argument)


def parse_module(hlo_text: str) -> dict[str, Computation]:
  """The computations of an HLO module's text, by name."""
  out, current = {}, None
  for line in hlo_text.splitlines():
    if not line or line.startswith("HloModule"):
      continue
    if not line[0].isspace():
      if line.startswith("}"):
        current = None
        continue
      header = _HEADER.match(line)
      if header and line.rstrip().endswith("{"):
        current = Computation(header.group(1), {},
                              line.startswith("ENTRY"))
        out[current.name] = current
      continue
    if current is not None:
      inst = _instruction(line)
      if inst is not None:
        current.instructions[inst.name] = inst
        if line.lstrip().startswith("ROOT "):
          current.root = inst.name
  return out


# ---- FLOPs -------------------------------------------------------------------

def _dot_flops(inst: Instruction, shapes: dict[str, list[Array]]) -> float:
  lhs = shapes.get(inst.operands[0]) if inst.operands else None
  if not lhs or not inst.outputs:
    return 0.0
  dims = {m.group(1): [int(d) for d in m.group(2).split(",") if d]
          for m in _DIMS_ATTR.finditer(inst.attributes)}
  contracted = math.prod(lhs[0].dims[d]
                         for d in dims.get("lhs_contracting_dims", []))
  return 2.0 * math.prod(inst.outputs[0].dims) * contracted


def _valid_positions(size: int, out: int, window: int, stride: int,
                     low: int, lhs_dilate: int, rhs_dilate: int) -> int:
  """(output, window) pairs of one spatial dim that read an input element
  (XLA's HloCostAnalysis counts convolution FLOPs so)."""
  count = 0
  dilated = (size - 1) * lhs_dilate + 1
  for o in range(out):
    for k in range(window):
      pos = o * stride + k * rhs_dilate - low
      if 0 <= pos < dilated and pos % lhs_dilate == 0:
        count += 1
  return count


def _window(attributes: str, rank: int) -> dict[str, list]:
  out = {"size": [1] * rank, "stride": [1] * rank, "pad": [(0, 0)] * rank,
         "lhs_dilate": [1] * rank, "rhs_dilate": [1] * rank}
  m = _WINDOW.search(attributes)
  if m:
    for item in m.group(1).split():
      key, _, value = item.partition("=")
      parts = value.split("x")
      if key == "pad":
        out[key] = [tuple(int(v) for v in p.split("_")) for p in parts]
      elif key in out:
        out[key] = [int(v) for v in parts]
  return out


def _conv_flops(inst: Instruction, shapes: dict[str, list[Array]]) -> float:
  labels = _DIM_LABELS.search(inst.attributes)
  operands = [shapes.get(o) for o in inst.operands[:2]]
  if not labels or not all(operands) or not inst.outputs:
    return 0.0
  lhs, rhs, out = operands[0][0], operands[1][0], inst.outputs[0]
  lhs_l, rhs_l, out_l = labels.groups()
  groups = {m.group(1): int(m.group(2))
            for m in _GROUP_COUNT.finditer(inst.attributes)}
  spatial = sorted(c for c in lhs_l if c.isdigit())
  w = _window(inst.attributes, len(spatial))
  positions = 1
  for i, s in enumerate(spatial):
    positions *= _valid_positions(
        lhs.dims[lhs_l.index(s)], out.dims[out_l.index(s)], w["size"][i],
        w["stride"][i], w["pad"][i][0], w["lhs_dilate"][i],
        w["rhs_dilate"][i])
  in_feature = lhs.dims[lhs_l.index("f")]
  out_feature = out.dims[out_l.index("f")]
  batch = lhs.dims[lhs_l.index("b")]
  del rhs
  fma = (in_feature // groups.get("feature_group_count", 1) * out_feature
         * batch // groups.get("batch_group_count", 1) * positions)
  return 2.0 * fma


def _instruction_flops(inst: Instruction, comp: Computation,
                       module: dict[str, Computation]) -> float:
  """The dot and convolution FLOPs of one instruction (a fusion's: of the
  computations it calls)."""
  if inst.opcode == "fusion":
    return sum(_instruction_flops(i, c, module) for c in _fused(inst, module)
               for i in c.instructions.values())
  if inst.opcode not in ("dot", "convolution"):
    return 0.0
  shapes = {n: i.outputs for n, i in comp.instructions.items()}
  return (_dot_flops(inst, shapes) if inst.opcode == "dot"
          else _conv_flops(inst, shapes))


# ---- grouping ------------------------------------------------------------------

def _fused(inst: Instruction, module: dict[str, Computation]) -> list[Computation]:
  return [module[c] for c in inst.called if c in module]


def _has_dot(comp: Computation, module: dict[str, Computation]) -> bool:
  return any(i.opcode in ("dot", "convolution")
             or (i.opcode == "fusion" and any(
                 _has_dot(c, module) for c in _fused(i, module)))
             for i in comp.instructions.values())


def score_dims(module: dict[str, Computation],
               einsums: tuple[str, ...] = SCORE_EINSUMS) -> set[tuple]:
  """The sorted dims of every attention-score einsum's output."""
  out = set()
  for comp in module.values():
    for inst in comp.instructions.values():
      if (inst.opcode in ("dot", "convolution") and inst.outputs
          and any(e in inst.op_name for e in einsums)):
        out.add(tuple(sorted(d for d in inst.outputs[0].dims if d > 1)))
  return out


def _group(inst: Instruction, module: dict[str, Computation],
           scores: set[tuple], has_gradient: bool) -> str:
  base = inst.opcode.removesuffix("-start").removesuffix("-done")
  fused = _fused(inst, module)
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
  if inst.opcode in ("copy", "transpose") or (
      inst.opcode == "fusion" and fused and all(
          i.opcode in _LAYOUT for c in fused
          for i in c.instructions.values())):
    return "layout copies"
  if inst.opcode in ("dot", "convolution") or (
      inst.opcode == "fusion" and any(_has_dot(c, module) for c in fused)):
    return "matmuls"
  if has_gradient and inst.op_name and "jvp(" not in inst.op_name and \
      "transpose(" not in inst.op_name:
    return "optimizer"
  return "other"


# ---- traffic -------------------------------------------------------------------

def _hbm(arrays: list[Array]) -> float:
  return sum(a.bytes for a in arrays if a.memory_space == 0)


def _read(inst: Instruction, comp: Computation,
          module: dict[str, Computation]) -> float:
  """HBM bytes of the operands (a fusion parameter used only through
  slices: the slices' bytes)."""
  if inst.opcode.endswith("-done") or inst.opcode in _NO_TRAFFIC:
    return 0.0
  params: dict[int, list[Array]] = {}
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
  total, seen = 0.0, set()
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
    total += _hbm(arrays)
  return total


def _constant(inst: Instruction | None) -> int | None:
  if inst is None or inst.opcode != "constant":
    return None
  try:
    return int(inst.argument)
  except ValueError:
    return None


def _trips(loop: Instruction, comp: Computation,
           module: dict[str, Computation]) -> int | None:
  """A ``while``'s trip count: XLA's ``known_trip_count``, else a
  condition ``counter < N`` (or ``<=``) with N a constant and the counter
  a tuple element that starts at a constant (0 where its start is not
  one, as a scan's counter does)."""
  m = _TRIPS.search(loop.attributes)
  if m:
    return int(m.group(1))
  cond = module.get(next((n for n in loop.called if n in module and
                          f"condition=%{n}" in loop.attributes), ""))
  root = cond.instructions.get(cond.root) if cond else None
  if root is None or root.opcode != "compare" or len(root.operands) != 2:
    return None
  direction = re.search(r"direction=(\w+)", root.attributes)
  counter, bound = (cond.instructions.get(n) for n in root.operands)
  limit = _constant(bound)
  if (direction is None or direction.group(1) not in ("LT", "LE")
      or limit is None or counter is None
      or counter.opcode != "get-tuple-element"):
    return None
  index = int(re.search(r"index=(\d+)", counter.attributes).group(1))
  init = comp.instructions.get(loop.operands[0]) if loop.operands else None
  start = None
  if init is not None and init.opcode == "tuple" and index < len(
      init.operands):
    start = _constant(comp.instructions.get(init.operands[index]))
  return max(0, limit - (start or 0) + (direction.group(1) == "LE"))


def breakdown(hlo_text: str,
              einsums: tuple[str, ...] = SCORE_EINSUMS) -> Breakdown:
  """The :class:`Breakdown` of an optimized HLO module's text (module
  docstring)."""
  module = parse_module(hlo_text)
  entry = next((c for c in module.values() if c.is_entry), None)
  if entry is None:
    raise ValueError("the HLO text has no ENTRY computation")
  scores = score_dims(module, einsums)
  has_gradient = any("jvp(" in i.op_name for c in module.values()
                     for i in c.instructions.values())
  rows: list[Row] = []
  unknown = 0

  def visit(comp: Computation, trips: int) -> None:
    nonlocal unknown
    for inst in comp.instructions.values():
      if inst.opcode == "while":
        n = _trips(inst, comp, module)
        unknown += n is None
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
      flops = _instruction_flops(inst, comp, module)
      main = max(inst.outputs, key=lambda a: a.bytes, default=None)
      rows.append(Row(
          inst.name, inst.opcode, _group(inst, module, scores, has_gradient),
          str(main) if main else "", trips, _hbm(outputs) * trips,
          _read(inst, comp, module) * trips, flops * trips,
          sum(a.bytes for a in outputs if a.memory_space != 0) * trips,
          _short(inst.op_name)))

  visit(entry, 1)
  return Breakdown(tuple(rows), unknown)


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
  if result["unknown_trip_loops"]:
    lines.append(f"({result['unknown_trip_loops']} loop(s) of unknown trip "
                 "count counted once)")
  lines.append(f"{'group':<20}{'instr':>7}{'written':>11}{'share':>7}"
               f"{'read':>11}{'TFLOP':>8}")
  for g in result["groups"]:
    lines.append(f"{g['group']:<20}{g['instructions']:>7}"
                 f"{_size(g['written_gb']):>11}{g['share_of_written']:>7.0%}"
                 f"{_size(g['read_gb']):>11} {g['flops'] / 1e12:>7.3g}")
  lines.append(f"{'top instructions':<20}{'trips':>7}{'written':>11}"
               f"{'read':>11}  group, shape, source op")
  for r in result["top"]:
    lines.append(f"{r['name'][:20]:<20}{r['trips']:>7}"
                 f"{_size(r['written_gb']):>11}{_size(r['read_gb']):>11}  "
                 f"{r['group']}, {r['shape']}, {r['op_name'][:60]}")
  return "\n".join(lines)
