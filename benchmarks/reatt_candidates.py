"""ReAtt's training options against the original's, on a small synthetic task.

Issue #27 item 9: jaxfid's ReAtt retrieves a little worse than a PyTorch
reference after QA-only training. This measures the original's training
choices that jaxfid lacked (``plain``: none of them, Adam carried across
the QA-only warm-up):

* ``restart``: a fresh Adam after the QA-only warm-up (the original's
  ``--init_from`` runs; ``RESTART_OPTIMIZER``, :mod:`jaxfid.reatt.restarts`);
* ``scale``: the learned scale ``exp(c)`` of the relevance scores in the KL
  (the original's ``combine_weight``; ``LEARNED_SCORE_SCALE``); ``both``;
* ``posbias``: ``restart`` with the relative position bias in the training
  scores (the original's training path; ``POSITION_BIAS``);
* ``qa_only``: ``plain`` without the KL term (the paper's ablation #2).

``--heldout`` trains on a word-pair world (:func:`heldout_world`) and scores
the questions of 32 documents training never shows; ``--steps 0`` scores
the untrained model.

The task is the key-value world of ``tests/reatt_world.py`` (64 documents
``"<key> is <value>"``, questions are keys, 4 close documents each, one
holding the answer) and the set-up of
``tests/test_reatt_learning.py``: a tiny ReAtt (1 bi-encoder layer of 3, 2
decoder layers), Adam 3e-3 clipped at 1, batch 16, 50 QA-only steps then
the KL term (alpha 8); after training the whole corpus is indexed with the
model's token index (exact) and every question retrieves: R@1 and R@5 of
its own document. One JSON line per run on stdout, then the means.

  python benchmarks/reatt_candidates.py [--steps 300] [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from jaxfid.core.tokenization import Tokenizer  # noqa: E402
from jaxfid.reader.examples import FidExample, Passage  # noqa: E402
from jaxfid.reatt import model as reatt  # noqa: E402
from jaxfid.reatt import token_index  # noqa: E402
from jaxfid.reatt.batches import ReAttBatcher  # noqa: E402
from jaxfid.reatt.restarts import restart_adam_at  # noqa: E402
from jaxfid.training.step import make_train_step  # noqa: E402
from jaxfid.training.task import Phase, train_state  # noqa: E402
from reatt_world import (WORDS, make_world, tiny_model,  # noqa: E402
                         write_corpus)

# variant: (fresh Adam after the QA-only steps, learned score scale,
# position bias in the training scores, KL weight)
VARIANTS = {"plain": (False, False, False, 8.0),
            "restart": (True, False, False, 8.0),
            "scale": (False, True, False, 8.0),
            "both": (True, True, False, 8.0),
            "posbias": (True, False, True, 8.0),
            "qa_only": (False, False, False, 0.0)}
NUM_KEYS, WARMUP, LENGTH, BATCH = 64, 50, 16, 16
HELDOUT_TRAIN, HELDOUT_TEST = 96, 32


def heldout_world(seed: int = 0, n_context: int = 4
                  ) -> tuple[list[Passage], list[FidExample], list[FidExample]]:
  """Documents ``"<a> <b> is <value>"`` for 128 distinct word pairs; the
  question is ``"<a> <b>"``. Training questions on 96 of them (close
  documents among those 96, two of them sharing a word with the question
  where there are such), held-out questions on the other 32: documents
  training never shows, of words it does (a new corpus, a known
  vocabulary); retrieval must match both words."""
  rng = np.random.default_rng(seed)
  first, second, values = WORDS[:30], WORDS[30:60], WORDS[60:]
  pairs = rng.choice(len(first) * len(second),
                     HELDOUT_TRAIN + HELDOUT_TEST, replace=False)
  docs = [Passage(title="", id=f"d{i}", text=(
      f"{first[c // len(second)]} {second[c % len(second)]} is "
      f"{values[rng.integers(len(values))]}")) for i, c in enumerate(pairs)]
  words = [set(d.text.split()[:2]) for d in docs]

  def example(i: int, ctxs: tuple) -> FidExample:
    a, b, _, v = docs[i].text.split()
    return FidExample(question=f"{a} {b}", answers=(v,), ctxs=ctxs, id=str(i))

  train = []
  for i in range(HELDOUT_TRAIN):
    near = [j for j in range(HELDOUT_TRAIN) if j != i and words[j] & words[i]]
    ids = [i, *rng.permutation(near)[:2].tolist()]
    rest = [j for j in range(HELDOUT_TRAIN) if j not in ids]
    ids += rng.choice(rest, n_context - len(ids), replace=False).tolist()
    rng.shuffle(ids)
    train.append(example(i, tuple(docs[j] for j in ids)))
  test = [example(i, ()) for i in range(HELDOUT_TRAIN, len(docs))]
  return docs, train, test


def recall(model, params, corpus, examples, directory) -> tuple[float, float]:
  """R@1, R@5 of every question's own document (``d<id>``) over the corpus."""
  encoder = token_index.TokenEncoder.from_model(model, params)
  meta = token_index.build_token_index(
      encoder, Tokenizer(), corpus, directory, doc_maxlength=LENGTH,
      query_maxlength=LENGTH, batch_size=64, progress=False)
  searcher = token_index.TokenSearcher(directory, meta)
  hits = searcher.search([e.question for e in examples], 5,
                         token_top_k=meta["num_tokens"])
  ranked = [searcher.store.ids([r for r, _ in h]) for h in hits]
  gold = [f"d{e.id}" for e in examples]
  return (float(np.mean([g in r[:1] for g, r in zip(gold, ranked)])),
          float(np.mean([g in r[:5] for g, r in zip(gold, ranked)])))


