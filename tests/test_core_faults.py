"""core: storage faults as one line, stale temporaries, directory locks."""
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxfid.cli import main
from jaxfid.commands import eval_retrieval
from jaxfid.core.errors import InputError, StorageError
from jaxfid.runtime import processes
from jaxfid.runtime.files import (atomic_directory, atomic_write, preallocate,
                               remove_stale_temporaries, storage_errors,
                               storage_fault, temporary_writer)
from jaxfid.runtime.locks import DirectoryLock, LockedError, lock_file


def _dead_pid() -> int:
  """The id of a process of this host that has exited (and been reaped)."""
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def _enospc(filename=None) -> OSError:
  return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)


def test_storage_faults_are_recognised_and_named():
  fault = storage_fault(_enospc(), "/data/index")
  assert isinstance(fault, StorageError) and isinstance(fault, OSError)
  assert str(fault) == "/data/index: no space left on device"
  assert fault.errno == errno.ENOSPC
  quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/q/f")
  assert str(storage_fault(quota)) == "/q/f: disk quota exceeded"
  faiss_error = RuntimeError("Error in faiss::write_index: write error in "
                             "/x/faiss.index: 1 != 2 (No space left on "
                             "device)")
  assert storage_fault(faiss_error, "/x").reason == "no space left on device"
  wrapped = ValueError("checkpoint failed")
  wrapped.__cause__ = _enospc()
  assert storage_fault(wrapped, "/run").path == "/run"
  # a permission error counts only where the output is written
  denied = OSError(errno.EACCES, "Permission denied", "/data/.index.1.tmp")
  assert storage_fault(denied, "/data/index").reason == "permission denied"
  elsewhere = OSError(errno.EACCES, "Permission denied", "/etc/shadow")
  assert storage_fault(elsewhere, "/data/index") is None
  assert storage_fault(ValueError("bad value")) is None
  assert storage_fault(FileNotFoundError(errno.ENOENT, "x", "/y")) is None


def test_storage_errors_removes_the_block_temporaries(tmp_path):
  staging = tmp_path / "staging"
  staging.mkdir()
  (staging / "part").write_text("x")
  with pytest.raises(StorageError) as e:
    with storage_errors(tmp_path / "out", remove=[staging]):
      raise _enospc()
  assert str(e.value) == f"{tmp_path / 'out'}: no space left on device"
  assert not staging.exists()
  with pytest.raises(KeyError):  # anything else passes through untouched
    with storage_errors(tmp_path / "out", remove=[tmp_path]):
      raise KeyError("x")
  assert tmp_path.exists()


def test_atomic_writers_turn_a_full_disk_into_one_line(tmp_path):
  path = tmp_path / "run.trec"
  path.write_text("old\n")
  with pytest.raises(StorageError, match=r"run.trec: no space left"):
    with atomic_write(path) as f:
      f.write("new")
      raise _enospc()
  with pytest.raises(StorageError, match="no space left on device"):
    with atomic_directory(tmp_path / "index") as tmp:
      (tmp / "a").write_text("1")
      raise _enospc()
  assert path.read_text() == "old\n"
  assert sorted(os.listdir(tmp_path)) == ["run.trec"]


def test_cli_prints_a_full_disk_anywhere_as_one_line(monkeypatch, capsys):
  def full(args):
    raise RuntimeError("save failed") from _enospc("/ckpt/tmp")

  monkeypatch.setattr(eval_retrieval, "run", full)
  assert main(["eval-retrieval", "--run", "r", "--qrels", "q"]) == 1
  err = capsys.readouterr().err
  assert err == ("jaxfid eval-retrieval: error: /ckpt/tmp: no space left on "
                 "device\n")


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
  dead, tag = _dead_pid(), processes.host_tag()
  stale_dir = tmp_path / f".index.{dead}.{tag}.ab12cd34.tmp"
  stale_dir.mkdir()
  (stale_dir / "passages.bin").write_text("x")
  stale_file = tmp_path / f".meta.json.{dead}.{tag}.0123456789ab.tmp"
  stale_file.write_text("{")
  live = tmp_path / f".index.{os.getpid()}.{tag}.ab12cd34.tmp"
  live.mkdir()
  parent = tmp_path / f".index.{os.getppid()}.{tag}.zz.old"
  parent.mkdir()
  other_host = tmp_path / f".index.{dead}.00000000.ab12cd34.tmp"
  other_host.mkdir()
  unrelated = tmp_path / ".index.12.notatemp"
  unrelated.mkdir()
  assert temporary_writer(stale_dir.name) == (dead, tag)
  assert temporary_writer(stale_dir.name, "other") is None
  assert remove_stale_temporaries(tmp_path, "other") == []
  removed = remove_stale_temporaries(tmp_path)
  assert sorted(removed) == sorted([stale_dir, stale_file])
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      [live.name, parent.name, other_host.name, unrelated.name])


