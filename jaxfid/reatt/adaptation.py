"""ReAtt's domain adaptation data (the paper's section 3.3) as QA data.

Every kind of supervision becomes records ``{"id", "question", "answers"}``:
IR supervision (query, document, grade l > 0) gives the answer
``"relevance: {l}. {text}"`` per relevant document; unsupervised data gives
salient span masking queries (:func:`salient_span_records`, with
``"source"``). :func:`write_queries` writes JSONL for ``jaxfid retrieve``;
salient span queries instead go through :func:`ssm_training_examples`, which
keeps the masked entity out of the close documents.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterable, Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.evaluation.retrieval import read_qrels
from jaxfid.reader.examples import FidExample, Passage as Context
from jaxfid.retrieval.search import search_all
from jaxfid.retrieval.store.corpus import Passage, read_corpus
from jaxfid.retrieval.store.queries import read_queries
from jaxfid.runtime.files import atomic_write

MASK = "<extra_id_0>"
END = "<extra_id_1>"
# The original's rules (create_pseudo_queries_from_corpus's defaults and its
# call: num_sent_per_doc=5, max_num_mask_ent=1).
SENTENCES_PER_DOCUMENT = 5
MIN_WORDS = 5          # 'skip_less_5_words': words of the query besides the mask
MAX_CHARS = 512        # 'skip_long_512_chars': characters of the sentence
_SENTENCE = re.compile(r"[^.!?]*[^.!?\s][^.!?]*(?:[.!?]+|$)")
_CAPITALISED = re.compile(r"[A-Z][\w'-]*(?:\s+(?:of\s+|the\s+)?[A-Z][\w'-]*)*")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def relevance_target(grade: int, passage: Passage,
                     with_title: bool = False) -> str:
  """``"relevance: {grade}. {text}"`` (``with_title``: ``{title} {text}``)."""
  document = (f"{passage.title} {passage.text}"
              if with_title and passage.title else passage.text)
  return f"relevance: {grade}. {document}"


def ir_supervision_records(queries_path: str | os.PathLike,
                           qrels_path: str | os.PathLike,
                           corpus_path: str | os.PathLike,
                           with_title: bool = False) -> list[dict]:
  """One record per query with at least one relevant (grade > 0) document.

  Raises:
    InputError: a judged relevant document is not in the corpus.
  """
  qrels = read_qrels(qrels_path)
  needed = {d for judged in qrels.values() for d, g in judged.items() if g > 0}
  docs = {p.id: p for _, p in read_corpus(corpus_path) if p.id in needed}
  records = []
  for query in read_queries(queries_path):
    answers = []
    for docid, grade in sorted(qrels.get(query.id, {}).items()):
      if grade <= 0:
        continue
      if docid not in docs:
        raise InputError(qrels_path, f"relevant document {docid!r} of query "
                         f"{query.id!r} is not in {corpus_path}")
      answers.append(relevance_target(grade, docs[docid], with_title))
    if answers:
      records.append({"id": query.id, "question": query.text,
                      "answers": answers})
  return records


def sentences(text: str) -> list[tuple[int, int]]:
  """(start, end) character spans of the sentences of ``text``."""
  return [(m.start(), m.end()) for m in _SENTENCE.finditer(text)]


def salient_spans(sentence: str) -> list[tuple[int, int]]:
  """Entity-like spans: runs of capitalised words (the sentence's first word
  left out) and numbers."""
  first = len(sentence) - len(sentence.lstrip())
  spans = []
  for m in _CAPITALISED.finditer(sentence):
    a, b = m.span()
    if a == first:  # the sentence's first word is capitalised anyway
      rest = re.match(r"\S+\s+", sentence[a:b])
      if rest is None or not sentence[a + rest.end()].isupper():
        continue
      a += rest.end()
    spans.append((a, b))
  spans += [(m.start(), m.end()) for m in _NUMBER.finditer(sentence)]
  return sorted(set(spans))


def maskable_spans(sentence: str) -> list[tuple[int, int]]:
  """The spans the original may mask, filtered in its order: of the
  :func:`salient_spans` (sorted by start), those that start before the
  previous one ends are dropped; then those of one character ('nochar');
  then those whose lower-cased text another span has ('single')."""
  spans = salient_spans(sentence)
  spans = [x for i, x in enumerate(spans) if i == 0 or x[0] >= spans[i - 1][1]]
  kept = [(a, b) for a, b in spans if b - a > 1]
  texts = [sentence[a:b].lower().strip() for a, b in kept]
  return [span for span, t in zip(kept, texts) if texts.count(t) == 1]


def salient_span_records(passages: Iterable[Passage], *, seed: int = 0,
                         per_passage: int = SENTENCES_PER_DOCUMENT
                         ) -> list[dict]:
  """Salient span masking queries, the original's rules.

  Per passage of more than one sentence, ``per_passage`` distinct sentences are
  drawn (seeded); one skipped if over 512 characters, without a
  :func:`maskable_spans` entity, or leaving fewer than 5 words. One span is
  replaced by ``<extra_id_0>`` (the question); the answer is
  ``"<extra_id_0> ENTITY <extra_id_1>"``; ``"source"`` is the passage without
  that sentence. Ids are ``<passage id>-ssm<k>``, in text order. Entities come
  from :func:`salient_spans` (no tagger).
  """
  rng = np.random.default_rng(seed)
  records = []
  for passage in passages:
    text = " ".join(passage.text.split())
    spans = sentences(text)
    if len(spans) <= 1:
      continue
    drawn = sorted(rng.choice(len(spans), min(len(spans), per_passage),
                              replace=False).tolist())
    k = 0
    for s in drawn:
      sentence = text[spans[s][0]:spans[s][1]].strip()
      if len(sentence) > MAX_CHARS:
        continue
      candidates = maskable_spans(sentence)
      if not candidates:
        continue
      a, b = candidates[int(rng.integers(len(candidates)))]
      before, after = sentence[:a], sentence[b:]
      if len(f"{before.strip()} {after.strip()}".split()) < MIN_WORDS:
        continue
      context = " ".join(text[x:y].strip() for i, (x, y) in enumerate(spans)
                         if i != s)
      records.append({"id": f"{passage.id}-ssm{k}",
                      "question": f"{before}{MASK}{after}",
                      "answers": [f"{MASK} {sentence[a:b]} {END}"],
                      "source": {"id": passage.id, "title": passage.title,
                                 "text": context}})
      k += 1
  return records


def ssm_training_examples(records: Sequence[dict], searcher, top_k: int,
                          **options) -> list[FidExample]:
  """FiD training examples of salient span records, without the answer leak.

  Each question retrieves ``top_k`` passages from ``searcher``; its source
  passage is dropped from them and put first as ``source`` (without the masked
  sentence), scored one above the best hit; ``top_k`` in all.
  """
  hits = search_all(searcher, [r["question"] for r in records], top_k,
                    progress=False, **options)
  out = []
  for record, found in zip(records, hits):
    source = record["source"]
    rows = [(row, score) for row, score in found
            if searcher.store[row].id != source["id"]][:top_k - 1]
    best = max((score for _, score in found), default=0.0)
    ctxs = [Context(title=source["title"], text=source["text"],
                    score=float(best) + 1.0, id=source["id"])]
    for row, score in rows:
      p = searcher.store[row]
      ctxs.append(Context(title=p.title, text=p.text, score=float(score),
                          id=p.id))
    out.append(FidExample(question=record["question"],
                          answers=tuple(record["answers"]), ctxs=tuple(ctxs),
                          id=record["id"]))
  return out


def write_queries(path: str | os.PathLike, records: Sequence[dict]) -> None:
  """JSONL queries with answers (atomic), the input of ``jaxfid retrieve``."""
  with atomic_write(path) as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + "\n")
