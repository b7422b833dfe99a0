"""Messages for the user on stderr: one line, from process 0 only.

A multi-host run executes the same code on every process; what it tells
the user (a resumed step, a converted checkpoint, a warning) is said once.
"""
from __future__ import annotations

import sys

import jax


def say(message: str) -> None:
  """One line on stderr from process 0."""
  if jax.process_index() == 0:
    print(message, file=sys.stderr)
