"""``jaxfid bench MODE``: benchmarks, one registered mode each.

A plug-in registers modes with :func:`register_mode` (``compile``:
:mod:`jaxfid.aot.plugin`; FiD's ``train``, ``decode``, ``memory``). Each mode
is a subcommand with its own flags and ``jaxfid train``'s gin flags, its gin
reads checked under its ``gin_command`` name.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable

from jaxfid.commands import gin_flags
from jaxfid.commands.registry import Command
from jaxfid.core.gin_checks import Reads
from jaxfid.core.registry import Registry


@dataclasses.dataclass(frozen=True)
class Mode:
  """One ``jaxfid bench <name>`` mode.

  Attributes:
    name: the mode on the command line.
    help: one line for ``jaxfid bench --help``.
    add_arguments: adds the mode's own flags to its parser.
    run: ``run(args) -> exit status``.
    gin_command: the name its gin reads are registered and checked under.
    reads: what its gin configuration reads.
    order: its place in ``jaxfid bench --help``.
  """
  name: str
  help: str
  add_arguments: Callable[[Any], None]
  run: Callable[[Any], int]
  gin_command: str
  reads: Reads
  order: int


MODES: Registry[Mode] = Registry(
    "bench mode", hint="import jaxfid.methods, which registers every "
    "method's bench modes")


def register_mode(mode: Mode) -> Mode:
  return MODES.register(mode.name, mode)


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "bench", help="benchmark training or decoding, or compile them for a "
      "TPU slice", description="Benchmarks of gin-configured runs; `jaxfid "
      "bench MODE --help` for a mode's flags.")
  modes = p.add_subparsers(dest="mode", required=True, metavar="MODE")
  for mode in sorted((m for _, m in MODES.items()), key=lambda m: m.order):
    mp = modes.add_parser(mode.name, help=mode.help, description=mode.help)
    mode.add_arguments(mp)
    gin_flags.add_gin_arguments(mp)
    mp.set_defaults(func=mode.run, accepts_gin_bindings=True)


class _ModeReads(Mapping[str, Reads]):
  """The registered modes' gin reads by gin command name, looked up when
  asked (methods register their modes after this module loads)."""

  def _table(self) -> dict[str, Reads]:
    return {m.gin_command: m.reads for _, m in MODES.items()}

  def __getitem__(self, name: str) -> Reads:
    return self._table()[name]

  def __iter__(self):
    return iter(self._table())

  def __len__(self) -> int:
    return len(self._table())


COMMAND = Command("bench", add_parser, order=100, model=True, gin=_ModeReads())
