"""The index directory: ``meta.json`` says what kind of index it holds.

Every index is a directory with ``meta.json`` (``{"type", "num_passages",
...}``) and the passage store files; every build runs inside
:func:`building`.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from jaxfid.core.errors import InputError
from jaxfid.runtime.files import (
    atomic_write, remove_stale_temporaries, storage_errors)
from jaxfid.runtime.locks import DirectoryLock

META_FILE = "meta.json"
FORMAT_VERSION = 1


def write_meta(directory: str | os.PathLike, index_type: str,
               **fields) -> dict:
  """Writes ``meta.json`` (type, format_version and ``fields``); returns it."""
  meta = {"type": index_type, "format_version": FORMAT_VERSION, **fields}
  with atomic_write(Path(directory) / META_FILE) as f:
    json.dump(meta, f, indent=2, ensure_ascii=False)
    f.write("\n")
  return meta


@contextlib.contextmanager
def building(output: str | os.PathLike,
             remove: Iterable[str | os.PathLike] = ()) -> Iterator[Path]:
  """The scope of one index build into ``output`` (yielded as a Path): a
  lock (a dead build's taken over), dead builds' temporaries removed, a
  storage fault a StorageError naming ``output`` after deleting ``remove``."""
  output = Path(output)
  with storage_errors(output):
    with DirectoryLock(output, what="index"):
      for target in (output.name, f"{output.name}.lock"):
        remove_stale_temporaries(output.parent, target)
      with storage_errors(output, remove=remove):
        yield output


def check_output(output: str | os.PathLike) -> None:
  """Refuses an ``--output`` that exists and is neither empty nor an index
  (an index is replaced), so a mistyped path deletes nothing."""
  output = Path(output)
  if output.exists() and not (output.is_dir() and (
      not any(output.iterdir()) or (output / META_FILE).exists())):
    raise InputError(output, "output exists and is not an index directory; "
                     "remove it or choose another --output")


def read_meta(directory: str | os.PathLike) -> dict:
  """Reads ``meta.json``; InputError if the directory is not an index."""
  path = Path(directory) / META_FILE
  if not Path(directory).is_dir():
    raise InputError(directory, "no such index directory")
  try:
    with open(path, encoding="utf-8") as f:
      meta = json.load(f)
  except FileNotFoundError:
    raise InputError(directory, f"not an index directory (no {META_FILE})"
                     ) from None
  except json.JSONDecodeError as e:
    raise InputError(path, f"bad JSON: {e.msg}", where=e.lineno) from None
  if not isinstance(meta, dict) or not isinstance(meta.get("type"), str):
    raise InputError(path, "missing index 'type'")
  return meta
