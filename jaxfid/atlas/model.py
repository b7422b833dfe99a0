"""Atlas's model: a FiD reader and a T5 dual-encoder retriever, one
parameter tree ``{"reader": T5 params, "retriever": dual encoder params}``,
and the joint loss of a training step.

Letters: B questions (of this microbatch), K retrieved passages, L reader
tokens per passage, P retriever tokens per passage, Q retriever tokens per
question, T target tokens.

The batch (:mod:`jaxfid.atlas.batches`) holds the passages the in-loop
index retrieved for each question: the reader's rows
``encoder_input_tokens`` [B, K, L] (``"question: Q title: T context: P"``),
``passage_mask`` [B, K], ``decoder_target_tokens`` [B, T], and the
retriever's ``query_tokens`` [B, Q] and ``passage_tokens`` [B, K, P].

The loss (Atlas ``train.py``: ``train_loss = reader_loss + retriever_loss``)
is the reader's token cross-entropy over the first N_CONTEXT of the K
passages (all K unless RETRIEVER_N_CONTEXT is larger) plus the retriever
loss of ``RETRIEVER_LOSS`` (:mod:`jaxfid.atlas.losses`) on the retriever's
fresh scores of all K passages, whose gold scores come from the reader
(:mod:`jaxfid.atlas.gold`). The reader learns from the reader loss only,
the retriever from the retriever loss only (the gold scores are
constants). With ``QUERY_SIDE_ONLY`` the retriever learns through the
query embeddings only: the passage embeddings of the loss are computed
without dropout under ``stop_gradient`` (Atlas's
``UntiedDualEncoderRetriever.embed_passages``: ``eval()`` and
``torch.no_grad()``, ``src/retrievers.py:123-135``; it never sets
``requires_grad``). QUERY_SIDE_MODE says from which weights: 'frozen', a
separate passage tower that the step keeps (:mod:`jaxfid.atlas.step`; the
query tower starts as its copy, as ``UntiedDualEncoderRetriever`` means
to); 'shared', the one tower being trained (what the released code does
with a bare Contriever, which its ``copy.deepcopy`` skips,
``src/retrievers.py:116-117``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxfid.atlas import gold as gold_lib
from jaxfid.atlas.config import AtlasConfig
from jaxfid.atlas.losses import emdr_loss, kl_loss, retriever_scores
from jaxfid.dual_encoder.model import QUERY_TOWER, DualEncoder
from jaxfid.t5.layers import fold
from jaxfid.t5.model import EncoderDecoderModel, cross_entropy, decoder_inputs

Array = jax.Array
READER, RETRIEVER = "reader", "retriever"
# metrics that are sums over the whole batch's normaliser: they add up over
# microbatches (jaxfid.training.step.make_train_step's ``additive``)
ADDITIVE = ("num_target_tokens", "reader_loss", "retriever_loss")


class AtlasModel:
  """The reader and the retriever as pure functions of one parameter tree.

  Args:
    reader: the FiD reader (an encoder-decoder).
    retriever: the dual encoder (separate towers with QUERY_SIDE_ONLY in
      QUERY_SIDE_MODE 'frozen').
    atlas: the objective and its temperatures.
    reader_n_context: the reader trains on the first this many of a
      batch's K retrieved passages (N_CONTEXT, with RETRIEVER_N_CONTEXT
      above it); None: all K.
  """

  def __init__(self, reader: EncoderDecoderModel, retriever: DualEncoder,
               atlas: AtlasConfig, reader_n_context: int | None = None):
    self.reader, self.retriever, self.atlas = reader, retriever, atlas
    self.reader_n_context = reader_n_context
    self.config = reader.config  # the run config's "model" (the reader's)
    self.additive_metrics = ADDITIVE

  def init_params(self, seed: int = 0) -> dict:
    """Random parameters; separate towers (QUERY_SIDE_MODE 'frozen') start
    equal, the query tower a copy of the passage tower."""
    return {READER: self.reader.init_params(seed),
            RETRIEVER: untied(self.retriever.init_params(seed + 1))}

  def abstract_params(self) -> dict:
    return {READER: self.reader.abstract_params(),
            RETRIEVER: self.retriever.abstract_params()}

  def param_axes(self) -> dict:
    return {READER: self.reader.param_axes(),
            RETRIEVER: self.retriever.param_axes()}

  # ---- retrieval ---------------------------------------------------------

  def embed_queries(self, params: dict, tokens: Array,
                    dropout_rng: Array | None = None) -> Array:
    """float32 [B, D]: the query tower of ``params[RETRIEVER]``."""
    return self.retriever.embed(params, tokens, tower="query",
                                dropout_rng=dropout_rng)

  def embed_passages(self, params: dict, tokens: Array,
                     dropout_rng: Array | None = None) -> Array:
    """float32 [N, D]: the passage tower of ``params[RETRIEVER]``."""
    return self.retriever.embed(params, tokens, tower="passage",
                                dropout_rng=dropout_rng)

  # ---- the joint loss ------------------------------------------------------

  def gold(self, params: dict, batch: dict) -> Array:
    """The reader's gold scores of the batch's passages ([B, K]; EMDR^2:
    token log-probabilities [B, K, T])."""
    mode, reader = self.atlas.retriever_loss, params[READER]
    args = (self.reader, reader, batch["encoder_input_tokens"],
            batch["passage_mask"], batch["decoder_target_tokens"])
    if mode == "adist":
      return gold_lib.adist_gold(*args)
    if mode == "pdist":
      return gold_lib.pdist_gold(*args)
    if mode == "loop":
      return gold_lib.loop_gold(*args)
    if mode == "emdr2":
      return gold_lib.emdr_token_logprobs(
          *args, temperature_gold=self.atlas.temperature_gold)
    raise ValueError(f"no gold scores for RETRIEVER_LOSS {mode!r}")

  def scores(self, params: dict, batch: dict,
             dropout_rng: Array | None = None) -> Array:
    """float32 [B, K]: the retriever's scores of the batch's passages, with
    gradients through the query embeddings (and the passage embeddings
    unless QUERY_SIDE_ONLY, where the passage side runs without dropout and
    without gradient, as Atlas's ``UntiedDualEncoderRetriever.
    embed_passages`` in eval mode under ``torch.no_grad()``; in
    QUERY_SIDE_MODE 'shared' from the same weights as the query side)."""
    retriever = params[RETRIEVER]
    q = self.embed_queries(retriever, batch["query_tokens"],
                           fold(dropout_rng, 0))                    # [B, D]
    b, k, length = batch["passage_tokens"].shape
    no_grad = self.atlas.query_side_only  # eval mode, no gradient (Atlas)
    p = self.embed_passages(
        jax.lax.stop_gradient(retriever) if no_grad else retriever,
        batch["passage_tokens"].reshape(b * k, length),
        None if no_grad else fold(dropout_rng, 1))                  # [B*K, D]
    return retriever_scores(q, p.reshape(b, k, -1))                 # [B, K]

  def retriever_loss(self, params: dict, batch: dict, normalizer: dict,
                     dropout_rng: Array | None = None) -> Array:
    """The objective of ``RETRIEVER_LOSS`` ('none': 0), divided by the whole
    batch's count (``normalizer``)."""
    atlas = self.atlas
    if atlas.retriever_loss == "none":
      return jnp.zeros((), jnp.float32)
    scores = self.scores(params, batch, dropout_rng)
    gold = self.gold(params, batch)
    if atlas.retriever_loss == "emdr2":
      return emdr_loss(scores, gold, batch["decoder_target_tokens"] > 0,
                       temperature_score=atlas.temperature_score,
                       count=normalizer["tokens"])
    return kl_loss(scores, gold, temperature_gold=atlas.temperature_gold,
                   temperature_score=atlas.temperature_score,
                   count=normalizer["passages"])

  def loss(self, params: dict, batch: dict, dropout_rng: Array | None = None,
           normalizer: dict | None = None, train_retriever: bool = True
           ) -> tuple[Array, dict]:
    """``reader_loss + retriever_loss`` and metrics; ``normalizer``:
    ``{"tokens", "passages"}`` of the whole batch (:func:`normalizer`),
    default this batch's; ``train_retriever=False``: the reader's loss
    alone (FREEZE_RETRIEVER_STEPS; Atlas's ``train_retriever`` argument,
    ``src/atlas.py:452``)."""
    normalizer = normalizer or batch_normalizer(batch)
    targets = batch["decoder_target_tokens"]
    n = self.reader_n_context                  # the reader's first n of K
    logits = self.reader.logits(params[READER],
                                batch["encoder_input_tokens"][:, :n],
                                decoder_inputs(batch),
                                passage_mask=batch["passage_mask"][:, :n],
                                dropout_rng=fold(dropout_rng, 0))
    reader_loss, n, acc = cross_entropy(logits, targets, normalizer["tokens"])
    retriever_loss = (self.retriever_loss(params, batch, normalizer,
                                          fold(dropout_rng, 1))
                      if train_retriever else jnp.zeros((), jnp.float32))
    loss = reader_loss + retriever_loss
    return loss, {"loss": loss, "reader_loss": reader_loss,
                  "retriever_loss": retriever_loss, "num_target_tokens": n,
                  "token_accuracy": acc}


def untied(retriever: dict) -> dict:
  """Dual encoder parameters whose query tower (if any) is a copy of the
  passage tower: arrays of their own (a train state whose leaves shared a
  buffer could not be donated)."""
  if QUERY_TOWER not in retriever:
    return retriever
  tower = {k: v for k, v in retriever.items() if k != QUERY_TOWER}
  return {**tower, QUERY_TOWER: jax.tree.map(jnp.copy, tower)}


def batch_normalizer(batch: dict) -> dict:
  """The counts a whole batch's losses are divided by: its target tokens
  (the reader's and EMDR^2's) and its passages, B x K (``KLDivLoss``'s
  'mean')."""
  return {"tokens": jnp.sum(batch["decoder_target_tokens"] > 0).astype(
              jnp.float32),
          "passages": jnp.float32(batch["passage_mask"].size)}
