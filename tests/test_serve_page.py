"""`jaxfid serve`'s page script (static/page.js) run by Node over a stand-in
DOM (no browser): what it shows for a response. tests/test_serve.py checks
the page in headless Chromium where one is installed."""
import json
import os
import shutil
import subprocess

import pytest

from jaxfid.serving import page

NODE = shutil.which("node")

# The few DOM calls page.js makes, recorded on plain objects.
DOM = """
class Node {
  constructor(tag) { this.tag = tag; this.children = []; this.hidden = false;
                     this.textContent = ""; this.className = ""; this.style = {}; }
  append(...nodes) { this.children.push(...nodes); }
  replaceChildren(...nodes) { this.children = nodes; }
  addEventListener() {}
}
const nodes = {};
globalThis.document = {
  getElementById: (id) => (nodes[id] = nodes[id] || new Node(id)),
  createElement: (tag) => new Node(tag),
  createDocumentFragment: () => new Node("#fragment"),
};
globalThis.window = {location: "http://x/", history: {replaceState() {}}};
"""

SHOW = """
show(RESULT);
const out = {};
for (const id of ["answer", "notice", "passages-heading"])
  out[id] = {hidden: nodes[id].hidden, text: nodes[id].textContent};
out.passages = nodes["passages"].children.length;
out.bars = nodes["passages"].children.map(
    (li) => li.children[0].children[0].children[0].style.width);
console.log(JSON.stringify(out));
"""


