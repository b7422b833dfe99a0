// jaxfid serve's page: a header from GET /v1/info (the model, the index,
// the limits; example questions about the index's titles), controls for
// the passages read and the beam size within those limits; ask POST
// /v1/answer with "attention": true and show the answer and the passages,
// best reader score first (or the notice of a question with no passage
// retrieved), each with a bar of its reader score (its share of the
// reader's attention, on an absolute scale), its share of the attention
// while the answer was generated, its retrieval rank and score, and its
// tokens shaded by the reader's attention (hover an answer token: the
// attention while that token was generated); the raw JSON in a toggle.
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

// A token's share of the reader's attention -> its shade in [0, 1], on one
// absolute (log) scale for every passage, question and answer token: a
// share of 0.0001 or less is unshaded, 0.1 or more fully shaded.
function shade(share) {
  if (!(share > 1e-4)) return 0;
  return Math.min(1, (Math.log10(share) + 4) / 3);
}

function paint(span, share) {
  const alpha = shade(share);
  span.style.backgroundColor = alpha > 0 ? `rgba(245, 158, 11, ${alpha.toFixed(2)})` : "";
  span.title = `${(100 * share).toFixed(3)}% of the reader's attention`;
}

// The passages' token spans and their shares, repainted on hover.
let painted = [];

// Paints every passage token with its mean share (`t` null) or its share
// while answer token `t` was generated.
function repaint(t) {
  for (const {spans, attention} of painted) {
    const shares = t === null ? attention.weights : attention.by_answer_token[t];
    spans.forEach((span, j) => paint(span, shares[j]));
  }
}

// The passage's reader input as token spans; a token that is also one of
// the answer's tokens is underlined.
function tokenSpans(attention, answerTokens) {
  const text = element("p", "tokens");
  const answer = new Set(answerTokens.filter((t) => t !== "</s>").map((t) => t.trim().toLowerCase()));
  const spans = attention.tokens.map((token) => {
    const span = element("span", answer.has(token.trim().toLowerCase()) && token.trim() ? "answer" : "", token);
    text.append(span);
    return span;
  });
  painted.push({spans, attention});
  return text;
}

function showAnswerTokens(tokens) {
  const line = $("answer-tokens");
  line.hidden = !tokens;
  line.replaceChildren();
  if (!tokens) return;
  line.append("generated as ");
  tokens.forEach((token, t) => {
    const chip = element("span", "", token.trim() ? token : "␣");  // a bare space as ␣
    chip.title = "hover: the attention while this token was generated";
    chip.addEventListener("mouseenter", () => repaint(t));
    chip.addEventListener("mouseleave", () => repaint(null));
    line.append(chip);
  });
  line.append(" (hover a token: the attention while it was generated; else the mean over them)");
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
  painted = [];
  showAnswerTokens(result.answer_tokens);
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
    meta.append(bar, element("span", "reader", `reader ${p.reader_score.toFixed(3)}`));
    if (p.attention) {
      const read = element("span", "read", `while answering ${p.attention.weight.toFixed(3)}`);
      read.title = "its share of the reader's attention, averaged over the answer's tokens";
      meta.append(read);
    }
    meta.append(element("span", "rank", `retrieval rank ${p.rank}`),
                element("span", "score", `score ${p.retrieval_score === null ? "-" : p.retrieval_score.toFixed(3)}`));
    const title = element("p", "title");
    title.append(highlighted(p.title || "", result.answer));
    // With the attention: the reader's input token by token, shaded; else
    // the text with the answer highlighted.
    const text = p.attention ? tokenSpans(p.attention, result.answer_tokens || [])
                             : element("p", "text");
    if (!p.attention) text.append(highlighted(p.text, result.answer));
    item.append(meta, title, text);
    list.append(item);
  }
  repaint(null);
  $("json").textContent = JSON.stringify(result, null, 2);
  $("result").hidden = false;
}

// The request: the question, the reader's attention, and the passages and
// beam size chosen (the server's defaults until GET /v1/info has answered).
function request(question) {
  const body = {question, attention: true};
  const n = parseInt($("n-context").value, 10);
  const beam = parseInt($("beam-size").value, 10);
  if (n > 0) body.n_context = n;
  if (beam > 0) body.beam_size = beam;
  return body;
}

function choices(select, high, chosen) {
  select.replaceChildren();
  for (let k = 1; k <= high; k++) {
    const option = element("option", "", String(k));
    option.value = String(k);
    option.selected = k === chosen;
    select.append(option);
  }
  select.value = String(chosen);
}

function showInfo(info) {
  $("info").textContent = `model ${info.checkpoint} · index ${info.index} ` +
      `(${info.index_type}, ${info.passages_in_index} passages) · ` +
      `up to ${info.n_context} passages of ${info.text_maxlength} tokens, ` +
      `answers up to ${info.decode_maxlength} tokens, beam size up to ${info.beam_size}` +
      (info.ready ? "" : " · loading");
  choices($("n-context"), info.n_context, info.n_context);
  choices($("beam-size"), info.beam_size, info.beam_size);
  const examples = $("examples");
  examples.replaceChildren();
  const titles = info.example_titles || [];
  if (titles.length) examples.append("try ");
  for (const title of titles) {
    const question = `what is ${title}?`;
    const button = element("button", "example", question);
    button.type = "button";
    button.addEventListener("click", () => {
      $("question").value = question;
      ask(question);
    });
    examples.append(button, " ");
  }
}

async function loadInfo() {
  try {
    const response = await fetch("/v1/info");
    showInfo(await response.json());
  } catch (error) {
    $("info").textContent = `could not read /v1/info: ${error.message}`;
  }
}

async function ask(question) {
  const status = $("status");
  status.className = "";
  status.textContent = "asking…";
  $("go").disabled = true;
  try {
    const response = await fetch("/v1/answer", {
      method: "POST", headers: {"content-type": "application/json"},
      body: JSON.stringify(request(question)),
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
// The controls are filled before the question of the link is asked.
loadInfo().then(() => {
  if (initial) {
    $("question").value = initial;
    ask(initial);
  }
});
