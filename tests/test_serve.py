"""`jaxfid serve` end to end (slow: it trains a tiny FiD and compiles): one
server per module, on a BM25 index and a checkpoint trained on tiny_fid's
questions.

Its answers equal `jaxfid retrieve` + `jaxfid predict --passage-scores` on
the same questions (the same passages, tokens and reader scores); concurrent
clients get what one client at a time gets, in shared batches; bad requests
leave it serving; the page shows the answer and the passages in headless
Chromium (the screenshot stays in the test's tmp directory); SIGTERM
finishes the request in flight and exits 0.
"""
import concurrent.futures
import html
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from jaxfid.cli import main
from tiny_fid import WORDS

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THINGS = 20
N_CONTEXT, TEXT_MAXLENGTH, DECODE_MAXLENGTH = 3, 20, 4


def _question(i):
  return f"what is thing {i}?"


def _write_world(directory):
  """A corpus (three passages about each thing, one with its answer) and
  the questions about the things, as JSONL."""
  with open(directory / "corpus.jsonl", "w") as f:
    for i in range(THINGS):
      for j in range(3):
        word = WORDS[(i + j) % len(WORDS)]
        text = (f"the thing {i} is {word}" if j == 0 else
                f"a thing {i} likes {word}")
        f.write(json.dumps({"_id": f"p{i}_{j}", "title": f"thing {i}",
                            "text": text}) + "\n")
  with open(directory / "questions.jsonl", "w") as f:
    for i in range(THINGS):
      f.write(json.dumps({"id": str(i), "question": _question(i),
                          "answers": [WORDS[i % len(WORDS)]]}) + "\n")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """The index, the retrieved training data and a checkpoint trained on it
  (60 steps: it answers the questions)."""
  d = tmp_path_factory.mktemp("serve_world")
  _write_world(d)
  assert main(["index", "bm25", "--corpus", str(d / "corpus.jsonl"),
               "--output", str(d / "index")]) == 0
  assert main(["retrieve", "--index", str(d / "index"), "--queries",
               str(d / "questions.jsonl"), "--top-k", str(N_CONTEXT),
               "--output", str(d / "retrieved.json")]) == 0
  assert main([
      "train", "--gin_file=gin/fid/tiny.gin", f"--gin.MODEL_DIR='{d}/model'",
      f"--gin.TRAIN_DATA='{d}/retrieved.json'", "--gin.TRAIN_STEPS=60",
      "--gin.BATCH_SIZE=8", f"--gin.N_CONTEXT={N_CONTEXT}",
      f"--gin.TEXT_MAXLENGTH={TEXT_MAXLENGTH}",
      f"--gin.ANSWER_MAXLENGTH={DECODE_MAXLENGTH}", "--gin.EVAL_EVERY=60",
      "--gin.CHECKPOINT_EVERY=60", "--gin.LEARNING_RATE=3e-3",
      "--gin.DROPOUT_RATE=0.0", "--gin.MESH='data=1'",
      "--gin.loop.train.progress=False"]) == 0
  return d


def _get(url, timeout=30):
  try:
    with urllib.request.urlopen(url, timeout=timeout) as r:
      return r.status, r.read().decode()
  except urllib.error.HTTPError as e:
    return e.code, e.read().decode()


