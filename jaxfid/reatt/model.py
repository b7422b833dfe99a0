"""Retrieval as Attention (ReAtt; Jiang et al., EMNLP 2022) on the jaxfid T5.

Einsum letters: B questions, P passages per question, N = B*P passage rows,
L tokens per row, Q question-token positions, S document-token positions,
H heads, E head width, D d_model, T target length.

A ReAtt batch is a FiD batch [B, P, L] plus ``question_length`` [B]. Encoder
layers ``[0, n)`` (``n = bi_encoder_layers``) are a bi-encoder (question and
document tokens attend only within their block), layers ``[n, num_layers)``
and the decoder are FiD's; with ``n = 0`` the model is FiD. Relevance:
layer ``n``'s query/key projections, ``r_h = mean_i max_j q_i . k_j`` per
head, combined by ``softmax(w / tau)`` over the only new parameter
``reatt/head_weights`` [H]. Loss: ``QA + kl_weight * KL(P_tgt || P_ret)``
(:mod:`jaxfid.reatt.loss`, :mod:`jaxfid.reatt.retrieval_attention`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxfid.core.config import Config, option
from jaxfid.t5.config import T5Config
from jaxfid.t5.layers import fold
from jaxfid.t5.model import EncoderDecoderModel, cross_entropy, decoder_inputs
from jaxfid.t5.network import T5, StackOutput
from jaxfid.t5.passages import as_passages
from jaxfid.reatt.loss import (in_batch_targets, kl_to_target,
                               target_distribution)
from jaxfid.reatt.retrieval_attention import (
    avg_max_relevance, bi_encode, block_mask, head_probabilities,
    question_lengths_from_tokens, retrieval_keys, retrieval_queries)

Array = jax.Array
PARAMS_KEY = "reatt"            # params = T5 params + {"reatt": {...}}
HEAD_WEIGHTS = "head_weights"
SCORE_SCALE = "score_scale"     # log of the learned relevance scale (option)
HEAD_AXIS = "reatt_heads"       # not in the sharding rules: replicated


@dataclasses.dataclass(frozen=True)
class ReAttConfig(Config):
  """ReAtt's switches on top of the T5 config.

  Attributes:
    bi_encoder_layers: encoder layers run as a bi-encoder (at least 1);
      retrieval attention uses layer ``bi_encoder_layers``.
    head_temperature: tau of the head selector ``softmax(w / tau)``.
    in_batch_negatives: score every question against every document of the
      batch (other questions' documents get target 0); otherwise only its
      own close documents.
    separator_ids: token ids of ``title:``, to find the question prefix when
      a batch has no ``question_length``; filled in by the task.
    relevance_chunk: documents per chunk when scoring in-batch relevance
      (bounds memory: [B, H, Q, chunk, S] at a time); 0 = one go.
    query_maxlength: question tokens that take part in retrieval (the
      first ones of the row); 0 = the whole row.
    score_scale: learn a scale ``exp(c)`` of the relevance scores in the KL
      (parameter ``score_scale``, c starts at 0); rankings do not depend on it.
    position_bias: add the encoder's relative position bias to the training
      scores before the max (the original's training path); retrieval never
      adds it, so training and retrieval then score differently.
  """
  bi_encoder_layers: int = option(12, low=1)
  head_temperature: float = option(0.001, above=0)
  in_batch_negatives: bool = True
  separator_ids: tuple[int, ...] = (2233, 10)
  relevance_chunk: int = option(0, low=0)
  query_maxlength: int = option(0, low=0)
  score_scale: bool = False
  position_bias: bool = False


@dataclasses.dataclass
class SplitEncoding:
  """The split encoder's outputs for B questions of P rows."""
  hidden: Array                 # [B, P*L, D] cross-encoder output
  mask: Array                   # bool [B, P*L]
  queries: Array | None = None  # [B, Q, H, E] question-token queries
  query_mask: Array | None = None  # bool [B, Q]
  keys: Array | None = None     # [B*P, L, H, E] document-token keys
  key_mask: Array | None = None  # bool [B*P, L]


# -------------------------------------------------------------------- model


def t5_part(params: dict) -> dict:
  """The T5 parameters of ReAtt params (all but ``reatt/``): what HF and
  T5X checkpoints hold and :class:`T5` runs."""
  return {k: v for k, v in params.items() if k != PARAMS_KEY}


def add_head_weights(t5_params: dict, num_heads: int,
                     score_scale: bool = False) -> dict:
  """ReAtt params from T5 params (``reatt/head_weights`` zeros [H] added)
  or from ReAtt params; with ``score_scale`` ``reatt/score_scale`` is 0
  unless present, without it the parameter is dropped."""
  own = dict(t5_params.get(PARAMS_KEY) or
             {HEAD_WEIGHTS: jnp.zeros((num_heads,), jnp.float32)})
  if score_scale:
    own.setdefault(SCORE_SCALE, jnp.zeros((), jnp.float32))
  else:
    own.pop(SCORE_SCALE, None)
  return {**t5_params, PARAMS_KEY: own}


class ReAttModel(EncoderDecoderModel):
  """FiD's model with the split encoder, retrieval attention and the KL loss.

  ``params`` is the T5 dict plus ``{"reatt": {"head_weights": [H]}}``, so any
  T5 checkpoint initialises it. :meth:`encode` is the base's encode hook; on
  FiD inputs the question prefix is found from the ``title:`` tokens.
  """

  # under accumulation these add up over microbatches (see training/step.py)
  additive_metrics = ("num_target_tokens", "qa_loss")

  def __init__(self, config: T5Config, reatt: ReAttConfig = ReAttConfig()):
    if not 0 <= reatt.bi_encoder_layers < config.num_layers:
      raise ValueError(f"bi_encoder_layers must be in [0, {config.num_layers})"
                       f" for a {config.num_layers}-layer encoder, got "
                       f"{reatt.bi_encoder_layers}")
    super().__init__(config)
    self.reatt = reatt

  # ---- parameters -------------------------------------------------------

  def init_params(self, seed: int = 0) -> dict:
    return add_head_weights(super().init_params(seed), self.config.num_heads,
                            self.reatt.score_scale)

  def abstract_params(self) -> dict:
    params = super().abstract_params()
    params[PARAMS_KEY] = {HEAD_WEIGHTS: jax.ShapeDtypeStruct(
        (self.config.num_heads,), jnp.float32)}
    if self.reatt.score_scale:
      params[PARAMS_KEY][SCORE_SCALE] = jax.ShapeDtypeStruct((), jnp.float32)
    return params

  def param_axes(self) -> dict:
    axes = super().param_axes()
    axes[PARAMS_KEY] = {HEAD_WEIGHTS: (HEAD_AXIS,)}
    if self.reatt.score_scale:
      axes[PARAMS_KEY][SCORE_SCALE] = ()
    return axes

  def network(self, params: dict) -> T5:
    return super().network(t5_part(params))

  def head_probabilities(self, params: dict) -> Array:
    return head_probabilities(params[PARAMS_KEY][HEAD_WEIGHTS],
                              self.reatt.head_temperature)

  # ---- the split encoder ------------------------------------------------

  def row_question_lengths(self, tokens: Array,
                           question_length: Array | None = None) -> Array:
    """int32 [B, P]: the question prefix length of every row."""
    if question_length is None:
      return question_lengths_from_tokens(tokens, self.reatt.separator_ids)
    qlen = jnp.minimum(question_length.astype(jnp.int32), tokens.shape[-1])
    return jnp.broadcast_to(qlen[:, None], tokens.shape[:2])

  def encode(self, net: T5, tokens: Array, passage_mask: Array | None = None,
             question_length: Array | None = None, *,
             dropout_rng: Array | None = None, extras: Any = None,
             with_retrieval: bool = False) -> SplitEncoding:
    """Encode [B, P, L] rows: bi-encoder, then cross-encoder (FiD layout).

    Dropout keys as ``T5.encode``; ``with_retrieval`` also returns layer ``n``'s
    question queries and every row's document keys.
    """
    tokens = as_passages(tokens)
    b, p, l = tokens.shape
    n = self.reatt.bi_encoder_layers
    valid = tokens != 0                                           # [B, P, L]
    if passage_mask is not None:
      valid = valid & passage_mask[:, :, None]
    qlen = self.row_question_lengths(tokens, question_length)     # [B, P]
    flat_valid = valid.reshape(b * p, l)
    flat_qlen = qlen.reshape(b * p)
    x = net.embed(tokens.reshape(b * p, l), fold(dropout_rng, 0))  # [N, L, D]
    enc_rng = fold(dropout_rng, 1)
    h = bi_encode(net.encoder, x, flat_valid, flat_qlen, n,
                  dropout_rng=enc_rng)                            # [N, L, D]
    out: StackOutput = net.encoder(h, flat_valid, start=n,
                                   dropout_rng=enc_rng, extras=extras)
    enc = SplitEncoding(hidden=out.hidden.reshape(b, p * l, -1),
                        mask=flat_valid.reshape(b, p * l))
    if with_retrieval:
      pos = jnp.arange(l)
      lq = min(self.reatt.query_maxlength or l, l)
      first = h.reshape(b, p, l, -1)[:, 0, :lq]                   # [B, Q, D]
      enc.queries = retrieval_queries(net.encoder, first, n)      # [B, Q, H, E]
      enc.query_mask = ((pos[None, :] < qlen[:, :1]) & valid[:, 0])[:, :lq]
      enc.keys = retrieval_keys(net.encoder, h, n)
      enc.key_mask = (pos[None, :] >= flat_qlen[:, None]) & flat_valid
    return enc

  def retrieval_scores(self, params: dict, queries: Array, query_mask: Array,
                       keys: Array, key_mask: Array, num_passages: int,
                       in_batch: bool, position_bias: bool = False
                       ) -> tuple[Array, Array]:
    """Head-mixed relevance and validity: [B, B*P] (in-batch) or [B, P].

    ``queries`` [B, Q, H, E] / ``query_mask`` [B, Q]; ``keys`` [B*P, L, H, E] /
    ``key_mask`` [B*P, L], rows grouped by question.
    """
    probs = self.head_probabilities(params)                       # [H]
    b = queries.shape[0]
    bias = None
    if position_bias:
      bias = self.network(params).encoder.relpos_bias(
          queries.shape[1], keys.shape[1])[0]                     # [H, Q, L]
    doc_valid = jnp.any(key_mask, axis=-1)                        # [B*P]
    if in_batch:
      per_head = avg_max_relevance(queries, query_mask, keys, key_mask,
                                   chunk=self.reatt.relevance_chunk,
                                   bias=bias)                     # [B, H, B*P]
      valid = jnp.broadcast_to(doc_valid[None], (b, doc_valid.shape[0]))
    else:
      keys = keys.reshape(b, num_passages, *keys.shape[1:])      # [B, P, L, H, E]
      kmask = key_mask.reshape(b, num_passages, -1)              # [B, P, L]
      per_head = jax.vmap(
          lambda q, qm, k, km: avg_max_relevance(q[None], qm[None], k, km,
                                                 bias=bias)[0]
      )(queries, query_mask, keys, kmask)                        # [B, H, P]
      valid = doc_valid.reshape(b, num_passages)                 # [B, P]
    scores = jnp.einsum("bhn,h->bn", per_head, probs)
    if self.reatt.score_scale:
      scores = jnp.exp(params[PARAMS_KEY][SCORE_SCALE]) * scores
    return scores, valid

  # ---- training ---------------------------------------------------------

  def forward(self, params, batch: dict, dropout_rng: Array | None = None,
              extras: Any = None) -> tuple[SplitEncoding, Array, Array]:
    """Teacher-forced pass: (encoding, logits [B, T, V], P_tgt [B, P]).

    P_tgt is under a stop-gradient. Dropout keys: encoder ``fold(rng, 0)``,
    decoder ``fold(rng, 1)``.
    """
    inputs = decoder_inputs(batch)
    tokens = as_passages(batch["encoder_input_tokens"])
    p = tokens.shape[1]
    net = self.network(params)
    enc = self.encode(net, tokens, batch.get("passage_mask"),
                      batch.get("question_length"),
                      dropout_rng=fold(dropout_rng, 0), extras=extras,
                      with_retrieval=True)
    logits, dec = net.decode(enc.hidden, enc.mask, inputs,
                             dropout_rng=fold(dropout_rng, 1), extras=extras,
                             output_attention_logits=True)
    target = jax.lax.stop_gradient(target_distribution(
        dec.cross_attention_logits[-1], enc.mask, p))             # [B, P]
    return enc, logits, target

  def retrieval_loss(self, params, queries: Array, query_mask: Array,
                     keys: Array, key_mask: Array, target: Array,
                     kl_weights: Array | None = None,
                     kl_weight: float = 0.0) -> tuple[Array, dict]:
    """The KL term and retrieval metrics of B questions and their rows.

    ``target``: P_tgt [B, P]. ``kl_weights`` [B]: the term is
    ``sum_b kl_weights[b] * KL_b``; None: ``kl_weight * mean_b KL_b``.
    """
    b, p = target.shape
    in_batch = self.reatt.in_batch_negatives
    scores, valid = self.retrieval_scores(params, queries, query_mask, keys,
                                          key_mask, p, in_batch,
                                          self.reatt.position_bias)
    if in_batch:  # other questions' documents: target 0
      target = in_batch_targets(target)
    kl_rows = kl_to_target(target, scores, valid)                 # [B]
    if kl_weights is not None:
      kl_term = jnp.sum(kl_weights.astype(jnp.float32) * kl_rows)
    else:
      kl_term = kl_weight * jnp.mean(kl_rows)
    masked = jnp.where(valid, scores, -jnp.inf)
    top = jnp.argmax(masked, axis=-1)
    agree = (top == jnp.argmax(target, axis=-1)).astype(jnp.float32)
    own = (top // p == jnp.arange(b)) if in_batch else jnp.ones((b,), bool)
    probs = self.head_probabilities(params)
    return kl_term, {
        "kl_loss": jnp.mean(kl_rows),
        "retrieval_accuracy": jnp.mean(agree),
        "retrieval_own_accuracy": jnp.mean(own.astype(jnp.float32)),
        "head_max_prob": jnp.max(probs),
        "retrieval_head": jnp.argmax(probs).astype(jnp.float32)}

  def loss(self, params, batch: dict, dropout_rng: Array | None = None,
           extras: Any = None, normalizer: Array | None = None,
           kl_weight: float = 0.0) -> tuple[Array, dict]:
    """``QA + KL`` and metrics.

    The KL term is ``sum_b batch["kl_weight"][b] * KL_b`` when the batch has
    per-question weights (so microbatches add up), else
    ``kl_weight * mean_b KL_b``.
    """
    enc, logits, target = self.forward(params, batch, dropout_rng, extras)
    qa_loss, n, acc = cross_entropy(logits, batch["decoder_target_tokens"],
                                    normalizer)
    kl_term, metrics = self.retrieval_loss(
        params, enc.queries, enc.query_mask, enc.keys, enc.key_mask, target,
        batch.get("kl_weight"), kl_weight)
    metrics = {"loss": qa_loss + kl_term, "qa_loss": qa_loss,
               "num_target_tokens": n, "token_accuracy": acc, **metrics}
    return qa_loss + kl_term, metrics

  # ---- inference --------------------------------------------------------

  def relevance(self, params, encoder_input_tokens: Array, *,
                passage_mask: Array | None = None,
                question_length: Array | None = None) -> Array:
    """Retrieval relevance r(q, d) of each question's own rows [B, P]."""
    tokens = as_passages(encoder_input_tokens)
    enc = self.encode(self.network(params), tokens, passage_mask,
                      question_length, with_retrieval=True)
    scores, valid = self.retrieval_scores(params, enc.queries, enc.query_mask,
                                          enc.keys, enc.key_mask,
                                          tokens.shape[1], False)
    return jnp.where(valid, scores, -jnp.inf)


# ------------------------------------------------------------ run configs


def run_config_fields(reatt: ReAttConfig) -> dict:
  """What a ReAtt MODEL_DIR's jaxfid_config.json adds to FiD's fields."""
  return {"method": "reatt", "reatt": reatt.to_dict()}


def model_from_run_config(run: dict, config: T5Config) -> ReAttModel:
  """The model of a ReAtt run config (``method == "reatt"``)."""
  return ReAttModel(config, ReAttConfig.from_dict(run.get("reatt", {})))


__all__ = ["ReAttConfig", "ReAttModel", "avg_max_relevance", "bi_encode",
           "block_mask", "head_probabilities", "in_batch_targets", "kl_to_target",
           "question_lengths_from_tokens", "retrieval_keys",
           "retrieval_queries", "target_distribution",
           "model_from_run_config", "run_config_fields", "add_head_weights"]
