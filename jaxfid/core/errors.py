"""Errors a user sees as one line, with no traceback: bad input
(:class:`InputError`, exit 2: every reader raises it for user files, never a
bare ValueError), storage faults (:class:`StorageError`, exit 1) and a failed
peer (:class:`PeerError`).
"""
from __future__ import annotations


class InputError(Exception):
  """Bad user input: ``path``, ``where`` (a 1-based line, a record or None)
  and ``reason``; ``str()`` is one line, ``FILE:LINE: reason``."""

  def __init__(self, path, reason: str, where: int | str | None = None):
    self.path = str(path)
    self.where = where
    self.reason = " ".join(str(reason).split())  # always one line
    super().__init__(self.message)

  @property
  def message(self) -> str:
    """The one-line message (also when a framework appended context to args)."""
    if self.where is None:
      return f"{self.path}: {self.reason}"
    if isinstance(self.where, int):
      return f"{self.path}:{self.where}: {self.reason}"
    return f"{self.path}: {self.where}: {self.reason}"


class StorageError(OSError):
  """A write failed because of the storage (full disk, quota, read-only):
  ``str()`` is ``PATH: reason``, exit status 1; an OSError (``errno`` kept)."""

  def __init__(self, path, reason: str, errno: int | None = None):
    self.path = str(path)
    self.reason = " ".join(str(reason).split())
    super().__init__(errno, self.reason, self.path)

  @property
  def message(self) -> str:
    """The one-line message (just the reason when no path is known)."""
    return f"{self.path}: {self.reason}" if self.path else self.reason

  def __str__(self) -> str:
    return self.message

  def __reduce__(self):
    return type(self), (self.path, self.reason, self.errno)


class PeerError(Exception):
  """Another process of a multi-host command failed (``process``, in step
  ``what``), so this one stops too, exiting with its ``code`` (2: bad
  input, 1: anything else). ``str()`` is one line."""

  def __init__(self, process: int, what: str, code: int = 1):
    self.process, self.what, self.code = process, what, code
    super().__init__(self.message)

  @property
  def message(self) -> str:
    return (f"process {self.process} failed while {self.what}; its own "
            "error says why")
