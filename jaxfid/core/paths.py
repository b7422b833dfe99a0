"""Run directories as paths or URLs (``gs://bucket/run``), one code path
(``etils.epath``, orbax's), as t5x allows; memory-mapped files (indexes,
corpora) stay local.
"""
from __future__ import annotations

import os
import re

from etils import epath

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike) -> bool:
  """Whether ``path`` names a location by URL scheme (``gs://``, ``s3://``)."""
  return bool(_SCHEME.match(os.fspath(path)))


def as_path(path: str | os.PathLike) -> epath.Path:
  """An ``epath.Path``; local paths are made absolute (as orbax wants)."""
  if is_url(path):
    return epath.Path(os.fspath(path))
  return epath.Path(os.path.abspath(os.fspath(path)))


def join(path: str | os.PathLike, *parts: str) -> str:
  """``os.path.join`` that keeps a URL's ``scheme://``."""
  return os.fspath(epath.Path(os.fspath(path)).joinpath(*parts)) if is_url(
      path) else os.path.join(os.fspath(path), *parts)


def exists(path: str | os.PathLike) -> bool:
  return as_path(path).exists()


def isdir(path: str | os.PathLike) -> bool:
  return as_path(path).is_dir()


def makedirs(path: str | os.PathLike) -> None:
  as_path(path).mkdir(parents=True, exist_ok=True)


def read_text(path: str | os.PathLike) -> str:
  return as_path(path).read_text(encoding="utf-8")


def copy(source: str | os.PathLike, destination: str | os.PathLike) -> None:
  """Copies a file (local or URL on either side), replacing ``destination``."""
  destination = as_path(destination)
  destination.parent.mkdir(parents=True, exist_ok=True)
  as_path(source).copy(destination, overwrite=True)
