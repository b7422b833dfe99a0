"""Errors a user sees as one line: bad input, and storage faults.

The command line prints ``str(error)`` as one line and exits non-zero, with no
traceback. Every reader in jaxfid raises :class:`InputError` (never a bare
``ValueError``) for problems in user-supplied files (exit status 2); writers
raise :class:`StorageError` when the disk is full, over quota, read-only or
not writable (exit status 1; see :func:`jaxfid.runtime.files.storage_errors`).
"""
from __future__ import annotations


class InputError(Exception):
  """Bad user input. ``str()`` is one line: ``FILE:LINE: reason``.

  Attributes:
    path: the file (or directory) that holds the bad input.
    where: a line number (1-based) or record description, or None.
    reason: what is wrong, without a trailing period.
  """

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
  """A write failed because of the storage: full disk, quota, read-only, ...

  ``str()`` is one line, ``PATH: reason``; the CLI exits with status 1. It is
  an :class:`OSError` (``errno`` kept).

  Attributes:
    path: the output (file or directory) that could not be written.
    reason: the cause, without a trailing period.
  """

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
  """Another process of a multi-host command failed, so this one stops too.

  ``str()`` is one line naming that process and the step; the CLI exits with
  ``code``.

  Attributes:
    process: the index of the process that failed.
    what: the step it failed in.
    code: its exit status (2: bad input, 1: anything else).
  """

  def __init__(self, process: int, what: str, code: int = 1):
    self.process, self.what, self.code = process, what, code
    super().__init__(self.message)

  @property
  def message(self) -> str:
    return (f"process {self.process} failed while {self.what}; its own "
            "error says why")
