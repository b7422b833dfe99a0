"""ReAtt's training batches: FiD batches plus what the KL term needs.

Each row of a FiD batch is ``question: Q title: T context: P``; ReAtt adds
per question ``question_length`` [B] (the exact number of tokens of the
``question: Q`` prefix, where the bi-encoder's block mask splits the row)
and ``kl_weight`` [B] = ``KL_WEIGHT / BATCH_SIZE`` (0 before the QA-only
warm-up ends), so the KL term sums correctly over microbatches.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxfid.reader.batches import FidBatcher
from jaxfid.reader.examples import QUESTION_PREFIX, FidExample


class ReAttBatcher:
  """FiD batches + ``question_length`` [B] and ``kl_weight`` [B] (host rows)."""

  def __init__(self, examples: Sequence[FidExample], tokenizer, *,
               batch_size: int, n_context: int, text_maxlength: int,
               target_maxlength: int, kl_weight: float,
               retrieval_warmup_steps: int, seed: int = 0,
               dataset: str = "nq", passage_eos: bool = True):
    self.fid = FidBatcher(
        examples, tokenizer, batch_size=batch_size, n_context=n_context,
        text_maxlength=text_maxlength, target_maxlength=target_maxlength,
        seed=seed, dataset=dataset, passage_eos=passage_eos)
    ids = tokenizer.encode_batch([f"{QUESTION_PREFIX} {e.question}"
                                  for e in examples])
    # An example without passages is all question: it has no document.
    self.question_length = np.array(
        [min(len(i), text_maxlength) if e.ctxs else text_maxlength
         for i, e in zip(ids, examples)], np.int32)
    self.batch_size = batch_size
    self.kl_per_question = kl_weight / batch_size
    self.retrieval_warmup_steps = retrieval_warmup_steps

  def batch(self, step: int, rows: slice | None = None) -> dict[str, np.ndarray]:
    rows = rows or slice(0, self.batch_size)
    host = dict(self.fid.batch(step, rows))
    picked = self.fid.indices(step)[rows]
    host["question_length"] = self.question_length[picked]
    weight = self.kl_per_question if step >= self.retrieval_warmup_steps else 0.0
    host["kl_weight"] = np.full(len(picked), weight, np.float32)
    return host

  def close(self) -> None:
    self.fid.close()
