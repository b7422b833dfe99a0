"""ReAtt's domain adaptation data (the paper's section 3.3) as QA queries files.

ReAtt adapts to a new corpus by end-to-end training on whatever supervision
there is; every kind becomes question/answer pairs, the reader's task:

* **QA supervision**: the QA data itself (nothing to convert);
* **IR supervision**: query-document-relevance triples become generation:
  the answers of a query are ``"relevance: {l}. {document}"`` for each of
  its relevant documents (grade l > 0; the document is ``title text``), one
  of which is sampled per step, as FiD samples answers;
* **unsupervised** (salient span masking, as REALM's): one sentence of a
  document with one entity replaced by the sentinel ``<extra_id_0>`` is the
  question, the entity the answer. Entities are found without a tagger:
  runs of capitalised words not starting the sentence, and numbers.

Each converter returns records ``{"id", "question", "answers"}``;
:func:`write_queries` writes them as JSONL, which ``jaxfid retrieve`` reads
as queries and turns into FiD training data with each question's close
documents (``--output train.json``), the input of ``jaxfid train`` with a
ReAtt gin file.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterable, Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.core.files import atomic_write
from jaxfid.retrieval.store.corpus import Passage, read_corpus
from jaxfid.evaluation.retrieval import read_qrels
from jaxfid.retrieval.store.queries import read_queries

MASK = "<extra_id_0>"
_SENTENCE = re.compile(r"[^.!?]*[^.!?\s][^.!?]*(?:[.!?]+|$)")
_CAPITALISED = re.compile(r"[A-Z][\w'-]*(?:\s+(?:of\s+|the\s+)?[A-Z][\w'-]*)*")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def relevance_target(grade: int, passage: Passage) -> str:
  """``"relevance: {grade}. {title} {text}"`` (no title: the text alone)."""
  document = f"{passage.title} {passage.text}" if passage.title else passage.text
  return f"relevance: {grade}. {document}"


def ir_supervision_records(queries_path: str | os.PathLike,
                           qrels_path: str | os.PathLike,
                           corpus_path: str | os.PathLike) -> list[dict]:
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
      answers.append(relevance_target(grade, docs[docid]))
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


def salient_span_records(passages: Iterable[Passage], *, seed: int = 0,
                         per_passage: int = 1) -> list[dict]:
  """Up to ``per_passage`` masked sentences per passage (random, seeded).

  Each draw picks a sentence uniformly among the passage's sentences that
  hold a salient span not drawn yet, then one of those spans uniformly (the
  paper's section 3.3: "randomly choose one sentence from a document and
  mask one entity"; a sentence with many entities is not favoured).
  Passages without a salient span are skipped.
  Records follow the text order; ids are ``<passage id>-ssm<k>``.
  """
  rng = np.random.default_rng(seed)
  records = []
  for passage in passages:
    left = {}  # sentence index -> (sentence, spans not drawn yet)
    for s, (a, b) in enumerate(sentences(passage.text)):
      sentence = passage.text[a:b]
      spans = salient_spans(sentence)
      if spans:
        left[s] = (sentence, spans)
    picks = []
    while left and len(picks) < per_passage:
      s = sorted(left)[int(rng.integers(len(left)))]
      sentence, spans = left[s]
      span = spans[int(rng.integers(len(spans)))]
      picks.append((s, span, sentence))
      rest = [x for x in spans if x != span]
      if rest:
        left[s] = (sentence, rest)
      else:
        del left[s]
    for k, (_, (a, b), sentence) in enumerate(sorted(picks)):
      question = " ".join(f"{sentence[:a]}{MASK}{sentence[b:]}".split())
      records.append({"id": f"{passage.id}-ssm{k}", "question": question,
                      "answers": [sentence[a:b]]})
  return records


def write_queries(path: str | os.PathLike, records: Sequence[dict]) -> None:
  """JSONL queries with answers (atomic), the input of ``jaxfid retrieve``."""
  with atomic_write(path) as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + "\n")
