"""Flags shared by the long-running commands: ``--progress`` and numbers.

Every long command (``index bm25|dense|reatt``, ``retrieve``,
``eval-retrieval``) shows a tqdm bar on stderr with its rate (passages/s or
queries/s) when stderr is a terminal; ``--progress`` shows it anyway (in a
log file, say) and ``--no-progress`` never.
"""
from __future__ import annotations

import argparse


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
      "--progress", action=argparse.BooleanOptionalAction, default=None,
      help="progress bar on stderr (default: when stderr is a terminal)")


def positive(text: str) -> int:
  """argparse type: an integer >= 1."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be positive, got {value}")
  return value
