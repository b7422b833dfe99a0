"""One error type for bad input: it names the file, the record and what is wrong.

The command line prints ``str(error)`` as one line and exits non-zero, with no
traceback. Every reader in jaxfid raises it (never a bare ``ValueError``) for
problems in user-supplied files.
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
