"""FiD question files: read, validate and write them.

The format is facebookresearch/FiD's (README "Data format"), a JSON list or
JSONL (one record per line), optionally gzip-compressed; which one is told by
content (a first non-blank ``[``; gzip's magic bytes), and JSONL is streamed::

  {"id": "0", "question": "...", "target": "...", "answers": ["...", ...],
   "ctxs": [{"title": "...", "text": "...", "score": 12.3, "id": "..."}, ...]}

Only ``question`` is required (``answers`` may be spelt ``answer`` or
``golden_answers``); scores may be numeric strings (DPR's), ids strings or
integers (kept as strings). Questions without passages may come as the QA
TSV of DPR and Anserini (``question<TAB>['answer 1', ...]``, ids the 0-based
line positions). Anything else raises InputError naming the file and the
JSONL line (or ``record N``, from 1).
"""
from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import math
import os
import zlib
from collections.abc import Iterator, Sequence

from jaxfid.core.errors import InputError
from jaxfid.core.textio import open_binary
from jaxfid.retrieval.store.qa_tsv import qa_lines, split_qa_line
from jaxfid.runtime.files import atomic_write

QUESTION_PREFIX = "question:"
TITLE_PREFIX = "title:"
PASSAGE_PREFIX = "context:"
TRIVIA_QA = "trivia_qa"  # the dataset whose drawn answers are title-cased
_BOM = b"\xef\xbb\xbf"


@dataclasses.dataclass(frozen=True)
class Passage:
  """One retrieved passage of an example."""
  title: str
  text: str
  score: float | None = None
  id: str | None = None


@dataclasses.dataclass(frozen=True)
class FidExample:
  """One question with its gold answers and retrieved passages."""
  question: str
  answers: tuple[str, ...] = ()
  target: str | None = None
  ctxs: tuple[Passage, ...] = ()
  id: str | None = None


# ----------------------------------------------------------------- validation


def _json_type(value) -> str:
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "boolean"
  if isinstance(value, (int, float)):
    return "number"
  if isinstance(value, str):
    return "string"
  if isinstance(value, list):
    return "array"
  if isinstance(value, dict):
    return "object"
  return type(value).__name__


def _optional_id(value, name: str, path, where) -> str | None:
  if value is None:
    return None
  if isinstance(value, str):
    return value
  if isinstance(value, int) and not isinstance(value, bool):
    return str(value)
  raise InputError(path, f"{name} must be a string or an integer, got "
                   f"{_json_type(value)}", where=where)


def _score(value, name: str, path, where) -> float | None:
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    raise InputError(path, f"{name} must be a number, got {_json_type(value)}",
                     where=where)
  try:
    score = float(value)
  except ValueError:
    raise InputError(path, f"{name} must be a number, got {value!r}",
                     where=where) from None
  if math.isnan(score):
    raise InputError(path, f"{name} is NaN", where=where)
  return score


def _passage(ctx, k: int, path, where) -> Passage:
  name = f"ctxs[{k}]"
  if not isinstance(ctx, dict):
    raise InputError(path, f"{name} must be an object with a \"text\", got "
                     f"{_json_type(ctx)}", where=where)
  if "text" not in ctx:
    raise InputError(path, f"{name} has no \"text\"", where=where)
  text = ctx["text"]
  if not isinstance(text, str):
    raise InputError(path, f"{name}.text must be a string, got "
                     f"{_json_type(text)}", where=where)
  title = ctx.get("title")
  if title is None:
    title = ""
  elif not isinstance(title, str):
    raise InputError(path, f"{name}.title must be a string, got "
                     f"{_json_type(title)}", where=where)
  return Passage(title=title, text=text,
                 score=_score(ctx.get("score"), f"{name}.score", path, where),
                 id=_optional_id(ctx.get("id"), f"{name}.id", path, where))


