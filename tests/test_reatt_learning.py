"""ReAtt learns to retrieve from QA supervision alone (plus its KL term).

A tiny ReAtt (3 encoder layers, the first one a bi-encoder) is trained on
the synthetic key-value world (``reatt_world``): questions are key words,
each with 4 close documents, one of which holds the answer. No retrieval
labels are used: after 50 QA-only steps the KL term distils the reader's
cross-attention into retrieval attention. Retrieval over the whole 64-passage
corpus (the token index, exact) is measured before and after training.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfid.reatt import token_index
from jaxfid.core.tokenization import Tokenizer
from jaxfid.reatt.batches import ReAttBatcher
from jaxfid.training.step import make_train_step
from reatt_world import make_world, tiny_model, write_corpus

NUM_KEYS = 64
STEPS = 300
WARMUP = 50
LENGTH = 16


def _recall(model, params, corpus, examples, directory) -> tuple[float, float]:
  """R@1, R@5 of every question's own document over the whole corpus."""
  encoder = token_index.TokenEncoder.from_model(model, params)
  meta = token_index.build_token_index(
      encoder, Tokenizer(), corpus, directory, doc_maxlength=LENGTH,
      query_maxlength=LENGTH, batch_size=64, progress=False)
  searcher = token_index.TokenSearcher(directory, meta)
  hits = searcher.search([e.question for e in examples], 5,
                         token_top_k=meta["num_tokens"])
  gold = [f"d{i}" for i in range(len(examples))]
  ranked = [searcher.store.ids([r for r, _ in h]) for h in hits]
  r1 = np.mean([g in r[:1] for g, r in zip(gold, ranked)])
  r5 = np.mean([g in r[:5] for g, r in zip(gold, ranked)])
  return float(r1), float(r5)


@pytest.mark.slow
def test_retrieval_accuracy_rises_with_qa_training(tmp_path):
  docs, examples = make_world(num_keys=NUM_KEYS, n_context=4)
  corpus = tmp_path / "corpus.jsonl"
  write_corpus(corpus, docs)
  model = tiny_model(bi_encoder_layers=1, num_decoder_layers=2)
  params = model.init_params(0)
  before = _recall(model, params, corpus, examples, tmp_path / "before")

  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-3))
  batcher = ReAttBatcher(examples, Tokenizer(), batch_size=16, n_context=4,
                         text_maxlength=LENGTH, target_maxlength=4,
                         kl_weight=8.0, retrieval_warmup_steps=WARMUP)
  step = jax.jit(make_train_step(
      lambda p, b, r, n: model.loss(p, b, r, normalizer=n), opt, seed=0))
  state = {"step": jnp.zeros((), jnp.int32), "params": params,
           "opt_state": opt.init(params)}
  try:
    for s in range(STEPS):
      state, metrics = step(state, jax.tree.map(jnp.asarray, batcher.batch(s)))
  finally:
    batcher.close()
  after = _recall(model, state["params"], corpus, examples, tmp_path / "after")
  print(f"R@1 {before[0]:.3f} -> {after[0]:.3f}, "
        f"R@5 {before[1]:.3f} -> {after[1]:.3f}")
  assert float(metrics["head_max_prob"]) > 0.99  # one retrieval head
  assert after[1] >= 0.6 and after[1] >= before[1] + 0.4
  assert after[0] >= before[0] + 0.1
