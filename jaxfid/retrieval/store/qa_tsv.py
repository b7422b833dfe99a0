"""DPR's QA TSV (``*.qa.csv``): ``question<TAB>['answer', ...]`` per line.

The one reader of the format: ``jaxfid retrieve``'s queries
(:mod:`jaxfid.retrieval.store.queries`) and the reader's question files
(:mod:`jaxfid.reader.examples`) both parse it here.
"""
from __future__ import annotations

import ast
import json
import os
from typing import Iterable, Iterator

from jaxfid.core.errors import InputError
from jaxfid.core.textio import iter_lines


def answer_list(text: str) -> list[str] | None:
  """A QA TSV answer column (``['a', "b's"]``, a Python or JSON list of
  strings) as a list, or None if it is not one."""
  text = text.strip()
  if not (text.startswith("[") and text.endswith("]")):
    return None
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError, MemoryError, RecursionError):
    try:
      value = json.loads(text)
    except json.JSONDecodeError:
      return None
  if isinstance(value, (list, tuple)) and all(isinstance(a, str)
                                              for a in value):
    return list(value)
  return None


def _unquote(field: str) -> str:
  """A field double-quoted as csv writes it, without the quotes."""
  if len(field) >= 2 and field[0] == field[-1] == '"':
    return field[1:-1].replace('""', '"')
  return field


def split_qa_line(line: str) -> tuple[str, list[str]] | None:
  """(question, answers) of a QA TSV line, or None if it is not one."""
  question, tab, answers = line.rpartition("\t")
  if not tab:
    return None
  parsed = answer_list(answers)
  if parsed is None:
    return None
  return _unquote(question.strip()), parsed


def iter_qa_tsv(path: str | os.PathLike
                ) -> Iterator[tuple[int, tuple[str, list[str]]]]:
  """Yields (line number, (question, answers)) of a QA TSV file; InputError
  for a line that is not ``question<TAB>[answers]``."""
  return qa_lines(iter_lines(path), path,
                  "(a QA TSV such as DPR's nq-test.qa.csv)")


def qa_lines(lines: Iterable[tuple[int, str]], path: str | os.PathLike,
             hint: str) -> Iterator[tuple[int, tuple[str, list[str]]]]:
  """(line number, (question, answers)) of numbered QA TSV lines, blank
  ones skipped; a line that is not ``question<TAB>[answers]`` is an
  InputError naming ``path`` and the line, ending with ``hint``."""
  for lineno, line in lines:
    if not line.strip():
      continue
    pair = split_qa_line(line)
    if pair is None:
      raise InputError(path, f"expected question<TAB>['answer', ...] {hint}",
                       where=lineno)
    yield lineno, pair