def test_a_reused_process_id_is_a_dead_writer():
  # our parent lives, but it started long after a file written at time 0
  assert processes.is_running(os.getppid())
  assert not processes.is_running(os.getppid(), started_by=0.0)
  assert not processes.is_running(_dead_pid())


def test_directory_lock(tmp_path):
  out = tmp_path / "index"
  with DirectoryLock(out, what="index") as lock:
    assert lock.lock == tmp_path / ".index.lock"
    holder = json.loads(lock.lock.read_text())
    assert holder["pid"] == os.getpid()
    assert holder["host"] == processes.host_name()
    with pytest.raises(LockedError) as e:
      DirectoryLock(out, what="index").acquire()
    assert isinstance(e.value, InputError)
    assert e.value.message.startswith(
        f"index {out} is in use by process {os.getpid()} on host "
        f"{processes.host_name()} since ")
  assert sorted(os.listdir(tmp_path)) == []
  # a dead holder's lock is taken over silently
  lock_file(out).write_text(json.dumps(
      {"pid": _dead_pid(), "host": processes.host_name(), "created": 1.0}))
  with DirectoryLock(out, what="index"):
    assert json.loads(lock_file(out).read_text())["pid"] == os.getpid()
  assert not lock_file(out).exists()
  # ... also when its id is now ours (a restarted container reuses ids)
  lock_file(out).write_text(json.dumps(
      {"pid": os.getpid(), "host": processes.host_name(), "created": 1.0}))
  with DirectoryLock(out, what="index"):
    pass
  assert not lock_file(out).exists()
  # another host's lock is never taken over: the message says what to do
  lock_file(out).write_text(json.dumps(
      {"pid": 1, "host": "elsewhere", "created": 1.0}))
  with pytest.raises(LockedError, match=r"on host elsewhere since .*remove "
                     "it if that process is gone"):
    DirectoryLock(out, what="index").acquire()
  # inside the directory (a MODEL_DIR)
  with DirectoryLock(tmp_path / "run", what="MODEL_DIR", inside=True) as lock:
    assert lock.lock == tmp_path / "run" / ".jaxfid.lock"
    with pytest.raises(LockedError, match="MODEL_DIR .*run is in use"):
      DirectoryLock(tmp_path / "run", "MODEL_DIR", inside=True).acquire()
  assert os.listdir(tmp_path / "run") == []


def test_a_lock_on_a_full_disk_is_a_storage_error(tmp_path, monkeypatch):
  real_open = open

  def full_open(path, mode="r", *args, **kwargs):
    if "x" in mode or "w" in mode:
      raise _enospc(path)
    return real_open(path, mode, *args, **kwargs)

  monkeypatch.setattr("builtins.open", full_open)
  with pytest.raises(StorageError, match="no space left on device"):
    DirectoryLock(tmp_path / "index").acquire()
  monkeypatch.undo()
  assert os.listdir(tmp_path) == []


def test_preallocate_reserves_memory_mapped_files(tmp_path):
  array = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+",
                                    dtype=np.float32, shape=(4096,))
  preallocate(tmp_path / "a.npy")
  assert os.stat(tmp_path / "a.npy").st_blocks * 512 >= array.nbytes
