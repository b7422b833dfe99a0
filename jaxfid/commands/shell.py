"""Commands jaxfid prints for the user to run next, runnable as pasted in
the current directory: :func:`jaxfid_command` (the running Python's
``jaxfid``, e.g. ``.venv/bin/jaxfid``), :func:`install_command` (pip for an
extra) and :func:`require_extra` (a missing extra as one line with it).
"""
from __future__ import annotations

import importlib
import os
import shlex
import shutil
import sys

from jaxfid.core.errors import InputError

# The directory above the package: a source checkout when setup.py is there.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHECKOUT = os.path.dirname(_PACKAGE_DIR)


def _shown(path: str) -> str:
  """``path`` relative to the current directory when it lies under it."""
  relative = os.path.relpath(path)
  if relative == os.pardir or relative.startswith(os.pardir + os.sep):
    return path
  if relative == os.curdir or os.sep in relative:
    return relative
  return os.path.join(os.curdir, relative)  # not a bare name the PATH finds


def jaxfid_command() -> str:
  """How to run ``jaxfid`` from here: ``jaxfid`` when the PATH finds this
  Python's console script, else that script's path (``.venv/bin/jaxfid``),
  else ``<python> -m jaxfid``."""
  script = os.path.join(os.path.dirname(sys.executable), "jaxfid")
  if not os.path.isfile(script):
    return f"{shlex.quote(_shown(sys.executable))} -m jaxfid"
  found = shutil.which("jaxfid")
  if found is not None and os.path.samefile(found, script):
    return "jaxfid"
  return shlex.quote(_shown(script))


def install_command(extra: str) -> str:
  """The pip command that installs setup.py's ``extra`` into this Python:
  ``.venv/bin/python -m pip install -e '.[serve]'`` from a source checkout,
  ``python -m pip install 'jaxfid[serve]'`` for an installed one."""
  python = shlex.quote(_shown(sys.executable))
  if os.path.isfile(os.path.join(_CHECKOUT, "setup.py")):
    target = f"{_shown(_CHECKOUT)}[{extra}]"
    return f"{python} -m pip install -e {shlex.quote(target)}"
  return f"{python} -m pip install {shlex.quote(f'jaxfid[{extra}]')}"


def require_extra(extra: str, modules: tuple[str, ...], what: str) -> None:
  """Raises InputError (one line naming the extra and its install command)
  unless every one of ``modules`` imports."""
  for name in modules:
    try:
      importlib.import_module(name)
    except ImportError:
      raise InputError(
          name, f"not installed; {what} needs the {extra!r} extra "
          f"({', '.join(modules)}): {install_command(extra)}") from None
