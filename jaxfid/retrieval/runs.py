"""Run files: TREC runs for evaluation and FiD JSON for the reader.

* **TREC**: ``qid Q0 docid rank score tag`` per line, ranks from 1, scores as
  the shortest decimal that reads back to the same float32.
* **FiD JSON** (``.json`` list or ``.jsonl``): ``{"id", "question",
  "answers", "ctxs": [{"id", "title", "text", "score", "has_answer"}]}``,
  passages best first; ``has_answer`` is DPR's string match.

Writers are atomic; readers raise InputError naming file and line.
"""
from __future__ import annotations

import json
import os
from typing import Iterator, Sequence

import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.core.textio import (
    iter_json_lines, iter_lines, read_json_document, starts_json_array)
from jaxfid.retrieval.store.passage_store import PassageStore
from jaxfid.retrieval.store.queries import Query
from jaxfid.retrieval.text.answer_match import AnswerMatcher, PreparedCache
from jaxfid.runtime.files import atomic_write

FID_SUFFIXES = (".json", ".jsonl")


def run_format(path: str | os.PathLike) -> str:
  """``"fid"`` for names ending in ``.json``/``.jsonl``, else ``"trec"``."""
  return "fid" if str(path).lower().endswith(FID_SUFFIXES) else "trec"


def format_score(score: float) -> str:
  """Shortest decimal that reads back as the same float32."""
  return str(np.float32(score))


def write_trec(path: str | os.PathLike, qids: Sequence[str],
               results: Sequence[Sequence[tuple[str, float]]],
               tag: str = "jaxfid") -> None:
  """Writes ``results[i]`` (docid, score pairs, best first) for ``qids[i]``."""
  if len(tag.split()) != 1:
    raise ValueError(f"run tag must be one word, got {tag!r}")
  with atomic_write(path) as f:
    for qid, hits in zip(qids, results, strict=True):
      scores = np.asarray([s for _, s in hits], np.float32).astype(str)
      f.writelines(f"{qid} Q0 {docid} {rank} {score} {tag}\n"
                   for rank, ((docid, _), score)
                   in enumerate(zip(hits, scores.tolist()), start=1))


def fid_example(query: Query, hits: Sequence[tuple[int, float]],
                store: PassageStore,
                cache: PreparedCache | None = None) -> dict:
  """One FiD example: the query and its passages (store rows, scores)."""
  matcher = AnswerMatcher(query.answers or ())
  cache = cache if cache is not None else PreparedCache()
  ctxs = []
  for row, score in hits:
    passage = store[row]
    found = bool(matcher.answers) and matcher(cache.get(row, passage.text))
    ctxs.append({"id": passage.id, "title": passage.title,
                 "text": passage.text,
                 "score": float(format_score(score)),
                 "has_answer": found})
  return {"id": query.id, "question": query.text,
          "answers": list(query.answers or ()), "ctxs": ctxs}


def write_fid_json(path: str | os.PathLike, queries: Sequence[Query],
                   results: Sequence[Sequence[tuple[int, float]]],
                   store: PassageStore) -> None:
  """Writes FiD examples; ``results[i]`` are (store row, score), best first.

  ``.jsonl`` gives one example per line, anything else one JSON list.
  """
  lines = str(path).lower().endswith(".jsonl")
  cache = PreparedCache()
  with atomic_write(path) as f:
    if not lines:
      f.write("[\n")
    for i, (query, hits) in enumerate(zip(queries, results, strict=True)):
      text = json.dumps(fid_example(query, hits, store, cache),
                        ensure_ascii=False)
      if lines:
        f.write(text + "\n")
      else:
        f.write(("" if i == 0 else ",\n") + text)
    if not lines:
      f.write("\n]\n")


def read_trec_run(path: str | os.PathLike, order: str = "trec_eval"
                  ) -> dict[str, list[tuple[str, float]]]:
  """Reads a TREC run: qid -> [(docid, score)].

  ``order``: ``"trec_eval"`` (score descending, then docid descending; for
  qrels metrics) or ``"rank"`` (the rank column; for answer recall).
  """
  if order not in ("trec_eval", "rank"):
    raise ValueError(f"order must be 'trec_eval' or 'rank', got {order!r}")
  run: dict[str, dict[str, float]] = {}
  ranks: dict[tuple[str, str], int] = {}
  for lineno, line in iter_lines(path):
    fields = line.split()
    if not fields:
      continue
    if len(fields) != 6:
      raise InputError(path, "expected 6 columns (qid Q0 docid rank score "
                       f"tag), found {len(fields)}", where=lineno)
    qid, _, docid, rank, score, _ = fields
    try:
      ranks[qid, docid] = int(rank)
      value = float(score)
    except ValueError:
      raise InputError(path, f"bad rank {rank!r} or score {score!r}",
                       where=lineno) from None
    docs = run.setdefault(qid, {})
    if docid in docs:
      raise InputError(path, f"document {docid!r} listed twice for query "
                       f"{qid!r}", where=lineno)
    docs[docid] = value
  ranked = {}
  for qid, docs in run.items():
    if order == "rank":
      ranked[qid] = sorted(docs.items(), key=lambda d: ranks[qid, d[0]])
    else:
      by_docid = sorted(docs.items(), reverse=True)  # docid descending ...
      ranked[qid] = sorted(by_docid, key=lambda d: -d[1])  # ... by score
  return ranked


def iter_fid_examples(path: str | os.PathLike) -> Iterator[tuple[object, dict]]:
  """Yields (line or element, example dict) from FiD ``.json``/``.jsonl``."""
  if starts_json_array(path):
    examples = read_json_document(path)
    for i, example in enumerate(examples):
      yield f"element {i}", _check_example(path, example, f"element {i}")
    return
  for lineno, example in iter_json_lines(path):
    yield lineno, _check_example(path, example, lineno)


def _check_example(path, example, where) -> dict:
  if not isinstance(example, dict):
    raise InputError(path, "expected a JSON object per example", where=where)
  ctxs = example.get("ctxs")
  if not isinstance(ctxs, list):
    raise InputError(path, "missing 'ctxs' list", where=where)
  for ctx in ctxs:
    if not isinstance(ctx, dict):
      raise InputError(path, "each ctx must be a JSON object", where=where)
  return example
