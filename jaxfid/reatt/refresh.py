"""ReAtt's iterative training inside one run: re-index, re-retrieve.

With ``RETRIEVAL_CORPUS`` set, after the warm-up and every
``ITERATION_STEPS`` steps the corpus is re-indexed into ``MODEL_DIR/index``
and the training questions' close documents re-retrieved into
``MODEL_DIR/iterations/train_step<S>.jsonl``; a resumed run reloads (or
redoes) the latest refresh.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from jaxfid.reader.examples import FidExample, Passage
from jaxfid.reatt import token_index
from jaxfid.reatt.model import ReAttModel
from jaxfid.retrieval.search import search_all


def phase_boundaries(train_steps: int, retrieval_warmup_steps: int,
                     iteration_steps: int) -> list[int]:
  """Steps where a phase ends and (with a corpus) close documents refresh."""
  if iteration_steps <= 0:
    return []
  out, s = [], retrieval_warmup_steps + iteration_steps
  while s < train_steps:
    out.append(s)
    s += iteration_steps
  return out


def iteration_file(model_dir: str, step: int) -> str:
  """Where the close documents retrieved at ``step`` are kept."""
  return os.path.join(model_dir, "iterations", f"train_step{step}.jsonl")


def refresh_close_documents(model: ReAttModel, params: dict, tokenizer,
                            examples: Sequence[FidExample], corpus: str,
                            index_dir: str, *, n_context: int,
                            doc_maxlength: int, query_maxlength: int,
                            token_top_k: int, rerank_top_k: int = 0,
                            batch_size: int = 64,
                            progress: bool | None = None) -> list[FidExample]:
  """Re-index ``corpus`` with the current model; each example's ctxs become
  its ``n_context`` best passages (scores = avg-max relevance; with
  ``rerank_top_k`` > 0 only that many candidates are rescored, the
  original's cut)."""
  encoder = token_index.TokenEncoder.from_model(model, params)
  meta = token_index.build_token_index(
      encoder, tokenizer, corpus, index_dir, doc_maxlength=doc_maxlength,
      query_maxlength=query_maxlength, batch_size=batch_size,
      progress=progress)
  searcher = token_index.TokenSearcher(index_dir, meta)
  cut = {"rerank_top_k": rerank_top_k} if rerank_top_k else {}
  hits = search_all(searcher, [e.question for e in examples], n_context,
                    progress, token_top_k=token_top_k, **cut)
  out = []
  for example, found in zip(examples, hits):
    ctxs = []
    for row, score in found:
      p = searcher.store[row]
      ctxs.append(Passage(title=p.title, text=p.text, score=score, id=p.id))
    out.append(dataclasses.replace(example, ctxs=tuple(ctxs)))
  return out