def parse_record(record, path, where,
                 require_answers: bool = False) -> FidExample:
  """The :class:`FidExample` of one decoded JSON record; InputError naming
  ``path`` and ``where`` (a line number or ``"record 3"``) if it does not
  follow the FiD format, or (``require_answers``) has no target nor answer."""
  if not isinstance(record, dict):
    raise InputError(path, "expected a JSON object with a \"question\", got "
                     f"{_json_type(record)}", where=where)
  if "question" not in record:
    raise InputError(path, "\"question\" is missing", where=where)
  question = record["question"]
  if not isinstance(question, str):
    raise InputError(path, "\"question\" must be a string, got "
                     f"{_json_type(question)}", where=where)
  key = next((k for k in ("answers", "answer", "golden_answers")
              if k in record), "answers")
  answers = record.get(key)
  if answers is None:
    answers = []
  if not isinstance(answers, list):
    raise InputError(path, f"\"{key}\" must be a list of strings, got "
                     f"{_json_type(answers)}", where=where)
  for k, a in enumerate(answers):
    if not isinstance(a, str):
      raise InputError(path, f"\"{key}\"[{k}] must be a string, got "
                       f"{_json_type(a)}", where=where)
  target = record.get("target")
  if target is not None and not isinstance(target, str):
    raise InputError(path, "\"target\" must be a string, got "
                     f"{_json_type(target)}", where=where)
  if require_answers and target is None and not answers:
    raise InputError(path, "no \"target\" and no \"answers\": nothing to "
                     "train or evaluate on", where=where)
  ctxs = record.get("ctxs")
  if ctxs is None:
    ctxs = []
  if not isinstance(ctxs, list):
    raise InputError(path, "\"ctxs\" must be a list of passages, got "
                     f"{_json_type(ctxs)}", where=where)
  return FidExample(
      question=question, answers=tuple(answers), target=target,
      ctxs=tuple(_passage(c, k, path, where) for k, c in enumerate(ctxs)),
      id=_optional_id(record.get("id"), "\"id\"", path, where))


# -------------------------------------------------------------------- reading


def _decode(line: bytes, path, lineno: int) -> str:
  try:
    return line.decode("utf-8")
  except UnicodeDecodeError as e:
    raise InputError(path, f"not UTF-8 text (byte {line[e.start]:#04x} at "
                     f"column {e.start + 1})", where=lineno) from None


def _read_json_list(head: bytes, stream, path,
                    require_answers: bool) -> Iterator[FidExample]:
  data = head + stream.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    lineno = data.count(b"\n", 0, e.start) + 1
    raise InputError(path, f"not UTF-8 text (byte {data[e.start]:#04x})",
                     where=lineno) from None
  del data
  try:
    records = json.loads(text)
  except json.JSONDecodeError as e:
    raise InputError(path, f"invalid JSON: {e.msg} (column {e.colno})",
                     where=e.lineno) from None
  del text
  if not records:
    raise InputError(path, "no examples (the JSON list is empty)")
  for k, record in enumerate(records):
    yield parse_record(record, path, f"record {k + 1}", require_answers)


def _read_jsonl(first: tuple[int, bytes], lines, path,
                require_answers: bool) -> Iterator[FidExample]:
  def numbered():
    yield first
    yield from lines
  for lineno, raw in numbered():
    line = _decode(raw, path, lineno)
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      hint = ""
      if lineno == first[0] and line.strip() == "{":
        hint = "; a JSON file must hold a list of records or one per line"
      raise InputError(path, f"invalid JSON: {e.msg} (column {e.colno})"
                       f"{hint}", where=lineno) from None
    yield parse_record(record, path, lineno, require_answers)


def _read_qa_tsv(first: tuple[int, bytes], lines, path,
                 require_answers: bool) -> Iterator[FidExample]:
  text = ((lineno, _decode(raw, path, lineno).rstrip("\r\n"))
          for lineno, raw in itertools.chain([first], lines))
  for position, (lineno, (question, answers)) in enumerate(
      qa_lines(text, path, "like the lines before")):
    if require_answers and not answers:
      raise InputError(path, "no answers: nothing to train or evaluate on",
                       where=lineno)
    yield FidExample(question=question, answers=tuple(answers),
                     id=str(position))


