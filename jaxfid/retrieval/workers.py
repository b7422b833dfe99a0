"""Worker processes for ``--threads``: a function mapped over batches, in order.

:func:`ordered_map` runs ``fn`` on each batch in a pool of ``threads``
processes, reading the input lazily (at most ``2 * threads`` batches in
flight) and yielding results in input order. ``initializer(*initargs)`` sets
up each worker without relying on the parent's state. With one thread or
fewer than ``min_batches`` batches it runs in the calling process.
"""
from __future__ import annotations

import collections
import gc
import itertools
import multiprocessing
import os
from typing import Callable, Iterable, Iterator, TypeVar

from jaxfid.core.errors import InputError

T = TypeVar("T")
R = TypeVar("R")


def available_cpus() -> int:
  """The CPUs this process may run on (the ``--threads`` default)."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:  # not on Linux
    return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int | None) -> int:
  """``threads``, or all available CPUs when None; InputError if < 1."""
  if threads is None:
    return available_cpus()
  if threads < 1:
    raise InputError("--threads", f"must be positive, got {threads}")
  return int(threads)


def ordered_map(fn: Callable[[T], R], batches: Iterable[T], threads: int,
                initializer: Callable[..., None] | None = None,
                initargs: tuple = (), min_batches: int | None = None
                ) -> Iterator[R]:
  """Yields ``fn(batch)`` for every batch, in order, on ``threads`` workers
  (``fn`` and ``initializer`` module-level: sent by name)."""
  batches = iter(batches)
  least = max(2, 2 * threads if min_batches is None else min_batches)
  head = list(itertools.islice(batches, least)) if threads > 1 else []
  if threads <= 1 or len(head) < least:
    if initializer is not None:
      initializer(*initargs)
    for batch in itertools.chain(head, batches):
      yield fn(batch)
    return
  # a forked worker that collects garbage would touch (and so copy) every
  # object it inherited: frozen, they are left out of its collections
  gc.freeze()
  try:
    pool = multiprocessing.get_context().Pool(threads, initializer, initargs)
  finally:
    gc.unfreeze()
  try:
    pending: collections.deque = collections.deque()
    for batch in itertools.chain(head, batches):
      pending.append(pool.apply_async(fn, (batch,)))
      if len(pending) >= 2 * threads:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()
    pool.close()
  finally:
    pool.terminate()
    pool.join()
