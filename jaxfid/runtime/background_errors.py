"""Reports of abandoned background work (orbax, tensorstore), kept quiet.

A failed orbax call abandons its other parts, which print hundreds of
tracebacks ("Event loop is closed", ignored coroutine exceptions, "Task
exception was never retrieved", absl thread errors) adding nothing to the
error the caller handles. :func:`install` drops the first three kinds,
:func:`held_logs` a call's absl records, and :func:`settled_on_failure`
waits for the parts still running.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import sys
import threading
import time
import types
from typing import Iterator

_CLOSED_LOOP = "Event loop is closed"
# packages whose coroutines are run, and abandoned, by orbax's event loops
_PACKAGES = ("orbax", "tensorstore")


def _in_packages(filename: str) -> bool:
  parts = os.path.normpath(filename).split(os.sep)
  return any(package in parts for package in _PACKAGES)


def is_abandoned_work(unraisable) -> bool:
  """Whether an unraisable exception (``sys.unraisablehook``'s argument)
  reports work whose caller has already had its error: a callback for an
  event loop that was closed, or an orbax/tensorstore coroutine that failed
  while being garbage-collected."""
  exc = unraisable.exc_value
  if isinstance(exc, RuntimeError) and str(exc) == _CLOSED_LOOP:
    return True
  obj = unraisable.object
  if isinstance(obj, (types.CoroutineType, types.AsyncGeneratorType)):
    code = getattr(obj, "cr_code", None) or getattr(obj, "ag_code", None)
    return code is not None and _in_packages(code.co_filename)
  return False


# how asyncio names a task's coroutine in its report ("coro=<f() done,
# defined at /.../orbax/checkpoint/...>")
_DEFINED_AT = re.compile(r"defined at (\S+?):\d+>")


# a TensorStore error as Python sees it: "RESOURCE_EXHAUSTED: Error
# writing ...", an absl status code first
_STATUS = re.compile(r"[A-Z]+(_[A-Z]+)*: ")
_FUTURE = "Future exception was never retrieved"


class _AbandonedTaskReports(logging.Filter):
  """Drops asyncio's reports of orbax/tensorstore tasks and futures that
  nobody awaited (a bare TensorStore future's by its absl status code)."""

  def filter(self, record):
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None and _traceback_in_packages(exc.__traceback__):
      return False
    message = record.getMessage()
    if (exc is not None and message.startswith(_FUTURE)
        and _STATUS.match(str(exc))):
      return False
    found = _DEFINED_AT.search(message)
    return not (found and _in_packages(found.group(1)))


def _traceback_in_packages(tb) -> bool:
  while tb is not None:
    if _in_packages(tb.tb_frame.f_code.co_filename):
      return True
    tb = tb.tb_next
  return False


def install() -> None:
  """Drops the reports of abandoned orbax/tensorstore work for the rest of
  the process (unraisable exceptions, :func:`is_abandoned_work`, and
  asyncio's logged reports); every other report goes on. Idempotent."""
  previous = sys.unraisablehook
  if not getattr(previous, "_jaxfid_quiet", False):
    def hook(unraisable):
      if not is_abandoned_work(unraisable):
        previous(unraisable)
    hook._jaxfid_quiet = True  # pylint: disable=protected-access
    sys.unraisablehook = hook
  logger = logging.getLogger("asyncio")
  if not any(isinstance(f, _AbandonedTaskReports) for f in logger.filters):
    logger.addFilter(_AbandonedTaskReports())


@contextlib.contextmanager
def settled_on_failure(timeout_s: float = 10.0) -> Iterator[None]:
  """On an exception, waits (``timeout_s`` at most) for the block's threads,
  so a failed orbax call's remaining parts do not lose their temporaries."""
  before = set(threading.enumerate())
  try:
    yield
  except BaseException:
    deadline = time.monotonic() + timeout_s
    while True:
      gc.collect()
      started = [t for t in threading.enumerate()
                 if t not in before and t.is_alive()]
      if not started or time.monotonic() > deadline:
        break
      started[0].join(min(0.1, max(0.0, deadline - time.monotonic())))
    raise


class _Held(logging.Filter):

  def __init__(self):
    super().__init__()
    self.records: list[logging.LogRecord] = []

  def filter(self, record):
    self.records.append(record)
    return False


@contextlib.contextmanager
def held_logs(handled: tuple[type[BaseException], ...],
              names: tuple[str, ...] = ("absl",)) -> Iterator[None]:
  """Holds back the records of loggers ``names`` inside the block (any
  thread): passed on when it ends or raises something else, dropped when it
  raises one of ``handled`` (an error the caller reports itself)."""
  held = {name: _Held() for name in names}
  for name, records in held.items():
    logging.getLogger(name).addFilter(records)
  drop = False
  try:
    yield
  except BaseException as e:
    drop = isinstance(e, handled)
    raise
  finally:
    for name, records in held.items():
      logger = logging.getLogger(name)
      logger.removeFilter(records)
      for record in [] if drop else records.records:
        logger.handle(record)


__all__ = ["held_logs", "install", "is_abandoned_work", "settled_on_failure"]
