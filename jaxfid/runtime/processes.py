"""Is the process that wrote a file still running? (temporaries and locks)

On this host, :func:`is_running` treats a missing pid, a zombie, or a
process started after the file was written (a reused id) as dead; on
another host the writer is assumed alive.
"""
from __future__ import annotations

import functools
import hashlib
import os
import socket

# /proc/<pid>/stat start times are in clock ticks after boot; boot time is
# whole seconds, so allow this much when comparing with file times
_START_SLACK_S = 2.0


@functools.lru_cache(maxsize=1)
def host_name() -> str:
  """This machine's host name (as recorded in lock files)."""
  return socket.gethostname() or "localhost"


@functools.lru_cache(maxsize=1)
def host_tag() -> str:
  """8 hex digits naming this host in temporary file names."""
  return hashlib.blake2b(host_name().encode("utf-8", "replace"),
                         digest_size=4).hexdigest()


@functools.lru_cache(maxsize=1)
def _boot_time() -> float | None:
  try:
    with open("/proc/stat", encoding="ascii") as f:
      for line in f:
        if line.startswith("btime "):
          return float(line.split()[1])
  except (OSError, ValueError, IndexError):
    pass
  return None


def _proc_stat(pid: int) -> tuple[str, float | None] | None:
  """(state, start time in seconds since the epoch) from /proc, or None."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
      text = f.read()
  except OSError:
    return None
  fields = text[text.rfind(")") + 2:].split()  # the name may hold spaces
  try:
    state, ticks = fields[0], int(fields[19])
  except (IndexError, ValueError):
    return None
  boot = _boot_time()
  if boot is None:
    return state, None
  return state, boot + ticks / os.sysconf("SC_CLK_TCK")


def is_running(pid: int, started_by: float | None = None) -> bool:
  """Whether process ``pid`` of this host lives and is the one meant (not a
  reused id started after ``started_by``)."""
  if pid <= 0:
    return False
  if pid != os.getpid():
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return False
    except PermissionError:
      pass  # it exists, owned by another user
    except OSError:
      return True  # cannot tell: assume it lives
  stat = _proc_stat(pid)
  if stat is None:
    return True
  state, start = stat
  if state in ("Z", "X", "x"):  # zombie or dead: killed, not yet reaped
    return False
  if started_by is not None and start is not None:
    return start <= started_by + _START_SLACK_S
  return True


__all__ = ["host_name", "host_tag", "is_running"]
