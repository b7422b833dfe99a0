"""Checkpoint + FiD file -> predictions, EM/F1 (``jaxfid predict`` and the
trainer's eval), in fixed-size batches (one compiled decoder), written
atomically.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxfid.evaluation import qa as evaluation
from jaxfid.reader import batches as pipeline
from jaxfid.reader.examples import FidExample
from jaxfid.runtime.console import inner_bar
from jaxfid.runtime.files import atomic_write


def predict_program(model, *, max_decode_len: int, num_beams: int = 1,
                    alpha: float = 0.6):
  """The pure ``fn(params, batch) -> int32 [B, max_decode_len]``: encoding
  and cached greedy (``num_beams=1``) or beam decoding of a batch of
  ``encoder_input_tokens`` [B, P, L] and ``passage_mask`` [B, P]."""
  def fn(params, batch):
    return model.predict(params, batch["encoder_input_tokens"],
                         passage_mask=batch["passage_mask"],
                         max_decode_len=max_decode_len, num_beams=num_beams,
                         alpha=alpha)
  return fn


def make_predict_fn(model, *, max_decode_len: int, num_beams: int = 1,
                    alpha: float = 0.6, out_sharding=None):
  """:func:`predict_program` jitted, the tokens placed by ``out_sharding``
  (replicated, so every process of a multi-host run can fetch them)."""
  return jax.jit(predict_program(model, max_decode_len=max_decode_len,
                                 num_beams=num_beams, alpha=alpha),
                 out_shardings=out_sharding)


def generate(model, params, tokenizer, examples: Sequence[FidExample], *,
             n_context: int, text_maxlength: int, answer_maxlength: int,
             batch_size: int = 8, num_beams: int = 1, alpha: float = 0.6,
             put_batch=None, predict_fn=None, progress: bool = True,
             passage_eos: bool = True) -> list[str]:
  """Predicted answer strings, in input order. ``answer_maxlength``: tokens
  generated, EOS included; ``put_batch``: places a host batch on devices."""
  predict_fn = predict_fn or make_predict_fn(
      model, max_decode_len=answer_maxlength, num_beams=num_beams, alpha=alpha)
  put_batch = put_batch or (lambda b: jax.tree.map(jnp.asarray, b))
  out: list[str] = []
  batches = pipeline.eval_batches(examples, tokenizer, batch_size=batch_size,
                                  n_context=n_context,
                                  text_maxlength=text_maxlength,
                                  passage_eos=passage_eos)
  total = (len(examples) + batch_size - 1) // batch_size
  for _, real, batch in inner_bar(batches, total=total, desc="predict",
                                 disable=not progress, leave=False):
    out.extend(decode_rows(tokenizer, predict_fn(params, put_batch(batch)),
                           real))
  return out


def decode_rows(tokenizer, tokens, real: int) -> list[str]:
  """The answer strings of the first ``real`` rows of a batch's generated
  ``tokens`` [B, T] (the rest pad the batch to its compiled size)."""
  tokens = np.asarray(jax.device_get(tokens))
  return [tokenizer.decode(row.tolist()) for row in tokens[:real]]


def score(examples: Sequence[FidExample], predictions: Sequence[str]) -> dict:
  """EM and F1 (SQuAD normalisation, max over gold answers); examples
  without answers get ``None`` and are left out of the means."""
  ems, f1s = [], []
  for p, ex in zip(predictions, examples):
    ems.append(evaluation.exact_match(p, ex.answers) if ex.answers else None)
    f1s.append(evaluation.f1_score(p, ex.answers) if ex.answers else None)
  scored = [e for e in ems if e is not None]
  n = max(len(scored), 1)
  return {"em": float(sum(scored) / n),
          "f1": float(sum(f for f in f1s if f is not None) / n),
          "scored": len(scored), "per_example_em": ems, "per_example_f1": f1s}


def passage_scores(model, params, tokenizer, examples: Sequence[FidExample], *,
                   n_context: int, text_maxlength: int, batch_size: int = 8,
                   mode: str = "probs", passage_eos: bool = True
                   ) -> list[list[float]]:
  """Cross-attention score of each example's passages (FiD's sorted order):
  ``mode`` 'probs' (attention mass) or 'logits' (FiD's averaged logits)."""
  fn = make_passage_scores_fn(model, mode=mode)
  out: list[list[float]] = []
  for _, real, batch in pipeline.eval_batches(
      examples, tokenizer, batch_size=batch_size, n_context=n_context,
      text_maxlength=text_maxlength, passage_eos=passage_eos):
    out.extend(passage_score_rows(
        fn(params, jax.tree.map(jnp.asarray, batch)), batch["passage_mask"],
        real))
  return out


def make_passage_scores_fn(model, *, mode: str = "probs"):
  """The jitted ``fn(params, batch) -> float [B, P]``: each passage's
  cross-attention score (``mode`` as in :func:`passage_scores`)."""
  return jax.jit(lambda p, b: model.passage_scores(
      p, b["encoder_input_tokens"], passage_mask=b["passage_mask"], mode=mode))


def passage_score_rows(scores, passage_mask, real: int) -> list[list[float]]:
  """The first ``real`` rows of a batch's passage ``scores`` [B, P], each
  cut to its real passages (``passage_mask`` [B, P])."""
  scores = np.asarray(jax.device_get(scores))
  return [[float(s) for s in scores[i, :int(np.sum(passage_mask[i]))]]
          for i in range(real)]


def write_predictions(path: str, examples: Sequence[FidExample],
                      predictions: Sequence[str], scores: dict,
                      passage_scores: Sequence[Sequence[float]] | None = None,
                      attention: Sequence[dict] | None = None) -> None:
  """One JSON line per example, input order; atomic. ``attention``: each
  example's :func:`jaxfid.reader.attention.attention_rows` row, written as
  ``answer_tokens`` and ``attention`` (its passages)."""
  with atomic_write(path) as f:
    for i, (ex, pred) in enumerate(zip(examples, predictions)):
      record = {"id": ex.id if ex.id is not None else i,
                "question": ex.question, "prediction": pred,
                "answers": list(ex.answers),
                "em": scores["per_example_em"][i],
                "f1": scores["per_example_f1"][i]}
      if passage_scores is not None:
        record["passage_scores"] = passage_scores[i]
      if attention is not None:
        record["answer_tokens"] = attention[i]["answer_tokens"]
        record["attention"] = attention[i]["passages"]
      f.write(json.dumps(record, ensure_ascii=False) + "\n")


class QaEvaluator:
  """EM/F1 during training: ``evaluator(model_dir, step, params,
  placement)`` decodes batches sharded over the data axes (every process
  gets every prediction), writes ``MODEL_DIR/eval/predictions_<step>.jsonl``
  (process 0) and returns ``eval_em``, ``eval_f1``, ``eval_examples``.
  ``answer_text`` maps each decoded text to the answer scored and written
  (Atlas's drops sentinels)."""
  answer_text: Callable[[str], str] | None = None

  def __init__(self, model, tokenizer, examples: Sequence[FidExample], *,
               n_context: int, text_maxlength: int, answer_maxlength: int,
               num_beams: int = 1, batch_size: int = 8,
               progress: bool = True, passage_eos: bool = True):
    self.model, self.tokenizer = model, tokenizer
    self.passage_eos = passage_eos
    self.examples = list(examples)
    self.n_context, self.text_maxlength = n_context, text_maxlength
    self.answer_maxlength, self.batch_size = answer_maxlength, batch_size
    self.num_beams = num_beams
    self.progress = progress
    self._predict_fn = None

  def __call__(self, model_dir: str, step: int, params, placement) -> dict:
    if self._predict_fn is None:
      self._predict_fn = make_predict_fn(
          self.model, max_decode_len=self.answer_maxlength,
          num_beams=self.num_beams, out_sharding=placement.replicated)
    preds = generate(
        self.model, params, self.tokenizer, self.examples,
        n_context=self.n_context, text_maxlength=self.text_maxlength,
        answer_maxlength=self.answer_maxlength,
        batch_size=placement.eval_batch_size(self.batch_size),
        predict_fn=self._predict_fn, progress=self.progress,
        put_batch=placement.shard, passage_eos=self.passage_eos)
    if self.answer_text is not None:
      preds = [self.answer_text(p) for p in preds]
    scores = score(self.examples, preds)
    if jax.process_index() == 0:
      write_predictions(os.path.join(model_dir, "eval",
                                     f"predictions_{step}.jsonl"),
                        self.examples, preds, scores)
    return {"eval_em": scores["em"], "eval_f1": scores["f1"],
            "eval_examples": len(self.examples)}
