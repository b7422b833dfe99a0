"""Validating a parsed gin configuration before any work is done.

:func:`validate` raises the first problem as a one-line
:class:`~jaxfid.core.errors.InputError`: an unknown macro, a command-line
value failing its :class:`Check`, a binding the command never reads, or a
read value failing its check or ``%gin.REQUIRED``; then config dataclasses
are built (``__post_init__`` runs) and ``check_configs`` applied. Checks are
keyed by (configurable, parameter), following gin references from the
command's roots (:class:`Reads`); only gin's parsed configuration is read.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any, Mapping

import gin

from jaxfid.core.config import (REFERENCE, Check, Config, field_check, flag,
                                integer, macro_of, number, text)
from jaxfid.core.errors import InputError
from jaxfid.core.gin_files import Binding, ParsedGin

_UNDEFINED = object()
_MACRO, _CONSTANT = "gin.macro", "gin.constant"
_REGISTRY = gin.config._REGISTRY  # pylint: disable=protected-access




class Table:
  """Checks per (configurable, parameter) that are not config fields (rules
  across parameters live in the config dataclasses' ``__post_init__`` and
  the tasks' ``check_configs``)."""

  def __init__(self):
    self.checks: dict[Any, dict[str, Check]] = {}

  def add(self, configurable, **checks: Check) -> None:
    """``configurable``'s parameters' checks (merged with earlier ones)."""
    self.checks.setdefault(configurable, {}).update(checks)

  def check(self, configurable, param: str) -> Check | None:
    """The table's check, else the one a config dataclass's field declares
    (:func:`jaxfid.core.config.field_checks`)."""
    found = self.checks.get(configurable, {}).get(param)
    return found if found is not None else field_check(configurable, param)


@dataclasses.dataclass(frozen=True)
class Reads:
  """What one command reads from gin.

  Attributes:
    roots: the configurables it calls (what they refer to is read too).
    macros: macros it reads itself, with their checks (None: not checked
      here).
    needs: those of ``macros`` the gin files must define.
    accepts: configurables whose bindings the command accepts unread.
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


def _construct(obj, walk: Walk, values: dict, built: dict):
  """Builds config dataclass ``obj`` from its parsed values (nested ones
  first) so its checks run before any work (InputError naming the macro);
  None where ``obj`` is no Config or a value another kind of reference."""
  if obj in built:
    return built[obj]
  built[obj] = None
  if not (isinstance(obj, type) and issubclass(obj, Config)):
    return None
  kwargs = {}
  for param, value in values.get(obj, {}).items():
    if isinstance(value, gin.config.ConfigurableReference):
      value = _construct(value.configurable.wrapped, walk, values, built)
      if value is None:
        return None
    kwargs[param] = value
  try:
    built[obj] = obj(**kwargs)
  except InputError as e:
    macros = {macro_of(obj, p): _resolve(r)[1] for o, p, r in walk.values
              if o is obj}
    raise InputError(macros.get(e.path) or e.path, e.reason, e.where) from None
  return built[obj]


def _check_together(obj, values: dict, built: dict) -> None:
  """Runs ``obj.check_configs(**configs)`` of a task taking several config
  dataclasses (rules across them: ReFusion's ``RETRIEVAL_DB`` with fusion
  modules) on their built values (bound, else defaults); skipped where one
  was not built."""
  rule = getattr(obj, "check_configs", None)
  if rule is None:
    return
  configs = {p: v for p, v in _defaults(obj).items() if isinstance(v, Config)}
  for param, value in values.get(obj, {}).items():
    if not isinstance(value, gin.config.ConfigurableReference):
      continue
    wrapped = value.configurable.wrapped
    if isinstance(wrapped, type) and issubclass(wrapped, Config):
      if built.get(wrapped) is None:
        return
      configs[param] = built[wrapped]
    else:
      configs.pop(param, None)
  rule(**configs)


def validate(parsed: ParsedGin, reads: Reads, table: Table,
             command: str) -> None:
  """Raises InputError for the first problem (module docstring), naming
  ``command`` (``"`jaxfid train`"``)."""
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

  built: dict = {}
  for obj in walk.configurables:
    if obj not in broken:
      _construct(obj, walk, values, built)
  for obj in walk.configurables:
    if obj not in broken:
      _check_together(obj, values, built)

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
