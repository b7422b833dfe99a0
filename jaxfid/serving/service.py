"""The question-answering service behind ``jaxfid serve``'s HTTP routes,
knowing no HTTP: :func:`parse_request` checks a body (RequestError with its
4xx status), :meth:`QaService.answer` retrieves each question's passages off
the event loop, hands them to the batcher and builds the response. The
passages are made as ``jaxfid retrieve`` writes and ``jaxfid predict`` reads
them (float32 scores), so the tokens are the same.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import time
from typing import Any, Sequence

from jaxfid.reader.examples import FidExample, parse_record, sorted_passages
from jaxfid.retrieval.runs import fid_example
from jaxfid.retrieval.search import Searcher
from jaxfid.retrieval.store.queries import Query
from jaxfid.serving.batcher import Batcher, Read

MAX_BODY_BYTES = 1 << 20
MAX_QUESTION_CHARS = 2000
MAX_BATCH_QUESTIONS = 256
ANSWER_FIELDS = ("question", "n_context", "beam_size", "attention")
BATCH_FIELDS = ("questions", "n_context", "beam_size", "attention")
# A question the index found no passage for is not read: a reader given only
# padding would still answer, with nothing to back the answer.
NO_PASSAGES = ("no passage was retrieved for this question (none of its "
               "terms is in the index), so the reader did not answer")


class RequestError(Exception):
  """A bad request: ``status`` (4xx) and a one-line ``message``."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status, self.message = status, message


@dataclasses.dataclass(frozen=True)
class AnswerRequest:
  """A checked request: its questions, passages to read, beam size, and
  whether to return the reader's attention over the passages' tokens."""
  questions: tuple[str, ...]
  n_context: int
  beam_size: int
  attention: bool = False


def _json_type(value) -> str:
  return {bool: "a boolean", int: "a number", float: "a number",
          str: "a string", list: "an array", dict: "an object",
          type(None): "null"}.get(type(value), type(value).__name__)


def _question(value, name: str) -> str:
  if not isinstance(value, str):
    raise RequestError(400, f'"{name}" must be a string, got '
                       f"{_json_type(value)}")
  if not value.strip():
    raise RequestError(400, f'"{name}" is empty')
  if len(value) > MAX_QUESTION_CHARS:
    raise RequestError(413, f'"{name}" has {len(value)} characters; at most '
                       f"{MAX_QUESTION_CHARS}")
  return value


def _count(record: dict, name: str, default: int, allowed: Sequence[int],
           flag: str) -> int:
  value = record.get(name, default)
  if isinstance(value, bool) or not isinstance(value, int):
    raise RequestError(400, f'"{name}" must be an integer, got '
                       f"{_json_type(value)}")
  if value not in allowed:
    low, high = min(allowed), max(allowed)
    raise RequestError(400, f'"{name}" must be between {low} and {high} '
                       f"(the server's {flag}), got {value}")
  return value


def parse_request(body: bytes, *, batch: bool, n_context: int,
                  beam_sizes: Sequence[int],
                  default_beam: int) -> AnswerRequest:
  """Checks the body of ``POST /v1/answer`` (``batch``: ``/v1/answer:batch``)
  against the server's ``n_context``, compiled ``beam_sizes`` and
  ``default_beam``: RequestError (400; 413 for sizes) for anything that is
  not an object of known, well-typed fields in range."""
  if len(body) > MAX_BODY_BYTES:
    raise RequestError(413, f"the body has {len(body)} bytes; at most "
                       f"{MAX_BODY_BYTES}")
  try:
    record = json.loads(body)
  except (ValueError, UnicodeDecodeError) as e:
    raise RequestError(400, f"the body is not JSON: {e}") from None
  if not isinstance(record, dict):
    raise RequestError(400, "the body must be a JSON object, got "
                       f"{_json_type(record)}")
  fields = BATCH_FIELDS if batch else ANSWER_FIELDS
  unknown = sorted(set(record) - set(fields))
  if unknown:
    raise RequestError(400, f"unknown field {unknown[0]!r}; the fields are "
                       + ", ".join(fields))
  if batch:
    if "questions" not in record:
      raise RequestError(400, '"questions" is missing')
    items = record["questions"]
    if not isinstance(items, list):
      raise RequestError(400, '"questions" must be an array of strings, got '
                         f"{_json_type(items)}")
    if not items:
      raise RequestError(400, '"questions" is empty')
    if len(items) > MAX_BATCH_QUESTIONS:
      raise RequestError(413, f'"questions" has {len(items)} questions; at '
                         f"most {MAX_BATCH_QUESTIONS}")
    questions = tuple(_question(q, f"questions[{i}]")
                      for i, q in enumerate(items))
  else:
    if "question" not in record:
      raise RequestError(400, '"question" is missing')
    questions = (_question(record["question"], "question"),)
  attention = record.get("attention", False)
  if not isinstance(attention, bool):
    raise RequestError(400, '"attention" must be a boolean (true or false), '
                       f"got {_json_type(attention)}")
  return AnswerRequest(
      questions,
      _count(record, "n_context", n_context, range(1, n_context + 1),
             "--n-context"),
      _count(record, "beam_size", default_beam, beam_sizes, "--beam-size"),
      attention)


