"""A synthetic few-shot task whose labels only the retrieval database knows.

ReFusion's claim is that fusing retrieved sentence representations gives a
classifier knowledge its input lacks. This module builds a task where that
is the *only* way to beat chance, in LM-BFF's SST-2 layout (``train.tsv``,
``dev.tsv``, ``test.tsv`` with header ``sentence\\tlabel``, labels 0/1, label
words terrible/great), so the real trainer runs it unchanged
(``TASK='sst-2'``):

* every example is about one made-up *item*, a name of nonsense syllables
  (``"stokris latus zudo"``) in a neutral frame (``"we talked about
  stokris latus zudo ."``). Every item belongs to one split and no name
  word is used twice, so no word of a test name has been seen in training;
  the frames go round in turn within each label, and labels are balanced
  in every split: from the text alone, chance (0.5) is the best a model can
  do on the test set;
* the database holds ``sentences_per_item`` sentences about every item (of
  all three splits), each joining ``phrases_per_sentence`` phrases of the
  item's sentiment, drawn from two small pools shared by all items
  (``"stokris latus zudo was a mess , not worth the time , and was dull and
  tedious ."`` for label 0, ``"... was superb , a joy to watch , and was
  wonderful , a delight ."`` for label 1; no label word appears);
* retrieval finds an item's own sentences through the name they share with
  the query: a mean-pooled encoder, even a random one, keeps much of each
  token's identity (:func:`retrieval_hit_rate` measures it).

A model that reads the retrieved neighbours — fused (ReFusion) or appended
to the input (the concatenation baseline) — can learn the direction that
separates the two phrase pools from the training items and apply it to
unseen ones; the plain backbone can only memorise the training names.

The database (:func:`build_database`) is embedded by a random tiny T5
(:func:`write_random_encoder`: HF layout, written from jaxfid's initialisers,
no torch) with mean pooling, *unnormalised* vectors and an L2 FAISS index,
as the original ReFusion's database (BERT vectors, L2 metric). Defaults and
why:

* ``d_model=256``: a wide random encoder keeps names apart (retrieval
  precision at k=4 ~0.99; measured with one phrase per sentence and unit
  vectors: 0.98 at d_model 64, 1.0 at 128 and 256) and leaves the two
  phrase pools linearly separable;
* two phrases per sentence: the sentiment's share of each mean-pooled
  vector is what a model can read. A logistic-regression probe on the mean
  of the 4 neighbours' vectors, fitted on the 16+16 training items, scored
  0.86 on the test items with one phrase and 0.99-1.0 with two (2 seeds);
* ``vector_scale=1`` (the encoder's final layer-norm scale, as initialised:
  the encoder's own scale; stored vectors of norm ~5.7). ReFusion's
  projection of a database of another width normalises the fused vector
  (``FUSED_NORM='auto'``), so the database's scale does not change what is
  fused; before it did, fusion only helped with vectors scaled x30 (norm
  ~170; see ``benchmarks/refusion_synthetic.py`` and
  ``benchmarks/RESULTS.md``).

Everything is a pure function of the seeds.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxfid.checkpoints import names
from jaxfid.checkpoints.hf import write_hf
from jaxfid.core.tokenization import bundled_vocab_path
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.dual_encoder.index import build_dense_index
from jaxfid.refusion import neighbours as nb_lib
from jaxfid.runtime.files import write_atomic
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

SPLITS = ("train", "dev", "test")
SENTENCE_FILE = "sentences.txt"

# Neutral frames of the inputs: nothing in them depends on the label.
QUERY_FRAMES = ("we talked about {name} .", "{name} came up today .",
                "someone mentioned {name} .", "i read about {name} .")
# The database's sentiment phrases, label 0 then label 1 (no label word).
PHRASES = (
    ("was dreadful , a waste", "was awful , a chore to sit through",
     "was dull and tedious", "was boring , painfully flat",
     "was a mess , not worth the time"),
    ("was wonderful , a delight", "was superb , a joy to watch",
     "was charming and moving", "was brilliant , truly lovely",
     "was a gem , worth every minute"),
)
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v",
           "z", "br", "dr", "gr", "kr", "pl", "st", "tr", "zh")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "", "n", "r", "s", "x")


@dataclasses.dataclass(frozen=True)
class Item:
  """One made-up item: its name, label, split and database rows."""
  name: str
  label: int
  split: str
  rows: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
  """The examples of every split and the database sentences.

  Attributes:
    examples: split -> [(sentence, label)], one example per item.
    items: split -> the items of those examples, in the same order.
    sentences: the database, one sentence per row.
  """
  examples: dict[str, list[tuple[str, int]]]
  items: dict[str, list[Item]]
  sentences: list[str]

  def all_items(self) -> list[Item]:
    """Every item, split by split in :data:`SPLITS` order."""
    return [item for split in SPLITS for item in self.items[split]]

  def row_items(self) -> np.ndarray:
    """int64 [num_sentences]: the :meth:`all_items` index of each row's item."""
    out = np.full((len(self.sentences),), -1, np.int64)
    for i, item in enumerate(self.all_items()):
      out[list(item.rows)] = i
    return out


