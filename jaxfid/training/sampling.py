"""Which examples a training step sees: a pure function of (seed, step).

Epoch ``e`` visits ``permutation(seed, e)``. :func:`stream_indices`
concatenates epochs and gives step ``s`` positions ``[s*B, (s+1)*B)``;
:func:`epoch_batch_indices` cuts each epoch into whole batches, so no
example appears twice in a batch.
"""
from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=64)
def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
  """The order in which epoch ``epoch`` visits ``num_examples`` examples."""
  order = np.random.default_rng([seed, epoch]).permutation(num_examples)
  order.flags.writeable = False
  return order


def stream_indices(num_examples: int, seed: int, start: int, count: int
                   ) -> np.ndarray:
  """Example indices at positions ``[start, start + count)`` of the stream."""
  positions = np.arange(start, start + count)
  epochs, offsets = np.divmod(positions, num_examples)
  return np.array([epoch_order(num_examples, seed, int(e))[o]
                   for e, o in zip(epochs, offsets)], np.int64)


def epoch_batch_indices(num_examples: int, seed: int, step: int,
                        batch_size: int) -> np.ndarray:
  """The examples of ``step`` when every epoch is cut into whole batches."""
  per_epoch = num_examples // batch_size
  epoch, k = divmod(step, per_epoch)
  order = epoch_order(num_examples, seed, epoch)
  return order[k * batch_size:(k + 1) * batch_size]
