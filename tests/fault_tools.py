"""Fault injection for tests: a small disk, and a process held then killed.

* :class:`SmallDisk`: a directory on a small file system whose free space a
  test sets (:meth:`SmallDisk.leave`): a tmpfs mounted there when this
  process may mount one (root; ``JAXFID_TEST_NO_MOUNT=1`` forbids it), else
  an injected limit: the writers' ``open`` charges every byte written under
  the directory and raises ENOSPC past the budget. Always ``close()`` it.
* :func:`hold_at`: runs ``jaxfid ARGS`` in a child process that sleeps at a
  patched function (before or after its Nth call), so that a test can look
  at what a live run holds and then kill it (:func:`kill`: SIGKILL) at a
  known point; or (``until_signal``) waits there for SIGTERM or SIGINT,
  which the command's own handler takes, and then goes on: the signal lands
  at that point of the run, however fast or slow the host.
"""
from __future__ import annotations

import contextlib
import errno
import importlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILLER = "filler"


class _Budgeted:
  """A file opened for writing that charges its writes to a SmallDisk."""

  def __init__(self, f, disk: "SmallDisk"):
    self._f, self._disk = f, disk

  def write(self, data):
    self._disk.charge(len(data))
    return self._f.write(data)

  def writelines(self, lines):
    for line in lines:
      self.write(line)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return self._f.__exit__(*exc)

  def __getattr__(self, name):
    return getattr(self._f, name)


# modules whose ``open`` the injected limit replaces (the writers of indexes
# and runs; numpy's np.save)
WRITER_MODULES = ("jaxfid.runtime.files", "jaxfid.runtime.locks",
                   "jaxfid.retrieval.store.passage_store",
                   "jaxfid.retrieval.bm25.scoring", "jaxfid.reatt.token_index",
                   "numpy.lib._npyio_impl")


class SmallDisk:
  """A directory on a small file system whose free space a test sets.

  A tmpfs of ``size`` mounted there when possible (root), else an injected limit:
  the writers' ``open`` charges every byte written under the directory and
  raises ENOSPC past the budget.
  """

  def __init__(self, path: Path, monkeypatch, size: str = "2m",
               writers: tuple[str, ...] = WRITER_MODULES):
    self.path = path
    path.mkdir()
    self.mounted = _mount_tmpfs(path, size)
    self.budget: float = float("inf")
    if not self.mounted:
      real_open = open

      def limited_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if (isinstance(file, (str, os.PathLike)) and set(mode) & set("wxa+")
            and os.path.abspath(file).startswith(str(self.path) + os.sep)):
          return _Budgeted(f, self)
        return f

      for name in writers:
        monkeypatch.setattr(importlib.import_module(name), "open",
                            limited_open, raising=False)

  def charge(self, n: int) -> None:
    self.budget -= n
    if self.budget < 0:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def leave(self, free: int) -> None:
    """Makes about ``free`` bytes available."""
    filler = self.path / FILLER
    if not self.mounted:
      self.budget = free
      return
    filler.unlink(missing_ok=True)
    st = os.statvfs(self.path)
    size = st.f_bavail * st.f_frsize - free
    if size > 0:
      with open(filler, "wb") as f:
        f.write(b"\0" * size)

  def unlimited(self) -> None:
    (self.path / FILLER).unlink(missing_ok=True)
    self.budget = float("inf")

  def listing(self) -> list[str]:
    return sorted(set(os.listdir(self.path)) - {FILLER})

  def close(self) -> None:
    if self.mounted:
      _umount(self.path)


def _mount_tmpfs(path: Path, size: str) -> bool:
  if os.environ.get("JAXFID_TEST_NO_MOUNT") or os.geteuid() != 0:
    return False
  try:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}",
                           "tmpfs", str(path)], capture_output=True,
                          check=False, timeout=60)
  except (OSError, subprocess.SubprocessError):
    return False
  return done.returncode == 0


def _umount(path: Path) -> None:
  for args in (["umount", str(path)], ["umount", "-l", str(path)]):
    with contextlib.suppress(OSError, subprocess.SubprocessError):
      if subprocess.run(args, capture_output=True, check=False,
                        timeout=60).returncode == 0:
        return


HOLD = r"""
import importlib, sys, time
target, when, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
until_signal = sys.argv[4] == "signal"
module_name, _, attr = target.partition(":")
owner = importlib.import_module(module_name)
*parents, name = attr.split(".")
for parent in parents:
  owner = getattr(owner, parent)
original = getattr(owner, name)
calls = []

def hold():
  if not until_signal:
    print("HOLDING", flush=True)
    time.sleep(3600)
    return
  # the command's handlers, each noting that it ran; back in place after
  import signal
  got, installed = [], {}
  for sig in (signal.SIGTERM, signal.SIGINT):
    handler = signal.getsignal(sig)
    if callable(handler):
      def noted(signum, frame, handler=handler):
        got.append(signum)
        handler(signum, frame)
      installed[sig] = (noted, handler)
      signal.signal(sig, noted)
  print("HOLDING", flush=True)
  try:
    while not got:
      time.sleep(0.05)
  finally:
    for sig, (noted, handler) in installed.items():
      if signal.getsignal(sig) is noted:  # (a handler may have replaced it)
        signal.signal(sig, handler)

def patched(*args, **kwargs):
  calls.append(1)
  if when == "before" and len(calls) == count:
    hold()
  result = original(*args, **kwargs)
  if when == "after" and len(calls) == count:
    hold()
  return result

setattr(owner, name, patched)
from jaxfid.cli import main
sys.exit(main(sys.argv[5:]))
"""


def default_sigint() -> None:
  """``preexec_fn`` of a child a test sends SIGINT: Ctrl-C as in a terminal.

  A process started in the background by a non-interactive shell (``make
  test &``, some CI runners) ignores SIGINT, and an ignored signal stays
  ignored across ``exec``: the child's second Ctrl-C would be lost with it.
  """
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def hold_at(target: str, when: str, count: int, argv, log: Path,
            until_signal: bool = False, env: dict | None = None):
  """A child running ``jaxfid argv``, held (sleeping) at ``target``; with
  ``until_signal``, held there until its handler of SIGTERM or SIGINT has
  run (the test sends it once this returns), then going on. Its stdout is
  the returned process's, its stderr ``log``; ``env``: its environment
  (default: this one with PYTHONPATH the checkout)."""
  env = env or {**os.environ, "PYTHONPATH": str(ROOT)}
  with open(log, "wb") as err:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, target, when, str(count),
         "signal" if until_signal else "sleep", *map(str, argv)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=err, preexec_fn=default_sigint)
  deadline = time.time() + 600
  while time.time() < deadline:
    ready, _, _ = select.select([proc.stdout], [], [], 1.0)
    if ready:
      line = proc.stdout.readline()
      if line.strip() == b"HOLDING":
        return proc
      if not line:
        break
    elif proc.poll() is not None:
      break
  proc.kill()
  proc.wait()
  raise AssertionError(f"the run never reached {target}: "
                       f"{log.read_text(errors='replace')[-3000:]}")


def kill(proc) -> None:
  proc.kill()  # SIGKILL
  proc.wait()
  proc.stdout.close()