def _post(url, body, timeout=60):
  data = body if isinstance(body, bytes) else json.dumps(body).encode()
  request = urllib.request.Request(url, data=data, method="POST", headers={
      "content-type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


class Server:
  """A `jaxfid serve` process and its URL."""

  def __init__(self, world, tmp):
    self.log = tmp / "serve.log"
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "jaxfid.cli", "serve", "--checkpoint",
         str(world / "model"), "--index", str(world / "index"), "--port", "0",
         "--n-context", str(N_CONTEXT), "--text-maxlength",
         str(TEXT_MAXLENGTH), "--decode-maxlength", str(DECODE_MAXLENGTH),
         "--max-batch", "4", "--max-wait-ms", "100"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
        stdout=subprocess.PIPE, stderr=open(self.log, "w"), text=True)
    # While it loads: the URL on stderr, /healthz 503.
    self.loading = []
    deadline = time.time() + 300
    while not (m := re.search(r"listening on (http://\S+),",
                              self.log.read_text())):
      assert self.proc.poll() is None and time.time() < deadline, self.stderr
      time.sleep(0.05)
    self.url = m.group(1)
    self.loading.append(_get(self.url + "healthz")[0])
    ready = self.proc.stdout.readline()  # the one line, once compiled
    assert ready == f"jaxfid serve: ready at {self.url}\n", self.stderr

  @property
  def stderr(self):
    return self.log.read_text()

  def stop(self):
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()


@pytest.fixture(scope="module")
def server(world, tmp_path_factory):
  s = Server(world, tmp_path_factory.mktemp("serve"))
  yield s
  s.stop()


def test_it_reports_loading_then_ready(server):
  assert server.loading == [503]
  assert _get(server.url + "healthz") == (200, '{"status":"ready"}')
  assert "compiled 2 programs" in server.stderr  # buckets 1 and 4, beam 1


def _retrieve_and_predict(world, tmp_path, questions, flag: str) -> None:
  """``jaxfid retrieve`` then ``jaxfid predict FLAG`` of ``questions``, as
  the server reads them: tmp_path/run.json and tmp_path/pred.jsonl."""
  queries = tmp_path / "q.jsonl"
  queries.write_text("".join(json.dumps({"id": str(i), "question": q}) + "\n"
                             for i, q in enumerate(questions)))
  assert main(["retrieve", "--index", str(world / "index"), "--queries",
               str(queries), "--top-k", str(N_CONTEXT), "--output",
               str(tmp_path / "run.json")]) == 0
  assert main(["predict", "--checkpoint", str(world / "model"), "--data",
               str(tmp_path / "run.json"), "--n-context", str(N_CONTEXT),
               "--text-maxlength", str(TEXT_MAXLENGTH), "--decode-maxlength",
               str(DECODE_MAXLENGTH), flag, "--output",
               str(tmp_path / "pred.jsonl")]) == 0


def test_answers_equal_retrieve_and_predict(server, world, tmp_path):
  questions = [_question(i) for i in range(8)]
  _retrieve_and_predict(world, tmp_path, questions, "--passage-scores")
  retrieved = json.loads((tmp_path / "run.json").read_text())
  predicted = [json.loads(line) for line in
               (tmp_path / "pred.jsonl").read_text().splitlines()]
  right = 0
  for question, run, pred in zip(questions, retrieved, predicted):
    status, got = _post(server.url + "v1/answer", {"question": question})
    assert status == 200, got
    assert got["answer"] == pred["prediction"]
    right += got["answer"] == WORDS[int(question.split()[-1][:-1]) % 10]
    assert [(p["id"], p["title"], p["text"], p["retrieval_score"])
            for p in got["passages"]] == [
                (c["id"], c["title"], c["text"], c["score"])
                for c in run["ctxs"]]
    assert [p["rank"] for p in got["passages"]] == [1, 2, 3]
    assert [p["reader_score"] for p in got["passages"]] == pytest.approx(
        pred["passage_scores"], abs=1e-5)
    assert set(got["timings_ms"]) == {"retrieve", "read", "total"}
  assert right >= 6  # the tiny reader learned the things


def test_concurrent_clients_get_what_one_at_a_time_gets(server):
  questions = [_question(i) for i in range(THINGS)]
  alone = [_post(server.url + "v1/answer", {"question": q})[1]
           for q in questions]
  with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
    together = list(pool.map(
        lambda q: _post(server.url + "v1/answer", {"question": q})[1],
        questions))

  def answers(results):
    return [(r["answer"], [p["id"] for p in r["passages"]],
             [round(p["reader_score"], 5) for p in r["passages"]])
            for r in results]
  assert answers(together) == answers(alone)
  assert max(r["batch_size"] for r in together) > 1  # they shared batches
  status, batch = _post(server.url + "v1/answer:batch",
                        {"questions": questions[:6]})
  assert status == 200 and answers(batch["answers"]) == answers(alone[:6])
  _, metrics = _get(server.url + "metrics")
  assert re.search(r'jaxfid_serve_batches_total\{bucket="4"\} [1-9]',
                   metrics), metrics


def test_bad_requests_leave_it_serving(server):
  for body, status in [(b"{", 400), (b"{}", 400), (b'{"question": ""}', 400),
                       ({"question": "x" * 100_000}, 413),
                       ({"question": "q", "n_context": -1}, 400),
                       ({"question": "q", "n_context": 10**9}, 400),
                       ({"question": ["q"]}, 400),
                       ({"questions": "q"}, 400)]:
    got, content = _post(server.url + "v1/answer", body)
    assert got == status and content["error"], (body, content)
  assert _post(server.url + "nowhere", {"question": "q"})[0] == 404
  assert _get(server.url + "nowhere")[0] == 404
  status, got = _post(server.url + "v1/answer",
                      {"question": _question(3), "n_context": 1})
  assert status == 200 and len(got["passages"]) == 1
  assert server.proc.poll() is None


def test_a_question_with_no_passage_retrieved_is_not_answered(server):
  status, got = _post(server.url + "v1/answer",
                      {"question": "who wrote xylophonic quuxes?"})
  assert status == 200 and got["answer"] is None and got["passages"] == []
  assert got["notice"].startswith("no passage was retrieved")
  status, got = _post(server.url + "v1/answer:batch", {"questions": [
      "who wrote xylophonic quuxes?", _question(2)]})
  assert status == 200
  assert [a["answer"] is None for a in got["answers"]] == [True, False]


def test_attention_equals_predict_attention(server, world, tmp_path):
  """"attention": true gives `jaxfid predict --attention`'s shares."""
  question = _question(4)
  _retrieve_and_predict(world, tmp_path, [question], "--attention")
  pred = json.loads((tmp_path / "pred.jsonl").read_text())
  status, got = _post(server.url + "v1/answer",
                      {"question": question, "attention": True})
  assert status == 200 and got["answer_tokens"] == pred["answer_tokens"]
  for passage, want in zip(got["passages"], pred["attention"], strict=True):
    assert passage["id"] == want["id"]
    assert passage["attention"]["tokens"] == want["tokens"]
    assert passage["attention"]["weights"] == pytest.approx(want["weights"],
                                                            abs=1e-5)


def test_the_page_shows_the_answer_and_the_passages(server, world, tmp_path):
  chromium = shutil.which("chromium") or shutil.which("chromium-browser")
  if chromium is None:
    pytest.skip("no chromium (.ci/run installs Debian's chromium)")
  question = _question(7)
  page = f"{server.url}?q={urllib.parse.quote(question)}"
  flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
           "--virtual-time-budget=20000", "--window-size=1000,1400"]
  dom = subprocess.run(flags + ["--dump-dom", page], capture_output=True,
                       text=True, timeout=120).stdout
  _, expected = _post(server.url + "v1/answer",
                      {"question": question, "attention": True})
  answer = expected["answer"]
  assert re.search(rf'<p id="answer">{re.escape(answer)}</p>', dom), dom
  # the header and the controls, from GET /v1/info
  assert re.search(rf'<p id="info" class="dim">model {re.escape(str(world))}'
                   r"/model · index .*/index \(bm25, 60 passages\)", dom), dom
  options = re.search(r'<select id="n-context"[^>]*>(.*?)</select>', dom)
  assert re.findall(r"<option[^>]*>(\d+)</option>", options.group(1)) == [
      "1", "2", "3"]
  assert re.findall(r'<button class="example"[^>]*>([^<]*)</button>', dom)[
      0] == "what is thing 0?"
  items = re.findall(r'<li class="passage">(.*?)</li>', dom)
  assert len(items) == len(expected["passages"]) == N_CONTEXT
  best = max(expected["passages"], key=lambda p: p["reader_score"])
  assert f"retrieval rank {best['rank']}" in items[0]  # by reader score
  # the bar is the reader's weight on an absolute scale (scores sum to 1)
  width = re.search(r'class="bar"[^>]*><span style="width: ([\d.]+)%;"',
                    items[0])
  assert width, items[0]
  assert abs(float(width.group(1)) - 100 * best["reader_score"]) < 0.051
  assert f"while answering {best['attention']['weight']:.3f}" in items[0]
  # each token shaded by its share of the attention, on the absolute scale
  tokens = re.search(r'<p class="tokens">(.*?)</p>', items[0]).group(1)
  spans = re.findall(r"<span([^>]*)>([^<]*)</span>", tokens)
  assert [html.unescape(t) for _, t in spans] == best["attention"]["tokens"]
  colours = [re.search(r"rgba?\(245, 158, 11(?:, ([\d.]+))?\)", attrs)
             for attrs, _ in spans]  # Chromium writes alpha 1 as rgb(...)
  alphas = [0.0 if c is None else float(c.group(1) or 1) for c in colours]
  weights = best["attention"]["weights"]
  want = [min(1.0, max(0.0, (math.log10(w) + 4) / 3)) if w > 1e-4 else 0.0
          for w in weights]
  assert alphas == pytest.approx(want, abs=0.006)
  top = max(range(len(weights)), key=weights.__getitem__)
  assert alphas[top] == max(alphas) > 0  # shaded where it is highest
  assert '<details id="json-view">' in dom and "answer_tokens" in dom
  shot = tmp_path / "page.png"  # kept in pytest's tmp directory
  subprocess.run(flags + [f"--screenshot={shot}", page], capture_output=True,
                 timeout=120, check=True)
  assert shot.stat().st_size > 10_000


