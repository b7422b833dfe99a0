"""``jaxfid eval-retrieval``: scoring a run file against qrels or answers.

:func:`evaluate_with_qrels`: nDCG@10, MRR@10 and R@k of a TREC or FiD-JSON
run. :func:`evaluate_with_answers`: answer recall R@k with DPR's
``has_answer``, passages from the run's ``ctxs`` or from ``index_dir``,
answers from ``data`` or the run; every question of the answer source
counts. A run sharing no query with the judgments is an InputError; the
output reports unmatched queries and judged documents missing from the
corpus. Metrics: :mod:`jaxfid.evaluation.retrieval`.
"""
from __future__ import annotations

import os
from typing import Sequence

from tqdm.auto import tqdm

from jaxfid.core.errors import InputError
from jaxfid.retrieval.text.answer_match import AnswerMatcher, PreparedCache
from jaxfid.evaluation.retrieval import answer_recall, evaluate_run, read_qrels
from jaxfid.retrieval.index_dir import read_meta
from jaxfid.retrieval.runs import iter_fid_examples, read_trec_run, run_format
from jaxfid.retrieval.store.passage_store import PassageStore
from jaxfid.retrieval.store.queries import Query, read_queries

DEFAULT_ANSWER_KS = (1, 5, 20, 100)


def _fid_run(path) -> list[tuple[object, dict]]:
  return list(iter_fid_examples(path))


def _example_id(example: dict, position: int) -> str:
  return str(example.get("id", position))


def _check_overlap(run_path, run_ids: Sequence[str], source_path,
                   source_ids: Sequence[str], what: str) -> None:
  """InputError when the run is empty or shares no query with the source."""
  if not run_ids:
    raise InputError(run_path, "the run holds no query")
  source = set(source_ids)
  if not any(q in source for q in run_ids):
    raise InputError(run_path, f"no query of the run is in the {what} "
                     f"{source_path} (run: {len(run_ids)} queries, e.g. "
                     f"{run_ids[0]!r}; {what}: {len(source)} queries, e.g. "
                     f"{next(iter(source_ids))!r})")


def _open_store(index_dir) -> PassageStore:
  meta = read_meta(index_dir)
  return PassageStore(index_dir, num_passages=meta.get("num_passages"))


def evaluate_with_qrels(run_path: str | os.PathLike,
                        qrels_path: str | os.PathLike,
                        recall_ks: Sequence[int] = (100,),
                        index_dir: str | os.PathLike | None = None) -> dict:
  """nDCG@10, MRR@10 and R@k of a run against qrels (with ``index_dir``,
  counting judged documents missing from the corpus)."""
  if run_format(run_path) == "fid":
    run = {}
    for i, (where, example) in enumerate(_fid_run(run_path)):
      docs = []
      for ctx in example["ctxs"]:
        if "id" not in ctx:
          raise InputError(run_path, "ctx without 'id'", where=where)
        docs.append((str(ctx["id"]), float(ctx.get("score", 0.0))))
      by_docid = sorted(docs, reverse=True)
      run[_example_id(example, i)] = sorted(by_docid, key=lambda d: -d[1])
  else:
    run = read_trec_run(run_path)
  qrels = read_qrels(qrels_path)
  _check_overlap(run_path, list(run), qrels_path, list(qrels), "qrels")
  out = evaluate_run(run, qrels, recall_ks=recall_ks)
  out["queries_without_results"] = sum(1 for q in qrels if not run.get(q))
  out["queries_without_judgments"] = sum(1 for q in run if q not in qrels)
  if index_dir is not None:
    store = _open_store(index_dir)
    judged = {docid for docs in qrels.values() for docid in docs}
    out["judged_documents_missing_from_corpus"] = sum(
        1 for docid in judged if docid not in store)
  return out


def _answers_by_id(data_path) -> dict[str, Query]:
  queries = read_queries(data_path)
  if not any(q.answers for q in queries):
    raise InputError(data_path, "no 'answers' in this file: answer recall "
                     "needs a QA set (question + answers)")
  return {q.id: q for q in queries}


def evaluate_with_answers(run_path: str | os.PathLike,
                          data_path: str | os.PathLike | None = None,
                          ks: Sequence[int] = DEFAULT_ANSWER_KS,
                          index_dir: str | os.PathLike | None = None,
                          progress: bool | None = False) -> dict:
  """Answer recall R@k of a run (module docstring); ``progress``: a bar on
  stderr (None: on a terminal)."""
  data = _answers_by_id(data_path) if data_path is not None else None
  hits: dict[str, list[bool]] = {}
  cache = PreparedCache()
  disable = None if progress is None else not progress
  if run_format(run_path) == "fid":
    examples = _fid_run(run_path)
    run_ids = [_example_id(example, i) for i, (_, example)
               in enumerate(examples)]
    if data is not None:
      _check_overlap(run_path, run_ids, data_path, list(data), "QA set")
    elif not run_ids:
      raise InputError(run_path, "the run holds no query")
    for i, (where, example) in enumerate(tqdm(
        examples, desc="matching answers", unit=" queries",
        disable=disable)):
      qid = run_ids[i]
      if data is not None:
        if qid not in data:
          continue  # not a question of the evaluated set
        answers = data[qid].answers or ()
      else:
        answers = example.get("answers", example.get("answer"))
        if answers is None:
          raise InputError(run_path, "example without 'answers'; pass the "
                           "QA set with --data", where=where)
        answers = [answers] if isinstance(answers, str) else answers
      matcher = AnswerMatcher(answers)
      row = []
      for ctx in example["ctxs"]:
        if "text" in ctx:
          text = ctx["text"]
          key = ctx.get("id")
          row.append(matcher(text if key is None else cache.get(key, text)))
        elif "has_answer" in ctx or "hasanswer" in ctx:
          row.append(bool(ctx.get("has_answer", ctx.get("hasanswer"))))
        else:
          raise InputError(run_path, "ctx has neither 'text' nor "
                           "'has_answer'", where=where)
      hits[qid] = row
  else:
    if data is None or index_dir is None:
      raise InputError(run_path, "answer recall of a TREC run needs the QA "
                       "set (--data) and the index it was retrieved from "
                       "(--index)")
    run = read_trec_run(run_path, order="rank")
    run_ids = list(run)
    _check_overlap(run_path, run_ids, data_path, list(data), "QA set")
    store = _open_store(index_dir)
    for qid, docs in tqdm(run.items(), total=len(run),
                          desc="matching answers", unit=" queries",
                          disable=disable):
      if qid not in data:
        continue
      matcher = AnswerMatcher(data[qid].answers or ())
      row = []
      for docid, _ in docs:
        try:
          passage_row = store.index_of(docid)
        except KeyError:
          raise InputError(run_path, f"document {docid!r} is not in the "
                           f"index {index_dir}") from None
        row.append(matcher(cache.get(passage_row, store.text(passage_row))))
      hits[qid] = row
  qids = list(data) if data is not None else list(hits)
  out = answer_recall([hits.get(q, []) for q in qids], ks)
  out["num_queries"] = len(qids)
  out["queries_without_results"] = sum(1 for q in qids if not hits.get(q))
  if data is not None:
    out["queries_without_answers"] = sum(1 for q in run_ids if q not in data)
  return out
