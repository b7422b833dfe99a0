"""Reading passage corpora: JSONL, DPR TSV and sentence files, gzipped or not.

* JSONL: BEIR (``_id``, ``title``, ``text``), DPR (``id``), pyserini /
  FlashRAG (``id``, ``contents``; a first line that is a double-quoted title
  is split off), or sentences (``text`` without id: ids are record numbers);
* DPR TSV: a header naming ``id``, ``text`` and optionally ``title``, then
  rows in DPR's ``csv`` quoting;
* sentences (``.txt``): one passage per non-blank line, ids 0, 1, ...

The format comes from the suffix (``.jsonl``/``.json``, ``.tsv``, each maybe
``.gz``) or else the first non-blank line; gzip is detected by magic bytes.
Any malformed line (bad encoding or JSON, missing id or text, wrong column
count, an id with whitespace) raises InputError naming file and line.
Readers stream in constant memory.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from typing import Iterator, NamedTuple

from jaxfid.core.errors import InputError
from jaxfid.core.textio import iter_json_lines, iter_lines

FORMATS = ("jsonl", "tsv", "sentences")


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


def _first_line(path, encoding: str = "utf-8") -> str | None:
  for _, line in iter_lines(path, encoding):
    if line.strip():
      return line
  return None


def _json_object(line: str) -> dict | None:
  """The line parsed as a JSON object, or None if it is not one."""
  if not line.lstrip().startswith("{"):
    return None
  try:
    value = json.loads(line)
  except json.JSONDecodeError:
    return None
  return value if isinstance(value, dict) else None


def _tsv_header(line: str) -> bool:
  names = {field.strip().lower() for field in line.split("\t")}
  return "\t" in line and {"id", "text"} <= names


def detect_format(path: str | os.PathLike, encoding: str = "utf-8") -> str:
  """``"jsonl"``, ``"tsv"`` or ``"sentences"``: see the module docstring."""
  suffix = _suffix(path)
  if suffix in (".jsonl", ".json"):
    return "jsonl"
  if suffix == ".tsv":
    return "tsv"
  line = _first_line(path, encoding)
  if line is None:  # an empty file: no passages either way
    return "sentences" if suffix == ".txt" else "jsonl"
  if suffix == ".txt":
    if _json_object(line) is not None:
      return "jsonl"
    return "tsv" if _tsv_header(line) else "sentences"
  return "jsonl" if line.lstrip().startswith("{") else "tsv"


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


def split_contents(contents: str) -> tuple[str, str]:
  """(title, text) of pyserini's ``contents``: ``"Title"\\ntext`` is split,
  anything else is all text."""
  first, newline, rest = contents.partition("\n")
  if newline and len(first) >= 2 and first[0] == first[-1] == '"':
    return first[1:-1], rest
  return "", contents


def _read_jsonl(path, encoding: str = "utf-8"
                ) -> Iterator[tuple[int, Passage]]:
  with_ids = None
  row = 0
  for lineno, record in iter_json_lines(path, array_hint=True,
                                        encoding=encoding):
    if not isinstance(record, dict):
      raise InputError(path, f"expected a JSON object, got "
                       f"{type(record).__name__}", where=lineno)
    if with_ids is None:  # the first record decides
      with_ids = "_id" in record or "id" in record
    if not with_ids:
      yield lineno, _sentence_record(path, record, lineno, row)
      row += 1
      continue
    if "_id" in record:
      docid = record["_id"]
    elif "id" in record:
      docid = record["id"]
    else:
      raise InputError(path, "missing passage id ('_id' or 'id')",
                       where=lineno)
    docid = check_id(path, docid, lineno)
    title = record.get("title") or ""
    if "text" in record:
      text = record["text"]
    elif "contents" in record:
      text = record["contents"]
      if isinstance(text, str) and "title" not in record:
        title, text = split_contents(text)
    else:
      raise InputError(path, "missing 'text'", where=lineno)
    if not isinstance(text, str) or not isinstance(title, str):
      raise InputError(path, "'title' and 'text' must be strings",
                       where=lineno)
    yield lineno, Passage(docid, title, text)


def _sentence_record(path, record: dict, lineno: int, row: int) -> Passage:
  """A JSON record without id: its row number is the id."""
  if not isinstance(record.get("text"), str):
    raise InputError(path, "expected a JSON object with a string 'text'",
                     where=lineno)
  title = record.get("title") or ""
  if not isinstance(title, str):
    raise InputError(path, "'title' must be a string", where=lineno)
  return Passage(str(row), title, record["text"])


def _read_sentences(path, encoding: str = "utf-8"
                    ) -> Iterator[tuple[int, Passage]]:
  row = 0
  for lineno, line in iter_lines(path, encoding):
    if line.strip():
      yield lineno, Passage(str(row), "", line)
      row += 1


class _CsvLines:
  """Feeds csv.reader decoded lines and remembers the physical line number."""

  def __init__(self, path, encoding: str = "utf-8"):
    self._lines = iter_lines(path, encoding)
    self.lineno = 0

  def __iter__(self):
    return self

  def __next__(self) -> str:
    self.lineno, line = next(self._lines)
    return line + "\n"


def _read_tsv(path, encoding: str = "utf-8"
              ) -> Iterator[tuple[int, Passage]]:
  csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long documents
  lines = _CsvLines(path, encoding)
  reader = csv.reader(lines, delimiter="\t", strict=True)
  header = None
  columns: dict[str, int] = {}
  try:
    end = 0  # the last physical line of the previous row
    for row in reader:
      start, end = end + 1, lines.lineno  # quoted fields may span lines
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


def read_corpus(path: str | os.PathLike, fmt: str | None = None,
                encoding: str = "utf-8") -> Iterator[tuple[int, Passage]]:
  """Yields (line number, Passage) for every passage of a corpus file.

  ``fmt``: ``"jsonl"``, ``"tsv"`` or ``"sentences"`` (detected when None).
  Raises InputError on a malformed line.
  """
  fmt = fmt or detect_format(path, encoding)
  if fmt == "jsonl":
    return _read_jsonl(path, encoding)
  if fmt == "tsv":
    return _read_tsv(path, encoding)
  if fmt == "sentences":
    return _read_sentences(path, encoding)
  raise ValueError(f"unknown corpus format {fmt!r}; one of {FORMATS}")


def iter_passages(path: str | os.PathLike,
                  encoding: str = "utf-8") -> Iterator[Passage]:
  """Like :func:`read_corpus` without line numbers."""
  for _, passage in read_corpus(path, encoding=encoding):
    yield passage


def passage_contents(passage: Passage) -> str:
  """The text that is indexed: title and text, as Anserini's "contents"."""
  if passage.title:
    return f"{passage.title}\n{passage.text}"
  return passage.text


__all__ = ["Passage", "read_corpus", "iter_passages", "detect_format",
           "check_id", "passage_contents", "split_contents", "FORMATS"]
