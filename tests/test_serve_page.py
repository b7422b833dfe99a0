"""`jaxfid serve`'s page script (static/page.js) run by Node over a stand-in
DOM (no browser): what it shows for a response. tests/test_serve.py checks
the page in headless Chromium where one is installed."""
import json
import os
import shutil
import subprocess

import pytest

from jaxfid.fid.serving import page

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
  for name in ("answer", "notice", "passages-heading", "passages"):
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
