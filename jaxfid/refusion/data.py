"""A ReFusion run's few-shot data: splits, neighbours, arrays, batch vectors.

'input' retrieval keeps only the neighbours' rows (``neighbour_rows``
[N, S, K]) and :class:`NeighbourVectors` gathers a batch's vectors when it
is made; 'hidden' retrieval searches per batch with the encoder states; the
concatenation baseline appends the neighbour sentences to the input text.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer
from jaxfid.refusion import batches as batch_lib
from jaxfid.refusion import lmbff
from jaxfid.refusion import neighbours as nb_lib
from jaxfid.refusion.model import ReFusionModel


def read_splits(spec: lmbff.TaskSpec, data_dir: str
                ) -> dict[str, list[lmbff.Example]]:
  """Every split of the task (train, dev, test), read and checked."""
  return {s: lmbff.read_split(spec, data_dir, s) for s in lmbff.SPLITS}


def database_width(retrieval_db: str | None, *, fused: bool, concat: bool,
                   db_dim: int | None, hidden_width: int | None,
                   mode: str) -> int:
  """R, the width of RETRIEVAL_DB's vectors (0 without fusion modules or
  CONCAT_NEIGHBOURS), checked against DB_DIM (``db_dim``, with fusion) and,
  in 'hidden' or 'layer' retrieval (``mode``), against the model's hidden
  states that query it (``hidden_width``)."""
  if not (fused or concat):
    return 0
  width = nb_lib.db_width(retrieval_db)
  if fused and db_dim is not None and db_dim != width:
    raise InputError(retrieval_db, f"holds {width}-d vectors, but DB_DIM is "
                     f"{db_dim}")
  if hidden_width is not None and width != hidden_width:
    raise InputError(retrieval_db, f"RETRIEVAL_MODE {mode!r} queries the "
                     f"database with the model's {hidden_width}-d hidden "
                     f"states, but it holds {width}-d vectors: build it with "
                     "`jaxfid index dense --checkpoint` of this backbone")
  return width


def encode_splits(spec: lmbff.TaskSpec, splits: dict[str, Sequence],
                  tokenizer: Tokenizer, label_tokens: np.ndarray, *,
                  max_length: int, retrieval_db: str | None, top_k: int,
                  fused: bool, hidden: bool, concat_neighbours: bool,
                  neighbour_cache: str | None, progress: bool,
                  input_eos: bool = True
                  ) -> dict[str, dict[str, np.ndarray]]:
  """The arrays of every split; ``fused``: the model has fusion modules;
  ``hidden``: no offline neighbours; ``input_eos``: inputs end with EOS."""
  count_tokens = lambda text: len(tokenizer.encode(text))
  offline = concat_neighbours or (fused and not hidden)
  arrays = {}
  for name, examples in splits.items():
    # The prompt is fitted to MAX_LENGTH by shortening the sentences, so the
    # mask (often at the end of the template) is never truncated away.
    inputs = [lmbff.render_fitted(spec, ex, max_length - int(input_eos),
                                  count_tokens) for ex in examples]
    rows = None
    if offline:
      rows = nb_lib.retrieve_neighbours(
          retrieval_db, [lmbff.segments(spec, ex) for ex in examples], top_k,
          cache_dir=neighbour_cache, progress=progress,
          with_vectors=False).rows                             # [N, S, K]
    if concat_neighbours:
      inputs = batch_lib.with_neighbour_texts(
          inputs, nb_lib.neighbour_texts(retrieval_db, rows))
    arrays[name] = batch_lib.encode_split(
        inputs, [ex.label for ex in examples], label_tokens, tokenizer,
        max_length, add_eos=input_eos)
    if fused and not hidden:  # rows only: vectors are gathered per batch
      arrays[name]["neighbour_rows"] = rows
  return arrays


class NeighbourVectors:
  """Adds each batch's ``neighbours`` vectors float32 [B, S, K, R].

  'input': the stored vectors of ``neighbour_rows``; 'hidden': a search with
  the backbone's mean-pooled encoder states (S = 1); no fusion: unchanged.
  """

  def __init__(self, model: ReFusionModel, retrieval_db: str | None, *,
               top_k: int, hidden: bool):
    self.searcher = (nb_lib.open_database(retrieval_db)
                     if model.fusion.enabled else None)
    self.hidden = hidden and model.fusion.enabled
    self.top_k = top_k
    self._pooled = jax.jit(model.pooled_hidden)

  def __call__(self, params, host: dict,
               replicate: Callable[[Any], Any]) -> dict:
    """``host`` with its ``neighbours`` (``replicate`` places the queries'
    tokens for the on-line search)."""
    if "neighbour_rows" in host:
      host = dict(host)
      rows = host.pop("neighbour_rows")                         # [B, S, K]
      return dict(host, neighbours=nb_lib.gather_vectors(self.searcher, rows))
    if not self.hidden:
      return host
    queries = np.asarray(jax.device_get(self._pooled(
        params, replicate(host["encoder_input_tokens"]))), np.float32)  # [B, D]
    return dict(host, neighbours=nb_lib.online_neighbours(
        self.searcher, queries, self.top_k))