def test_sigterm_while_loading_exits_0(world, tmp_path):
  """Its own short-lived server: stopped while it compiles (three beam
  sizes, three buckets: nine programs), it ends after the program at hand,
  never says ready, and exits 0."""
  log = tmp_path / "serve.log"
  with open(log, "w") as err:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxfid.cli", "serve", "--checkpoint",
         str(world / "model"), "--index", str(world / "index"), "--port", "0",
         "--n-context", str(N_CONTEXT), "--text-maxlength",
         str(TEXT_MAXLENGTH), "--decode-maxlength", str(DECODE_MAXLENGTH),
         "--beam-size", "3", "--max-batch", "16"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
        stdout=subprocess.PIPE, stderr=err, text=True)
    deadline = time.time() + 300
    while "compiling the reader" not in log.read_text():
      assert proc.poll() is None and time.time() < deadline, log.read_text()
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0, log.read_text()
  assert stdout == ""  # never ready
  assert log.read_text().rstrip().endswith("jaxfid serve: stopped")


def test_sigterm_finishes_the_request_in_flight_and_exits_0(server):
  """Last: it stops the module's server. The request's headers arrive
  before SIGTERM and its body after: SIGTERM is sent once /metrics counts
  it in flight, so it is in flight when the signal lands, whatever the
  machine's load; new connections are refused meanwhile."""
  url = urllib.parse.urlsplit(server.url)
  body = json.dumps({"questions": [_question(i) for i in range(8)]}).encode()
  head = (f"POST /v1/answer:batch HTTP/1.1\r\nHost: {url.netloc}\r\n"
          "Content-Type: application/json\r\n"
          f"Content-Length: {len(body)}\r\n\r\n").encode()
  with socket.create_connection((url.hostname, url.port), timeout=60) as s:
    s.sendall(head + body[:10])
    deadline = time.time() + 60
    while "jaxfid_serve_requests_in_flight 1" not in _get(
        server.url + "metrics")[1]:
      assert time.time() < deadline, "never in flight:\n" + server.stderr
      time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 30
    while True:  # it stops accepting connections
      try:
        socket.create_connection((url.hostname, url.port), timeout=5).close()
      except OSError:
        break
      assert time.time() < deadline, "still accepting after SIGTERM"
      time.sleep(0.05)
    s.sendall(body[10:])
    response = b""
    while chunk := s.recv(65536):
      response += chunk
  status_line, _, rest = response.partition(b"\r\n")
  assert status_line == b"HTTP/1.1 200 OK", response[:500]
  answers = json.loads(rest.partition(b"\r\n\r\n")[2])["answers"]
  assert [a["question"] for a in answers] == [_question(i) for i in range(8)]
  assert server.proc.wait(timeout=60) == 0
  assert server.stderr.rstrip().endswith("jaxfid serve: stopped")
  assert "Traceback" not in server.stderr
