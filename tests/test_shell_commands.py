"""The commands jaxfid prints for the user to run (jaxfid/commands/shell.py):
they name an executable that exists from the current directory, and a
missing extra is one line with the pip command that installs it."""
import os
import shlex
import sys

import pytest

from jaxfid.cli import main
from jaxfid.commands import shell

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_serve_without_the_serve_extra_is_one_line_naming_it(
    monkeypatch, capsys, tmp_path):
  monkeypatch.chdir(ROOT)
  monkeypatch.setitem(sys.modules, "uvicorn", None)  # import fails
  code = main(["serve", "--checkpoint", str(tmp_path / "model"), "--index",
               str(tmp_path / "index")])
  out, err = capsys.readouterr()
  assert code == 2 and out == ""
  line, = err.strip().splitlines()  # no traceback
  assert line.startswith("jaxfid serve: error: uvicorn: not installed; ")
  assert "'serve' extra" in line
  command = line.rsplit(": ", 1)[1]
  assert command == shell.install_command("serve")
  words = shlex.split(command)
  assert words[1:] == ["-m", "pip", "install", "-e", ".[serve]"]
  assert os.path.samefile(words[0], sys.executable)  # runs as printed


def test_install_command_outside_the_checkout(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  words = shlex.split(shell.install_command("serve"))
  assert words[-1] == ROOT + "[serve]"
  assert os.path.samefile(words[0], sys.executable)


def test_require_extra_passes_when_installed():
  shell.require_extra("serve", ("json", "os"), "x")  # no error


def test_jaxfid_command_names_an_executable_that_exists(monkeypatch,
                                                        tmp_path):
  venv = tmp_path / ".venv" / "bin"
  venv.mkdir(parents=True)
  (venv / "python").symlink_to(sys.executable)
  script = venv / "jaxfid"
  script.write_text("#!/bin/sh\n")
  script.chmod(0o755)
  monkeypatch.setattr(sys, "executable", str(venv / "python"))
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("PATH", "/usr/bin:/bin")  # as after `make demo`
  assert shell.jaxfid_command() == ".venv/bin/jaxfid"
  monkeypatch.setenv("PATH", f"{venv}:/usr/bin:/bin")  # an activated venv
  assert shell.jaxfid_command() == "jaxfid"
  (tmp_path / "elsewhere").mkdir()
  monkeypatch.chdir(tmp_path / "elsewhere")  # not under it: the full path
  monkeypatch.setenv("PATH", "/usr/bin:/bin")
  assert shell.jaxfid_command() == str(script)
  script.unlink()  # no console script (python -m jaxfid from a checkout)
  assert shlex.split(shell.jaxfid_command()) == [str(venv / "python"), "-m",
                                                 "jaxfid"]
