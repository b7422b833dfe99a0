"""All-or-nothing outputs: a file or directory appears complete, or not at all.

Content is written to a temporary sibling
(``.NAME.<pid>.<host>.<random>.tmp``) and moved into place with
``os.replace`` when complete; :func:`remove_stale_temporaries` removes dead
writers' temporaries. A storage fault raises
:class:`~jaxfid.core.errors.StorageError` naming the output after the
temporaries are removed (:func:`storage_errors` for other blocks).
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import IO, Callable, Iterator

from jaxfid.core import paths
from jaxfid.core.errors import InputError
from jaxfid.runtime.processes import host_tag, is_running
from jaxfid.runtime.storage import (  # noqa: F401 (part of this module's API)
    preallocate, remove_path, storage_errors, storage_fault)


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _temp_prefix(path: Path) -> str:
  return f".{path.name}.{os.getpid()}.{host_tag()}."


# .NAME.<pid>.<host tag>.<random>.tmp (or .old: a replaced directory)
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.(?P<host>[0-9a-f]{8})"
                        r"\.[A-Za-z0-9_]+\.(?:tmp|old)$")


def temporary_writer(name: str, target: str | None = None
                     ) -> tuple[int, str] | None:
  """(pid, host tag) of temporary ``name``'s writer (for ``target``) or None."""
  match = _TEMP_NAME.match(name)
  if match is None or (target is not None and match["name"] != target):
    return None
  return int(match["pid"]), match["host"]


def remove_stale_temporaries(directory: str | os.PathLike,
                             target: str | None = None) -> list[Path]:
  """Removes this module's temporaries in ``directory`` (only ``target``'s
  with one) written on this host by a dead process; returns their paths."""
  directory = Path(directory)
  try:
    names = os.listdir(directory)
  except (FileNotFoundError, NotADirectoryError):
    return []
  removed = []
  for name in sorted(names):
    writer = temporary_writer(name, target)
    if writer is None or writer[1] != host_tag():
      continue
    path = directory / name
    try:  # the inode change time: at or after the name was made (a hard
      written = path.lstat().st_ctime  # link's too), unlike its mtime
    except FileNotFoundError:
      continue
    if is_running(writer[0], started_by=written):
      continue
    remove_path(path)
    removed.append(path)
  return removed


def _parent(path: Path) -> Path:
  parent = path.parent if str(path.parent) else Path(".")
  parent.mkdir(parents=True, exist_ok=True)
  return parent


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
  """Yields a fresh temporary name next to ``path`` (parents created),
  renamed to it on success; if the body raises, what it made is removed.
  A storage fault is a StorageError naming ``path``; a URL is written
  locally and uploaded whole."""
  if paths.is_url(path):  # a bucket: write locally, then upload the object
    with tempfile.TemporaryDirectory(prefix="jaxfid-upload-") as staging:
      tmp = Path(staging) / paths.as_path(path).name
      yield tmp
      with storage_errors(path):
        paths.copy(tmp, path)
    return
  path = Path(path)
  with storage_errors(path):
    parent = _parent(path)
  tmp = parent / (_temp_prefix(path) + secrets.token_hex(6) + ".tmp")
  try:
    yield tmp
    os.replace(tmp, path)
    if os.path.lexists(tmp):  # both names were links to one file: a no-op
      os.unlink(tmp)
  except BaseException as e:
    fault = storage_fault(e, path) if isinstance(e, Exception) else None
    remove_path(tmp)
    if fault is None or fault is e:
      raise
    raise fault from e


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w",
                 encoding: str | None = "utf-8") -> Iterator[IO]:
  """Yields an open temporary file (``mode`` ``"w"`` or ``"wb"``) next to
  ``path``, renamed to it on success, removed on an exception."""
  exclusive = mode.replace("w", "x")
  with atomic_path(path) as tmp:
    if "b" in mode:
      f = open(tmp, exclusive)  # pylint: disable=unspecified-encoding
    else:
      f = open(tmp, exclusive, encoding=encoding, newline="")
    with f:
      yield f


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
  """Writes ``data`` (text as UTF-8) to ``path`` with :func:`atomic_write`."""
  with atomic_write(path, "wb") as f:
    f.write(data.encode("utf-8") if isinstance(data, str) else data)


def check_destination(path: str | os.PathLike, overwrite: bool) -> Path:
  """Refuses a non-empty existing destination directory unless ``overwrite``."""
  path = Path(path)
  if path.exists():
    if not path.is_dir():
      raise InputError(path, "exists and is not a directory")
    if any(path.iterdir()) and not overwrite:
      raise InputError(path, "already exists and is not empty (pass "
                       "overwrite=True / --overwrite to replace it)")
  return path


def _publishable(directory: Path) -> None:
  """Gives a finished tree ordinary permissions (mkdtemp/mkstemp: 0700/0600)."""
  mask = _umask()
  os.chmod(directory, 0o777 & ~mask)
  for root, dirs, files in os.walk(directory):
    for name in dirs:
      os.chmod(os.path.join(root, name), 0o777 & ~mask)
    for name in files:
      os.chmod(os.path.join(root, name), 0o666 & ~mask)


def replace_directory(source: str | os.PathLike,
                      path: str | os.PathLike) -> None:
  """Moves the finished sibling ``source`` to ``path``, which always holds
  either the old tree or the new one."""
  source, path = Path(source), Path(path)
  _publishable(source)
  old = None
  if path.exists():
    old = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".old",
                                dir=str(_parent(path))))
    os.replace(path, old / path.name)
  try:
    os.replace(source, path)
  except BaseException:
    if old is not None:  # put the old tree back
      os.replace(old / path.name, path)
      shutil.rmtree(old, ignore_errors=True)
    raise
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, overwrite: bool = False, *,
                     check: Callable[[Path], object] | None = None
                     ) -> Iterator[Path]:
  """Yields a temporary directory that becomes ``path`` on a clean exit
  (removed on an exception; StorageError for a storage fault). Only an
  empty ``path`` is replaced, unless ``overwrite`` or ``check(path)``."""
  path = Path(path)
  if check is None:
    check_destination(path, overwrite)
  else:
    check(path)
  with storage_errors(path):
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp",
                                dir=str(_parent(path))))
  try:
    yield tmp
    replace_directory(tmp, path)
  except BaseException as e:
    fault = storage_fault(e, path) if isinstance(e, Exception) else None
    remove_path(tmp)
    if fault is None or fault is e:
      raise
    raise fault from e


def link_or_copy(source: str | os.PathLike, path: str | os.PathLike) -> None:
  """Makes ``path`` a hard link to ``source`` (a copy where links fail)."""
  with atomic_path(path) as tmp:
    try:
      os.link(source, tmp)
    except OSError:
      shutil.copyfile(source, tmp)


__all__ = ["atomic_path", "atomic_write", "write_atomic", "link_or_copy",
           "atomic_directory", "check_destination", "replace_directory",
           "storage_errors", "storage_fault", "preallocate",
           "remove_stale_temporaries", "temporary_writer"]
