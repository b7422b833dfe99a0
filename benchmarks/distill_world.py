"""A world where BM25 cannot rank the evidence but a reader can (FiD-KD).

Every entity has a made-up two-syllable name that is two pieces of the T5
vocabulary (``Tavo``, ``Rimu``, ...: short, so a tiny model trained from
scratch tells names apart sooner) and one passage per relation, titled
with its name::

  title "Tavo", text "Tavo's favourite color is green."

and a question asks for one relation in other words: every relation has a
paraphrase that shares no term with any passage (``what is the preferred
hue of Tavo?``). Under Lucene's English analysis a question's only
indexed term found in the corpus is the entity's name, which every one of
the entity's passages holds equally often: BM25 ranks the entity's passages
above all others but cannot tell which of them holds the answer (their
order is fixed by length and ties, not by the question; recall@1 is about
one in ``len(RELATIONS)``). A reader trained on those passages learns which
relation each paraphrase asks for and copies the answer from its passage,
so its cross-attention singles out that passage: what ``jaxfid distill
iterate`` distils into the retriever.

Each relation draws its answers from a pool of its own, so an entity's
other passages never hold the answer by chance (answer recall counts the
gold passage, or another entity's passage with the same answer). Training
and dev questions are about disjoint entities; the corpus holds both.

The words were chosen so that no paraphrase shares a Porter stem with a
passage word (checked when the world is made); names whose stem is a stop
word or collides with a word of the world or another name are left out.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os

import numpy as np

from jaxfid.core.tokenization import load_tokenizer
from jaxfid.retrieval.text.analysis import EnglishAnalyzer

# (the passage's words, the question's paraphrase, the answers)
RELATIONS = (
    ("favourite color", "preferred hue",
     ("red", "green", "blue", "yellow", "black", "white")),
    ("home city", "town of residence",
     ("paris", "london", "tokyo", "berlin", "rome", "madrid")),
    ("pet", "animal companion",
     ("dog", "cat", "horse", "rabbit", "parrot", "goat")),
    ("job", "profession",
     ("doctor", "teacher", "farmer", "pilot", "lawyer", "baker")),
    ("sport", "athletic pastime",
     ("tennis", "football", "golf", "hockey", "rugby", "cricket")),
    ("instrument", "musical device",
     ("piano", "guitar", "violin", "drums", "flute", "harp")),
)


_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


@dataclasses.dataclass(frozen=True)
class World:
  """The corpus (DPR TSV rows ``(id, text, title)``) and QA questions
  (``{"id", "question", "answers", "gold_id"}``)."""
  passages: tuple[tuple[str, str, str], ...]
  train: tuple[dict, ...]
  dev: tuple[dict, ...]


def _check_words(analyzer: EnglishAnalyzer) -> set[str]:
  """The passages' terms; fails if a paraphrase shares one of them."""
  passage_terms = set(analyzer.analyze("s is"))
  for relation, _, answers in RELATIONS:
    passage_terms |= set(analyzer.analyze(f"{relation} {' '.join(answers)}"))
  for relation, paraphrase, _ in RELATIONS:
    shared = set(analyzer.analyze(paraphrase)) & passage_terms
    if shared:
      raise ValueError(f"the paraphrase {paraphrase!r} of {relation!r} "
                       f"shares {sorted(shared)} with the passages")
  return passage_terms


def name_pool(analyzer: EnglishAnalyzer, taken: set[str]) -> list[str]:
  """Made-up two-syllable names (``Tavo``, ``Rimu``, ...) that are
  two pieces of the T5 vocabulary and one Lucene term of their own (no stem
  shared with the world's words or another name), in a fixed order."""
  tokenizer = load_tokenizer(None)
  names, seen = [], set(taken)
  for c1, v1, c2, v2 in itertools.product(_CONSONANTS, _VOWELS, _CONSONANTS,
                                          _VOWELS):
    name = (c1 + v1 + c2 + v2).capitalize()
    if len(tokenizer.encode(name)) != 2:
      continue  # one piece is most often a real word ('Lake', 'Data')
    terms = analyzer.analyze(name)
    if len(terms) == 1 and terms[0] not in seen:
      seen.add(terms[0])
      names.append(name)
  return names


def make_world(num_train_entities: int = 300, num_dev_entities: int = 16,
               seed: int = 0) -> World:
  """The world: ``len(RELATIONS)`` passages and questions per entity.

  An entity's passages are listed in a random order (so BM25's ties do not
  favour one relation through the passage ids); questions are shuffled.
  """
  rng = np.random.default_rng(seed)
  analyzer = EnglishAnalyzer()
  taken = _check_words(analyzer)
  for _, paraphrase, _ in RELATIONS:
    taken |= set(analyzer.analyze(paraphrase))
  pool = name_pool(analyzer, taken)
  n = num_train_entities + num_dev_entities
  if n > len(pool):
    raise ValueError(f"{n} entities: the pool has {len(pool)} names")
  names = [pool[i] for i in rng.choice(len(pool), n, replace=False)]
  passages, questions = [], []
  for e, name in enumerate(names):
    for r in rng.permutation(len(RELATIONS)):
      relation, paraphrase, answers = RELATIONS[r]
      answer = str(answers[rng.integers(len(answers))])
      pid = str(len(passages))
      passages.append((pid, f"{name}'s {relation} is {answer}.", name))
      questions.append({"id": f"q{e}-{r}",
                        "question": f"what is the {paraphrase} of {name}?",
                        "answers": [answer], "gold_id": pid})
  cut = num_train_entities * len(RELATIONS)
  train, dev = questions[:cut], questions[cut:]
  rng.shuffle(train)
  rng.shuffle(dev)
  return World(tuple(passages), tuple(train), tuple(dev))


def write_world(world: World, directory: str) -> dict[str, str]:
  """Writes ``corpus.tsv`` (DPR TSV), ``train.jsonl`` and ``dev.jsonl`` (QA
  JSONL, with each question's ``gold_id``); returns their paths."""
  os.makedirs(directory, exist_ok=True)
  paths = {name: os.path.join(directory, name)
           for name in ("corpus.tsv", "train.jsonl", "dev.jsonl")}
  with open(paths["corpus.tsv"], "w") as f:
    f.write("id\ttext\ttitle\n")
    for row in world.passages:
      f.write("\t".join(row) + "\n")
  for name, questions in (("train.jsonl", world.train),
                          ("dev.jsonl", world.dev)):
    with open(paths[name], "w") as f:
      for q in questions:
        f.write(json.dumps(q) + "\n")
  return paths
