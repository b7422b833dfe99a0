"""Write a checkpoint directory all at once, or not at all.

A writer fills a fresh temporary directory beside the destination and only
then renames it into place, so an interrupted conversion never leaves a
half-written checkpoint that a later run would mistake for a whole one.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from jaxfid.core.errors import InputError


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _publishable(directory: Path) -> None:
  """Gives the temporary tree ordinary permissions (mkdtemp/mkstemp: 0700)."""
  mask = _umask()
  os.chmod(directory, 0o777 & ~mask)
  for root, dirs, files in os.walk(directory):
    for name in dirs:
      os.chmod(os.path.join(root, name), 0o777 & ~mask)
    for name in files:
      os.chmod(os.path.join(root, name), 0o666 & ~mask)


def check_destination(path, overwrite: bool) -> Path:
  """Refuse a non-empty existing destination unless ``overwrite``."""
  path = Path(path)
  if path.exists():
    if not path.is_dir():
      raise InputError(path, "exists and is not a directory")
    if any(path.iterdir()) and not overwrite:
      raise InputError(path, "already exists and is not empty (pass "
                       "overwrite=True / --overwrite to replace it)")
  return path


@contextlib.contextmanager
def atomic_directory(path, overwrite: bool = False):
  """Yields a temporary directory that becomes ``path`` on a clean exit.

  On an exception the temporary directory is removed and ``path`` is left as
  it was. An existing empty ``path`` is replaced; a non-empty one only with
  ``overwrite`` (it is renamed away first and deleted after the swap).
  """
  path = check_destination(path, overwrite)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  _publishable(tmp)
  old = None
  if path.exists():
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.replace(path, old / path.name)
  os.replace(tmp, path)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def write_bytes_atomic(path, data: bytes) -> None:
  """Writes one file via a temporary file in the same directory."""
  path = Path(path)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise
