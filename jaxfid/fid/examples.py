"""FiD question files: read and validate, format passages, tokenize.

The format is the one of facebookresearch/FiD (README "Data format"): a list of
records ::

  {"id": "0", "question": "...", "target": "...", "answers": ["...", ...],
   "ctxs": [{"title": "...", "text": "...", "score": 12.3, "id": "..."}, ...]}

stored either as one JSON list or as JSONL (one record per line), optionally
gzip-compressed. The reader decides by content, not by name: if the first
non-blank character is ``[`` the file is a JSON list, otherwise JSONL; gzip is
recognised by its magic bytes. JSONL is streamed line by line, so large
retrieval outputs need not fit in memory twice.

Only ``question`` is required. ``answers`` defaults to ``[]`` (prediction
needs none; the NQ-open spelling ``answer`` is accepted when ``answers`` is
absent), ``target`` to None, ``ctxs`` to ``[]``, a passage's ``title`` to
``""`` and its ``score`` / ``id`` to None. Scores may be numbers or numeric
strings (DPR writes ``"score": "80.3"``; FiD calls ``float()`` on them). Ids
may be strings or integers and are kept as strings. Anything else raises
:class:`~jaxfid.core.errors.InputError` naming the file and the JSONL line (or
``record N``, counted from 1, in a JSON list).

The model input follows FiD's ``Dataset`` and ``Collator`` (``src/data.py``):
passages sorted by score, descending and stable (FiD gives score-less passages
one shared score, which keeps their order; here unscored passages also follow
all scored ones), the first ``n_context`` kept, each rendered as
``"question: Q title: T context: P"``; an example without passages is the
question alone (``"question: Q"``). Each string is tokenized, truncated to
``text_maxlength`` and padded with 0; with ``passage_eos`` (the default) it
ends with EOS, kept on truncation (what T5 tokenizers of transformers >= 3.1
and seqio do); without, it is cut at ``text_maxlength`` tokens and has no EOS
(FiD pinned transformers 3.0.2, whose T5 tokenizer appended none: its
published readers were trained so). Missing passages are all-zero rows with
a False mask. Targets are ``target`` if given, else an answer drawn
uniformly with a NumPy generator (FiD: ``random.choice``); for TriviaQA an
all-uppercase answer is title-cased, as FiD's preprocessing does. Targets
always end with EOS (FiD appended ``" </s>"`` to them explicitly).
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

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.core.files import atomic_write
from jaxfid.core.textio import open_binary
from jaxfid.core.tokenization import (
    DECODER_START_ID, PAD_ID, Tokenizer, encode_padded)

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
  """Validates one decoded JSON record and returns its :class:`FidExample`.

  Args:
    record: the decoded JSON value.
    path: the file it came from (for errors).
    where: its line number (int) or a description such as ``"record 3"``.
    require_answers: the record must have a ``target`` or an answer.

  Returns:
    the example.

  Raises:
    InputError: the record does not follow the FiD format.
  """
  if not isinstance(record, dict):
    raise InputError(path, "expected a JSON object with a \"question\", got "
                     f"{_json_type(record)}", where=where)
  if "question" not in record:
    raise InputError(path, "\"question\" is missing", where=where)
  question = record["question"]
  if not isinstance(question, str):
    raise InputError(path, "\"question\" must be a string, got "
                     f"{_json_type(question)}", where=where)
  key = "answers" if "answers" in record or "answer" not in record else "answer"
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


def iter_fid_examples(path: str | os.PathLike,
                      require_answers: bool = False) -> Iterator[FidExample]:
  """Yields the examples of a FiD JSON / JSONL (/ .gz) file, validating each.

  See :func:`read_fid_examples`.

  Raises:
    InputError: a missing, empty, non-UTF-8, corrupt or malformed file.
  """
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
  """Reads and validates a FiD JSON / JSONL file (gzip allowed).

  Args:
    path: the file.
    require_answers: every example must have a ``target`` or at least one
      answer (training and evaluation need one).
    n_context: if given, keep only the passages :func:`format_passages` would
      use (the ``n_context`` best by score), to save memory.
    limit: read at most this many examples.

  Returns:
    the examples, in file order.

  Raises:
    InputError: the file is missing, empty, not UTF-8, not JSON, or a record
      is malformed; the message names the file and line / record.
  """
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
  """Writes examples atomically: JSONL unless the name ends in ``.json``.

  A ``.gz`` suffix compresses (``x.json.gz`` is a gzip JSON list). The file is
  written next to its destination and renamed into place at the end.
  """
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


# ------------------------------------------------------------ model inputs


def sorted_passages(example: FidExample) -> list[Passage]:
  """Passages by score, descending and stable; unscored ones keep their order
  after the scored ones (all unscored: file order)."""
  return sorted(example.ctxs,
                key=lambda p: -p.score if p.score is not None else math.inf)


def format_passages(example: FidExample, n_context: int) -> list[str]:
  """FiD encoder strings: ``"question: Q title: T context: P"`` per passage.

  Args:
    example: the example.
    n_context: the number of passages to keep (the best by score).

  Returns:
    ``min(n_context, len(ctxs))`` strings, or ``["question: Q"]`` when the
    example has no passages.
  """
  if n_context < 1:
    raise ValueError(f"n_context must be at least 1, got {n_context}")
  question = f"{QUESTION_PREFIX} {example.question}"
  if not example.ctxs:
    return [question]
  return [f"{question} {TITLE_PREFIX} {p.title} {PASSAGE_PREFIX} {p.text}"
          for p in sorted_passages(example)[:n_context]]


def encode_examples(tokenizer: Tokenizer, examples: Sequence[FidExample],
                    n_context: int, text_maxlength: int,
                    passage_eos: bool = True
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Encoder inputs of a batch: tokens int32 ``[B, n_context, L]`` and mask.

  Every passage string is cut to ``text_maxlength`` tokens and padded with
  0; with ``passage_eos`` it ends with EOS inside that length (see the module
  docstring). Passages an example lacks are all-zero rows with mask False.

  Returns:
    ``(tokens, passage_mask)`` with shapes ``[B, n_context, text_maxlength]``
    (int32) and ``[B, n_context]`` (bool).
  """
  texts = [format_passages(e, n_context) for e in examples]
  flat = encode_padded(tokenizer, [t for ts in texts for t in ts],
                       text_maxlength, add_eos=passage_eos)
  tokens = np.zeros((len(examples), n_context, text_maxlength), np.int32)
  mask = np.zeros((len(examples), n_context), bool)
  start = 0
  for b, ts in enumerate(texts):
    tokens[b, :len(ts)] = flat[start:start + len(ts)]
    mask[b, :len(ts)] = True
    start += len(ts)
  return tokens, mask


def encode_example(tokenizer: Tokenizer, example: FidExample, n_context: int,
                   text_maxlength: int, passage_eos: bool = True
                   ) -> tuple[np.ndarray, np.ndarray]:
  """:func:`encode_examples` of one example: ``[n_context, L]``, ``[n_context]``.
  """
  tokens, mask = encode_examples(tokenizer, [example], n_context,
                                 text_maxlength, passage_eos)
  return tokens[0], mask[0]


def choose_target(example: FidExample, rng: np.random.Generator,
                  dataset: str = "nq") -> str:
  """The training target: ``target`` if given, else a uniform random answer.

  For ``dataset == "trivia_qa"`` an all-uppercase sampled answer is
  title-cased (``"THE BEATLES"`` -> ``"The Beatles"``), as FiD's TriviaQA
  preprocessing does; an explicit ``target`` is used verbatim.

  Raises:
    ValueError: the example has neither a target nor answers (read files
      with ``require_answers=True`` to report this as an InputError).
  """
  if example.target is not None:
    return example.target
  if not example.answers:
    raise ValueError(f"example {example.id or example.question!r} has no "
                     "target and no answers")
  answer = example.answers[int(rng.integers(len(example.answers)))]
  if dataset == TRIVIA_QA:
    answer = title_case_if_upper(answer)
  return answer


def title_case_if_upper(text: str) -> str:
  """FiD's TriviaQA casing: an all-uppercase text is title-cased
  (``"THE BEATLES"`` -> ``"The Beatles"``, ``"DON'T"`` -> ``"Don'T"``,
  Python's ``str.title``); any other text is returned as it is."""
  return text.title() if text.isupper() else text


def encode_target(tokenizer: Tokenizer, text: str,
                  target_maxlength: int) -> np.ndarray:
  """Target ids int32 ``[target_maxlength]``: EOS kept on truncation, 0-pad.
  """
  return encode_padded(tokenizer, [text], target_maxlength)[0]


def target_candidates(example: FidExample, dataset: str = "nq") -> list[str]:
  """Every text :func:`choose_target` can return for ``example``."""
  if example.target is not None:
    return [example.target]
  if dataset == TRIVIA_QA:
    return [title_case_if_upper(a) for a in example.answers]
  return list(example.answers)


def longest_target_length(tokenizer: Tokenizer,
                          examples: Sequence[FidExample],
                          dataset: str = "nq") -> int:
  """Tokens of the longest target :func:`choose_target` can draw, EOS
  included (at least 1): the fixed target length that truncates nothing."""
  texts = [t for e in examples for t in target_candidates(e, dataset)]
  return 1 + max((len(ids) for ids in tokenizer.encode_batch(texts)),
                 default=0)


def decoder_inputs_from_targets(targets) -> np.ndarray:
  """Teacher-forcing decoder inputs: targets shifted right along the last axis.

  Position 0 gets the decoder start id (0); negative ids (label padding such
  as -100) become PAD.
  """
  targets = np.asarray(targets)
  if targets.ndim < 1:
    raise ValueError("targets must have at least one axis")
  out = np.full(targets.shape, DECODER_START_ID, dtype=np.int32)
  out[..., 1:] = np.where(targets[..., :-1] < 0, PAD_ID, targets[..., :-1])
  return out
