"""All-or-nothing outputs: a file or directory appears complete, or not at all.

Everything the retrieval commands write (run files, passage TSVs, index
directories) goes through these helpers: content is written to a temporary
sibling in the same directory and moved into place with ``os.replace`` only
when it is complete, so an interrupted or failed command never leaves a
half-written output behind.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

from jaxfid.core.errors import InputError


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w",
                 encoding: str | None = "utf-8") -> Iterator[IO]:
  """Opens a temporary file next to ``path``; renames it to ``path`` on success.

  Args:
    path: the final file name.
    mode: ``"w"`` (text, with ``encoding``) or ``"wb"``.
    encoding: text encoding; ignored in binary mode.

  Yields:
    The open temporary file. If the body raises, the temporary file is removed
    and ``path`` is left untouched.
  """
  path = Path(path)
  if path.parent and not path.parent.exists():
    path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                             dir=str(path.parent))
  try:
    if "b" in mode:
      f = os.fdopen(fd, mode)
    else:
      f = os.fdopen(fd, mode, encoding=encoding, newline="")
    with f:
      yield f
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates files 0600
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def _is_replaceable_dir(path: Path) -> bool:
  """An existing output dir may be replaced if it is empty or an index."""
  if not path.is_dir():
    return False
  entries = list(path.iterdir())
  return not entries or (path / "meta.json").exists()


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
  """Yields a temporary directory that becomes ``path`` on success.

  An existing ``path`` is replaced only if it is empty or holds an index (has a
  ``meta.json``); anything else is refused with an :class:`InputError`, so a
  mistyped ``--output`` cannot delete unrelated files.
  """
  path = Path(path)
  if path.exists() and not _is_replaceable_dir(path):
    raise InputError(path, "output exists and is not an index directory; "
                     "remove it or choose another --output")
  parent = path.parent if str(path.parent) else Path(".")
  parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp",
                              dir=str(parent)))
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates directories 0700
  old = None
  if path.exists():
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old",
                                dir=str(parent)))
    os.rmdir(old)
    os.replace(path, old)
  os.replace(tmp, path)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)
