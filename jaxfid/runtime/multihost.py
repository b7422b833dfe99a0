"""Jobs that every process of a multi-host run shares, led by process 0.

Every process takes part in every device call; process 0 alone reads inputs
and writes outputs, and the others wait for it through the
``jax.distributed`` key-value store (waits of :data:`WAIT_S`), not in a
device collective: :class:`Channel` (ordered JSON messages from process 0),
:func:`agree` (all stop if any part failed, :class:`PeerError`) and
:func:`on_leader` (process 0 runs a step, the others get its result). Every
process must make the same calls. With one process these are local calls.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
from typing import Any, Callable, Iterator

import jax
import numpy as np
from jax._src import distributed as jax_distributed

from jaxfid.core.errors import InputError, PeerError

# how long a process waits for another one (seconds; 7 days by default)
WAIT_S = int(os.environ.get("JAXFID_MULTIHOST_WAIT_S", 7 * 24 * 3600))
_names = itertools.count()


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_leader() -> bool:
  """Whether this process writes the outputs (process 0)."""
  return jax.process_index() == 0


def _client():
  client = jax_distributed.global_state.client
  if client is None:
    raise RuntimeError("several JAX processes but no jax.distributed client")
  return client


def _key() -> str:
  return f"jaxfid/{next(_names)}"


def exit_code(error: BaseException | None) -> int:
  """The exit status the command line gives ``error`` (0: none)."""
  if error is None:
    return 0
  if isinstance(error, PeerError):
    return error.code
  if isinstance(error, InputError):
    return 2
  if isinstance(error, KeyboardInterrupt):
    return 130
  return 1


class Channel:
  """JSON messages about ``what`` from process 0 to the others, in order."""

  def __init__(self, what: str):
    self.what = what
    self.key = _key() if process_count() > 1 else ""
    self._sent = 0

  def _next(self) -> str:
    self._sent += 1
    return f"{self.key}/{self._sent}"

  def send(self, message: dict) -> None:
    """Process 0: the next message (no-op with one process)."""
    if process_count() > 1:
      _client().key_value_set(self._next(), json.dumps(message))

  def receive(self) -> dict:
    """Other processes: the next message; PeerError if process 0 failed."""
    value = _client().blocking_key_value_get(self._next(), WAIT_S * 1000)
    message = json.loads(value)
    if "failed" in message:
      raise PeerError(0, self.what, int(message["failed"]))
    return message

  def fail(self, error: BaseException) -> None:
    """Process 0: tells the others it stopped with ``error``."""
    self.send({"failed": exit_code(error) or 1})

  @contextlib.contextmanager
  def leading(self) -> Iterator["Channel"]:
    """Process 0's scope: sends ``{"end": true}`` when it closes, or that
    process 0 failed when an error leaves it (the error propagates)."""
    try:
      yield self
    except (Exception, KeyboardInterrupt) as e:
      self.fail(e)
      raise
    self.send({"end": True})


def agree(error: BaseException | None, what: str) -> None:
  """Returns when every process's part of ``what`` worked; otherwise each
  raises ``error`` where it failed, PeerError (the first failed) elsewhere."""
  if process_count() > 1:
    key, client = _key(), _client()
    client.key_value_set(f"{key}/{process_index()}", str(exit_code(error)))
    codes = [int(client.blocking_key_value_get(f"{key}/{i}", WAIT_S * 1000))
             for i in range(process_count())]
    failed = [i for i, code in enumerate(codes) if code]
    if failed and error is None:
      raise PeerError(failed[0], what, codes[failed[0]])
  if error is not None:
    raise error


def run_agreed(fn: Callable[[], Any], what: str) -> Any:
  """``fn()`` on every process, then :func:`agree` on whether it worked."""
  error, result = None, None
  try:
    result = fn()
  except (Exception, KeyboardInterrupt) as e:
    error = e
  agree(error, what)
  return result


def on_leader(fn: Callable[[], Any], what: str) -> Any:
  """``fn()`` on process 0 alone, its (JSON) result returned everywhere; if
  it raised, process 0 re-raises and the others raise PeerError."""
  if process_count() == 1:
    return fn()
  channel = Channel(what)
  if not is_leader():
    return channel.receive()["value"]
  try:
    result = fn()
  except (Exception, KeyboardInterrupt) as e:
    channel.fail(e)
    raise
  channel.send({"value": result})
  return result


def put(tree: Any, sharding: Any) -> Any:
  """``jax.device_put`` of host values every process holds in full, each
  process placing its own devices' parts (``sharding``: one or a tree)."""
  if process_count() == 1:
    return jax.device_put(tree, sharding)

  def place(x, s):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, s, lambda index: x[index])
  if isinstance(sharding, jax.sharding.Sharding):
    return jax.tree.map(lambda x: place(x, sharding), tree)
  return jax.tree.map(place, tree, sharding)


__all__ = ["WAIT_S", "Channel", "agree", "exit_code", "is_leader",
           "on_leader", "process_count", "process_index", "put", "run_agreed"]
