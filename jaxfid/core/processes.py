"""Is the process that wrote a file still running? (temporaries and locks)

A temporary file name (:mod:`jaxfid.core.files`) and a lock file
(:mod:`jaxfid.core.locks`) record the writer's process id and host. On the
same host, :func:`is_running` tells whether that writer still lives: a
process id that does not exist, or that now belongs to a zombie or to a
process started *after* the file was written (the id was reused), is a dead
writer. On another host nothing can be known, so callers treat the writer as
alive.
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
  """Whether process ``pid`` of this host lives (and is the same process).

  Args:
    pid: a process id of this host.
    started_by: when known, a time (``time.time()``) by which the process
      we mean had started (the time it wrote a file); a live process with
      that id that started later is another process that reused the id
      (this one too: a container restarted after a crash often gives the
      new process the id of the old one).
  """
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