def _word(rng: np.random.Generator, syllables: int) -> str:
  parts = [_ONSETS[rng.integers(len(_ONSETS))]
           + _VOWELS[rng.integers(len(_VOWELS))] for _ in range(syllables)]
  return "".join(parts) + _CODAS[rng.integers(len(_CODAS))]


def make_names(count: int, rng: np.random.Generator, *,
               words: int = 3) -> list[str]:
  """``count`` made-up names of ``words`` words (2-3 syllables each); no
  word appears in two names."""
  names: list[str] = []
  used: set[str] = set()
  while len(names) < count:
    parts = [_word(rng, int(rng.integers(2, 4))) for _ in range(words)]
    if len(set(parts)) == words and not used.intersection(parts):
      used.update(parts)
      names.append(" ".join(parts))
  return names


def make_task(seed: int, *, train_per_class: int = 16,
              dev_per_class: int = 16, test_per_class: int = 50,
              sentences_per_item: int = 4, phrases_per_sentence: int = 2,
              name_words: int = 3) -> SyntheticTask:
  """The task of ``seed`` (see the module docstring).

  Args:
    seed: names, labels, frames, phrases and orders all follow from it.
    train_per_class / dev_per_class / test_per_class: items of each label in
      each split (one example per item; LM-BFF's few-shot sets have 16).
    sentences_per_item: database sentences about every item.
    phrases_per_sentence: distinct sentiment phrases joined in a sentence.
    name_words: words per made-up name.

  Raises:
    ValueError: a count below 1, or more phrases per sentence than a pool
      holds.
  """
  counts = {"train": train_per_class, "dev": dev_per_class,
            "test": test_per_class}
  for what, value in (*counts.items(),
                      ("sentences_per_item", sentences_per_item),
                      ("phrases_per_sentence", phrases_per_sentence),
                      ("name_words", name_words)):
    if int(value) < 1:
      raise ValueError(f"{what} must be at least 1, got {value}")
  if phrases_per_sentence > min(len(p) for p in PHRASES):
    raise ValueError(f"phrases_per_sentence must be at most "
                     f"{min(len(p) for p in PHRASES)}, got "
                     f"{phrases_per_sentence}")
  rng = np.random.default_rng([seed, 0x5EED])
  names = iter(make_names(2 * sum(counts.values()), rng, words=name_words))
  sentences: list[str] = []
  examples: dict[str, list[tuple[str, int]]] = {}
  items: dict[str, list[Item]] = {}
  for split in SPLITS:
    labels = np.repeat([0, 1], counts[split])
    labels = labels[rng.permutation(len(labels))]
    examples[split], items[split] = [], []
    seen = [0, 0]  # examples of each label so far: frames go round per label
    for label in labels.tolist():
      name = next(names)
      pool = PHRASES[label]
      rows = []
      for _ in range(sentences_per_item):
        picks = rng.permutation(len(pool))[:phrases_per_sentence]
        rows.append(len(sentences))
        sentences.append(f"{name} " + " , and ".join(pool[p] for p in picks)
                         + " .")
      frame = QUERY_FRAMES[seen[label] % len(QUERY_FRAMES)]
      seen[label] += 1
      examples[split].append((frame.format(name=name), label))
      items[split].append(Item(name, label, split, tuple(rows)))
  # Shuffle the database: an item's rows are not neighbours by position.
  order = rng.permutation(len(sentences))
  new_row = np.empty_like(order)
  new_row[order] = np.arange(len(order))
  items = {split: [dataclasses.replace(
      item, rows=tuple(int(new_row[r]) for r in item.rows)) for item in group]
      for split, group in items.items()}
  return SyntheticTask(examples=examples, items=items,
                       sentences=[sentences[i] for i in order])


