"""Reading user text files: gzip (by magic bytes) or not, a UTF-8 BOM
skipped, lines, JSON lines, JSON; problems are InputErrors naming file and
line. Every reader of user text goes through here.
"""
from __future__ import annotations

import codecs
import gzip
import json
import os
from typing import IO, Iterator

from jaxfid.core.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"


class _GzipReader(gzip.GzipFile):
  """A GzipFile that also closes the file it decompresses."""

  def __init__(self, raw: IO[bytes]):
    super().__init__(fileobj=raw, mode="rb")
    self._raw = raw

  def close(self) -> None:
    try:
      super().close()
    finally:
      self._raw.close()


def open_binary(path: str | os.PathLike, expected: str = "a file"
                ) -> IO[bytes]:
  """Opens ``path`` for reading bytes, gunzipping transparently; InputError
  for a missing, unopenable or directory path."""
  try:
    f = open(path, "rb")
  except FileNotFoundError:
    raise InputError(path, "no such file") from None
  except IsADirectoryError:
    raise InputError(path, f"is a directory, expected {expected}") from None
  except OSError as e:
    raise InputError(path, f"cannot open: {e.strerror or e}") from None
  if f.peek(2)[:2] == GZIP_MAGIC:
    return _GzipReader(f)  # type: ignore[return-value]
  return f


def check_encoding(encoding: str) -> str:
  """Canonical name of an ASCII-compatible encoding; InputError otherwise."""
  try:
    name = codecs.lookup(encoding).name
  except LookupError:
    raise InputError("--encoding", f"unknown encoding {encoding!r}") from None
  if "\n\t{}".encode(name, "replace") != b"\n\t{}":
    raise InputError("--encoding", f"{encoding!r} is not ASCII-compatible; "
                     "convert the file to UTF-8")
  return name


def iter_lines(path: str | os.PathLike, encoding: str = "utf-8"
               ) -> Iterator[tuple[int, str]]:
  """Yields (1-based line number, line without newline) of a text file
  (UTF-8 or another ASCII-compatible ``encoding``); InputError for
  undecodable bytes or a corrupt gzip stream."""
  encoding = "utf-8" if encoding == "utf-8" else check_encoding(encoding)
  what = "UTF-8" if encoding == "utf-8" else encoding
  with open_binary(path) as f:
    lineno = 0
    try:
      for lineno, raw in enumerate(f, start=1):
        try:
          line = raw.decode(encoding)
        except UnicodeDecodeError as e:
          raise InputError(path, f"not valid {what} ({e.reason} at byte "
                           f"{e.start})", where=lineno) from None
        if lineno == 1 and line.startswith("\ufeff"):
          line = line[1:]  # UTF-8 byte order mark
        yield lineno, line.rstrip("\r\n")
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
      raise InputError(path, f"cannot read: {e}", where=lineno + 1) from None


def iter_json_lines(path: str | os.PathLike, *, array_hint: bool = False,
                    encoding: str = "utf-8"
                    ) -> Iterator[tuple[int, object]]:
  """Yields (line number, value) of each non-blank JSON line; InputError
  naming line and column of bad JSON (``array_hint``: or a JSON array)."""
  for lineno, line in iter_lines(path, encoding):
    if not line.strip():
      continue
    try:
      value = json.loads(line)
    except json.JSONDecodeError as e:
      if array_hint and lineno == 1 and line.lstrip().startswith("["):
        raise InputError(path, "expected JSON lines (one object per line), "
                         "found a JSON array", where=lineno) from None
      raise InputError(path, f"bad JSON: {e.msg} at column {e.colno}",
                       where=lineno) from None
    yield lineno, value


def json_records(lines) -> list[dict]:
  """The JSON objects of an append-only log's lines (metrics.jsonl, a
  ``--search-log``): a line cut short by a crash, or not an object, is
  skipped, not an error."""
  records = []
  for line in lines:
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict):
      records.append(record)
  return records


def starts_json_array(path: str | os.PathLike) -> bool:
  """True when the file's first non-blank byte opens a JSON array."""
  with open_binary(path) as f:
    return f.read(4096).lstrip().startswith(b"[")


def read_json_document(path: str | os.PathLike) -> object:
  """The whole file parsed as one JSON value (InputError on bad JSON)."""
  with open_binary(path) as f:
    try:
      return json.loads(f.read().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise InputError(path, f"bad JSON: {getattr(e, 'msg', e)}",
                       where=getattr(e, "lineno", None)) from None


__all__ = ["GZIP_MAGIC", "open_binary", "check_encoding", "iter_lines", "iter_json_lines",
           "starts_json_array", "read_json_document"]
