"""Retrieval inside training: the corpus, its retriever tokens, the sharded
index (:mod:`jaxfid.atlas.index`) and the query side, as the task uses them.

Letters: N passages, P retriever tokens per passage, Q per question, D
embedding width, k hits.

The corpus is read once (``CORPUS``, any format of
:mod:`jaxfid.retrieval.store.corpus`) and each passage tokenised once for
the retriever as Atlas's ``--retriever_format`` ``"{title} {text}"``
(EOS-terminated, ``PASSAGE_MAXLENGTH`` tokens): what every refresh embeds
and what a step's retriever re-embeds for the passages it retrieved.
Questions are tokenised once too, as PROMPT_FORMAT's query
(:func:`jaxfid.atlas.prompts.query`; 'atlas': "question: Q answer:
<extra_id_0>", ``QUERY_MAXLENGTH``). Searches embed the
questions with the current query tower and take the exact top k of the
index; they run on every process alike (SPMD), and every process gets all
the hits.

With ``rerank_k`` (``RERANK_K``, Atlas's ``retrieve_with_rerank``,
``src/atlas.py``) a search for k hits takes C = max(rerank_k, k) candidates
from the index (the embeddings of the last refresh), embeds their passage
tokens again with the current passage tower (``batch_size`` passages a
device per call, the candidates split over the mesh by rows), scores them
``q . p`` as the index does, and keeps the best k by those fresh scores.
"""
from __future__ import annotations

import functools
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

from jaxfid.atlas import prompts
from jaxfid.atlas.index import PassageIndex
from jaxfid.atlas.model import RETRIEVER, AtlasModel
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer, encode_padded
from jaxfid.dual_encoder.model import passage_text
from jaxfid.retrieval.store.corpus import Passage, read_corpus


def read_passages(path: str) -> list[Passage]:
  passages = [p for _, p in read_corpus(path)]
  if not passages:
    raise InputError(path, "the corpus has no passages")
  return passages


class InLoopRetriever:
  """The corpus, its index on ``mesh`` and the searches of a run.

  Args:
    model: the Atlas model (its retriever embeds).
    passages: the corpus.
    tokenizer: the run's vocabulary.
    mesh: the run's device mesh.
    passage_maxlength / query_maxlength: retriever token lengths.
    batch_size: the most passages each device embeds per encoder call when
      (re)building (:class:`~jaxfid.atlas.index.PassageIndex`) and when
      re-ranking, and queries per search call.
    dtype: the index's storage dtype.
    rerank_k: candidates a search re-scores with the current passage tower
      (module docstring); 0: none.
  """

  def __init__(self, model: AtlasModel, passages: Sequence[Passage],
               tokenizer: Tokenizer, mesh: Mesh, *, passage_maxlength: int,
               query_maxlength: int, batch_size: int, dtype: str,
               rerank_k: int = 0):
    self.model, self.passages, self.tokenizer = model, list(passages), tokenizer
    self.query_maxlength = query_maxlength
    self.passage_maxlength = passage_maxlength
    self.batch_size = batch_size
    self.rerank_k = rerank_k
    self.replicated = NamedSharding(mesh, PartitionSpec())
    self.index = PassageIndex(mesh, len(self.passages),
                              model.retriever.dim, dtype, batch_size)

  @functools.cached_property
  def tokens(self) -> np.ndarray:
    """The corpus's retriever tokens, int32 [N, P] (tokenised when first
    needed: a search of a loaded index never needs them)."""
    return encode_padded(
        self.tokenizer, [passage_text(p.title, p.text) for p in self.passages],
        self.passage_maxlength)

  # ---- the index ------------------------------------------------------------

  @functools.cached_property
  def _embed_passages(self):
    return lambda params, tokens: self.model.embed_passages(
        params[RETRIEVER], tokens)

  def refresh(self, params, progress: bool = False) -> None:
    """Re-embed the corpus with the passage tower of ``params``."""
    with tqdm(total=len(self.passages), desc="refresh index", file=sys.stderr,
              disable=not progress, leave=False) as bar:
      self.index.build(self._embed_passages, params, self.tokens, bar.update)

  # ---- searches ----------------------------------------------------------

  def query_tokens(self, questions: Sequence[str]) -> np.ndarray:
    """int32 [len(questions), Q]: the queries of PROMPT_FORMAT."""
    fmt = self.model.atlas.prompt_format
    return encode_padded(self.tokenizer,
                         [prompts.query(q, fmt) for q in questions],
                         self.query_maxlength)

  @functools.cached_property
  def _embed_queries(self):
    return jax.jit(lambda params, tokens: self.model.embed_queries(
        params[RETRIEVER], tokens), out_shardings=self.replicated)

  def search(self, params, tokens: np.ndarray, k: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """(ids int [n, k], scores float32 [n, k]) of the best k passages for
    each row of query ``tokens`` [n, Q], best first (re-scored with
    ``rerank_k``). Calls are of at most ``batch_size`` queries, padded to a
    power of two (few compilations)."""
    ids, scores = [], []
    b = min(self.batch_size, 1 << max(len(tokens) - 1, 0).bit_length())
    c = min(max(self.rerank_k, k), self.index.num_passages)
    for start in range(0, len(tokens), b):
      part = tokens[start:start + b]
      chunk = np.zeros((b, tokens.shape[1]), np.int32)
      chunk[:len(part)] = part
      q = self._embed_queries(params, jax.device_put(chunk, self.replicated))
      if self.rerank_k:
        s, i = self._rerank(params, q, c, k)
      else:
        s, i = self.index.search(q, k)
      ids.append(np.asarray(jax.device_get(i))[:len(part)])
      scores.append(np.asarray(jax.device_get(s))[:len(part)])
    return np.concatenate(ids), np.concatenate(scores)

  # ---- re-ranking (RERANK_K) ------------------------------------------------

  @functools.cached_property
  def _embed_passage_rows(self):
    return jax.jit(self._embed_passages, out_shardings=self.replicated)

  @functools.cached_property
  def _rescore(self):
    def rescore(q, p, ids, k):   # q [b, D], p [b, C, D], ids [b, C]
      fresh = jnp.einsum("bd,bcd->bc", q, p,
                         preferred_element_type=jnp.float32)   # [b, C]
      top, pos = jax.lax.top_k(fresh, k)                       # [b, k]
      return top, jnp.take_along_axis(ids, pos, axis=1)
    return jax.jit(rescore, static_argnums=3,
                   out_shardings=(self.replicated, self.replicated))

  def _rerank(self, params, q, c: int, k: int):
    """(scores [b, k], ids [b, k]): the index's top ``c`` for queries ``q``
    [b, D], embedded again by the current passage tower, best ``k`` by
    ``q . p``."""
    _, candidates = self.index.search(q, c)                    # [b, C]
    cand = np.asarray(jax.device_get(candidates))
    rows = self.tokens[cand.reshape(-1)]                       # [b*C, P]
    # Calls of E = S * batch_size rows, split by rows over the mesh as the
    # index's rows are: each device embeds batch_size of them.
    n, e = len(rows), self.index.shards * self.batch_size
    padded = np.zeros((-(-n // e) * e, rows.shape[1]), np.int32)  # [E*m, P]
    padded[:n] = rows
    embedded = [self._embed_passage_rows(params, jax.make_array_from_callback(
        (e, rows.shape[1]), self.index.sharding,
        lambda index, i=i: padded[i:i + e][index]))
        for i in range(0, len(padded), e)]                     # [E, D] each
    p = jnp.concatenate(embedded)[:n].reshape(cand.shape + (-1,))  # [b, C, D]
    return self._rescore(q, p, candidates, k)
