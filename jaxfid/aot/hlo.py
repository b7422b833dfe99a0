"""The text of an optimized HLO module, as :mod:`jaxfid.aot.breakdown` reads it.

:func:`parse_module` turns ``compiled.as_text()`` into its computations and
instructions (name, opcode, output arrays with their memory space, operands,
called computations, ``op_name``); :func:`instruction_flops` counts a dot's
or convolution's FLOPs (a fusion's, of the computations it calls) as XLA's
cost analysis does; :func:`loop_trips` reads how often a ``while`` runs.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re

_ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
               "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
               "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5}
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
  """A computation: its instructions by name, in order."""
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
  lhs, out = operands[0][0], inst.outputs[0]
  lhs_l, _, out_l = labels.groups()
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
  fma = (in_feature // groups.get("feature_group_count", 1) * out_feature
         * batch // groups.get("batch_group_count", 1) * positions)
  return 2.0 * fma


def instruction_flops(inst: Instruction, comp: Computation,
                      module: dict[str, Computation]) -> float:
  """The dot and convolution FLOPs of one instruction (a fusion's: of the
  computations it calls)."""
  if inst.opcode == "fusion":
    return sum(instruction_flops(i, c, module) for c in fused(inst, module)
               for i in c.instructions.values())
  if inst.opcode not in ("dot", "convolution"):
    return 0.0
  shapes = {n: i.outputs for n, i in comp.instructions.items()}
  return (_dot_flops(inst, shapes) if inst.opcode == "dot"
          else _conv_flops(inst, shapes))


def fused(inst: Instruction,
          module: dict[str, Computation]) -> list[Computation]:
  """The computations an instruction calls (a fusion's body)."""
  return [module[c] for c in inst.called if c in module]


def _constant(inst: Instruction | None) -> int | None:
  if inst is None or inst.opcode != "constant":
    return None
  try:
    return int(inst.argument)
  except ValueError:
    return None


def loop_trips(loop: Instruction, comp: Computation,
               module: dict[str, Computation]) -> tuple[int | None, bool]:
  """``(trips, exact)`` of a ``while``: XLA's ``known_trip_count``, else a
  condition ``counter < N`` (or ``<=``) with N a constant and the counter
  a tuple element that starts at a constant (0 where its start is not
  one, as a scan's counter does); a condition ``counter < N and ...`` (a
  decoding loop that stops early when every row is done) gives N as an
  upper bound (``exact`` False). ``(None, False)`` when unknown."""
  m = _TRIPS.search(loop.attributes)
  if m:
    return int(m.group(1)), True
  cond = module.get(next((n for n in loop.called if n in module and
                          f"condition=%{n}" in loop.attributes), ""))
  root = cond.instructions.get(cond.root) if cond else None
  exact = True
  if root is not None and root.opcode == "and":
    exact = False
    root = next((c for c in (cond.instructions.get(n) for n in root.operands)
                 if c is not None and c.opcode == "compare"), None)
  if root is None or root.opcode != "compare" or len(root.operands) != 2:
    return None, False
  direction = re.search(r"direction=(\w+)", root.attributes)
  counter, bound = (cond.instructions.get(n) for n in root.operands)
  limit = _constant(bound)
  if (direction is None or direction.group(1) not in ("LT", "LE")
      or limit is None or counter is None
      or counter.opcode != "get-tuple-element"):
    return None, False
  index = int(re.search(r"index=(\d+)", counter.attributes).group(1))
  init = comp.instructions.get(loop.operands[0]) if loop.operands else None
  start = None
  if init is not None and init.opcode == "tuple" and index < len(
      init.operands):
    start = _constant(comp.instructions.get(init.operands[index]))
  trips = max(0, limit - (start or 0) + (direction.group(1) == "LE"))
  return trips, exact
