"""Configuration values: frozen dataclasses that gin binds whole (as t5x's
``network.T5Config``).

Gin builds the dataclass (``FidTask.reader = @FidReaderConfig()``), which
checks its values once (InputError naming the macro); the command line's gin
validation (:mod:`jaxfid.core.gin_checks`) derives each field's check from
its annotation (int, float, str, bool, ``| None``, a nested config) and
:func:`option`'s bounds and choices. An option is one field plus its gin
default. ``to_dict`` / ``from_dict`` round-trip through JSON (tuples as
lists; unknown keys ignored).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
import types
import typing
from typing import Any, Callable, Iterable

import gin

from jaxfid.core.errors import InputError

CHECK = "jaxfid.check"  # field metadata key: the keyword arguments of Check
REFERENCE = "reference"
INT_OR_STR = (int, str)  # the kind of an ``int | str`` field
_TYPE_NAMES = {int: "an int", float: "a number", str: "a string",
               bool: "True or False", REFERENCE: "a gin reference (@name())",
               INT_OR_STR: "an int or a string"}


def _is_reference(value) -> bool:
  return isinstance(value, gin.config.ConfigurableReference)


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
    kind: int, float (ints accepted), str, bool, INT_OR_STR (an
      ``int | str`` field; bounds do not apply) or REFERENCE (``@name()``).
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
      return _is_reference(value)
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
      if self.kind is not REFERENCE and not _is_reference(value):
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


def _range(low, high, above, below) -> dict:
  """Check's bounds from inclusive ``low``/``high`` or exclusive
  ``above``/``below``."""
  return {"low": above if above is not None else low,
          "high": below if below is not None else high,
          "low_open": above is not None, "high_open": below is not None}


def number(low: float | None = None, high: float | None = None, *,
           above: float | None = None, below: float | None = None,
           optional: bool = False) -> Check:
  """A finite number: ``>= low`` or ``> above``, ``<= high`` or ``< below``."""
  return Check(float, optional=optional, **_range(low, high, above, below))


def text(choices=None, *, optional: bool = False, test=None) -> Check:
  """A string, one of ``choices`` if given; ``test(value)`` -> reason."""
  return Check(str, choices=tuple(choices) if choices is not None else None,
               optional=optional, test=test)


def flag() -> Check:
  return Check(bool)


def option(default: Any = dataclasses.MISSING, *, low: float | None = None,
           high: float | None = None, above: float | None = None,
           below: float | None = None, choices: Iterable | None = None,
           test: Callable[[Any], str | None] | None = None,
           macro: str | None = None,
           default_factory: Any = dataclasses.MISSING) -> Any:
  """A config field whose value must respect ``low``/``high`` (inclusive),
  ``above``/``below`` (exclusive), ``choices`` or ``test(value) -> reason or
  None``; type and optionality come from the annotation. ``macro``: the gin
  macro binding it, where not the field's name in capitals."""
  spec = {"macro": macro, **_range(low, high, above, below),
          "choices": tuple(choices) if choices is not None else None,
          "test": test}
  return dataclasses.field(default=default, default_factory=default_factory,
                           metadata={CHECK: spec})


@functools.lru_cache(maxsize=None)
def field_types(cls) -> dict[str, tuple[Any, bool]]:
  """``{field: (base type, optional)}`` of dataclass ``cls``: the annotation
  with ``| None`` removed (``optional``), ``tuple[...]`` as ``tuple``."""
  hints = typing.get_type_hints(cls)
  return {f.name: _split_optional(hints.get(f.name, Any))
          for f in dataclasses.fields(cls)}


def _split_optional(hint) -> tuple[Any, bool]:
  """(base type, optional) of an annotation: ``| None`` removed,
  ``tuple[...]`` as ``tuple``."""
  optional = False
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = len(args) < len(typing.get_args(hint))
    if set(args) == set(INT_OR_STR):
      return INT_OR_STR, optional
    hint = args[0] if len(args) == 1 else Any
  return typing.get_origin(hint) or hint, optional


def _kind(base) -> Any:
  """The Check kind of a field's base type (None: not checked)."""
  if base in (int, float, str, bool) or base == INT_OR_STR:
    return base
  if dataclasses.is_dataclass(base):
    return REFERENCE  # another config, bound as @Name()
  return None


