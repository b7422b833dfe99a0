"""Atlas's options as one config value (gin: ``AtlasTask.atlas =
@AtlasConfig()``, each field from its macro in ``gin/atlas/tiny.gin``).

The reader's options (``TRAIN_DATA``, ``EVAL_DATA``, ``N_CONTEXT``,
``TEXT_MAXLENGTH``, ...) are FiD's (:class:`~jaxfid.fid.config.
FidReaderConfig`): ``N_CONTEXT`` is both the passages retrieved per
question and the passages the reader reads (Atlas's ``--n_context`` and
``--retriever_n_context``, equal in its example scripts). The training
examples' own ``ctxs`` are not read: every passage comes from the in-loop
index over ``CORPUS``.
"""
from __future__ import annotations

import dataclasses

from jaxfid.core.config import Config, option

RETRIEVER_LOSSES = ("adist", "emdr2", "pdist", "loop", "none")
QUERY_SIDE_MODES = ("frozen", "shared")
INDEX_DTYPES = ("bfloat16", "float32", "int8")


@dataclasses.dataclass(frozen=True)
class AtlasConfig(Config):
  """The retriever's objective, the in-loop index and its refresh.

  Attributes:
    corpus: the passages (DPR TSV or JSONL) the in-loop index holds.
    retriever_loss: Atlas's ``--gold_score_mode``: 'adist' (attention
      distillation: the ``normssum`` aggregate that Atlas's ``adist`` /
      ``evalnormsum`` evidently means; the released code looks up
      ``normsum`` and raises KeyError), 'emdr2' (``emdr``), 'pdist'
      (perplexity distillation, ``ppmean``), 'loop' (leave-one-out),
      'none' (the retriever is not trained).
    temperature_gold: Atlas's ``--temperature_gold`` (the reader's scores).
    temperature_score: Atlas's ``--temperature_score`` (the retriever's).
    refresh_every: re-embed the corpus with the current passage encoder
      every this many steps (Atlas's ``--refresh_index`` with one
      interval); 0: only at the start.
    query_side_only: Atlas's ``--query_side_retriever_training``: the
      retriever learns through the query embeddings only; the passage
      embeddings of the loss are computed without dropout and without
      gradient. How the passage side relates to the trained weights is
      ``query_side_mode``'s.
    query_side_mode: with ``query_side_only``: 'frozen' (the default): a
      separate passage tower, a copy of the initial weights that no update
      moves, and the index is never refreshed (what the option's help text
      and the Atlas paper describe); 'shared': what the released code does
      (``UntiedDualEncoderRetriever`` deep-copies only an encoder with a
      ``.module`` attribute, so a bare Contriever is one module for both
      sides, ``src/retrievers.py:116-117``; the passage side runs under
      ``torch.no_grad()``, ``src/retrievers.py:124-130``): one tower, whose
      weights the query side's updates move, so the passage embeddings of
      the loss are those of the current weights while the index stays as
      last built (REFRESH_EVERY applies, as ``--refresh_index`` does).
    init_retriever: the retriever's initial weights (a dual encoder
      MODEL_DIR, a sentence-transformers / HF T5 directory, a T5X
      checkpoint); None: random (SEED), or an Atlas INIT_CHECKPOINT's.
    query_maxlength: retriever tokens per question, EOS included.
    passage_maxlength: retriever tokens per passage, EOS included (Atlas's
      retriever reads ``"{title} {text}"``, its ``--retriever_format``).
    index_batch_size: the most passages each device embeds per encoder
      call when the index is (re)built (Atlas's
      ``--per_gpu_embedder_batch_size``: each device embeds its own rows)
      and when RERANK_K re-embeds its candidates; queries per search
      call.
    rerank_k: Atlas's ``--retrieve_with_rerank`` with
      ``--n_to_rerank_with_retrieve_with_rerank``: every search takes this
      many candidates from the index (built at the last refresh), embeds
      them again with the current passage tower and keeps the best by the
      fresh scores; 0: off (the index's order).
    index_dtype: the stored embeddings' dtype (scores are accumulated in
      float32); 'int8': symmetric per-row int8 codes and a float32 scale
      per row (:func:`jaxfid.atlas.index.quantize_int8`).
    eval_recall_k: the largest k of the logged ``eval_recall@k`` (with 1
      and 5).
  """
  corpus: str = option()
  retriever_loss: str = option("pdist", choices=RETRIEVER_LOSSES)
  temperature_gold: float = option(0.01, above=0)
  temperature_score: float = option(0.01, above=0)
  refresh_every: int = option(0, low=0)
  query_side_only: bool = option(False)
  query_side_mode: str = option("frozen", choices=QUERY_SIDE_MODES)
  init_retriever: str | None = option(None)
  query_maxlength: int = option(64, low=2)
  passage_maxlength: int = option(256, low=2)
  index_batch_size: int = option(256, low=1)
  index_dtype: str = option("bfloat16", choices=INDEX_DTYPES)
  rerank_k: int = option(0, low=0)
  eval_recall_k: int = option(20, low=5)

  @property
  def separate_towers(self) -> bool:
    """Whether the retriever has a query tower of its own beside a frozen
    passage tower (``query_side_only`` with ``query_side_mode`` 'frozen')."""
    return self.query_side_only and self.query_side_mode == "frozen"

  def refresh_steps(self, train_steps: int) -> list[int]:
    """The steps after which the index is (re)built: 0 (the start), then
    every ``refresh_every`` before the end (never with a frozen passage
    tower: :attr:`separate_towers`)."""
    if self.separate_towers or not self.refresh_every:
      return [0]
    return list(range(0, train_steps, self.refresh_every))
