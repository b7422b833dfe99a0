"""`jaxfid serve` without a model (fast): request checks, error answers,
loading, internal failures, metrics, the batch buckets and the batcher's
policy (over a stand-in device read).

The routes are called as ASGI (no socket, no uvicorn) over a stand-in
service; tests/test_serve.py runs the real server on a trained checkpoint.
"""
import asyncio
import concurrent.futures
import json
import logging

import pytest

from jaxfid.reader.examples import FidExample
from jaxfid.retrieval.store.corpus import Passage
from jaxfid.serving import page
from jaxfid.serving.batcher import Batcher, Read, bucket_sizes
from jaxfid.serving.commands.serve_app import ServerState, build_app
from jaxfid.serving.metrics import Metrics
from jaxfid.serving.service import (MAX_QUESTION_CHARS, AnswerRequest,
                                        example_titles,
                                        QaService, RequestError,
                                        parse_request)

pytest.importorskip("starlette")


def _call(app, method, path, body=b""):
  """(status, decoded body, content type) of one ASGI request."""
  incoming = [{"type": "http.request", "body": body, "more_body": False}]
  sent = []

  async def receive():
    return incoming.pop(0) if incoming else {"type": "http.disconnect"}

  async def send(message):
    sent.append(message)

  scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
           "method": method, "scheme": "http", "path": path,
           "raw_path": path.encode(), "query_string": b"", "root_path": "",
           "headers": [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())],
           "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
  asyncio.run(app(scope, receive, send))
  start = next(m for m in sent if m["type"] == "http.response.start")
  headers = dict(start["headers"])
  content = b"".join(m.get("body", b"") for m in sent
                     if m["type"] == "http.response.body")
  kind = headers.get(b"content-type", b"").decode()
  return (start["status"], json.loads(content) if "json" in kind else
          content.decode(), kind)


class FakeService:
  """Answers "what is X?" with X; ``fail`` makes answering raise."""

  def __init__(self, fail=False):
    self.fail = fail

  def parse(self, body, batch):
    return parse_request(body, batch=batch, n_context=3,
                         beam_sizes=(1, 2), default_beam=1)

  async def answer(self, request: AnswerRequest):
    if self.fail:
      raise RuntimeError("the device\nfell over")
    return [{"question": q, "answer": q.split()[-1].rstrip("?"),
             "passages": [], "timings_ms": {}} for q in request.questions]


@pytest.fixture
def state():
  return ServerState(Metrics(bucket_sizes(4)), FakeService())


