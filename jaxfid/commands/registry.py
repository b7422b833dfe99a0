"""The command line's plug-ins: commands and ``jaxfid index`` types.

Every ``jaxfid <command>`` is a :class:`Command` registered in
:data:`COMMANDS`: the shared commands by :mod:`jaxfid.cli`, a method's own
commands by the method's plug-in module (``jaxfid/<method>/plugin.py``,
imported by :mod:`jaxfid.methods`). A method adds a type to the shared
``jaxfid index`` command by registering the function that adds its
subparsers in :data:`INDEX_COMMANDS`. ``jaxfid eval``'s evaluators have
their own registry beside the command
(:data:`jaxfid.commands.seqio_eval.METHODS`).

``jaxfid --help`` lists the commands by :attr:`Command.order`: the shared
and FiD commands hold 10..110 in steps of 10 (convert, predict, train, eval,
index, retrieve, corpus, eval-retrieval, plot, bench, demo), FiD's serve
115, ReAtt 120, FiD's distill 125, ReFusion 130; a new method takes the
next free number. ``jaxfid index
--help`` lists ``bm25`` (shared) first, then the registered types in
registration order (the order :mod:`jaxfid.methods` imports the methods).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxfid.core.gin_checks import Reads
from jaxfid.core.registry import Registry

AddParser = Callable[[Any], None]  # (argparse subparsers) -> None


@dataclasses.dataclass(frozen=True)
class Command:
  """One ``jaxfid <name>`` command.

  Attributes:
    name: the command's name on the command line.
    add_parser: ``add_parser(subparsers)`` adds the command's parser (and
      its subcommands); each parser's ``set_defaults(func=run)`` names the
      function :func:`jaxfid.cli.main` calls with the parsed arguments.
    order: its place in ``jaxfid --help`` (module docstring).
    model: its time goes into XLA programs (train and decode steps): on a
      CPU it runs with :func:`jaxfid.core.host_memory.tune_cpu_malloc`.
    gin: what each gin-driven (sub)command reads, by its name after
      ``jaxfid`` (``"train"``, ``"reatt iterate"``): a
      :class:`~jaxfid.core.gin_checks.Reads`, or a function returning one
      when it depends on other registrations (``eval``'s evaluators).
      :data:`jaxfid.commands.gin_specs.COMMANDS` collects them.
  """
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
