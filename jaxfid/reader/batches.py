"""Deterministic, resumable FiD batches: step ``s``'s batch is a pure
function of (seed, s), so resuming needs no iterator state.

Order: :func:`jaxfid.training.sampling.stream_indices` (epochs of
``permutation(seed, e)``, step ``s`` taking positions ``[s*B, (s+1)*B)``).
Targets: ``target``, else an answer drawn from ``rng(seed, s, i)``, to
``target_maxlength`` tokens. Each process builds only the global batch's
``rows`` that its devices hold, in a background thread ahead of the step.
"""
from __future__ import annotations

import concurrent.futures
from typing import Sequence

import numpy as np

from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader.examples import FidExample
from jaxfid.training.sampling import stream_indices


class FidBatcher:
  """Tokenised FiD batches for training (and fixed-order eval batches)."""

  def __init__(self, examples: Sequence[FidExample], tokenizer, *,
               batch_size: int, n_context: int, text_maxlength: int,
               target_maxlength: int, seed: int = 0, dataset: str = "nq",
               mixture: Sequence[tuple[int, float, str]] | None = None,
               passage_eos: bool = True, cache_limit_bytes: int = 2 << 30):
    """``mixture``: consecutive parts of ``examples`` as (count, rate,
    dataset), sampled by rate (see :meth:`indices`); default one part."""
    self.examples = list(examples)
    self.mixture = list(mixture or [(len(self.examples), 1.0, dataset)])
    if sum(c for c, _, _ in self.mixture) != len(self.examples):
      raise ValueError("mixture counts must add up to the examples")
    self._offsets = np.cumsum([0] + [c for c, _, _ in self.mixture])
    rates = np.asarray([r if c else 0.0 for c, r, _ in self.mixture], float)
    self._rates = rates / rates.sum()
    self.tokenizer = tokenizer
    self.batch_size = batch_size
    self.n_context = n_context
    self.text_maxlength = text_maxlength
    self.target_maxlength = target_maxlength
    self.passage_eos = passage_eos
    self.seed = seed
    self.dataset = dataset
    # Encoded passages are cached (int16 holds the 32128-token vocabulary)
    # when they fit the budget; otherwise re-tokenised per step.
    per_example = n_context * text_maxlength * 2
    self._cache: dict[int, tuple[np.ndarray, np.ndarray]] | None = (
        {} if per_example * len(self.examples) <= cache_limit_bytes else None)
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._pending: dict[int, concurrent.futures.Future] = {}

  def indices(self, step: int) -> np.ndarray:
    """Global example indices of step ``s``'s batch: the epoch stream; for a
    mixture, row j comes from part c drawn by rate from ``rng(seed, s, j)``,
    at position ``s*B + j`` of part c's own stream (as seqio's mixtures)."""
    start = step * self.batch_size
    if len(self.mixture) == 1:
      return stream_indices(len(self.examples), self.seed, start,
                            self.batch_size)
    out = np.empty(self.batch_size, np.int64)
    for j in range(self.batch_size):
      c = int(np.random.default_rng([self.seed, step, j, 7]).choice(
          len(self._rates), p=self._rates))
      out[j] = self._offsets[c] + stream_indices(
          self.mixture[c][0], self.seed + c, start + j, 1)[0]
    return out

  def dataset_of(self, index: int) -> str:
    part = int(np.searchsorted(self._offsets, index, side="right")) - 1
    return self.mixture[part][2]

  def _passages(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    if self._cache is not None and i in self._cache:
      tokens, mask = self._cache[i]
      return tokens.astype(np.int32), mask
    tokens, mask = fid_inputs.encode_example(
        self.tokenizer, self.examples[i], self.n_context, self.text_maxlength,
        self.passage_eos)
    if self._cache is not None:
      self._cache[i] = (tokens.astype(np.int16), mask)
    return tokens, mask

  def _build(self, step: int, rows: slice) -> dict[str, np.ndarray]:
    offset = rows.start or 0
    enc, pmask, targets = [], [], []
    for j, i in enumerate(self.indices(step)[rows]):
      tokens, mask = self._passages(int(i))
      enc.append(tokens)
      pmask.append(mask)
      rng = np.random.default_rng([self.seed, step, offset + j])
      text = fid_inputs.choose_target(self.examples[i], rng,
                                      self.dataset_of(int(i)))
      targets.append(fid_inputs.encode_target(self.tokenizer, text,
                                              self.target_maxlength))
    return {"encoder_input_tokens": np.stack(enc).astype(np.int32),
            "passage_mask": np.stack(pmask),
            "decoder_target_tokens": np.stack(targets).astype(np.int32)}

  def batch(self, step: int, rows: slice | None = None, prefetch: int = 2
            ) -> dict[str, np.ndarray]:
    """Rows ``rows`` (default: all) of the batch of 0-based ``step``;
    prefetches the same rows of the next steps."""
    rows = rows or slice(0, self.batch_size)
    key = (rows.start, rows.stop)
    future = self._pending.pop((step, key), None)
    result = future.result() if future is not None else self._build(step, rows)
    for s in range(step + 1, step + 1 + prefetch):
      if (s, key) not in self._pending:
        self._pending[(s, key)] = self._pool.submit(self._build, s, rows)
    for k in [k for k in self._pending if k[0] < step]:
      self._pending.pop(k).cancel()
    return result

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)


def eval_batches(examples: Sequence[FidExample], tokenizer, *, batch_size: int,
                 n_context: int, text_maxlength: int,
                 passage_eos: bool = True):
  """Fixed-order evaluation batches, each of exactly ``batch_size`` rows (the
  last padded): ``(first index, real rows, batch dict)``."""
  for start in range(0, len(examples), batch_size):
    chunk = examples[start:start + batch_size]
    enc, pmask = [], []
    for ex in chunk:
      tokens, mask = fid_inputs.encode_example(tokenizer, ex, n_context,
                                               text_maxlength, passage_eos)
      enc.append(tokens)
      pmask.append(mask)
    real = len(chunk)
    while len(enc) < batch_size:
      enc.append(np.zeros_like(enc[0]))
      pmask.append(np.zeros_like(pmask[0]))
    yield start, real, {"encoder_input_tokens": np.stack(enc).astype(np.int32),
                        "passage_mask": np.stack(pmask)}