BAD = [
    (b"not json", 400, "not JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b"{}", 400, '"question" is missing'),
    (b'{"question": ""}', 400, '"question" is empty'),
    (b'{"question": "   "}', 400, '"question" is empty'),
    (json.dumps({"question": "x" * 100_000}).encode(), 413, "at most"),
    (b'{"question": 7}', 400, "must be a string, got a number"),
    (b'{"question": "q", "n_context": -1}', 400, "between 1 and 3"),
    (b'{"question": "q", "n_context": 0}', 400, "between 1 and 3"),
    (b'{"question": "q", "n_context": 1000000}', 400, "between 1 and 3"),
    (b'{"question": "q", "n_context": "2"}', 400, "must be an integer"),
    (b'{"question": "q", "n_context": true}', 400, "must be an integer"),
    (b'{"question": "q", "n_context": 2.5}', 400, "must be an integer"),
    (b'{"question": "q", "beam_size": 3}', 400, "between 1 and 2"),
    (b'{"question": "q", "n_ctx": 2}', 400, "unknown field 'n_ctx'"),
    (b'{"question": "q", "attention": 1}', 400,
     '"attention" must be a boolean'),
    (b'{"question": "q", "attention": "yes"}', 400,
     '"attention" must be a boolean'),
    (b"\xff\xfe", 400, "not JSON"),
]


@pytest.mark.parametrize("body, status, message", BAD)
def test_bad_requests_get_a_4xx_json_error(state, body, status, message):
  app = build_app(state)
  got, content, _ = _call(app, "POST", "/v1/answer", body)
  assert got == status and message in content["error"], content
  assert "\n" not in content["error"]


def test_the_server_goes_on_after_bad_requests(state):
  app = build_app(state)
  for body, _, _ in BAD:
    _call(app, "POST", "/v1/answer", body)
  assert _call(app, "POST", "/v1/answer",
               b'{"question": "what is paris?"}')[:2] == (
                   200, {"question": "what is paris?", "answer": "paris",
                         "passages": [], "timings_ms": {}})
  metrics = _call(app, "GET", "/metrics")[1]
  assert ('jaxfid_serve_requests_total{endpoint="/v1/answer",status="400"} '
          f"{sum(s == 400 for _, s, _ in BAD)}") in metrics
  assert ('jaxfid_serve_errors_total{endpoint="/v1/answer",status="413"} 1'
          in metrics)
  assert 'jaxfid_serve_request_seconds_count{endpoint="/v1/answer"} ' in (
      metrics)
  assert "jaxfid_serve_requests_in_flight 0" in metrics  # each one ended


def test_batch_requests(state):
  app = build_app(state)
  status, content, _ = _call(app, "POST", "/v1/answer:batch", json.dumps(
      {"questions": ["what is red?", "what is golf?"],
       "n_context": 2}).encode())
  assert status == 200
  assert [a["answer"] for a in content["answers"]] == ["red", "golf"]
  for body, message in [({"questions": []}, '"questions" is empty'),
                        ({"questions": "q"}, "must be an array"),
                        ({"questions": ["q", 3]}, '"questions[1]" must be'),
                        ({"question": "q"}, "unknown field 'question'"),
                        ({}, '"questions" is missing')]:
    status, content, _ = _call(app, "POST", "/v1/answer:batch",
                               json.dumps(body).encode())
    assert status == 400 and message in content["error"], (body, content)


def test_unknown_paths_and_methods_are_json_errors(state):
  app = build_app(state)
  assert _call(app, "GET", "/nothing")[:2] == (404, {"error": "no /nothing"})
  status, content, _ = _call(app, "GET", "/v1/answer")
  assert status == 405 and "Method Not Allowed" in content["error"]
  assert _call(app, "DELETE", "/healthz")[0] == 405


def test_loading_is_503_then_ready(state):
  service, state.service = state.service, None
  app = build_app(state)
  assert _call(app, "GET", "/healthz")[:2] == (503, {"status": "loading"})
  status, content, _ = _call(app, "POST", "/v1/answer", b'{"question": "q"}')
  assert status == 503 and "not ready" in content["error"]
  assert "jaxfid_serve_ready 0" in _call(app, "GET", "/metrics")[1]
  state.service, state.metrics.ready = service, True
  assert _call(app, "GET", "/healthz")[:2] == (200, {"status": "ready"})
  assert "jaxfid_serve_ready 1" in _call(app, "GET", "/metrics")[1]


def test_an_internal_failure_is_a_500_and_one_log_line(state, caplog):
  state.service = FakeService(fail=True)
  app = build_app(state)
  with caplog.at_level(logging.ERROR, logger="jaxfid.serve"):
    status, content, _ = _call(app, "POST", "/v1/answer", b'{"question": "q"}')
  assert status == 500 and "RuntimeError" in content["error"]
  assert [r.getMessage() for r in caplog.records] == [
      "POST /v1/answer failed: RuntimeError: the device fell over"]
  state.service = FakeService()  # the next request is served
  assert _call(app, "POST", "/v1/answer", b'{"question": "q"}')[0] == 200


def test_an_error_outside_the_answer_routes_is_one_log_line(state, caplog,
                                                           monkeypatch):
  def broken(name):
    raise OSError(f"cannot read {name}")
  monkeypatch.setattr(page, "read", broken)
  app = build_app(state)
  with caplog.at_level(logging.ERROR, logger="jaxfid.serve"):
    status, content, _ = _call(app, "GET", "/")
  assert status == 500 and content == {"error": "internal error (OSError)"}
  assert [r.getMessage() for r in caplog.records] == [
      "GET / failed: OSError: cannot read index.html"]


def test_the_page_is_served_from_the_package(state):
  app = build_app(state)
  status, html, kind = _call(app, "GET", "/")
  assert status == 200 and kind.startswith("text/html")
  assert '<script src="/static/page.js">' in html
  assert "http" not in html.replace("http-equiv", "")  # nothing from elsewhere
  for name, kind_prefix in [("page.js", "text/javascript"),
                            ("page.css", "text/css")]:
    status, text, kind = _call(app, "GET", f"/static/{name}")
    assert status == 200 and kind.startswith(kind_prefix) and text
    assert "://" not in text, name
  assert _call(app, "GET", "/static/serve.py")[0] == 404


def test_request_limits():
  ok = parse_request(json.dumps({"question": "x" * MAX_QUESTION_CHARS}
                                ).encode(), batch=False, n_context=2,
                     beam_sizes=(1,), default_beam=1)
  assert ok.n_context == 2 and ok.beam_size == 1
  with pytest.raises(RequestError) as e:
    parse_request(json.dumps({"question": "x" * (MAX_QUESTION_CHARS + 1)}
                             ).encode(), batch=False, n_context=2,
                  beam_sizes=(1,), default_beam=1)
  assert e.value.status == 413


def test_bucket_sizes_and_the_batch_histogram():
  assert bucket_sizes(16) == (1, 4, 16)
  assert bucket_sizes(10) == (1, 4, 10)
  assert bucket_sizes(1) == (1,)
  assert bucket_sizes(64) == (1, 4, 16, 64)
  metrics = Metrics(bucket_sizes(16))
  for size, bucket in [(1, 1), (3, 4), (16, 16)]:
    metrics.batch(size, bucket)
  text = metrics.text()
  assert 'jaxfid_serve_batch_size_bucket{le="1"} 1' in text
  assert 'jaxfid_serve_batch_size_bucket{le="4"} 2' in text
  assert 'jaxfid_serve_batch_size_bucket{le="+Inf"} 3' in text
  assert "jaxfid_serve_batch_size_sum 20" in text
  assert 'jaxfid_serve_batches_total{bucket="16"} 1' in text


def _batcher_recording(max_batch, max_wait_ms, fail_on=None):
  """A Batcher whose device read is a stand-in that records each batch
  (its questions and beam size); questions named ``fail_on`` raise."""
  batcher = Batcher(reader=None, n_context=1, text_maxlength=4,
                    decode_maxlength=2, beam_sizes=(1, 2), max_batch=max_batch,
                    max_wait_ms=max_wait_ms)
  batcher._programs = {(beam, bucket): None  # pylint: disable=protected-access
                       for beam in (1, 2) for bucket in batcher.buckets}
  seen = []

  def read(examples, beam_size):
    seen.append(([e.question for e in examples], beam_size))
    if fail_on in [e.question for e in examples]:
      raise RuntimeError("boom")
    return [Read(e.question.upper(), [], len(examples), max_batch)
            for e in examples]
  batcher.read = read
  return batcher, seen


def test_the_batcher_gathers_one_beam_size_up_to_max_batch():
  batcher, seen = _batcher_recording(max_batch=3, max_wait_ms=30)
  beams = [1, 1, 2, 1, 1]
  futures = [batcher.submit(FidExample(f"q{i}"), beam)
             for i, beam in enumerate(beams)]
  batcher.start()
  assert [f.result(timeout=10).answer for f in futures] == [
      f"Q{i}" for i in range(5)]
  batcher.close()
  # the oldest first, with the next ones of its beam size, at most 3
  assert seen == [(["q0", "q1", "q3"], 1), (["q2"], 2), (["q4"], 1)]
  with pytest.raises(RuntimeError, match="stopped"):
    batcher.submit(FidExample("late"), 1)
  with pytest.raises(ValueError, match="beam size 3 was not compiled"):
    _batcher_recording(3, 30)[0].submit(FidExample("q"), 3)


def test_a_failed_batch_fails_its_questions_and_the_batcher_goes_on():
  batcher, seen = _batcher_recording(max_batch=2, max_wait_ms=30,
                                     fail_on="bad")
  futures = [batcher.submit(FidExample(q), 1) for q in ("bad", "q1", "q2")]
  batcher.start()
  for future in futures[:2]:  # one batch: both fail
    with pytest.raises(RuntimeError, match="boom"):
      future.result(timeout=10)
  assert futures[2].result(timeout=10).answer == "Q2"
  batcher.close()
  assert seen == [(["bad", "q1"], 1), (["q2"], 1)]


def test_close_reads_what_is_queued():
  batcher, seen = _batcher_recording(max_batch=4, max_wait_ms=10_000)
  futures = [batcher.submit(FidExample(f"q{i}"), 1) for i in range(2)]
  batcher.start()
  batcher.close()  # does not wait the 10 s for more questions
  assert [f.result(timeout=0).answer for f in futures] == ["Q0", "Q1"]
  assert seen == [(["q0", "q1"], 1)]


class _Searcher:
  """Finds one passage for a question about Zorvane, none for any other."""
  store = [Passage("d0", "Zorvane", "Zorvane's pet is a cat.")]

  def search(self, questions, k):
    return [[(0, 3.5)] if "Zorvane" in q else [] for q in questions]


class _Batcher:
  """Reads a question as "cat", recording what it was given."""
  beam_sizes = (1,)

  def __init__(self):
    self.read = []

  def submit(self, example, beam_size):
    self.read.append(example.question)
    future = concurrent.futures.Future()
    future.set_result(Read("cat", [1.0] * len(example.ctxs), 1, 1))
    return future


def test_a_question_with_no_passage_retrieved_gets_no_answer():
  batcher = _Batcher()
  service = QaService(_Searcher(), batcher, n_context=2, beam_size=1)
  questions = ("who wrote Hamlet?", "what is the pet of Zorvane?")
  try:
    unread, read = asyncio.run(service.answer(AnswerRequest(questions, 2, 1)))
  finally:
    service.close()
  assert batcher.read == [questions[1]]  # the reader never saw the first
  assert unread["answer"] is None and unread["passages"] == []
  assert "no passage was retrieved" in unread["notice"]
  assert read["answer"] == "cat" and read["notice"] is None
  assert [p["id"] for p in read["passages"]] == ["d0"]
  # over HTTP: 200, the same body
  service = QaService(_Searcher(), batcher, n_context=2, beam_size=1)
  state = ServerState(Metrics(bucket_sizes(4)), service)
  try:
    status, body, _ = _call(build_app(state), "POST", "/v1/answer",
                            json.dumps({"question": questions[0]}).encode())
  finally:
    service.close()
  assert status == 200 and body["answer"] is None and body["notice"]


def test_info_says_what_is_served_loading_or_not(state):
  state.info = {"checkpoint": "runs/x", "n_context": 3}
  service, state.service = state.service, None
  app = build_app(state)
  assert _call(app, "GET", "/v1/info")[:2] == (
      200, {"checkpoint": "runs/x", "n_context": 3, "ready": False})
  state.service = service
  assert _call(app, "GET", "/v1/info")[1]["ready"] is True


def test_example_titles_are_distinct_titles_spread_over_the_index():
  store = [Passage(f"d{i}", f"thing {i // 3}" if i % 5 else "", "x")
           for i in range(12)]
  assert example_titles(store) == ["thing 1", "thing 2", "thing 3"]
  assert example_titles(store[:1]) == [] and example_titles([]) == []
