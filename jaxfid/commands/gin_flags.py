"""t5x-style gin flags shared by ``jaxfid train``, ``eval``, ``bench`` and others.

``--gin_file=F`` (repeatable; later files override earlier ones) and
``--gin.NAME=VALUE``; :func:`parse_checked` parses them and validates what
the command reads (:mod:`jaxfid.commands.gin_specs`) before anything else.
"""
from __future__ import annotations

import dataclasses

import gin

from jaxfid.commands import gin_specs
from jaxfid.core.errors import InputError
from jaxfid.core.gin_checks import Reads
from jaxfid.core.gin_files import SOURCE_ROOT, ParsedGin, parse_gin  # noqa: F401
from jaxfid.training import launch


def add_gin_arguments(parser) -> None:
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin config file (repeatable)")
  parser.add_argument("--gin_search_path", action="append", default=[],
                      help="extra directory to resolve gin files and includes")


def split_gin_bindings(unknown: list[str], prefix: str = "gin"
                       ) -> tuple[list[str], list[str]]:
  """Pulls ``--gin.NAME=VALUE`` (``--<prefix>.NAME=VALUE`` for the prefixes
  of ``set_defaults(gin_binding_prefixes=...)``, which :func:`jaxfid.cli.main`
  puts in ``args.<prefix>_bindings``) out of argparse's unknown arguments."""
  bindings, rest = [], []
  flag = f"--{prefix}."
  for arg in unknown:
    if arg.startswith(flag):
      name, sep, value = arg[len(flag):].partition("=")
      if not sep:
        raise SystemExit(f"jaxfid: error: {arg}: expected "
                         f"--{prefix}.NAME=VALUE")
      bindings.append(f"{name}={value}")
    else:
      rest.append(arg)
  return bindings, rest


def parse_checked(gin_files, bindings, search_paths, command: str,
                  reads: Reads) -> ParsedGin:
  """Parses the run and validates it for ``jaxfid <command>``, which reads
  ``reads`` (the command's registered gin reads); a problem is a one-line
  InputError, raised before anything is built or written. The parsed
  configuration stays (the caller runs it)."""
  parsed = parse_gin(list(gin_files), list(bindings), list(search_paths))
  try:
    gin_specs.check(parsed, command, reads)
  except InputError:
    gin.clear_config()
    raise
  return parsed


def gin_literal(value) -> str:
  """``value`` as a gin literal (strings quoted, None, numbers, booleans)."""
  return repr(value)


@dataclasses.dataclass(frozen=True)
class GinRun:
  """A user's gin files and bindings, parsed again for each run of a
  command that trains several times (``jaxfid reatt iterate``) with macros
  overridden; parsing clears any other configuration."""
  files: tuple[str, ...]
  bindings: tuple[str, ...] = ()
  search_paths: tuple[str, ...] = ()

  def parse(self, macros: dict | None = None) -> None:
    extra = [f"{k} = {gin_literal(v)}" for k, v in (macros or {}).items()]
    parse_gin(list(self.files), [*self.bindings, *extra],
              list(self.search_paths))

  def check(self, command: str, reads: Reads, macros: dict | None = None
            ) -> None:
    """Validates the run (with ``macros`` overridden) for ``jaxfid
    <command>``, which reads ``reads`` (:func:`parse_checked`); leaves no
    configuration."""
    extra = [f"{k} = {gin_literal(v)}" for k, v in (macros or {}).items()]
    parse_checked(self.files, [*self.bindings, *extra], self.search_paths,
                  command, reads)
    gin.clear_config()

  def macros(self, names) -> dict:
    """The values the run's gin gives the macros ``names`` (None if unset)."""
    self.parse()
    try:
      return {name: macro_value(name) for name in names}
    finally:
      gin.clear_config()

  def train(self, macros: dict | None = None) -> dict:
    """Runs ``launch.run`` (the trainer) with ``macros`` overridden."""
    self.parse(macros)
    try:
      return call_configurable(gin.get_configurable(launch.run))
    finally:
      gin.clear_config()


def macro_value(name: str):
  """A parsed gin macro's value (None when unbound; the class or function a
  configurable reference such as ``METHOD = @FidTask()`` calls)."""
  try:
    value = gin.query_parameter(f"%{name}")
  except ValueError:
    return None
  if (isinstance(value, gin.config.ConfigurableReference)
      and value.configurable.name in ("constant", "macro")):
    value = value.scoped_configurable_fn()  # %gin.REQUIRED, NAME = %OTHER
  if isinstance(value, gin.config.ConfigurableReference):
    return value.configurable.wrapped
  if value is gin.REQUIRED:
    return None
  return value


def call_configurable(fn):
  """``fn()`` (a gin configurable); a missing required binding becomes a
  one-line InputError."""
  try:
    return fn()
  except TypeError as e:
    if "gin.REQUIRED" in str(e) or "required" in str(e):
      raise InputError("gin", " ".join(str(e).split())) from None
    raise
