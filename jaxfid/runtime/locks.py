"""One writer per output: a lock file beside (or inside) a directory.

``with DirectoryLock(path, what="index"):`` creates a lock file atomically
recording the holder (pid, host, start time, command); a second lock on the
path refuses in one line naming the holder. A dead holder's lock on this host
is taken over; another host's never is. The lock file is
``PARENT/.NAME.lock`` (default, for outputs replaced whole) or, with
``inside=True``, ``PATH/.jaxfid.lock`` (a MODEL_DIR).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import sys
import time
from pathlib import Path

from jaxfid.core.errors import InputError
from jaxfid.runtime.processes import host_name, host_tag, is_running
from jaxfid.runtime.storage import storage_errors

INSIDE_NAME = ".jaxfid.lock"
# a lock file that cannot be parsed (its writer died while creating it
# without hard links) is taken over once it is this old
_UNREADABLE_GRACE_S = 30.0
_ATTEMPTS = 5
# errors of os.link on file systems without hard links
_NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
             errno.EMLINK, errno.ENOSYS, errno.EINVAL)


def lock_file(path: str | os.PathLike, inside: bool = False) -> Path:
  """The lock file of ``path`` (beside it, or inside it)."""
  path = Path(os.path.abspath(path))
  if inside:
    return path / INSIDE_NAME
  return path.parent / f".{path.name}.lock"


class LockedError(InputError):
  """The directory is locked by a live process (or one of another host)."""

  def __init__(self, path, what: str, holder: dict | None, lock: Path):
    self.what, self.holder, self.lock = what, holder, lock
    if holder is None:
      reason = f"is being locked by another process (lock file {lock})"
    else:
      since = time.strftime("%Y-%m-%d %H:%M:%S",
                            time.localtime(float(holder.get("created", 0))))
      reason = (f"is in use by process {holder.get('pid')} on host "
                f"{holder.get('host')} since {since} (lock file {lock}")
      if holder.get("host") != host_name():
        reason += "; remove it if that process is gone"
      reason += ")"
    super().__init__(path, reason)

  @property
  def message(self) -> str:
    return f"{self.what} {self.path} {self.reason}"


class DirectoryLock:
  """An exclusive lock on a directory for a ``with`` block (``what`` names
  it in messages): LockedError (an InputError) when a live process holds
  it, StorageError when the lock file cannot be written."""

  def __init__(self, path: str | os.PathLike, what: str = "directory", *,
               inside: bool = False):
    self.path = Path(path)
    self.what = what
    self.inside = inside
    self.lock = lock_file(path, inside)
    self.token = secrets.token_hex(8)
    self.held = False

  def _record(self) -> bytes:
    command = " ".join([os.path.basename(sys.argv[0] or "python")]
                       + sys.argv[1:])
    return (json.dumps({"pid": os.getpid(), "host": host_name(),
                        "created": time.time(), "token": self.token,
                        "command": command[:300]}) + "\n").encode("utf-8")

  def _create(self) -> bool:
    """Creates the lock file; False if it exists."""
    self.lock.parent.mkdir(parents=True, exist_ok=True)
    data = self._record()
    tmp = self.lock.parent / (f"{self.lock.name}.{os.getpid()}.{host_tag()}."
                              f"{secrets.token_hex(6)}.tmp")
    try:
      with open(tmp, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
      try:
        os.link(tmp, self.lock)
        return True
      except FileExistsError:
        return False
      except OSError as e:
        if e.errno not in _NO_LINKS:
          raise
    finally:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:  # no hard links here: exclusive creation, then the content
      fd = os.open(self.lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    return True

  def _read(self) -> tuple[bytes, dict | None] | None:
    """(raw bytes, parsed holder or None) of the lock file; None if gone."""
    try:
      raw = self.lock.read_bytes()
    except FileNotFoundError:
      return None
    try:
      holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
      return raw, None
    if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int):
      return raw, None
    return raw, holder

  def _is_stale(self, holder: dict | None) -> bool:
    if holder is None:  # half-written by a writer without hard links
      try:
        age = time.time() - self.lock.stat().st_mtime
      except FileNotFoundError:
        return False
      return age > _UNREADABLE_GRACE_S
    if holder.get("host") != host_name():
      return False
    return not is_running(holder["pid"], started_by=holder.get("created"))

  def _take_over(self, raw: bytes) -> None:
    """Removes the stale lock file whose content is ``raw`` (moved to a
    private name first, so one of two racing processes removes it)."""
    private = self.lock.parent / (f"{self.lock.name}.{os.getpid()}."
                                  f"{host_tag()}.{secrets.token_hex(6)}.tmp")
    try:
      os.rename(self.lock, private)
    except FileNotFoundError:
      return  # someone else took it over
    try:
      if private.read_bytes() != raw:  # a fresh lock: put it back
        with contextlib.suppress(OSError):
          os.link(private, self.lock)
    finally:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(private)

  def acquire(self) -> "DirectoryLock":
    """Takes the lock (see the class docstring)."""
    with storage_errors(self.lock):
      for _ in range(_ATTEMPTS):
        if self._create():
          self.held = True
          return self
        found = self._read()
        if found is None:
          continue  # released meanwhile
        raw, holder = found
        if not self._is_stale(holder):
          raise LockedError(self.path, self.what, holder, self.lock)
        self._take_over(raw)
    found = self._read()
    raise LockedError(self.path, self.what, found and found[1], self.lock)

  def release(self) -> None:
    """Removes the lock file if it is still this lock's."""
    if not self.held:
      return
    self.held = False
    found = self._read()
    if found is not None and found[1] is not None and (
        found[1].get("token") == self.token):
      with contextlib.suppress(FileNotFoundError):
        os.unlink(self.lock)

  def __enter__(self) -> "DirectoryLock":
    return self.acquire()

  def __exit__(self, *_) -> None:
    self.release()


__all__ = ["DirectoryLock", "LockedError", "lock_file", "INSIDE_NAME"]