def setup(variant: str, seed: int, work: str, heldout: bool = False):
  """What a run of ``variant`` trains and scores, for jaxfid and the PyTorch
  reference alike: ``(model, corpus path, training examples, the questions
  scored)``; the corpus is written to ``work``."""
  _, scale, position_bias, _ = VARIANTS[variant]
  if heldout:
    docs, examples, tests = heldout_world(seed)
  else:
    docs, examples = make_world(num_keys=NUM_KEYS, n_context=4)
    tests = examples
  corpus = os.path.join(work, "corpus.jsonl")
  write_corpus(corpus, docs)
  base = tiny_model(bi_encoder_layers=1, num_decoder_layers=2)
  model = reatt.ReAttModel(base.config, base.reatt.replace(
      score_scale=scale, position_bias=position_bias))
  return model, corpus, examples, tests


def batcher_for(variant: str, examples, seed: int) -> ReAttBatcher:
  """A run's batches: KL weight 0 for the QA-only warm-up, then the
  variant's."""
  return ReAttBatcher(examples, Tokenizer(), batch_size=BATCH, n_context=4,
                      text_maxlength=LENGTH, target_maxlength=4,
                      kl_weight=VARIANTS[variant][3],
                      retrieval_warmup_steps=WARMUP, seed=seed)


def run(variant: str, seed: int, steps: int, work: str,
        heldout: bool = False, losses: list | None = None) -> dict:
  """One training run and its recall; ``losses`` (if given) receives every
  step's loss."""
  restart, scale = VARIANTS[variant][:2]
  model, corpus, examples, tests = setup(variant, seed, work, heldout)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-3))
  phase = Phase("train", steps,
                make_state=lambda p, s: train_state(p, s, opt_state=tx.init(p)),
                step=make_train_step(
                    lambda p, b, r, n: model.loss(p, b, r, normalizer=n), tx,
                    seed=seed),
                learning_rate=lambda s: 3e-3)
  phase = restart_adam_at(phase, [WARMUP] if restart else [])
  step = jax.jit(phase.step)
  state = phase.make_state(model.init_params(seed), 0)
  batcher = batcher_for(variant, examples, seed)
  t0 = time.time()
  metrics = {"kl_loss": float("nan")}  # --steps 0: the untrained model
  try:
    for s in range(steps):
      state, metrics = step(state, jax.tree.map(jnp.asarray, batcher.batch(s)))
      if losses is not None:
        losses.append(float(metrics["loss"]))
  finally:
    batcher.close()
  params = state["params"]
  r1, r5 = recall(model, params, corpus, tests,
                  os.path.join(work, f"index_{variant}_{seed}"))
  own = params[reatt.PARAMS_KEY]
  return {"variant": variant, "seed": seed, "steps": steps,
          "questions": "held-out" if heldout else "training", "R@1": r1,
          "R@5": r5, "kl_loss": round(float(metrics["kl_loss"]), 4),
          "score_scale": (round(float(jnp.exp(own[reatt.SCORE_SCALE])), 4)
                          if scale else None),
          "seconds": round(time.time() - t0, 1)}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS),
                      default=list(VARIANTS))
  parser.add_argument("--heldout", action="store_true",
                      help="word-pair world: train on 96 documents' "
                      "questions, score 32 held-out documents' over all 128")
  args = parser.parse_args()
  rows = []
  with tempfile.TemporaryDirectory() as work:
    for variant in args.variants:
      for seed in args.seeds:
        rows.append(run(variant, seed, args.steps, work, args.heldout))
        print(json.dumps(rows[-1]), flush=True)
  for variant in args.variants:
    mine = [r for r in rows if r["variant"] == variant]
    print(json.dumps({"variant": variant, "seeds": len(mine),
                      "mean_R@1": round(np.mean([r["R@1"] for r in mine]), 3),
                      "mean_R@5": round(np.mean([r["R@5"] for r in mine]), 3)}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
