"""Retrieval metrics: answer recall for QA, nDCG/recall/MRR for qrels.

Answer recall R@k: the fraction of questions with an answer-bearing passage
(``has_answer``) among the first k. Qrels metrics are trec_eval's: documents
ordered by score, then docid descending; ``nDCG@k`` with gain = grade
(grade <= 0 gains nothing); ``R@k`` over relevant (grade > 0) documents;
``MRR@k`` as BEIR's ``mrr_cut``. Averages are over queries in both run and
qrels.
"""
from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

from jaxfid.core.errors import InputError
from jaxfid.core.textio import iter_lines

Qrels = Mapping[str, Mapping[str, int]]


def answer_recall(hits: Sequence[Sequence[bool]],
                  ks: Sequence[int]) -> dict[str, float]:
  """``{"R@k": fraction of questions with a hit in their first k}``."""
  n = len(hits)
  out = {}
  for k in ks:
    found = sum(1 for h in hits if any(h[:k]))
    out[f"R@{k}"] = found / n if n else 0.0
  return out


def read_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
  """Reads TREC qrels (``qid 0 docid grade``) or BEIR TSV qrels (with header).

  A file without any judgement is an InputError.
  """
  qrels: dict[str, dict[str, int]] = {}
  for lineno, line in iter_lines(path):
    fields = line.split()
    if not fields:
      continue
    if len(fields) == 4:
      qid, _, docid, grade = fields
    elif len(fields) == 3:
      qid, docid, grade = fields
    else:
      raise InputError(path, "expected 'qid 0 docid grade' (or BEIR's "
                       f"'query-id corpus-id score'), found {len(fields)} "
                       "columns", where=lineno)
    try:
      value = int(float(grade))
    except ValueError:
      if lineno == 1:
        continue  # header line
      raise InputError(path, f"bad relevance grade {grade!r}",
                       where=lineno) from None
    qrels.setdefault(qid, {})[docid] = value
  if not qrels:
    raise InputError(path, "no relevance judgements in the file")
  return qrels


def dcg(gains: Sequence[float]) -> float:
  return sum(g / math.log2(i + 2) for i, g in enumerate(gains) if g > 0)


def ndcg_at_k(ranked: Sequence[str], judged: Mapping[str, int], k: int
              ) -> float:
  """trec_eval's ndcg_cut.k for one query."""
  gains = [max(judged.get(d, 0), 0) for d in ranked[:k]]
  ideal = dcg(sorted((g for g in judged.values() if g > 0), reverse=True)[:k])
  return dcg(gains) / ideal if ideal > 0 else 0.0


def recall_at_k(ranked: Sequence[str], judged: Mapping[str, int], k: int
                ) -> float:
  """trec_eval's recall_k for one query (0 when nothing is relevant)."""
  relevant = {d for d, g in judged.items() if g > 0}
  if not relevant:
    return 0.0
  return len(relevant.intersection(ranked[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], judged: Mapping[str, int], k: int
             ) -> float:
  """Reciprocal rank of the first relevant document in the first k."""
  for rank, docid in enumerate(ranked[:k], start=1):
    if judged.get(docid, 0) > 0:
      return 1.0 / rank
  return 0.0


def evaluate_run(run: Mapping[str, Sequence[tuple[str, float]]], qrels: Qrels,
                 ndcg_k: int = 10, mrr_k: int = 10,
                 recall_ks: Sequence[int] = (100,)) -> dict:
  """Mean nDCG@ndcg_k, MRR@mrr_k and R@k over the queries of run and qrels.

  ``run``: qid -> [(docid, score)] in trec_eval order; ``qrels``: qid ->
  {docid: grade}.
  """
  qids = [q for q in run if q in qrels]
  sums = {f"nDCG@{ndcg_k}": 0.0, f"MRR@{mrr_k}": 0.0}
  sums.update({f"R@{k}": 0.0 for k in recall_ks})
  for qid in qids:
    ranked = [docid for docid, _ in run[qid]]
    judged = qrels[qid]
    sums[f"nDCG@{ndcg_k}"] += ndcg_at_k(ranked, judged, ndcg_k)
    sums[f"MRR@{mrr_k}"] += mrr_at_k(ranked, judged, mrr_k)
    for k in recall_ks:
      sums[f"R@{k}"] += recall_at_k(ranked, judged, k)
  n = len(qids)
  out: dict = {name: (total / n if n else 0.0) for name, total in sums.items()}
  out["num_queries"] = n
  out["queries_without_results"] = sum(1 for q in qrels if q not in run)
  return out
