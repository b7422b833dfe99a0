"""Deterministic, resumable FiD batches: the batch of step ``s`` is a pure function of (seed, s).

* Order: epoch ``e`` visits the examples in ``permutation(seed, e)``; the
  global batch of step ``s`` (0-based) takes positions ``[s*B, (s+1)*B)`` of
  the concatenation of epochs. No iterator state to checkpoint: resuming at
  step ``s`` gives exactly the batches an uninterrupted run would have seen.
* Targets: a random answer per step and example from ``rng(seed, s, i)``
  (``target`` when the example has one).
* Hosts: process ``k`` of ``n`` builds rows ``[k*B/n, (k+1)*B/n)`` of each
  global batch (its shard); the trainer assembles the global array.
* A background thread prepares the next batches while the device trains.
"""
from __future__ import annotations

import concurrent.futures
import functools
from typing import Sequence

import numpy as np

from jaxfid.fid import examples as fid_format
from jaxfid.fid.examples import FidExample


class FidBatcher:
  """Tokenised FiD batches for training (and fixed-order eval batches)."""

  def __init__(self, examples: Sequence[FidExample], tokenizer, *,
               batch_size: int, n_context: int, text_maxlength: int,
               answer_maxlength: int, seed: int = 0, dataset: str = "nq",
               process_index: int = 0, process_count: int = 1,
               cache_limit_bytes: int = 2 << 30):
    if batch_size % process_count:
      raise ValueError(f"batch size {batch_size} is not divisible by the "
                       f"{process_count} processes")
    self.examples = list(examples)
    self.tokenizer = tokenizer
    self.batch_size = batch_size
    self.n_context = n_context
    self.text_maxlength = text_maxlength
    self.answer_maxlength = answer_maxlength
    self.seed = seed
    self.dataset = dataset
    self.local_rows = slice(process_index * batch_size // process_count,
                            (process_index + 1) * batch_size // process_count)
    # Encoded passages are cached (int16 holds the 32128-token vocabulary)
    # when they fit the budget; otherwise re-tokenised per step.
    per_example = n_context * text_maxlength * 2
    self._cache: dict[int, tuple[np.ndarray, np.ndarray]] | None = (
        {} if per_example * len(self.examples) <= cache_limit_bytes else None)
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._pending: dict[int, concurrent.futures.Future] = {}

  @functools.lru_cache(maxsize=64)
  def _epoch_order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))

  def indices(self, step: int) -> np.ndarray:
    """Global example indices of the batch of 0-based ``step``."""
    n = len(self.examples)
    positions = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
    return np.array([self._epoch_order(int(p // n))[p % n] for p in positions])

  def _passages(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    if self._cache is not None and i in self._cache:
      tokens, mask = self._cache[i]
      return tokens.astype(np.int32), mask
    tokens, mask = fid_format.encode_example(
        self.tokenizer, self.examples[i], self.n_context, self.text_maxlength)
    if self._cache is not None:
      self._cache[i] = (tokens.astype(np.int16), mask)
    return tokens, mask

  def _build(self, step: int) -> dict[str, np.ndarray]:
    rows = self.indices(step)[self.local_rows]
    offset = self.local_rows.start
    enc, pmask, targets = [], [], []
    for j, i in enumerate(rows):
      tokens, mask = self._passages(int(i))
      enc.append(tokens)
      pmask.append(mask)
      rng = np.random.default_rng([self.seed, step, offset + j])
      text = fid_format.choose_target(self.examples[i], rng, self.dataset)
      targets.append(fid_format.encode_target(self.tokenizer, text,
                                              self.answer_maxlength))
    return {"encoder_input_tokens": np.stack(enc).astype(np.int32),
            "passage_mask": np.stack(pmask),
            "decoder_target_tokens": np.stack(targets).astype(np.int32)}

  def batch(self, step: int, prefetch: int = 2) -> dict[str, np.ndarray]:
    """The host-local batch of 0-based ``step``; prefetches the next ones."""
    future = self._pending.pop(step, None)
    result = future.result() if future is not None else self._build(step)
    for s in range(step + 1, step + 1 + prefetch):
      if s not in self._pending:
        self._pending[s] = self._pool.submit(self._build, s)
    for s in [s for s in self._pending if s < step]:
      self._pending.pop(s).cancel()
    return result

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)


def eval_batches(examples: Sequence[FidExample], tokenizer, *, batch_size: int,
                 n_context: int, text_maxlength: int):
  """Fixed-order batches for evaluation/prediction, the last one padded.

  Yields (first index, number of real rows, batch dict) with every batch of
  exactly ``batch_size`` rows, so one compiled function serves them all.
  """
  for start in range(0, len(examples), batch_size):
    chunk = examples[start:start + batch_size]
    enc, pmask = [], []
    for ex in chunk:
      tokens, mask = fid_format.encode_example(tokenizer, ex, n_context,
                                               text_maxlength)
      enc.append(tokens)
      pmask.append(mask)
    real = len(chunk)
    while len(enc) < batch_size:
      enc.append(np.zeros_like(enc[0]))
      pmask.append(np.zeros_like(pmask[0]))
    yield start, real, {"encoder_input_tokens": np.stack(enc).astype(np.int32),
                        "passage_mask": np.stack(pmask)}
