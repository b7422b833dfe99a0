"""Reading passage corpora: BEIR JSONL, DPR TSV and DPR JSONL, gzipped or not.

Three formats are accepted, detected from the file name (``.tsv``,
``.jsonl``/``.json``, each optionally ``.gz``) or, for other names, from the
first non-blank line (``{`` starts JSON lines):

* **BEIR JSONL**: ``{"_id": ..., "title": ..., "text": ...}`` per line (other
  keys such as ``metadata`` are ignored);
* **DPR JSONL**: the same with ``id`` instead of ``_id`` (pyserini's
  ``contents`` is accepted in place of ``text``);
* **DPR TSV**: a header naming the columns (``id``, ``text`` and optionally
  ``title``, in any order; DPR's ``psgs_w100.tsv`` has ``id text title``), then
  one passage per row. Fields follow DPR's ``csv`` conventions: tab-separated,
  a field holding quotes, tabs or newlines is double-quoted with ``""``
  escapes.

Gzip is recognised by its magic bytes, whatever the file name. Every problem
in the file (undecodable UTF-8, bad JSON, a missing id or text, a wrong
number of TSV columns, an id with whitespace, which a TREC run cannot hold)
raises :class:`InputError` naming the file and the line. Duplicate ids are
caught where passages are stored (:mod:`jaxfid.retrieval.store.passage_store`).

Readers are generators: a 21M-passage corpus streams through in constant
memory.
"""
from __future__ import annotations

import csv
import os
import sys
from typing import Iterator, NamedTuple

from jaxfid.core.errors import InputError
from jaxfid.core.textio import iter_json_lines, iter_lines

FORMATS = ("jsonl", "tsv")


class Passage(NamedTuple):
  """One passage (or document): its id, title ("" if none) and text."""
  id: str
  title: str
  text: str


def _suffix(path: str | os.PathLike) -> str:
  name = os.path.basename(str(path)).lower()
  if name.endswith(".gz"):
    name = name[:-3]
  return os.path.splitext(name)[1]


def detect_format(path: str | os.PathLike) -> str:
  """``"jsonl"`` or ``"tsv"``, from the extension or the first line."""
  suffix = _suffix(path)
  if suffix in (".jsonl", ".json"):
    return "jsonl"
  if suffix == ".tsv":
    return "tsv"
  for _, line in iter_lines(path):
    if line.strip():
      return "jsonl" if line.lstrip().startswith("{") else "tsv"
  return "jsonl"  # empty file: no passages either way


def check_id(path, docid, lineno: int, what: str = "id") -> str:
  """Validates an id (a string or integer, non-empty, no whitespace)."""
  if isinstance(docid, bool) or not isinstance(docid, (str, int)):
    raise InputError(path, f"{what} must be a string, got "
                     f"{type(docid).__name__}", where=lineno)
  docid = str(docid)
  if not docid:
    raise InputError(path, f"empty {what}", where=lineno)
  if "\x00" in docid:
    raise InputError(path, f"{what} {docid!r} contains a NUL character",
                     where=lineno)
  if len(docid.split()) != 1 or docid.split()[0] != docid:
    raise InputError(path, f"{what} {docid!r} contains whitespace (TREC run "
                     "files cannot hold it)", where=lineno)
  return docid


def _read_jsonl(path) -> Iterator[tuple[int, Passage]]:
  for lineno, record in iter_json_lines(path, array_hint=True):
    if not isinstance(record, dict):
      raise InputError(path, f"expected a JSON object, got "
                       f"{type(record).__name__}", where=lineno)
    if "_id" in record:
      docid = record["_id"]
    elif "id" in record:
      docid = record["id"]
    else:
      raise InputError(path, "missing passage id ('_id' or 'id')",
                       where=lineno)
    docid = check_id(path, docid, lineno)
    text = record.get("text", record.get("contents"))
    if text is None:
      raise InputError(path, "missing 'text'", where=lineno)
    title = record.get("title") or ""
    if not isinstance(text, str) or not isinstance(title, str):
      raise InputError(path, "'title' and 'text' must be strings",
                       where=lineno)
    yield lineno, Passage(docid, title, text)


class _CsvLines:
  """Feeds csv.reader decoded lines and remembers the physical line number."""

  def __init__(self, path):
    self._lines = iter_lines(path)
    self.lineno = 0

  def __iter__(self):
    return self

  def __next__(self) -> str:
    self.lineno, line = next(self._lines)
    return line + "\n"


def _read_tsv(path) -> Iterator[tuple[int, Passage]]:
  csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long documents
  lines = _CsvLines(path)
  reader = csv.reader(lines, delimiter="\t", strict=True)
  header = None
  columns: dict[str, int] = {}
  try:
    for row in reader:
      start = lines.lineno - (_row_lines(row) - 1)
      if header is None:
        if not any(field.strip() for field in row):
          continue
        header = [h.strip().lower() for h in row]
        columns = {name: i for i, name in enumerate(header)}
        missing = [c for c in ("id", "text") if c not in columns]
        if missing:
          raise InputError(path, "expected a header line naming the columns "
                           "(id, text, title); found "
                           f"{' '.join(row)[:80]!r}", where=start)
        continue
      if not row or (len(row) == 1 and not row[0].strip()):
        continue
      if len(row) != len(header):
        raise InputError(path, f"expected {len(header)} tab-separated "
                         f"columns ({', '.join(header)}), found {len(row)}",
                         where=start)
      docid = check_id(path, row[columns["id"]], start)
      title = row[columns["title"]] if "title" in columns else ""
      yield start, Passage(docid, title, row[columns["text"]])
  except csv.Error as e:
    raise InputError(path, f"malformed TSV: {e}", where=lines.lineno) from None


def _row_lines(row: list[str]) -> int:
  """Physical lines a parsed TSV row spanned (quoted fields may hold '\\n')."""
  return 1 + sum(field.count("\n") for field in row)


def read_corpus(path: str | os.PathLike,
                fmt: str | None = None) -> Iterator[tuple[int, Passage]]:
  """Yields (line number, Passage) for every passage of a corpus file.

  Args:
    path: a BEIR/DPR JSONL or DPR TSV file, optionally gzipped.
    fmt: ``"jsonl"`` or ``"tsv"``; detected when None.

  Raises:
    InputError: on any malformed line (the message names file and line).
  """
  fmt = fmt or detect_format(path)
  if fmt == "jsonl":
    return _read_jsonl(path)
  if fmt == "tsv":
    return _read_tsv(path)
  raise ValueError(f"unknown corpus format {fmt!r}; one of {FORMATS}")


def iter_passages(path: str | os.PathLike) -> Iterator[Passage]:
  """Like :func:`read_corpus` without line numbers."""
  for _, passage in read_corpus(path):
    yield passage


def passage_contents(passage: Passage) -> str:
  """The text that is indexed: title and text, as Anserini's "contents"."""
  if passage.title:
    return f"{passage.title}\n{passage.text}"
  return passage.text


__all__ = ["Passage", "read_corpus", "iter_passages", "detect_format",
           "check_id", "passage_contents", "FORMATS"]
