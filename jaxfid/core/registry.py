"""Named plug-ins: a shared layer looks up what a higher layer registered
(an index kind, a checkpoint loader, a source of examples); an unregistered
name is an InputError saying what to import.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from jaxfid.core.errors import InputError

T = TypeVar("T")


class Registry(Generic[T]):
  """``name -> T``; :meth:`get` of an unknown name raises InputError."""

  def __init__(self, kind: str, hint: str = ""):
    self.kind = kind
    self.hint = hint
    self._items: dict[str, T] = {}

  def register(self, name: str, item: T) -> T:
    self._items[name] = item
    return item

  def get(self, name: str, where: str | None = None) -> T:
    if name not in self._items:
      known = ", ".join(sorted(self._items)) or "none"
      hint = f"; {self.hint}" if self.hint else ""
      raise InputError(where or name, f"no {self.kind} {name!r} is "
                       f"registered (known: {known}){hint}")
    return self._items[name]

  def __contains__(self, name: str) -> bool:
    return name in self._items

  def names(self) -> list[str]:
    return sorted(self._items)

  def items(self) -> list[tuple[str, T]]:
    """``(name, item)`` pairs in the order they were registered."""
    return list(self._items.items())


def registering(registry: Registry[T], name: str) -> Callable[[T], T]:
  """Decorator form of :meth:`Registry.register`."""
  return lambda item: registry.register(name, item)