def write_task(task: SyntheticTask, data_dir: str | os.PathLike) -> Path:
  """Writes ``train.tsv``, ``dev.tsv``, ``test.tsv`` (SST-2 layout) and the
  database sentences ``sentences.txt`` into ``data_dir``; returns it."""
  data_dir = Path(data_dir)
  data_dir.mkdir(parents=True, exist_ok=True)
  for split in SPLITS:
    lines = ["sentence\tlabel"] + [f"{s}\t{l}" for s, l in task.examples[split]]
    write_atomic(data_dir / f"{split}.tsv", "\n".join(lines) + "\n")
  write_atomic(data_dir / SENTENCE_FILE, "\n".join(task.sentences) + "\n")
  return data_dir


def write_random_encoder(directory: str | os.PathLike, *, d_model: int = 256,
                         num_layers: int = 1, num_heads: int = 4,
                         vector_scale: float = 1.0, seed: int = 0) -> Path:
  """A random tiny T5 (HF layout, tied embeddings) to embed a database with.

  Written by :func:`jaxfid.checkpoints.hf.write_hf` from jaxfid's own
  initialisers (no torch); the encoder's final layer-norm scale is set to
  ``vector_scale``, which scales every mean-pooled vector by it. It loads
  with :func:`jaxfid.dual_encoder.checkpoint.load_dual_encoder`.
  """
  config = T5Config(vocab_size=32128, d_model=d_model,
                    d_kv=max(d_model // num_heads, 1), d_ff=2 * d_model,
                    num_heads=num_heads, num_layers=num_layers,
                    num_decoder_layers=1, feed_forward_proj="gated-gelu",
                    tie_word_embeddings=True, dropout_rate=0.0,
                    dtype="float32")
  flat = {k: np.asarray(v) for k, v in
          names.flatten(EncoderDecoderModel(config).init_params(seed)).items()}
  key = "encoder/encoder_norm/scale"
  flat[key] = np.full_like(flat[key], vector_scale)
  return write_hf(directory, config, flat, bundled_vocab_path(),
                  overwrite=True)


def build_database(sentence_file: str | os.PathLike,
                   directory: str | os.PathLike, *, d_model: int = 256,
                   vector_scale: float = 1.0, normalize: bool = False,
                   metric: str = "l2", seed: int = 0) -> Path:
  """Indexes ``sentence_file`` with a random tiny T5 encoder.

  ``DIRECTORY/encoder`` receives the encoder and ``DIRECTORY/db`` the dense
  index (the ``RETRIEVAL_DB``), which is returned. ``normalize`` and
  ``metric`` are those of the index (unit vectors, inner product: GTR's
  setting).
  """
  directory = Path(directory)
  encoder = write_random_encoder(directory / "encoder", d_model=d_model,
                                 vector_scale=vector_scale, seed=seed)
  build_dense_index(
      None, sentence_file, directory / "db", metric=metric, progress=False,
      encoder=load_dual_encoder(encoder, normalize=normalize))
  return directory / "db"


def retrieval_hit_rate(task: SyntheticTask, db_dir: str | os.PathLike,
                       top_k: int, splits: Sequence[str] = SPLITS
                       ) -> dict[str, float]:
  """How well the database's own encoder finds each item's sentences.

  Over the examples of ``splits``: ``hit_at_1`` (the best neighbour is about
  the query's item), ``precision`` (the share of the top ``top_k`` that
  are) and ``label_precision`` (the share carrying the query's label).
  The database must hold ``task.sentences`` in order.
  """
  all_items = task.all_items()
  position = {(item.split, item.name): i for i, item in enumerate(all_items)}
  queries, own = [], []
  for split in splits:
    for (sentence, _), item in zip(task.examples[split], task.items[split]):
      queries.append([sentence])
      own.append(position[(item.split, item.name)])
  found = nb_lib.retrieve_neighbours(db_dir, queries, top_k, cache_dir=False)
  rows = found.rows[:, 0]                                          # [N, K]
  owner = task.row_items()[np.where(rows >= 0, rows, 0)]           # [N, K]
  own = np.asarray(own)[:, None]                                   # [N, 1]
  labels = np.asarray([item.label for item in all_items])
  same_item = (owner == own) & (rows >= 0)
  same_label = (labels[owner] == labels[own]) & (rows >= 0)
  return {"hit_at_1": float(same_item[:, 0].mean()),
          "precision": float(same_item.mean()),
          "label_precision": float(same_label.mean())}
