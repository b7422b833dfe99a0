"""``jaxfid bench compile --search --search-log FILE``: a search resumes.

At paper sizes a ``--search`` is ten-odd compiles of 5 to 25 minutes each
on a CPU host. With ``--search-log FILE`` each finished compile's report is
appended to FILE as one JSON line under its key, and a rerun of the same
search with the same FILE takes the reports found there instead of
compiling again: a search stopped by Ctrl-C, SIGTERM, a crash or the
host's memory loses only the compiles under way.

The key is all that decides a compile: the slice (``--topology``,
``--slices``), the program, the gin configuration as gin parsed it (with
every included file: ``gin.config_str()``), the macros the search sets,
the versions of jax and libtpu, and jaxfid's version and source (any
edit to a ``.py`` file of the package starts the log afresh). A compile
that failed (a crashed or killed process, a configuration error) is not
logged, so a rerun tries it again. Lines are appended whole and synced;
a last line cut short by a crash is skipped.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib
import sys
import threading
from typing import Callable

import jax

from jaxfid.core.errors import InputError
from jaxfid.core.textio import json_records


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _source_digest() -> str:
  """sha256 of jaxfid's Python source: a change to the model, the step or
  the shardings changes what is compiled without changing the version."""
  root = pathlib.Path(__file__).resolve().parents[1]
  digest = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    digest.update(str(path.relative_to(root)).encode() + b"\0")
    digest.update(path.read_bytes() + b"\0")
  return digest.hexdigest()


def versions() -> dict:
  """The software that decides what the compiler writes: jax, libtpu and
  jaxfid (its version and its source)."""
  return {"jaxfid": _version("jaxfid"), "jaxfid_source": _source_digest(),
          "jax": jax.__version__, "libtpu": _version("libtpu")}


class SearchLog:
  """The reports of one search's finished compiles, in ``path``.

  ``search`` is the part of the key the whole search shares (slice,
  program, gin configuration, versions); each compile adds its macros.
  """

  def __init__(self, path: str, search: dict):
    self.path = path
    self._search = search
    self._lock = threading.Lock()
    self.reports: dict[str, dict] = {}
    self.reused = 0
    try:
      with open(path, "a+", encoding="utf-8") as f:
        f.seek(0)
        text = f.read()
        if text and not text.endswith("\n"):  # a line cut short: end it
          f.write("\n")
    except OSError as e:
      raise InputError("--search-log", f"{path}: {e.strerror}") from None
    for entry in json_records(text.splitlines()):
      if isinstance(entry.get("key"), str) and "report" in entry:
        self.reports[entry["key"]] = entry["report"]  # else: compiled again

  def key(self, macros: dict) -> str:
    whole = {**self._search, "macros": macros}
    return hashlib.sha256(json.dumps(whole, sort_keys=True,
                                     default=str).encode()).hexdigest()

  def cached(self, compile_fn: Callable[..., dict]) -> Callable[..., dict]:
    """``compile_fn`` that takes a logged report when there is one and
    logs each new one."""
    def fn(macros: dict, *args, **kwargs) -> dict:
      key = self.key(macros)
      with self._lock:
        if key in self.reports:
          self.reused += 1
          return self.reports[key]
      report = compile_fn(macros, *args, **kwargs)
      line = json.dumps({"key": key, "macros": macros, "report": report},
                        default=str) + "\n"
      with self._lock:
        self.reports[key] = report
        with open(self.path, "a", encoding="utf-8") as f:
          f.write(line)
          f.flush()
          os.fsync(f.fileno())
      return report
    return fn

  def say_reused(self) -> None:
    if self.reused:
      print(f"{self.reused} of the search's compiles were taken from "
            f"{self.path}", file=sys.stderr)
