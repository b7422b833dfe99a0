"""The documentation points only at what the repository holds.

README.md and docs/*.md are read as text (no model, no device): every
relative Markdown link names an existing file (and, with ``#anchor``, an
existing heading of it), no page refers to a path outside the repository
(``../shared``, ``/work/...``), every repository path a page quotes in
backticks (``jaxfid/reader/task.py``, ``reader/inputs.py::format_passages``,
``tests/test_demo.py``, ``test_fid_model.py``) exists, so a moved or deleted
file shows up here, and every ``jaxfid`` command of a page's ``sh`` blocks
parses with the CLI's own parser, a ``train`` command's gin (files, macros,
values) passing the validation ``jaxfid train`` runs before any work.
"""
from __future__ import annotations

import pathlib
import re
import shlex

import gin
import pytest

from jaxfid import cli
from jaxfid.commands import gin_specs
from jaxfid.commands.gin_flags import parse_checked, split_gin_bindings
from jaxfid.core.errors import InputError

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages another step writes (docs/configuration.md is generated from the
# configuration dataclasses): a link to one is checked once it exists.
GENERATED = {ROOT / "docs" / "configuration.md"}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`([^`\n]+)`")
# a path, not part of a pattern (``tests/test_fid_*.py``, ``<dir>/x``)
PATH = re.compile(r"(?<![\w.*<>{}/-])[\w.-]+(?:/[\w.-]+)+/?(?![\w.*<>{}-])")
OUTSIDE = re.compile(r"\.\./shared|(?<![\w.])/work/|\.\./\.\./")


def _id(page: pathlib.Path) -> str:
  return str(page.relative_to(ROOT))


def _anchors(page: pathlib.Path) -> set[str]:
  """GitHub's heading anchors: lower case, punctuation dropped, spaces to -."""
  text = FENCE.sub("", page.read_text(encoding="utf-8"))
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
          for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_pages_exist():
  names = {p.name for p in PAGES}
  for name in ("install.md", "fid.md", "reatt.md", "refusion.md",
               "retrieval.md", "evaluation.md", "reliability.md",
               "multihost.md", "fidelity.md", "results.md", "extending.md"):
    assert name in names, f"docs/{name} is missing"


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_relative_links_point_into_the_repository(page):
  problems = []
  for target in LINK.findall(page.read_text(encoding="utf-8")):
    if re.match(r"[a-z]+:", target):  # https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if ROOT not in resolved.parents and resolved != ROOT:
      problems.append(f"{target}: outside the repository")
    elif not resolved.exists():
      if resolved not in GENERATED:
        problems.append(f"{target}: no such file")
    elif anchor and resolved.suffix == ".md" and (
        anchor not in _anchors(resolved)):
      problems.append(f"{target}: no heading #{anchor}")
  assert not problems, f"{_id(page)}: " + "; ".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_no_path_outside_the_repository(page):
  lines = [f"line {n}: {line.strip()}" for n, line in
           enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
           if OUTSIDE.search(line)]
  assert not lines, f"{_id(page)} refers outside the repository: {lines}"


def _exists(path: str) -> bool:
  """``path`` from the repository root or from ``jaxfid/`` (pages name
  modules as ``reader/task.py``); ``fid/task.EXAMPLE_SOURCES`` is an attribute
  of ``reader/task.py``."""
  for base in (ROOT, ROOT / "jaxfid"):
    if (base / path).exists():
      return True
    head, _, name = path.rstrip("/").rpartition("/")
    stem = name.split(".")[0]
    if "." in name and (base / head / f"{stem}.py").exists():
      return True
  return False


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_quoted_repository_paths_exist(page):
  roots = ({p.name for p in ROOT.iterdir()} |
           {p.name for p in (ROOT / "jaxfid").iterdir()}) - {"__init__.py"}
  text = FENCE.sub("", page.read_text(encoding="utf-8"))
  missing = set()
  for code in CODE.findall(text):
    for path in PATH.findall(code.split("::")[0]):
      if path.split("/")[0] in roots and not _exists(path):
        missing.add(path)
    for name in re.findall(r"(?<![\w/])test_\w+\.py", code):  # tests/ alone
      if not (ROOT / "tests" / name).exists():
        missing.add(name)
  assert not missing, f"{_id(page)} names paths that do not exist: " + (
      ", ".join(sorted(missing)))


SH_BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```", re.S | re.M)


def _commands(page: pathlib.Path) -> list[tuple[str, list[str]]]:
  """(line, arguments after ``jaxfid``) of each command in ``sh`` blocks:
  continuation lines joined, comments and leading ``VAR=value`` dropped,
  optional ``[...]`` parts included and ``...`` left out."""
  found = []
  for block in SH_BLOCK.findall(page.read_text(encoding="utf-8")):
    for line in block.replace("\\\n", " ").splitlines():
      line = re.sub(r"\s+#.*$", "", line).strip()
      words = shlex.split(line) if line else []
      while words and re.match(r"[A-Z_]+=", words[0]):
        words.pop(0)
      if words[:1] in (["jaxfid"], [".venv/bin/jaxfid"]):  # (after make)
        args = [w.replace("[", "").replace("]", "") for w in words[1:]]
        found.append((line, [a for a in args if a and a != "..."]))
  return found


def test_pages_show_commands():
  assert len(_commands(ROOT / "README.md")) >= 10
  for page in ("fid.md", "reatt.md", "refusion.md", "retrieval.md"):
    assert _commands(ROOT / "docs" / page), page


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_documented_commands_parse(page):
  parser = cli.build_parser()
  written = set()  # files an earlier command on the page writes
  for line, args in _commands(page):
    try:
      parsed, unknown = parser.parse_known_args(args)
    except SystemExit:
      pytest.fail(f"{_id(page)}: does not parse: {line}")
    if getattr(parsed, "accepts_gin_bindings", False):
      parsed.gin_bindings, unknown = split_gin_bindings(unknown)
    for prefix in getattr(parsed, "gin_binding_prefixes", ()):
      _, unknown = split_gin_bindings(unknown, prefix)
    assert not unknown, f"{_id(page)}: unknown {unknown}: {line}"
    if parsed.command == "train":
      try:
        parse_checked(parsed.gin_file, parsed.gin_bindings,
                      parsed.gin_search_path, "train", gin_specs.TRAIN_READS)
      except InputError as e:
        if not any(e.message.endswith(f"no such file: {f}") for f in written):
          raise
      finally:
        gin.clear_config()
    written.update(str(v) for k in ("output", "save_executable")
                   if isinstance(v := getattr(parsed, k, None), str))
