"""Storage faults: a full disk, quota, read-only or unwritable place, as one line.

:func:`storage_fault` recognises such a fault in any exception (or its
causes); :func:`storage_errors` turns it into a
:class:`~jaxfid.core.errors.StorageError` naming the output, after removing
the block's temporaries.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from typing import Iterable, Iterator

from jaxfid.core.errors import InputError, StorageError


def remove_path(path: str | os.PathLike) -> None:
  """Removes a file or directory tree, if it exists (best effort)."""
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    with contextlib.suppress(FileNotFoundError, IsADirectoryError,
                             PermissionError):
      os.unlink(path)


_REASONS = {errno.ENOSPC: "no space left on device",
            errno.EDQUOT: "disk quota exceeded",
            errno.EFBIG: "file too large",
            errno.EROFS: "read-only file system",
            errno.EIO: "input/output error",
            errno.EACCES: "permission denied",
            errno.EPERM: "operation not permitted"}
# faults of the device itself, wherever they are raised
_DEVICE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS,
                  errno.EIO)
# faults only when raised about the place being written
_ACCESS_ERRNOS = (errno.EACCES, errno.EPERM)
# numpy's ndarray.tofile on a full disk raises OSError without an errno
_SHORT_WRITE = re.compile(r"^\d+ requested and \d+ written$")
_NEARLY_FULL_BYTES = 1 << 20


def _free_bytes(path) -> int | None:
  probe = os.path.abspath(path)
  while probe and not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      break
    probe = parent
  try:
    st = os.statvfs(probe)
  except OSError:
    return None
  return st.f_bavail * st.f_frsize


def _inside(filename, path) -> bool:
  """Whether ``filename`` is ``path``, in its directory, or under it."""
  if filename is None or path is None:
    return False
  name = os.path.abspath(os.fsdecode(filename))
  path = os.path.abspath(os.fspath(path))
  for area in (path, os.path.dirname(path)):
    if name == area or name.startswith(area.rstrip(os.sep) + os.sep):
      return True
  return False


def _one_fault(exc: BaseException, path) -> StorageError | None:
  target = path if path is not None else getattr(exc, "filename", None)
  if isinstance(exc, OSError):
    code = exc.errno
    if code in _DEVICE_ERRNOS or (code in _ACCESS_ERRNOS and _inside(
        getattr(exc, "filename", None), path)):
      return StorageError(target or "", _REASONS[code], code)
    if code is None and _SHORT_WRITE.match(str(exc)):
      free = _free_bytes(target or ".")
      if free is not None and free < _NEARLY_FULL_BYTES:
        return StorageError(target or "", _REASONS[errno.ENOSPC],
                            errno.ENOSPC)
      if path is not None:
        return StorageError(target, f"short write ({exc})", errno.EIO)
    return None
  text = str(exc)
  for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
    if os.strerror(code) in text:  # FAISS: "... (No space left on device)"
      return StorageError(target or "", _REASONS[code], code)
  return None


def storage_fault(exc: BaseException, path: str | os.PathLike | None = None
                  ) -> StorageError | None:
  """The storage fault behind ``exc`` (or its causes) as StorageError, or None.

  Recognised: an OSError of a full disk, quota, too large a file, a read-only
  file system or an I/O error; a permission error about ``path`` or its
  directory; numpy's short write; a message with the system's text for a full
  disk or quota. The error names ``path`` (else the OSError's file).
  """
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, InputError):  # bad input, whatever its message says
      return None
    if isinstance(exc, StorageError):
      if path is None or exc.path == os.fspath(path):
        return exc
      return StorageError(path, exc.reason, exc.errno)
    fault = _one_fault(exc, path)
    if fault is not None:
      return fault
    exc = exc.__cause__ or exc.__context__
  return None


@contextlib.contextmanager
def storage_errors(path: str | os.PathLike,
                   remove: Iterable[str | os.PathLike] = ()) -> Iterator[None]:
  """Turns a storage fault inside the block into a StorageError naming
  ``path`` after deleting ``remove``; other exceptions pass. A decorator too."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    fault = storage_fault(e, path)
    if fault is None:
      raise
    for item in remove:
      remove_path(item)
    if fault is e:
      raise
    raise fault from e


def preallocate(path: str | os.PathLike) -> None:
  """Reserves the blocks of a file created at full size (a memory map), so
  a full disk is an OSError here rather than SIGBUS in a write."""
  with open(path, "r+b") as f:
    size = os.fstat(f.fileno()).st_size
    if size == 0:
      return
    try:
      os.posix_fallocate(f.fileno(), 0, size)
    except OSError as e:
      if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
        raise


__all__ = ["storage_fault", "storage_errors", "preallocate", "remove_path"]
