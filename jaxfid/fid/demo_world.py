"""The demo's data: questions whose answer must be read from the right passage.

Every made-up entity (``Zorvane``) has one short document per relation
(``Zorvane's favourite color is green.``); a question asks for one relation
of one entity, and the answer, a common word drawn afresh per entity, must be
read, not memorised. Test entities never occur in training, so the model
must find among the retrieved passages the one whose relation word matches
and copy its answer: a tiny T5 learns this in a few thousand CPU steps
(made-up names or answers it cannot learn in that budget, measured with a
reference FiD).
"""
from __future__ import annotations

import dataclasses

import numpy as np

RELATIONS = ("favourite color", "home city", "pet", "favourite food",
             "sport", "job", "instrument", "car")

# Answers: common words, one shared pool, so the relation cannot give the
# answer away: it must be read from the passage that names the relation.
ANSWER_WORDS = (
    "red", "green", "blue", "yellow", "black", "white", "paris", "london",
    "tokyo", "berlin", "rome", "madrid", "dog", "cat", "horse", "rabbit",
    "bread", "rice", "cheese", "soup", "tennis", "football", "golf", "hockey",
    "doctor", "teacher", "farmer", "pilot", "piano", "guitar", "violin",
    "drums", "ford", "toyota", "honda", "volvo", "river", "garden", "winter",
    "summer")

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v",
           "z", "br", "dr", "gr", "kl", "tr", "zh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "n", "r", "l", "s", "th", "x", "nd")


@dataclasses.dataclass(frozen=True)
class Document:
  id: str
  title: str
  text: str


def entity_names(n: int, rng: np.random.Generator, exclude=frozenset()) -> list[str]:
  """``n`` distinct made-up three-syllable names, none in ``exclude``."""
  names: list[str] = []
  seen = set(exclude)
  while len(names) < n:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(3)]
    name = ("".join(parts) + rng.choice(_CODAS)).capitalize()
    if name not in seen:
      seen.add(name)
      names.append(name)
  return names


def make_world(names: list[str], rng: np.random.Generator, id_prefix: str
               ) -> tuple[list[Document], list[dict]]:
  """Documents (one per entity and relation) and every possible question."""
  docs, questions = [], []
  for e, name in enumerate(names):
    for r, relation in enumerate(RELATIONS):
      answer = str(rng.choice(ANSWER_WORDS))
      doc_id = f"{id_prefix}{e}-{r}"
      docs.append(Document(doc_id, name, f"{name}'s {relation} is {answer}."))
      questions.append({"id": f"q-{doc_id}",
                        "question": f"what is the {relation} of {name}?",
                        "answers": [answer], "gold_id": doc_id})
  return docs, questions


def make_demo_data(num_train_entities: int = 400, num_test_entities: int = 40,
                   seed: int = 0, num_dev_entities: int = 0) -> dict:
  """Train, test and dev worlds over disjoint entities: ``{'train_docs',
  'train_questions', 'test_docs', ..., 'dev_questions'}``. Dev (which picks
  the checkpoint) is drawn last, so train and test do not depend on
  ``num_dev_entities``."""
  rng = np.random.default_rng(seed)
  train_names = entity_names(num_train_entities, rng)
  test_names = entity_names(num_test_entities, rng, exclude=set(train_names))
  train_docs, train_q = make_world(train_names, rng, "train")
  test_docs, test_q = make_world(test_names, rng, "test")
  rng.shuffle(train_q)
  rng.shuffle(test_q)
  dev_names = entity_names(num_dev_entities, rng,
                           exclude=set(train_names) | set(test_names))
  dev_docs, dev_q = make_world(dev_names, rng, "dev")
  rng.shuffle(dev_q)
  return {"train_docs": train_docs, "train_questions": train_q,
          "test_docs": test_docs, "test_questions": test_q,
          "dev_docs": dev_docs, "dev_questions": dev_q}
