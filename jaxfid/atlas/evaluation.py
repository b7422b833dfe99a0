"""Atlas's evaluation during training: the in-loop retriever's answer recall
and the reader's exact match on what it retrieved.

Every ``EVAL_EVERY`` steps the ``EVAL_DATA`` questions are searched in the
current index with the current query tower (their file's ``ctxs`` are not
read), giving

* ``eval_recall@1``, ``eval_recall@5``, ``eval_recall@<k>`` (k =
  ``eval_recall_k``, 20 by default): the share of questions with a passage
  among their first k hits that contains an answer (DPR's ``has_answer`` on
  the passage text, :func:`jaxfid.evaluation.retrieval.answer_recall`);
* ``eval_em``, ``eval_f1``: the reader's greedy (or EVAL_BEAMS) answers
  over the first N_CONTEXT hits, read as PROMPT_FORMAT's rows, sentinels
  dropped from the answers under 'atlas' (:mod:`jaxfid.atlas.prompts`;
  FiD's evaluator, whose per-question
  predictions go to ``MODEL_DIR/eval/predictions_<step>.jsonl``; the
  retrieved passages' ids are not written there).
"""
from __future__ import annotations

from typing import Sequence

from jaxfid.atlas import prompts
from jaxfid.atlas.batches import with_retrieved
from jaxfid.atlas.model import READER
from jaxfid.atlas.retrieval import InLoopRetriever
from jaxfid.evaluation.retrieval import answer_recall
from jaxfid.reader.examples import FidExample
from jaxfid.reader.predict import QaEvaluator
from jaxfid.retrieval.text.answer_match import has_answer


def retrieval_recall(retriever: InLoopRetriever, ids, examples:
                     Sequence[FidExample], ks: Sequence[int]) -> dict:
  """``{"eval_recall@k": ...}`` of hits ``ids`` [E, >= max(ks)]."""
  hits = [[has_answer(e.answers, retriever.passages[int(i)].text)
           for i in row] for e, row in zip(examples, ids)]
  return {f"eval_recall@{k}": v for k, v in zip(
      ks, answer_recall(hits, ks).values())}


def evaluate(retriever: InLoopRetriever, reader_eval: QaEvaluator,
             examples: Sequence[FidExample], query_tokens, *, n_context: int,
             recall_k: int, model_dir: str, step: int, params, placement,
             prompt_format: str = "atlas") -> dict:
  """The evaluation record of ``step`` (module docstring)."""
  k = max(n_context, recall_k)
  ids, scores = retriever.search(params, query_tokens, k)
  record = retrieval_recall(retriever, ids, examples, (1, 5, recall_k))
  reader_eval.examples = [prompts.reader_example(
      with_retrieved(e, retriever.passages, row[:n_context], s[:n_context]),
      prompt_format) for e, row, s in zip(examples, ids, scores)]
  record.update(reader_eval(model_dir, step, params[READER], placement))
  return record
