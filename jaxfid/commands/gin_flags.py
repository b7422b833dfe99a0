"""t5x-style gin flags shared by ``jaxfid train``, ``bench`` and others.

``--gin_file=F`` (repeatable; later files override earlier ones) and
``--gin.NAME=VALUE`` bindings (``--gin.MODEL_DIR="'out'"``), parsed by
:func:`jaxfid.core.gin_files.parse_gin` (also available here as
``parse_gin``).
"""
from __future__ import annotations

from jaxfid.core.gin_files import SOURCE_ROOT, parse_gin  # noqa: F401


def add_gin_arguments(parser) -> None:
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin config file (repeatable)")
  parser.add_argument("--gin_search_path", action="append", default=[],
                      help="extra directory to resolve gin files and includes")


def split_gin_bindings(unknown: list[str]) -> tuple[list[str], list[str]]:
  """Pull ``--gin.NAME=VALUE`` out of argparse's unknown arguments."""
  bindings, rest = [], []
  for arg in unknown:
    if arg.startswith("--gin."):
      name, sep, value = arg[len("--gin."):].partition("=")
      if not sep:
        raise SystemExit(f"jaxfid: error: {arg}: expected --gin.NAME=VALUE")
      bindings.append(f"{name}={value}")
    else:
      rest.append(arg)
  return bindings, rest
