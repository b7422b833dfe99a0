"""A synthetic key-value world for the ReAtt tests.

Every document is ``"<key> is <value>"`` for a distinct key word; a question
is the key alone and its answer the value. Each question's close documents
are its own document and ``n_context - 1`` others. Keys and values are
single T5 tokens, so a tiny model reads them in a few hundred steps.
"""
from __future__ import annotations

import json

import numpy as np

from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader.examples import FidExample, Passage
from jaxfid.reatt import model as reatt
from jaxfid.t5.config import T5Config

WORDS = """red green blue yellow black white brown pink orange purple dog cat
horse cow sheep goat bird fish mouse bread rice milk cheese apple banana grape
lemon sugar salt tree flower grass river lake sea hill rock stone house door
window table chair bed wall roof floor garden car bus train ship plane road
bridge city town street book pen paper letter box bag shoe coat shirt sun moon
star rain snow wind cloud fire water queen child man woman friend doctor
teacher farmer pilot piano guitar violin tennis golf hockey winter summer
autumn spring morning night money gold silver iron glass wood paint music song
dance game ball""".split()


def make_world(num_keys: int = 64, n_context: int = 4, seed: int = 0
               ) -> tuple[list[Passage], list[FidExample]]:
  keys, values = WORDS[:num_keys], WORDS[num_keys:]
  rng = np.random.default_rng(seed)
  docs = [Passage(title="", text=f"{k} is {values[rng.integers(len(values))]}",
                  id=f"d{i}") for i, k in enumerate(keys)]
  examples = []
  for i, k in enumerate(keys):
    others = rng.choice([j for j in range(num_keys) if j != i], n_context - 1,
                        replace=False)
    ids = [i, *others]
    rng.shuffle(ids)
    examples.append(FidExample(question=k, answers=(docs[i].text.split()[-1],),
                               ctxs=tuple(docs[j] for j in ids), id=str(i)))
  return docs, examples


def write_corpus(path, docs: list[Passage]) -> None:
  with open(path, "w") as f:
    for d in docs:
      f.write(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n")


def write_examples(path, examples: list[FidExample]) -> None:
  records = [{"id": e.id, "question": e.question, "answers": list(e.answers),
              "ctxs": [{"id": p.id, "title": p.title, "text": p.text}
                       for p in e.ctxs]} for e in examples]
  with open(path, "w") as f:
    json.dump(records, f)


def tiny_config(**overrides) -> T5Config:
  fields = dict(d_model=32, d_kv=8, d_ff=64, num_heads=4, num_layers=3,
                num_decoder_layers=1, feed_forward_proj="gated-gelu",
                tie_word_embeddings=False, dropout_rate=0.0)
  fields.update(overrides)
  return T5Config(**fields)


def tiny_model(bi_encoder_layers: int = 1, **overrides) -> reatt.ReAttModel:
  cfg = reatt.ReAttConfig(bi_encoder_layers=bi_encoder_layers,
                          separator_ids=tuple(Tokenizer().encode("title:")))
  return reatt.ReAttModel(tiny_config(**overrides), cfg)
