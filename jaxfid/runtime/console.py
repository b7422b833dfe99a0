"""Messages for the user on stderr: one line, from process 0 only; and the
progress bar of work that runs inside another's (an evaluation in training).

A multi-host run executes the same code on every process; what it tells
the user (a resumed step, a converted checkpoint, a warning) is said once.
"""
from __future__ import annotations

import sys

import jax
from tqdm import tqdm


def say(message: str) -> None:
  """One line on stderr from process 0."""
  if jax.process_index() == 0:
    print(message, file=sys.stderr)


def inner_bar(iterable=None, **kwargs) -> tqdm:
  """A tqdm bar that may open while another one shows (an evaluation inside
  training). On a terminal it takes the line below (tqdm's nesting, which
  moves the cursor up with ``ESC[A``); on a log file or a pipe it shares the
  outer bar's line (position 0), so no cursor codes land in the file."""
  stream = kwargs.setdefault("file", sys.stderr)
  isatty = getattr(stream, "isatty", None)
  if not (isatty and isatty()):
    kwargs.setdefault("position", 0)
  return tqdm(iterable, **kwargs)