def iter_fid_examples(path: str | os.PathLike,
                      require_answers: bool = False) -> Iterator[FidExample]:
  """Yields the validated examples of a FiD JSON / JSONL (/ .gz) file
  (:func:`read_fid_examples`)."""
  path = os.fspath(path)
  stream = open_binary(path, expected="a FiD JSON or JSONL file")
  try:
    lines = enumerate(stream, start=1)
    first = None
    for lineno, line in lines:
      if lineno == 1 and line.startswith(_BOM):
        line = line[len(_BOM):]
      if line.strip():
        first = (lineno, line)
        break
    if first is None:
      raise InputError(path, "empty file: no examples")
    if first[1].lstrip().startswith(b"["):
      # a JSON list: everything before `first` was blank
      yield from _read_json_list(first[1], stream, path, require_answers)
    elif not first[1].lstrip().startswith(b"{") and split_qa_line(
        _decode(first[1], path, first[0]).rstrip("\r\n")) is not None:
      yield from _read_qa_tsv(first, lines, path, require_answers)
    else:
      yield from _read_jsonl(first, lines, path, require_answers)
  except (gzip.BadGzipFile, EOFError, zlib.error) as e:
    raise InputError(path, f"corrupt gzip file: {e}") from None
  finally:
    stream.close()


def read_fid_examples(path: str | os.PathLike, *,
                      require_answers: bool = False,
                      n_context: int | None = None,
                      limit: int | None = None) -> list[FidExample]:
  """The validated examples of a FiD JSON / JSONL file (gzip allowed), in
  file order. ``require_answers``: each needs a target or an answer;
  ``n_context``: keep only the passages :func:`format_passages` would use;
  ``limit``: at most this many. InputError naming the file and line /
  record for a missing, empty, non-UTF-8, non-JSON or malformed file."""
  out = []
  examples = iter_fid_examples(path, require_answers=require_answers)
  try:
    for example in itertools.islice(examples, limit):
      if n_context is not None:
        example = dataclasses.replace(
            example, ctxs=tuple(sorted_passages(example)[:n_context]))
      out.append(example)
  finally:
    examples.close()  # closes the file when `limit` stopped early
  return out


# -------------------------------------------------------------------- writing


def example_to_record(example: FidExample) -> dict:
  """The JSON record of an example (inverse of :func:`parse_record`)."""
  record = {"question": example.question, "answers": list(example.answers)}
  if example.id is not None:
    record = {"id": example.id, **record}
  if example.target is not None:
    record["target"] = example.target
  ctxs = []
  for p in example.ctxs:
    ctx = {"title": p.title, "text": p.text}
    if p.score is not None:
      ctx["score"] = p.score
    if p.id is not None:
      ctx["id"] = p.id
    ctxs.append(ctx)
  record["ctxs"] = ctxs
  return record


def write_fid_examples(path: str | os.PathLike,
                       examples: Sequence[FidExample]) -> None:
  """Writes examples atomically: JSONL unless the name ends in ``.json``;
  ``.gz`` compresses (``x.json.gz`` is a gzip JSON list)."""
  path = os.fspath(path)
  name = path[:-3] if path.endswith(".gz") else path
  as_list = name.endswith(".json")
  with atomic_write(path, "wb") as raw:
    f = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if path.endswith(
        ".gz") else raw
    records = (example_to_record(e) for e in examples)
    if as_list:
      f.write(json.dumps(list(records), ensure_ascii=False,
                         indent=1).encode("utf-8"))
      f.write(b"\n")
    else:
      for r in records:
        f.write(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n")
    if f is not raw:
      f.close()


def sorted_passages(example: FidExample) -> list[Passage]:
  """Passages by score, descending and stable; unscored ones keep their order
  after the scored ones (all unscored: file order)."""
  return sorted(example.ctxs,
                key=lambda p: -p.score if p.score is not None else math.inf)
