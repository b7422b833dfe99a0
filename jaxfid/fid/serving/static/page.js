// jaxfid serve's page: ask POST /v1/answer and show the answer and the
// passages, best reader score first (or the notice of a question with no
// passage retrieved), each with a bar of its reader score (its share of
// the reader's attention, on an absolute scale),
// its retrieval rank and score, and the answer highlighted where it occurs.
// /?q=... asks on load (a shareable link).
"use strict";

const $ = (id) => document.getElementById(id);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// `text` as nodes, every case-insensitive occurrence of `answer` in a <mark>.
function highlighted(text, answer) {
  const out = document.createDocumentFragment();
  const needle = answer.trim().toLowerCase();
  if (!needle) {
    out.append(text);
    return out;
  }
  const haystack = text.toLowerCase();
  let start = 0;
  for (let at = haystack.indexOf(needle); at >= 0;
       at = haystack.indexOf(needle, start)) {
    out.append(text.slice(start, at), element("mark", "", text.slice(at, at + needle.length)));
    start = at + needle.length;
  }
  out.append(text.slice(start));
  return out;
}

function show(result) {
  // "answer": null when no passage was retrieved: the notice says so.
  const answered = result.answer !== null;
  $("answer").hidden = !answered;
  $("answer").textContent = answered ? result.answer || "(an empty answer)" : "";
  $("notice").hidden = answered;
  $("notice").textContent = answered ? "" : result.notice;
  $("passages-heading").hidden = result.passages.length === 0;
  const t = result.timings_ms;
  $("timings").textContent = `retrieval ${t.retrieve.toFixed(1)} ms, reading ${t.read.toFixed(1)} ms, ` +
      `total ${t.total.toFixed(1)} ms (a batch of ${result.batch_size})`;
  const passages = result.passages.slice().sort((a, b) => b.reader_score - a.reader_score);
  const list = $("passages");
  list.replaceChildren();
  for (const p of passages) {
    const item = element("li", "passage");
    const meta = element("div", "meta");
    const bar = element("div", "bar");
    const fill = element("span");
    // On an absolute scale: the share of the reader's attention (the scores
    // sum to 1), so near-uniform weights look near-uniform.
    fill.style.width = `${(100 * Math.min(Math.max(p.reader_score, 0), 1)).toFixed(1)}%`;
    bar.append(fill);
    bar.title = `reader score ${p.reader_score}`;
    meta.append(bar, element("span", "reader", `reader ${p.reader_score.toFixed(3)}`),
                element("span", "rank", `retrieval rank ${p.rank}`),
                element("span", "score", `score ${p.retrieval_score === null ? "-" : p.retrieval_score.toFixed(3)}`));
    const title = element("p", "title");
    title.append(highlighted(p.title || "", result.answer));
    const text = element("p", "text");
    text.append(highlighted(p.text, result.answer));
    item.append(meta, title, text);
    list.append(item);
  }
  $("result").hidden = false;
}

async function ask(question) {
  const status = $("status");
  status.className = "";
  status.textContent = "asking…";
  $("go").disabled = true;
  try {
    const response = await fetch("/v1/answer", {
      method: "POST", headers: {"content-type": "application/json"},
      body: JSON.stringify({question}),
    });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    show(body);
    status.textContent = "";
  } catch (error) {
    status.className = "error";
    status.textContent = `error: ${error.message}`;
  } finally {
    $("go").disabled = false;
  }
}

$("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  const url = new URL(window.location);
  url.searchParams.set("q", question);
  window.history.replaceState(null, "", url);
  ask(question);
});

const initial = new URLSearchParams(window.location.search).get("q");
if (initial) {
  $("question").value = initial;
  ask(initial);
}
