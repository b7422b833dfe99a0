"""Reading queries: TSV, JSONL (BEIR / generic) and QA sets (NQ-open style).

* TSV: ``id<TAB>text`` (an ``id``/``qid``/... header line is skipped);
* QA TSV: ``question<TAB>['answer', ...]`` (DPR's ``*.qa.csv``);
* JSONL: id under ``id``/``_id``/``qid``, text under
  ``question``/``text``/``query``, answers under ``answer``/``answers``/
  ``golden_answers``;
* JSON: a list of such records (FiD data).

Records without an id are numbered ``"0"``, ``"1"``, ... (blank lines not
counted). Duplicate ids, missing text, bad JSON and tab-less TSV lines raise
InputError naming file and line.
"""
from __future__ import annotations

import json
import os
from typing import Iterator, NamedTuple

from jaxfid.core.errors import InputError
from jaxfid.core.textio import (
    iter_json_lines, iter_lines, read_json_document)
from jaxfid.retrieval.store.corpus import check_id
from jaxfid.retrieval.store.qa_tsv import iter_qa_tsv, split_qa_line

_ID_KEYS = ("id", "_id", "qid")
_TEXT_KEYS = ("question", "text", "query")
_HEADER_IDS = {"id", "qid", "query_id", "query-id", "_id"}
_HEADER_TEXTS = {"text", "query", "question"}
_ANSWER_KEYS = ("answers", "answer", "golden_answers")


class Query(NamedTuple):
  """One query; ``answers`` is None when the file has no answers."""
  id: str
  text: str
  answers: tuple[str, ...] | None = None


def _suffix(path) -> str:
  name = os.path.basename(str(path)).lower()
  if name.endswith(".gz"):
    name = name[:-3]
  return os.path.splitext(name)[1]


def _first_line(path) -> str:
  for _, line in iter_lines(path):
    if line.strip():
      return line
  return ""


def _first_char(path) -> str:
  line = _first_line(path)
  return line.lstrip()[0] if line else ""


def _is_json_object(line: str) -> bool:
  if not line.lstrip().startswith("{"):
    return False
  try:
    return isinstance(json.loads(line), dict)
  except json.JSONDecodeError:
    return False


def is_qa_tsv(path: str | os.PathLike) -> bool:
  """Whether the file's first non-blank line is a QA TSV line."""
  line = _first_line(path)
  return bool(line) and not line.lstrip().startswith(("{", "[")) and (
      split_qa_line(line) is not None)


def _answers(path, record: dict, where) -> tuple[str, ...] | None:
  key = next((k for k in _ANSWER_KEYS if k in record), None)
  if key is None:
    return None
  value = record[key]
  if isinstance(value, str):
    value = [value]
  if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
    raise InputError(path, "answers must be a string or a list of strings",
                     where=where)
  return tuple(value)


def _from_record(path, record, where, position: int) -> Query:
  if not isinstance(record, dict):
    raise InputError(path, f"expected a JSON object, got "
                     f"{type(record).__name__}", where=where)
  qid = next((record[k] for k in _ID_KEYS if k in record), None)
  qid = str(position) if qid is None else check_id(path, qid, where,
                                                   what="query id")
  text = next((record[k] for k in _TEXT_KEYS if k in record), None)
  if not isinstance(text, str):
    raise InputError(path, "missing query text ('question', 'text' or "
                     "'query')", where=where)
  return Query(qid, text, _answers(path, record, where))


def _read_jsonl(path) -> Iterator[tuple[int, Query]]:
  position = 0
  for lineno, record in iter_json_lines(path):
    yield lineno, _from_record(path, record, lineno, position)
    position += 1


def _read_json_list(path) -> Iterator[tuple[str, Query]]:
  records = read_json_document(path)
  if not isinstance(records, list):
    raise InputError(path, "expected a JSON list of questions")
  for i, record in enumerate(records):
    yield f"element {i}", _from_record(path, record, f"element {i}", i)


def _read_tsv(path) -> Iterator[tuple[int, Query]]:
  for lineno, line in iter_lines(path):
    if not line.strip():
      continue
    fields = line.split("\t")
    if len(fields) != 2:
      raise InputError(path, "expected 2 tab-separated columns (id, text), "
                       f"found {len(fields)}", where=lineno)
    qid, text = fields
    if (lineno == 1 and qid.strip().lower() in _HEADER_IDS
        and text.strip().lower() in _HEADER_TEXTS):
      continue
    yield lineno, Query(check_id(path, qid.strip(), lineno, "query id"), text)


def _read_qa_tsv(path) -> Iterator[tuple[int, Query]]:
  for position, (lineno, (question, answers)) in enumerate(iter_qa_tsv(path)):
    yield lineno, Query(str(position), question, tuple(answers))


def iter_queries(path: str | os.PathLike) -> Iterator[tuple[int | str, Query]]:
  """Yields (line number or element, Query); formats: see the module doc."""
  suffix = _suffix(path)
  if suffix == ".json":
    if _first_char(path) == "[":
      return _read_json_list(path)
    return _read_jsonl(path)
  if suffix == ".jsonl":
    return _read_jsonl(path)
  line = _first_line(path)
  if _is_json_object(line) or (suffix not in (".tsv", ".txt")
                               and line.lstrip().startswith("{")):
    return _read_jsonl(path)
  if is_qa_tsv(path):
    return _read_qa_tsv(path)
  return _read_tsv(path)


def read_queries(path: str | os.PathLike) -> list[Query]:
  """All queries of a file; InputError for a bad record, repeated id or none."""
  seen: dict[str, int | str] = {}
  queries = []
  for where, query in iter_queries(path):
    if query.id in seen:
      raise InputError(path, f"duplicate query id {query.id!r} (first seen "
                       f"at {seen[query.id]})", where=where)
    seen[query.id] = where
    queries.append(query)
  if not queries:
    raise InputError(path, "no queries in the file")
  return queries
