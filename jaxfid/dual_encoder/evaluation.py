"""The dual encoder's evaluation during training: eval_top1 / eval_top5.

Every eval question is scored against the pool of all eval questions'
passages (positives and hard negatives, each distinct passage once); its
rank is that of its positive. ``eval_top1`` / ``eval_top5`` are the shares of
questions whose positive ranks first / in the first five.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from jaxfid.core.tokenization import encode_padded
from jaxfid.dual_encoder.data import PairExample
from jaxfid.dual_encoder.model import DualEncoder, passage_text


class PairEvaluator:
  """Ranks eval positives among every eval passage (module docstring)."""

  def __init__(self, encoder: DualEncoder, tokenizer,
               examples: Sequence[PairExample], *, batch_size: int = 64):
    self.encoder = encoder
    self.examples = list(examples)
    self.batch_size = batch_size
    s = encoder.settings
    pool: dict[tuple[str, str], int] = {}
    for ex in self.examples:
      for passage in (ex.positive, *ex.hard_negatives):
        pool.setdefault(passage, len(pool))
    self.gold = np.asarray([pool[ex.positive] for ex in self.examples])
    self.query_tokens = encode_padded(
        tokenizer, [ex.question for ex in self.examples], s.query_maxlength)
    self.passage_tokens = encode_padded(
        tokenizer, [passage_text(t, x, s.passage_format) for t, x in pool],
        s.passage_maxlength)
    self._fns: dict = {}

  def _embed_fn(self, tower: str, placement):
    if tower not in self._fns:
      self._fns[tower] = jax.jit(
          lambda p, t: self.encoder.embed(p, t, tower=tower),
          out_shardings=placement.replicated)
    return self._fns[tower]

  def _embed(self, params, tokens: np.ndarray, tower: str,
             placement) -> np.ndarray:
    """float32 [N, dim] of tokens [N, L], in batches sharded over data."""
    mesh = placement.mesh
    parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    size = -(-self.batch_size // parallel) * parallel
    fn = self._embed_fn(tower, placement)
    out = []
    for a in range(0, len(tokens), size):
      chunk = tokens[a:a + size]                             # [<=size, L]
      padded = np.zeros((size, tokens.shape[1]), np.int32)   # [size, L]
      padded[:len(chunk)] = chunk
      batch = jax.device_put(padded, placement.batch)
      out.append(np.asarray(fn(params, batch))[:len(chunk)])
    return np.concatenate(out)

  def __call__(self, params, placement) -> dict:
    """``eval_top1``, ``eval_top5``, ``eval_examples`` of ``params``.

    ``placement``: the run's :class:`jaxfid.training.state.Placement`.
    """
    q = self._embed(params, self.query_tokens, "query", placement)
    p = self._embed(params, self.passage_tokens, "passage", placement)
    scores = q @ p.T                                         # [Q, pool]
    positive = scores[np.arange(len(self.examples)), self.gold]
    rank = 1 + np.sum(scores > positive[:, None], axis=1)
    return {"eval_top1": float(np.mean(rank <= 1)),
            "eval_top5": float(np.mean(rank <= 5)),
            "eval_examples": len(self.examples)}
