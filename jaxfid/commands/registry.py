"""The command line's plug-ins: :class:`Command`\\ s in :data:`COMMANDS`
(registered by :mod:`jaxfid.cli` or a method's ``plugin.py``) and ``jaxfid
index`` types in :data:`INDEX_COMMANDS` (``bm25`` first, then registration
order). ``jaxfid --help`` orders commands by :attr:`Command.order` (shared
and FiD 10..110, serve 115, ReAtt 120, distill 125, ReFusion 130; a new
method takes the next free number).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxfid.core.gin_checks import Reads
from jaxfid.core.registry import Registry

AddParser = Callable[[Any], None]  # (argparse subparsers) -> None


@dataclasses.dataclass(frozen=True)
class Command:
  """One ``jaxfid <name>`` command: ``add_parser(subparsers)`` (whose
  ``set_defaults(func=run)`` names what runs), its ``order`` in ``jaxfid
  --help``, ``model`` (it runs XLA programs: CPU malloc tuned) and ``gin``
  (per gin-driven (sub)command, its Reads or a function giving them)."""
  name: str
  add_parser: AddParser
  order: int
  model: bool = False
  gin: Mapping[str, Reads | Callable[[], Reads]] = dataclasses.field(
      default_factory=dict)


COMMANDS: Registry[Command] = Registry(
    "command", hint="import jaxfid.methods, which registers every method's "
    "commands")
INDEX_COMMANDS: Registry[AddParser] = Registry(
    "index command", hint="import jaxfid.methods, which registers every "
    "method's index types")


def register_command(command: Command) -> Command:
  """Registers ``command`` under its name; a second command of that name or
  of its place in ``jaxfid --help`` is a programming error."""
  for name, other in COMMANDS.items():
    if other is not command and (name == command.name
                                 or other.order == command.order):
      raise ValueError(f"command {command.name!r} (order {command.order}) "
                       f"clashes with the registered {name!r} (order "
                       f"{other.order})")
  return COMMANDS.register(command.name, command)


def commands() -> list[Command]:
  """The registered commands in ``jaxfid --help`` order."""
  return sorted((c for _, c in COMMANDS.items()), key=lambda c: c.order)


def model_commands() -> frozenset[str]:
  """Names of the commands that run XLA programs (:attr:`Command.model`)."""
  return frozenset(c.name for c in commands() if c.model)


def gin_reads() -> dict[str, Reads]:
  """``{"train": Reads, "reatt iterate": Reads, ...}`` of every registered
  command, the functions among them called now."""
  out = {}
  for command in commands():
    for name, reads in command.gin.items():
      out[name] = reads if isinstance(reads, Reads) else reads()
  return out
