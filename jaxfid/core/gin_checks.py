"""Validating a parsed gin configuration before any work is done.

A command parses its gin files and bindings (:func:`jaxfid.core.gin_files.
parse_gin`), then calls :func:`validate` with what it reads (:class:`Reads`)
and a :class:`Table` of checks; nothing is built, read or written. The first
problem is raised as a one-line :class:`~jaxfid.core.errors.InputError`:

1. a ``--gin.NAME=VALUE`` binding of a macro the gin files do not define
   (``unknown macro TRAIN_STEPZ (did you mean TRAIN_STEPS?)``);
2. a value bound on the command line that fails its :class:`Check` (type,
   range, choice);
3. a binding nothing the command runs reads: a macro no configurable it
   calls refers to, or a parameter of a jaxfid configurable it never calls;
4. any other value the command reads that fails its check or is
   ``%gin.REQUIRED`` (``MODEL_DIR: required: ...``); then each
   configurable's cross-parameter rules (``ACCUMULATION_STEPS`` divides
   ``BATCH_SIZE``); then the macros the command reads itself.

What the command reads is found by following gin's references from its
root configurables (``launch.run`` -> ``@loop.train`` -> ``%METHOD`` ->
``@FidTask()`` -> ``%N_CONTEXT`` ...), so a macro is checked where it is used
and not elsewhere: checks are keyed by (configurable, parameter), not by
macro name, because two methods may read one macro name differently
(``QUERY_MAXLENGTH``: 0 means "the whole row" to ReAtt, a length to the dual
encoder). Whether MESH's devices exist, files exist or a checkpoint fits is
left to the run: validation reads nothing but gin's parsed configuration.

This module knows no configurable: the tables are the commands'
(:mod:`jaxfid.commands.gin_specs`).
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
from typing import Any, Callable, Mapping

import gin

from jaxfid.core.errors import InputError
from jaxfid.core.gin_files import Binding, ParsedGin

REFERENCE = "reference"
_UNDEFINED = object()
_MACRO, _CONSTANT = "gin.macro", "gin.constant"
_REGISTRY = gin.config._REGISTRY  # pylint: disable=protected-access
_TYPE_NAMES = {int: "an int", float: "a number", str: "a string",
               bool: "True or False", REFERENCE: "a gin reference (@name())"}


def _bounds(low, high, low_open, high_open) -> str:
  if low is not None and high is not None:
    return (f" in {'(' if low_open else '['}{low}, {high}"
            f"{')' if high_open else ']'}")
  if low is not None:
    return f" {'>' if low_open else '>='} {low}"
  if high is not None:
    return f" {'<' if high_open else '<='} {high}"
  return ""


@dataclasses.dataclass(frozen=True)
class Check:
  """What one parameter accepts.

  Attributes:
    kind: int, float (ints accepted), str, bool or REFERENCE (``@name()``).
      An int is never a bool here, nor a float or a string.
    low, high: inclusive bounds (exclusive with ``low_open``/``high_open``).
    choices: the allowed values.
    optional: None is allowed (where the parameter's default is None).
    test: ``value -> reason or None``, for what bounds cannot say.
  """
  kind: Any
  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  choices: tuple | None = None
  optional: bool = False
  test: Callable[[Any], str | None] | None = None

  def describe(self) -> str:
    if self.choices is not None:
      text = "one of " + ", ".join(repr(c) for c in self.choices)
    else:
      text = _TYPE_NAMES[self.kind] + _bounds(self.low, self.high,
                                               self.low_open, self.high_open)
    return f"None or {text}" if self.optional else text

  def _typed(self, value) -> bool:
    if self.kind is REFERENCE:
      return isinstance(value, gin.config.ConfigurableReference)
    if isinstance(value, bool):
      return self.kind is bool
    if self.kind is float:
      return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, self.kind)

  def problem(self, value) -> str | None:
    """Why ``value`` is refused, or None."""
    if value is None:
      return None if self.optional else f"required ({self.describe()}), got None"
    wrong = f"must be {self.describe()}, got {value!r}"
    if not self._typed(value):
      if self.kind is not REFERENCE and not isinstance(
          value, gin.config.ConfigurableReference):
        wrong += f" ({type(value).__name__})"
      return wrong
    if self.choices is not None and value not in self.choices:
      return wrong
    if self.low is not None and (value <= self.low if self.low_open
                                 else value < self.low):
      return wrong
    if self.high is not None and (value >= self.high if self.high_open
                                  else value > self.high):
      return wrong
    return self.test(value) if self.test else None


def integer(low: int | None = None, high: int | None = None, *,
            optional: bool = False) -> Check:
  """An int in ``[low, high]``."""
  return Check(int, low, high, optional=optional)


def number(low: float | None = None, high: float | None = None, *,
           above: float | None = None, below: float | None = None,
           optional: bool = False) -> Check:
  """A finite number: ``>= low`` or ``> above``, ``<= high`` or ``< below``."""
  return Check(float, above if above is not None else low,
               below if below is not None else high, above is not None,
               below is not None, optional=optional)


def text(choices=None, *, optional: bool = False, test=None) -> Check:
  """A string, one of ``choices`` if given; ``test(value)`` -> reason."""
  return Check(str, choices=tuple(choices) if choices is not None else None,
               optional=optional, test=test)


def flag() -> Check:
  return Check(bool)


# A cross-parameter rule: {param: value} (bound or default) -> (param, reason)
# for the parameter to blame, or None.
Rule = Callable[[Mapping[str, Any]], "tuple[str, str] | None"]


class Table:
  """Checks per (configurable, parameter), and rules per configurable."""

  def __init__(self):
    self.checks: dict[Any, dict[str, Check]] = {}
    self.rules: dict[Any, tuple[Rule, ...]] = {}

  def add(self, configurable, *rules: Rule, **checks: Check) -> None:
    """``configurable``'s parameters' checks (merged with earlier ones)."""
    self.checks.setdefault(configurable, {}).update(checks)
    self.rules[configurable] = self.rules.get(configurable, ()) + rules

  def check(self, configurable, param: str) -> Check | None:
    return self.checks.get(configurable, {}).get(param)


@dataclasses.dataclass(frozen=True)
class Reads:
  """What one command reads from gin.

  Attributes:
    roots: the configurables it calls (what they refer to is read too).
    macros: macros it reads itself (``gin.query_parameter``), with their
      checks (None: checked where a configurable reads them, or not at all).
    needs: those of ``macros`` the gin files must define.
    accepts: configurables whose bindings (and what they refer to) the
      command accepts without reading them (``jaxfid bench`` takes the
      ``train`` command's arguments); not checked.
  """
  roots: tuple = ()
  macros: Mapping[str, Check | None] = dataclasses.field(default_factory=dict)
  needs: tuple[str, ...] = ()
  accepts: tuple = ()


def _bound_macro(name: str):
  """The value bound to macro ``name`` (maybe a reference), or _UNDEFINED."""
  try:
    return gin.query_parameter(f"%{name}")
  except ValueError:
    return _UNDEFINED


def _selector(configurable) -> str:
  """gin's shortest name for ``configurable`` (``T5Config``), for messages."""
  for selector, found in _REGISTRY.items():
    if found.wrapped is configurable:
      return _REGISTRY.minimal_selector(selector)
  return getattr(configurable, "__qualname__", str(configurable))


def _resolve(value):
  """(value, first macro name or None): macros followed, constants read."""
  name, seen = None, set()
  while isinstance(value, gin.config.ConfigurableReference):
    kind, scoped = value.configurable.selector, "/".join(value.scopes)
    if kind == _MACRO and scoped not in seen:
      seen.add(scoped)
      name = name or scoped
      value = _bound_macro(scoped)
    elif kind == _CONSTANT:
      value = gin.query_parameter(scoped)
    else:
      break  # a configurable: checked as a reference
  return value, name


class Walk:
  """Everything reachable from the roots through gin references."""

  def __init__(self, roots):
    self.configurables: list = []
    self.macros: set[str] = set()
    self.values: list[tuple[Any, str, Any]] = []  # (configurable, param, raw)
    for root in roots:
      self.configurable(root)

  def configurable(self, obj) -> None:
    if obj in self.configurables:
      return
    self.configurables.append(obj)
    try:
      bindings = gin.get_bindings(obj, resolve_references=False)
    except ValueError:  # gin does not know it: nothing bound
      bindings = {}
    for param, value in bindings.items():
      self.values.append((obj, param, value))
      self.value(value)

  def value(self, value) -> None:
    for ref in gin.config.iterate_references(value):
      kind, scoped = ref.configurable.selector, "/".join(ref.scopes)
      if kind == _MACRO:
        if scoped not in self.macros:
          self.macros.add(scoped)
          found = _bound_macro(scoped)
          if found is not _UNDEFINED:
            self.value(found)
      elif kind != _CONSTANT:
        self.configurable(ref.configurable.wrapped)


def _bound_configurable(binding: Binding):
  found = _REGISTRY.get_match(binding.selector)
  return found.wrapped if found else None


def _hint(name: str, known) -> str:
  close = difflib.get_close_matches(name, sorted(known), n=1)
  return f" (did you mean {close[0]}?)" if close else ""


def _defaults(configurable) -> dict:
  try:
    params = inspect.signature(configurable).parameters.values()
  except (TypeError, ValueError):
    return {}
  return {p.name: p.default for p in params
          if p.default is not inspect.Parameter.empty}


def _required(name: str) -> str:
  return f"required: set it, e.g. --gin.{name}=VALUE"


def _value_problems(walk: Walk, table: Table, bound: set
                    ) -> tuple[list, dict, set]:
  """([(bound on the command line, name, reason)], {configurable: {param:
  value}}, configurables with a problem)."""
  problems, values, broken = [], {}, set()
  for obj, param, raw in walk.values:
    value, macro = _resolve(raw)
    name = macro or f"{_selector(obj)}.{param}"
    check = table.check(obj, param)
    if value is gin.REQUIRED or value is _UNDEFINED:
      reason = _required(name)
    elif check is None:
      reason = None
    elif isinstance(value, gin.config.ConfigurableReference) and (
        check.kind is not REFERENCE):
      reason = f"must be {check.describe()}, got a reference {value!r}"
    else:
      reason = check.problem(value)
    values.setdefault(obj, {})[param] = value
    if reason:
      broken.add(obj)
      problems.append((name in bound or (obj, param) in bound, name, reason))
  return problems, values, broken


def validate(parsed: ParsedGin, reads: Reads, table: Table,
             command: str) -> None:
  """Raises InputError for the first problem (module docstring); else None.

  ``command`` names the command in messages (``"`jaxfid train`"``).
  """
  for b in parsed.bindings:
    if b.is_macro and b.name not in parsed.file_macros:
      hint = _hint(b.name, parsed.file_macros)
      raise InputError(b.flag, f"unknown macro {b.name}"
                       f"{hint or ': the gin files do not define it'}")
  walk = Walk(reads.roots)
  bound = {b.name for b in parsed.bindings} | {
      (_bound_configurable(b), b.param) for b in parsed.bindings
      if not b.is_macro}
  problems, values, broken = _value_problems(walk, table, bound)
  for on_command_line, name, reason in problems:  # the user's own first
    if on_command_line:
      raise InputError(name, reason)
  accepted = Walk(reads.accepts)
  for b in parsed.bindings:
    if b.is_macro and b.name not in (walk.macros | accepted.macros
                                     | set(reads.macros)):
      raise InputError(b.flag, f"nothing {command} runs reads {b.name}")
    target = None if b.is_macro else _bound_configurable(b)
    if (target is not None and target not in walk.configurables
        and target not in accepted.configurables
        and getattr(target, "__module__", "").startswith("jaxfid.")):
      raise InputError(b.flag, f"{command} never calls {b.selector}")
  for _, name, reason in problems:
    raise InputError(name, reason)

  for obj in walk.configurables:
    rules = table.rules.get(obj, ())
    if not rules or obj in broken:
      continue
    given = {**_defaults(obj), **values.get(obj, {})}
    for rule in rules:
      found = rule(given)
      if found:
        param, reason = found
        raw = {p: r for o, p, r in walk.values if o is obj}.get(param)
        macro = _resolve(raw)[1] if raw is not None else None
        raise InputError(macro or f"{_selector(obj)}.{param}", reason)

  for name, check in reads.macros.items():
    raw = _bound_macro(name)
    if raw is _UNDEFINED:
      if name in reads.needs:
        raise InputError(name, f"{command} reads it but the gin files do "
                         "not define it")
      continue
    value, _ = _resolve(raw)
    if value is gin.REQUIRED:
      if name in reads.needs or check is not None:
        raise InputError(name, _required(name))
    elif check is not None and check.problem(value):
      raise InputError(name, check.problem(value))
