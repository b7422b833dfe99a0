"""ReFusion's example arrays and deterministic batches.

Each split is tokenized once into numpy arrays:

  encoder_input_tokens   int32 [N, L]        the prompt (+ EOS), 0-padded
  decoder_target_tokens  int32 [N, T]        the gold label word + EOS
  labels                 int32 [N]           class index
  neighbour_rows         int64 [N, S, K]     neighbour rows (-1 = none)

Training batches are a pure function of (seed, step) over per-epoch
permutations, so a resumed run sees the batches an uninterrupted one would;
each process makes only its own rows of the global batch.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxfid.core.tokenization import Tokenizer, encode_padded
from jaxfid.training.sampling import stream_indices


def label_token_matrix(label_words: Sequence[str], tokenizer: Tokenizer
                       ) -> np.ndarray:
  """int32 [C, T]: every label word's tokens + EOS, 0-padded to the longest."""
  ids = [tokenizer.encode(w) for w in label_words]
  width = max(len(i) for i in ids) + 1
  return encode_padded(tokenizer, list(label_words), width)


def with_neighbour_texts(inputs: Sequence[str], texts: Sequence[Sequence[str]]
                         ) -> list[str]:
  """The concatenation baseline: each input followed by its neighbours
  (truncation cuts neighbours, never the prompt)."""
  return [" ".join([x, *t]) for x, t in zip(inputs, texts)]


def encode_split(inputs: Sequence[str], label_ids: Sequence[int],
                 label_tokens: np.ndarray, tokenizer: Tokenizer,
                 max_length: int, neighbours: np.ndarray | None = None,
                 add_eos: bool = True) -> dict[str, np.ndarray]:
  """The arrays of one split (see the module docstring; ``add_eos``: the
  inputs end with EOS)."""
  labels = np.asarray(label_ids, np.int32)
  arrays = {
      "encoder_input_tokens": encode_padded(tokenizer, list(inputs), max_length,
                                            add_eos=add_eos),
      "decoder_target_tokens": label_tokens[labels],  # [N, T]
      "labels": labels,
  }
  if neighbours is not None:
    arrays["neighbours"] = np.asarray(neighbours, np.float32)
  return arrays


def truncation_count(inputs: Sequence[str], tokenizer: Tokenizer,
                     max_length: int) -> int:
  """How many inputs lose tokens at ``max_length`` (EOS included)."""
  return sum(len(ids) + 1 > max_length for ids in tokenizer.encode_batch(
      list(inputs)))


def train_batch(arrays: dict[str, np.ndarray], step: int, batch_size: int,
                seed: int, rows: slice | None = None) -> dict[str, np.ndarray]:
  """Rows ``rows`` (default all) of step ``step``'s batch (stream positions
  ``[step*B, (step+1)*B)``), labels dropped."""
  lo, hi = (0, batch_size) if rows is None else (rows.start, rows.stop)
  order = stream_indices(len(arrays["labels"]), seed, step * batch_size + lo,
                         hi - lo)
  return {k: v[order] for k, v in arrays.items() if k != "labels"}


def eval_batches(arrays: dict[str, np.ndarray], batch_size: int):
  """Yields (batch, number of real rows); the last batch is padded by
  repeating row 0, so every batch has the same shape (one compilation)."""
  n = len(arrays["labels"])
  for start in range(0, n, batch_size):
    rows = np.arange(start, min(start + batch_size, n))
    real = len(rows)
    if real < batch_size:
      rows = np.concatenate([rows, np.zeros(batch_size - real, np.int64)])
    yield {k: v[rows] for k, v in arrays.items() if k != "labels"}, real
