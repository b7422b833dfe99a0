"""Parsing gin files and bindings, with one-line errors.

Gin files and their ``include``s are found relative to the working
directory, then to extra search paths, then to the jaxfid source tree (so
``gin/fid/tiny.gin`` works from anywhere).
"""
from __future__ import annotations

import logging
import os

import gin

from jaxfid.core.errors import InputError

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _resolve(path: str, search: list[str]) -> str:
  if os.path.exists(path):
    return path
  for root in search:
    candidate = os.path.join(root, path)
    if os.path.exists(candidate):
      return candidate
  raise InputError(path, "no such gin file")


def parse_gin(gin_files: list[str], bindings: list[str],
              search_paths: list[str] = ()) -> None:
  """Parse files then bindings; a gin error becomes a one-line InputError."""
  search = [os.getcwd(), *search_paths, SOURCE_ROOT]
  for root in search:
    gin.add_config_file_search_path(root)
  files = [_resolve(f, search) for f in gin_files]
  if not files:
    raise InputError("--gin_file", "at least one gin file is required")
  gin.clear_config()
  root = logging.getLogger()
  level = root.level
  root.setLevel(logging.CRITICAL)  # gin logs every search path it tries
  try:
    gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
  except (ValueError, SyntaxError, KeyError, ImportError, IOError) as e:
    where = files[-1] if not bindings else "gin bindings"
    raise InputError(where, f"gin: {' '.join(str(e).split())}") from None
  finally:
    root.setLevel(level)
