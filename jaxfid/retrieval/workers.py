"""Worker processes for ``--threads``: a function mapped over batches, in order.

Tokenising documents and scoring BM25 queries are Python and numpy work
that holds the GIL, so parallel index builds and batched retrieval use
processes. :func:`ordered_map` runs ``fn`` on each batch in a pool of
``threads`` processes and yields the results in input order, reading the
input lazily with at most ``2 * threads`` batches in flight, so a corpus
streams through in bounded memory and the caller (which reads the input,
in the main process) can raise an ``InputError`` at the right line. Each
worker is set up once by ``initializer(*initargs)`` (opening an index, say),
which must not rely on the parent's state: workers start with the default
start method of :mod:`multiprocessing` (fork on Linux, spawn elsewhere).
With one thread, or fewer batches than ``min_batches`` (two per worker by
default: starting processes for less costs more than it saves), everything
runs in the calling process (the same code, no process start-up).
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
  """Yields ``fn(batch)`` for every batch, in order, on ``threads`` workers.

  ``fn`` and ``initializer`` must be module-level functions (they are sent
  to the workers by name).
  """
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
