"""asyncio's reports of abandoned orbax/tensorstore work are dropped, the
rest kept (jaxfid.runtime.background_errors; the whole-run check is
test_quiet_recoveries.py)."""
import asyncio
import gc
import logging

import pytest

from jaxfid.runtime import background_errors


class _Records(logging.Handler):
  def __init__(self):
    super().__init__()
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage().splitlines()[0])


@pytest.fixture
def asyncio_log():
  """asyncio's logger with jaxfid's filter, recording what passes."""
  logger = logging.getLogger("asyncio")
  filters, handlers = list(logger.filters), list(logger.handlers)
  records = _Records()
  logger.addHandler(records)
  background_errors.install()
  try:
    yield records.messages
  finally:
    logger.filters[:], logger.handlers[:] = filters, handlers


def _abandon(exc: BaseException) -> None:
  """A future that ends with ``exc`` and that nobody awaits, collected."""
  loop = asyncio.new_event_loop()
  future = loop.create_future()
  future.set_exception(exc)
  del future
  gc.collect()
  loop.close()


def test_a_future_tensorstore_failed_is_not_reported(asyncio_log):
  """A full disk during a save: TensorStore's error, with no traceback,
  on a future orbax no longer awaits (the flake of 2026-12-04 in
  test_a_disk_that_fills_during_a_save_is_one_line)."""
  _abandon(ValueError('RESOURCE_EXHAUSTED: Error writing "opt_state/0" in '
                      "OCDBT database: No space left on device"))
  assert asyncio_log == []


def test_other_abandoned_futures_are_still_reported(asyncio_log):
  _abandon(ValueError("a mistake of someone else's"))
  assert asyncio_log == ["Future exception was never retrieved"]