def example_titles(store: Sequence, count: int = 4) -> list[str]:
  """Up to ``count`` distinct non-empty titles of an index's passages, taken
  at evenly spaced rows (the page's example questions ask about them)."""
  n = len(store)
  titles: list[str] = []
  for row in sorted({k * n // count for k in range(count)} if n else ()):
    title = store[row].title.strip()
    if title and title not in titles:
      titles.append(title)
  return titles


def _ms(seconds: float) -> float:
  return round(1000 * seconds, 3)


class QaService:
  """Retrieval and reading of questions from ``searcher`` (an open index)
  through ``batcher`` (started); requests may ask for up to ``n_context``
  passages and beam sizes 1 .. ``beam_size``."""

  def __init__(self, searcher: Searcher, batcher: Batcher, *, n_context: int,
               beam_size: int):
    self.searcher, self.batcher = searcher, batcher
    self.n_context, self.beam_size = n_context, beam_size
    # One thread: searchers are not known to be thread-safe (stemmers,
    # query encoders); it keeps retrieval off the event loop.
    self._retrieval = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="jaxfid-retrieve")

  def parse(self, body: bytes, batch: bool) -> AnswerRequest:
    """:func:`parse_request` with this server's limits."""
    return parse_request(body, batch=batch, n_context=self.n_context,
                         beam_sizes=self.batcher.beam_sizes,
                         default_beam=self.beam_size)

  def retrieve(self, questions: Sequence[str],
               n_context: int) -> list[FidExample]:
    """Each question's ``n_context`` best passages, as ``jaxfid retrieve``
    writes them to FiD JSON and ``jaxfid predict`` reads them back."""
    hits = self.searcher.search(list(questions), n_context)
    return [parse_record(fid_example(Query(str(i), q), found,
                                     self.searcher.store), "request",
                         f"questions[{i}]")
            for i, (q, found) in enumerate(zip(questions, hits))]

  async def answer(self, request: AnswerRequest) -> list[dict[str, Any]]:
    """The response object of each question of ``request``, in order."""
    start = time.perf_counter()
    loop = asyncio.get_running_loop()
    examples = await loop.run_in_executor(
        self._retrieval, self.retrieve, request.questions, request.n_context)
    retrieved = time.perf_counter()
    read = [e for e in examples if e.ctxs]
    futures = [self.batcher.submit(e, request.beam_size, attention=True)
               if request.attention else
               self.batcher.submit(e, request.beam_size) for e in read]
    results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    answered = iter(results)  # in the order of `read`
    reads = [next(answered) if e.ctxs else None for e in examples]
    done = time.perf_counter()
    timings = {"retrieve": _ms(retrieved - start),
               "read": _ms(done - retrieved), "total": _ms(done - start)}
    return [response(e, r, timings) for e, r in zip(examples, reads)]

  def close(self) -> None:
    self._retrieval.shutdown(wait=True)


def response(example: FidExample, read: Read | None,
             timings: dict[str, float]) -> dict[str, Any]:
  """One question's answer: the passages read (input order, the retrieval
  ranking) with both scores and the timings; with none retrieved,
  ``"answer": null`` and a ``"notice"`` saying why. With the reader's
  attention, ``"answer_tokens"`` and each passage's ``"attention"``."""
  if read is None:
    return {"question": example.question, "answer": None, "passages": [],
            "notice": NO_PASSAGES, "batch_size": 0,
            "timings_ms": dict(timings)}
  passages = sorted_passages(example)[:len(read.reader_scores)]
  shown = [{"rank": k + 1, "id": p.id, "title": p.title, "text": p.text,
            "retrieval_score": p.score, "reader_score": s}
           for k, (p, s) in enumerate(zip(passages, read.reader_scores))]
  out = {"question": example.question, "answer": read.answer,
         "notice": None, "passages": shown,
         "batch_size": read.batch_size, "timings_ms": dict(timings)}
  if read.attention is not None:
    out["answer_tokens"] = read.attention["answer_tokens"]
    for passage, weights in zip(shown, read.attention["passages"]):
      passage["attention"] = weights
  return out