@functools.lru_cache(maxsize=None)
def field_checks(cls) -> dict[str, Check]:
  """``{field: Check}`` of config dataclass ``cls``, from each field's
  annotation and :func:`option` metadata (fields of other types: none)."""
  checks = {}
  for f in dataclasses.fields(cls):
    base, optional = field_types(cls)[f.name]
    kind = _kind(base)
    if kind is None:
      continue
    spec = {k: v for k, v in f.metadata.get(CHECK, {}).items() if k != "macro"}
    checks[f.name] = Check(kind, optional=optional, **spec)
  return checks


def field_check(cls, name: str) -> Check | None:
  """The check of field ``name`` of config dataclass ``cls``; for another
  configurable (a task class, a function), the one parameter ``name``'s
  annotation gives (its type, None where ``| None``; a jaxfid class such as a
  config dataclass or a Task is a gin reference); else None."""
  if isinstance(cls, type) and dataclasses.is_dataclass(cls):
    return field_checks(cls).get(name)
  found = _parameter_types(cls).get(name)
  if found is None:
    return None
  base, optional = _split_optional(found)
  kind = _kind(base)
  if kind is None and isinstance(base, type) and base.__module__.startswith(
      "jaxfid."):
    kind = REFERENCE
  return None if kind is None else Check(kind, optional=optional)


@functools.lru_cache(maxsize=None)
def _parameter_types(obj) -> dict[str, Any]:
  """``{parameter: annotation}`` of a configurable's constructor or call."""
  target = obj.__init__ if isinstance(obj, type) else obj
  try:
    return typing.get_type_hints(target)
  except Exception:  # pylint: disable=broad-except
    return {}  # unresolvable annotations: no derived checks


def macro_of(cls, name: str) -> str:
  """The gin macro that binds field ``name`` of ``cls`` (errors name it)."""
  f = {f.name: f for f in dataclasses.fields(cls)}[name]
  return f.metadata.get(CHECK, {}).get("macro") or name.upper()


def field_docs(obj) -> dict[str, str]:
  """``{field or parameter: its description}`` from the ``Attributes:`` or
  ``Args:`` section of the docstring of ``obj`` (a class, with its bases',
  or a function), each as one line; an entry naming several (``a / b:`` or
  ``a, b:``) describes each of them."""
  docs: dict[str, str] = {}
  owners = reversed(obj.__mro__) if isinstance(obj, type) else (obj,)
  for owner in owners:
    text = (owner.__dict__.get("__doc__") if isinstance(owner, type)
            else owner.__doc__)
    inside, names = False, []
    for line in inspect.cleandoc(text or "").splitlines():
      if line.strip() in ("Attributes:", "Args:"):
        inside, names = True, []
        continue
      if not inside:
        continue
      if line and not line.startswith(" "):
        inside = False  # the section ended
        continue
      entry = _ENTRY.match(line)
      if entry:
        names = [n for n in re.split(r"[ ,/]+", entry.group(1)) if n]
        for n in names:
          docs[n] = (entry.group(2) or "").strip()
      elif line.strip() and names:
        for n in names:
          docs[n] = f"{docs[n]} {line.strip()}".strip()
  return docs


_ENTRY = re.compile(r"^ {2}([A-Za-z_][\w ,/]*?):(?:\s+(.*)|$)")


class Config:
  """Base of a frozen config dataclass: each field checked once when built
  (InputError naming the macro); ``replace``, ``to_dict``, ``from_dict``. A
  subclass's rules across fields go in ``__post_init__``, after super's."""

  def __post_init__(self):
    for name, check in field_checks(type(self)).items():
      if check.kind is REFERENCE:
        continue  # a nested config checks itself
      problem = check.problem(getattr(self, name))
      if problem:
        raise InputError(macro_of(type(self), name), problem)

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """Field values as JSON types (tuples as lists, nested configs as dicts)."""
    return {f.name: _jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)}

  @classmethod
  def from_dict(cls, fields: dict):
    """The inverse of :meth:`to_dict`; keys that are not fields are ignored
    (run configs of other versions)."""
    types_ = field_types(cls)
    kwargs = {}
    for name, value in fields.items():
      if name not in types_:
        continue
      kind = types_[name][0]
      if value is not None and kind is tuple:
        value = tuple(value)
      elif value is not None and isinstance(kind, type) and issubclass(
          kind, Config) and isinstance(value, dict):
        value = kind.from_dict(value)
      kwargs[name] = value
    return cls(**kwargs)


def _jsonable(value):
  if isinstance(value, Config):
    return value.to_dict()
  if isinstance(value, tuple):
    return [_jsonable(v) for v in value]
  return value

