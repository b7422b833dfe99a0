"""runtime/files.py: outputs appear complete or not at all, never half-written."""
import os
import stat

import pytest

from jaxfid.core.errors import InputError
from jaxfid.retrieval.index_dir import check_output
from jaxfid.runtime.files import (atomic_directory, atomic_path, atomic_write,
                               link_or_copy, replace_directory, write_atomic)


def _mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_write_appears_whole_or_not_at_all(tmp_path):
  path = tmp_path / "sub" / "out.txt"
  with atomic_write(path) as f:
    f.write("first\n")
    assert not path.exists()  # only the temporary file exists while writing
  assert path.read_text() == "first\n"
  with pytest.raises(RuntimeError):
    with atomic_write(path) as f:
      f.write("second\n")
      raise RuntimeError("interrupted")
  assert path.read_text() == "first\n"
  assert sorted(os.listdir(path.parent)) == ["out.txt"]
  write_atomic(path, b"\x00bytes")
  assert path.read_bytes() == b"\x00bytes"
  umask = os.umask(0o022)
  os.umask(umask)
  assert _mode(path) == 0o666 & ~umask


def test_concurrent_writers_never_share_a_temporary_file(tmp_path):
  path = tmp_path / "shared.json"
  with atomic_write(path) as a, atomic_write(path) as b:
    assert a.name != b.name
    assert os.path.basename(a.name).startswith(f".shared.json.{os.getpid()}.")
    a.write("a")
    b.write("b")
  assert path.read_text() == "a"  # the outer block finished last
  with atomic_path(path) as one, atomic_path(path) as two:
    assert one != two and one.parent == two.parent == tmp_path
    one.write_text("1")
    two.write_text("2")
  assert path.read_text() == "1"
  assert sorted(os.listdir(tmp_path)) == ["shared.json"]


def test_link_or_copy(tmp_path):
  (tmp_path / "src").write_text("payload")
  link_or_copy(tmp_path / "src", tmp_path / "dst")
  assert (tmp_path / "dst").read_text() == "payload"
  link_or_copy(tmp_path / "src", tmp_path / "dst")  # replaces
  assert sorted(os.listdir(tmp_path)) == ["dst", "src"]


def test_atomic_directory_replaces_only_what_it_may(tmp_path):
  out = tmp_path / "out"
  with atomic_directory(out) as tmp:
    (tmp / "a").write_text("1")
    assert not out.exists()
  assert (out / "a").read_text() == "1"
  assert _mode(out) & 0o700 == 0o700 and _mode(out / "a") & 0o600 == 0o600
  with pytest.raises(InputError, match="already exists and is not empty"):
    with atomic_directory(out):
      pass
  with pytest.raises(RuntimeError):
    with atomic_directory(out, overwrite=True) as tmp:
      (tmp / "b").write_text("2")
      raise RuntimeError("interrupted")
  assert sorted(os.listdir(out)) == ["a"]
  with atomic_directory(out, overwrite=True) as tmp:
    (tmp / "b").write_text("2")
  assert sorted(os.listdir(out)) == ["b"]
  assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary left behind
  (tmp_path / "file").write_text("x")
  with pytest.raises(InputError, match="not a directory"):
    with atomic_directory(tmp_path / "file", overwrite=True):
      pass


def test_index_outputs_replace_indexes_only(tmp_path):
  index = tmp_path / "index"
  with atomic_directory(index, check=check_output) as tmp:
    (tmp / "meta.json").write_text("{}")
  with atomic_directory(index, check=check_output) as tmp:  # an index: ok
    (tmp / "meta.json").write_text('{"new": 1}')
  assert (index / "meta.json").read_text() == '{"new": 1}'
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "todo.txt").write_text("keep me")
  with pytest.raises(InputError, match="not an index directory"):
    with atomic_directory(tmp_path / "notes", check=check_output):
      pass
  assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_replace_directory(tmp_path):
  (tmp_path / "new").mkdir()
  (tmp_path / "new" / "x").write_text("new")
  (tmp_path / "old").mkdir()
  (tmp_path / "old" / "y").write_text("old")
  replace_directory(tmp_path / "new", tmp_path / "old")
  assert sorted(os.listdir(tmp_path)) == ["old"]
  assert sorted(os.listdir(tmp_path / "old")) == ["x"]