def _show(result: dict) -> dict:
  script, _ = page.read("page.js")
  program = DOM + script.decode() + SHOW.replace("RESULT", json.dumps(result))
  done = subprocess.run([NODE, "-"], input=program, capture_output=True,
                        text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  return json.loads(done.stdout)


TIMINGS = {"retrieve": 1.0, "read": 0.0, "total": 1.0}


@pytest.mark.skipif(NODE is None, reason="no node")
def test_no_passage_retrieved_shows_the_notice_not_an_answer():
  notice = "no passage was retrieved for this question"
  shown = _show({"question": "who wrote Hamlet?", "answer": None,
                 "notice": notice, "passages": [], "batch_size": 0,
                 "timings_ms": TIMINGS})
  assert shown["answer"] == {"hidden": True, "text": ""}
  assert shown["notice"] == {"hidden": False, "text": notice}
  assert shown["passages-heading"]["hidden"] and shown["passages"] == 0


@pytest.mark.skipif(NODE is None, reason="no node")
def test_an_answer_shows_no_notice():
  passage = {"rank": 1, "id": "d0", "title": "Zorvane", "text": "a cat",
             "retrieval_score": 3.5, "reader_score": 1.0}
  shown = _show({"question": "q", "answer": "cat", "notice": None,
                 "passages": [passage], "batch_size": 1,
                 "timings_ms": TIMINGS})
  assert shown["answer"] == {"hidden": False, "text": "cat"}
  assert shown["notice"]["hidden"]
  assert not shown["passages-heading"]["hidden"] and shown["passages"] == 1


def test_the_page_has_the_elements_the_script_fills():
  html = page.read("index.html")[0].decode()
  for name in ("answer", "notice", "passages-heading", "passages", "info",
               "n-context", "beam-size", "examples", "answer-tokens",
               "json"):
    assert f'id="{name}"' in html


@pytest.mark.skipif(NODE is None, reason="no node")
def test_the_bars_are_the_reader_weights_on_an_absolute_scale():
  weights = [0.23, 0.27, 0.24, 0.26]  # near-uniform: four near-equal bars
  passages = [{"rank": k + 1, "id": f"d{k}", "title": "t", "text": "x",
               "retrieval_score": 1.0, "reader_score": w}
              for k, w in enumerate(weights)]
  shown = _show({"question": "q", "answer": "x", "notice": None,
                 "passages": passages, "batch_size": 1,
                 "timings_ms": TIMINGS})
  assert shown["bars"] == ["27.0%", "26.0%", "24.0%", "23.0%"]  # by weight


def _run(program_tail: str) -> dict:
  script, _ = page.read("page.js")
  done = subprocess.run([NODE, "-"], input=DOM + script.decode() + program_tail,
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  return json.loads(done.stdout.splitlines()[0])


SHADES = """
show(RESULT);
const item = nodes["passages"].children[0];
const tokens = item.children[2];
console.log(JSON.stringify({
  meta: item.children[0].children.map((c) => c.textContent),
  tokens: tokens.children.map((s) => [s.textContent, s.style.backgroundColor,
                                      s.className]),
  answer: nodes["answer-tokens"].children.map((c) => c.textContent),
  json: JSON.parse(nodes["json"].textContent)}));
"""


@pytest.mark.skipif(NODE is None, reason="no node")
def test_tokens_are_shaded_where_the_attention_is_high():
  tokens = [" question", ":", " who", "?", " Paris", " is", " big", "</s>"]
  weights = [0.001, 0.00005, 0.002, 0.0, 0.3, 0.01, 0.0001, 0.02]
  attention = {"weight": sum(weights), "tokens": tokens, "weights": weights,
               "by_answer_token": [weights, weights]}
  result = {"question": "who?", "answer": "Paris", "notice": None,
            "answer_tokens": [" Paris", "</s>"], "batch_size": 1,
            "passages": [{"rank": 1, "id": "d0", "title": "t", "text": "x",
                          "retrieval_score": 1.0, "reader_score": 0.5,
                          "attention": attention}],
            "timings_ms": TIMINGS}
  shown = _run(SHADES.replace("RESULT", json.dumps(result)))
  assert shown["meta"][1:3] == ["reader 0.500", "while answering 0.333"]
  assert [t for t, _, _ in shown["tokens"]] == tokens
  alpha = {t: float(bg.rsplit(",", 1)[1].rstrip(")")) if bg else 0.0
           for t, bg, _ in shown["tokens"]}
  # one absolute scale: 0.3 full, 0.02 and 0.01 strong, <= 0.0001 none
  assert alpha[" Paris"] == 1.0
  assert alpha["</s>"] > alpha[" is"] > alpha[" who"] > alpha[" question"] > 0
  assert alpha[":"] == alpha["?"] == alpha[" big"] == 0.0
  assert [c for t, _, c in shown["tokens"] if c] == ["answer"]  # " Paris"
  assert shown["answer"][1:3] == [" Paris", "</s>"]
  assert shown["json"] == result  # the JSON view is the response


INFO = """
showInfo(INFO);
console.log(JSON.stringify({
  info: nodes["info"].textContent,
  n: nodes["n-context"].children.map((o) => o.value),
  nValue: nodes["n-context"].value, beam: nodes["beam-size"].value,
  examples: nodes["examples"].children.filter((c) => c.tag === "button")
      .map((c) => c.textContent),
  request: (() => { nodes["n-context"].value = "2"; return request("q"); })()}));
"""


@pytest.mark.skipif(NODE is None, reason="no node")
def test_the_header_controls_and_examples_come_from_the_server_info():
  info = {"checkpoint": "runs/demo", "index": "bm25_index",
          "index_type": "bm25", "passages_in_index": 60, "n_context": 3,
          "beam_size": 2, "text_maxlength": 20, "decode_maxlength": 4,
          "max_batch": 4, "example_titles": ["thing 0", "thing 5"],
          "ready": True}
  shown = _run(INFO.replace("INFO", json.dumps(info)))
  assert shown["info"].startswith("model runs/demo · index bm25_index (bm25, "
                                  "60 passages) · up to 3 passages")
  assert shown["n"] == ["1", "2", "3"] and shown["nValue"] == "3"
  assert shown["beam"] == "2"
  assert shown["examples"] == ["what is thing 0?", "what is thing 5?"]
  assert shown["request"] == {"question": "q", "attention": True,
                              "n_context": 2, "beam_size": 2}
