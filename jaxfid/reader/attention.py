"""The reader's cross-attention over each passage's tokens while it generated
the answer (``jaxfid predict --attention``, ``jaxfid serve``'s
``"attention": true``).

The generated answer is fed back teacher-forced (one more forward pass) and
the decoder's cross-attention probabilities are averaged over heads and
layers. Per question (:func:`attention_rows`): ``answer_tokens`` (up to and
including the first EOS) and, per passage read in input order, ``tokens``
(its reader input as truncated, padding left out, SentencePiece's ``▁`` as a
space), ``by_answer_token`` [answer token][passage token] (each token's
share of the attention), ``weights`` (those shares averaged over answer
tokens) and ``weight`` (their sum). At each answer token the shares over all
passages sum to 1, so the ``weight``\\ s do too; at the first answer token a
passage's share is its 'probs' ``reader_score``. Rounded to :data:`DECIMALS`.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.core.tokenization import EOS_ID
from jaxfid.reader import batches as pipeline
from jaxfid.reader import predict as predict_lib
from jaxfid.reader.examples import FidExample, sorted_passages

DECIMALS = 6


def attention_program(model):
  """The pure ``fn(params, batch, answer_tokens) -> float32 [B, T, P*L]``
  of a batch (``encoder_input_tokens`` [B, P, L], ``passage_mask`` [B, P])
  and its generated ``answer_tokens`` int32 [B, T]."""
  def fn(params, batch, answer_tokens):
    return model.answer_attention(params, batch["encoder_input_tokens"],
                                  answer_tokens,
                                  passage_mask=batch["passage_mask"])
  return fn


def make_attention_fn(model):
  """:func:`attention_program` jitted."""
  return jax.jit(attention_program(model))


def answer_length(tokens: np.ndarray) -> int:
  """Generated tokens up to and including the first EOS (all without one)."""
  eos = np.flatnonzero(tokens == EOS_ID)
  return int(eos[0]) + 1 if eos.size else len(tokens)


def _shown(pieces: Sequence[str]) -> list[str]:
  return [p.replace("\u2581", " ") for p in pieces]


def _rounded(values: np.ndarray) -> list[float]:
  return [round(float(v), DECIMALS) for v in values]


def attention_rows(tokenizer, weights, answer_tokens, batch: dict,
                   real: int) -> list[dict[str, Any]]:
  """The attention of the first ``real`` questions of a batch (the module
  docstring's fields; ``passages`` without ids) from ``weights`` float32 [B,
  T, P*L], ``answer_tokens`` int32 [B, T] and the host batch
  (``encoder_input_tokens`` [B, P, L], ``passage_mask`` [B, P])."""
  weights = np.asarray(jax.device_get(weights), np.float64)  # [B, T, P*L]
  answer_tokens = np.asarray(jax.device_get(answer_tokens))  # [B, T]
  tokens = np.asarray(batch["encoder_input_tokens"])         # [B, P, L]
  _, p, l = tokens.shape
  out = []
  for i in range(real):
    n = answer_length(answer_tokens[i])
    shares = weights[i, :n].reshape(n, p, l)                 # [n, P*L] -> [n, P, L]
    passages = []
    for k in range(int(np.sum(batch["passage_mask"][i]))):
      keep = tokens[i, k] != 0
      per_token = shares[:, k, keep]                         # [n, real tokens]
      mean = per_token.mean(axis=0)
      passages.append({
          "weight": round(float(mean.sum()), DECIMALS),
          "tokens": _shown(tokenizer.pieces(tokens[i, k][keep])),
          "weights": _rounded(mean),
          "by_answer_token": [_rounded(row) for row in per_token]})
    out.append({"answer_tokens": _shown(tokenizer.pieces(answer_tokens[i, :n])),
                "passages": passages})
  return out


def generate_with_attention(model, params, tokenizer,
                            examples: Sequence[FidExample], *, n_context: int,
                            text_maxlength: int, answer_maxlength: int,
                            batch_size: int = 8, num_beams: int = 1,
                            alpha: float = 0.6, passage_eos: bool = True
                            ) -> tuple[list[str], list[dict[str, Any]]]:
  """:func:`~jaxfid.reader.predict.generate`'s answers (the same programs) and
  each question's attention (:func:`attention_rows`, each passage with its
  ``id``), in input order."""
  predict_fn = predict_lib.make_predict_fn(
      model, max_decode_len=answer_maxlength, num_beams=num_beams, alpha=alpha)
  attention_fn = make_attention_fn(model)
  answers: list[str] = []
  rows: list[dict[str, Any]] = []
  for start, real, host in pipeline.eval_batches(
      examples, tokenizer, batch_size=batch_size, n_context=n_context,
      text_maxlength=text_maxlength, passage_eos=passage_eos):
    batch = jax.tree.map(jnp.asarray, host)
    generated = predict_fn(params, batch)
    answers.extend(predict_lib.decode_rows(tokenizer, generated, real))
    read = attention_rows(tokenizer, attention_fn(params, batch, generated),
                          generated, host, real)
    for example, row in zip(examples[start:start + real], read):
      for passage, shown in zip(sorted_passages(example), row["passages"]):
        shown["id"] = passage.id
      rows.append(row)
  return answers, rows
