"""Atlas's options as one config value (gin: ``AtlasTask.atlas =
@AtlasConfig()``, each field from its macro in ``gin/atlas/tiny.gin``).

The reader's options (``TRAIN_DATA``, ``EVAL_DATA``, ``N_CONTEXT``,
``TEXT_MAXLENGTH``, ...) are FiD's (:class:`~jaxfid.reader.config.
FidReaderConfig`): ``N_CONTEXT`` is the passages the reader reads (Atlas's
``--n_context``) and, unless RETRIEVER_N_CONTEXT says more, the passages
retrieved per question (``--retriever_n_context``). The training
examples' own ``ctxs`` are not read: every passage comes from the in-loop
index over ``CORPUS``.
"""
from __future__ import annotations

import dataclasses

from jaxfid.atlas.prompts import PROMPT_FORMATS
from jaxfid.core.config import Config, option
from jaxfid.core.errors import InputError

NEVER = 2 ** 32  # Atlas's rate and end of "-1" (never refresh)
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
    refresh_every: Atlas's ``--refresh_index``: re-embed the corpus with
      the current passage encoder every this many steps (an int; 0 or
      "-1": only at the start), or a piecewise schedule parsed as Atlas's
      ``IndexRefreshScheduler`` (``src/util.py:111-158``): pieces
      ``"start-end:rate"`` joined by commas, e.g. "0-1000:500,1000-10000:2000";
      a step s refreshes when the first piece with ``start <= s < end`` has
      ``(s - start) % rate == 0``, and a step no piece covers does not.
      The index is always built at step 0.
    retriever_n_context: Atlas's ``--retriever_n_context``: passages
      retrieved per question, all of them scored by the reader for the gold
      scores and by the retriever for its loss, of which the reader trains
      on the first N_CONTEXT (``src/atlas.py:432-447,489-490``); None:
      N_CONTEXT. At least N_CONTEXT (Atlas would let the reader read
      fewer).
    retriever_learning_rate: Atlas's ``--lr_retriever``: the retriever's
      peak learning rate, on the run's SCHEDULE and WARMUP_STEPS (the
      reader's: LEARNING_RATE); None: LEARNING_RATE for both, one
      optimizer (:func:`jaxfid.atlas.step.atlas_optimizer`).
    freeze_retriever_steps: Atlas's ``--freeze_retriever_steps``: the
      first this many steps train the reader only (no retriever loss; the
      retriever's parameters and optimizer state are kept, as PyTorch's
      AdamW skips parameters without a gradient), and no refresh falls
      inside them (``src/util.py:148``, ``train.py:85``); 0: off.
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
    prompt_format: what the reader and the retriever read
      (:mod:`jaxfid.atlas.prompts`): 'atlas', the released code's QA
      prompt (rows "question: Q answer: <extra_id_0> title: T context: P",
      target "<extra_id_0> A", the retriever's query "question: Q answer:
      <extra_id_0>", sentinels dropped from the generated answer); 'fid',
      FiD's rows "question: Q title: T context: P", the answer as target,
      the bare question to the retriever.
  """
  corpus: str = option()
  retriever_loss: str = option("pdist", choices=RETRIEVER_LOSSES)
  temperature_gold: float = option(0.01, above=0)
  temperature_score: float = option(0.01, above=0)
  refresh_every: int | str = option(0, test=lambda v: _refresh_problem(v))
  freeze_retriever_steps: int = option(0, low=0)
  retriever_learning_rate: float | None = option(None, low=0)
  retriever_n_context: int | None = option(None, low=1)
  query_side_only: bool = option(False)
  query_side_mode: str = option("frozen", choices=QUERY_SIDE_MODES)
  init_retriever: str | None = option(None)
  query_maxlength: int = option(64, low=2)
  passage_maxlength: int = option(256, low=2)
  index_batch_size: int = option(256, low=1)
  index_dtype: str = option("bfloat16", choices=INDEX_DTYPES)
  rerank_k: int = option(0, low=0)
  eval_recall_k: int = option(20, low=5)
  prompt_format: str = option("atlas", choices=PROMPT_FORMATS)

  def retrieved(self, n_context: int) -> int:
    """Passages retrieved per question when the reader reads
    ``n_context``."""
    return self.retriever_n_context or n_context

  @property
  def separate_towers(self) -> bool:
    """Whether the retriever has a query tower of its own beside a frozen
    passage tower (``query_side_only`` with ``query_side_mode`` 'frozen')."""
    return self.query_side_only and self.query_side_mode == "frozen"

  def refresh_steps(self, train_steps: int) -> list[int]:
    """The steps after which the index is (re)built: 0 (the start), then
    those of ``refresh_every`` before the end that are not inside the
    first ``freeze_retriever_steps`` (never with a frozen passage tower:
    :attr:`separate_towers`)."""
    if self.separate_towers:
      return [0]
    pieces = refresh_pieces(self.refresh_every)
    steps = [0]
    for s in range(max(1, self.freeze_retriever_steps), train_steps):
      for start, end, rate in pieces:
        if start <= s < end:
          if (s - start) % rate == 0:
            steps.append(s)
          break
    return steps


def _refresh_problem(value) -> str | None:
  try:
    refresh_pieces(value)
  except InputError as e:
    return str(e).split(": ", 1)[-1]
  return None


def refresh_pieces(value: int | str) -> list[tuple[int, int, int]]:
  """``[(start, end, rate)]`` of a REFRESH_EVERY value, as Atlas's
  ``IndexRefreshScheduler.parse_index_refresh_schedule_string`` reads it
  (an int N or "N": ``[(0, 2**32, N)]``; 0 or "-1": never after the
  start)."""
  if isinstance(value, bool) or not isinstance(value, (int, str)):
    raise InputError("REFRESH_EVERY", f"must be an int or a schedule such "
                     f"as '0-1000:500,1000-10000:2000', got {value!r}")
  text = str(value).strip()
  if text in ("0", "-1"):
    return [(0, NEVER, NEVER)]
  if text.isdigit():
    return [(0, NEVER, int(text))]
  pieces = []
  for piece in text.split(","):
    try:
      span, rate = piece.split(":")
      start, end = (int(x) for x in span.split("-"))
      rate = int(rate)
    except ValueError:
      raise InputError("REFRESH_EVERY", f"{piece!r} of {value!r} is not "
                       "'start-end:rate' (e.g. '0-1000:500,1000-10000:2000')"
                       ) from None
    if not 0 <= start < end or rate < 1:
      raise InputError("REFRESH_EVERY", f"{piece!r} of {value!r}: needs 0 <= "
                       "start < end and rate >= 1")
    pieces.append((start, end, rate))
  return pieces
