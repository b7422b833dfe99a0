"""Data sources of the FiD QA tasks: FiD files, and TFDS questions + retrieval.

Both kinds yield the common features the preprocessors expect
(:mod:`tasks.preprocessors`): ``question``, ``passages`` (FiD encoder strings
``"question: Q title: T context: P"``, all of an example's passages, best
retrieval score first; ``["question: Q"]`` when it has none), ``answers``,
``target`` (``""`` when absent) and ``id`` (``""`` when absent).

* :func:`fid_file_dataset` streams a FiD JSON/JSONL file with
  ``jaxfid.fid.examples.iter_fid_examples`` (validated; a bad record
  fails the iteration with the file and line in the message). The training
  split requires a target or an answer in every record.
* :class:`RetrievalTfdsSource` reads a TFDS question set
  (``natural_questions_open``, ``trivia_qa/unfiltered.nocontext``,
  ``squad/v1.1``), maps its features to the common ones
  (:func:`tfds_to_common`) and joins each question with its retrieved
  passages (:func:`join_retrieval`). The join needs the split's retrieval
  file, which a seqio preprocessor does not know, so the source applies it in
  ``get_dataset(split=...)``; both steps are plain ``tf.data`` transforms
  that work on any dataset shaped like the TFDS features.

TFDS features used: NQ-open ``question``, ``answer`` (sequence); TriviaQA
``question``, ``question_id``, ``answer.aliases`` (the answers) and
``answer.value`` (the target, title-cased when all upper case, as FiD's
``preprocess.py`` does); SQuAD ``id``, ``question``, ``answers.text``.
Nothing touches the data before ``get_dataset``: registering the tasks
works without TFDS data or retrieval files.
"""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np
import seqio
import tensorflow as tf

from jaxfid.fid import examples as fid_format
from jaxfid.core.errors import InputError
from tasks import config
from tasks import preprocessors

NQ = "nq"
TRIVIA_QA = preprocessors.TRIVIA_QA
SQUAD = "squad"
DATASETS = (NQ, TRIVIA_QA, SQUAD)

# RE2's \s, used on both sides so that Python and TensorFlow keys agree.
_SPACE_RUN = r"[\t\n\f\r ]+"

OUTPUT_SIGNATURE = {
    "id": tf.TensorSpec([], tf.string),
    "question": tf.TensorSpec([], tf.string),
    "passages": tf.TensorSpec([None], tf.string),
    "answers": tf.TensorSpec([None], tf.string),
    "target": tf.TensorSpec([], tf.string),
}


def _strings(values) -> np.ndarray:
  out = np.empty([len(values)], dtype=object)
  out[:] = [v.encode("utf-8") for v in values]
  return out


def fid_file_dataset(path: str, require_answers: bool = False
                     ) -> tf.data.Dataset:
  """A FiD JSON/JSONL file as a dataset of the common features.

  Args:
    path: the file (read lazily, on each iteration).
    require_answers: every record must have a target or an answer.

  Raises:
    InputError: the file does not exist (malformed records fail the
      iteration instead).
  """
  if not tf.io.gfile.exists(path):
    raise InputError(path, "no such file")

  def generate():
    for ex in fid_format.iter_fid_examples(path,
                                           require_answers=require_answers):
      passages = fid_format.format_passages(ex, max(1, len(ex.ctxs)))
      yield {"id": ex.id or "", "question": ex.question,
             "passages": _strings(passages),
             "answers": _strings(ex.answers), "target": ex.target or ""}
  return tf.data.Dataset.from_generator(generate,
                                        output_signature=OUTPUT_SIGNATURE)


def fid_file_source(subdir: str) -> seqio.FunctionDataSource:
  """A seqio source reading ``{fid_data_dir}/{subdir}/{split}.json[l]``."""
  def dataset_fn(split: str, shuffle_files: bool, seed=None):
    del shuffle_files, seed  # one file per split
    return fid_file_dataset(config.fid_file(subdir, split),
                            require_answers=split == "train")
  dataset_fn.__name__ = f"fid_{subdir}_dataset"
  return seqio.FunctionDataSource(dataset_fn, splits=config.SPLITS)


# --------------------------------------------------------------- TFDS + join


def tfds_to_common(dataset: tf.data.Dataset, name: str) -> tf.data.Dataset:
  """Maps TFDS features of dataset ``name`` (nq, trivia_qa, squad) to
  ``question``, ``answers``, ``target`` and ``id``."""
  if name not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS}")
  empty = tf.constant("", tf.string)

  def fn(ex):
    if name == NQ:
      return {"question": ex["question"], "answers": ex["answer"],
              "target": empty, "id": empty}
    if name == TRIVIA_QA:
      return {"question": ex["question"], "answers": ex["answer"]["aliases"],
              "target": preprocessors.title_case_if_upper(
                  ex["answer"]["value"]),
              "id": ex["question_id"]}
    return {"question": ex["question"], "answers": ex["answers"]["text"],
            "target": empty, "id": ex["id"]}
  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


def normalize_question(text: str) -> str:
  """The join key of a question: whitespace runs collapsed, ends stripped."""
  return re.sub(_SPACE_RUN, " ", text).strip(" ")


def _normalize_question_tf(text: tf.Tensor) -> tf.Tensor:
  text = tf.strings.regex_replace(text, _SPACE_RUN, " ")
  return tf.strings.regex_replace(text, "^ | $", "")


def load_retrieval(path: str, n_context: int, key: str
                   ) -> tuple[list[str], list[str], list[int]]:
  """Reads a retrieval results file for :func:`join_retrieval`.

  Returns:
    ``(keys, suffixes, row_splits)``: one key per distinct question (the
    first record wins), and the passage suffixes ``" title: T context: P"``
    of record ``i`` (its ``n_context`` best, ``[""]`` when it has none) in
    ``suffixes[row_splits[i]:row_splits[i + 1]]``.

  Raises:
    InputError: a malformed file, or (``key == "id"``) a record without id.
  """
  keys, suffixes, splits, seen = [], [], [0], set()
  for number, ex in enumerate(fid_format.iter_fid_examples(path), start=1):
    if key == "id":
      if ex.id is None:
        raise InputError(path, "record has no \"id\" to join on "
                         "(fid_join_key.key = 'id')", where=f"record {number}")
      k = ex.id
    else:
      k = normalize_question(ex.question)
    if k in seen:
      continue
    seen.add(k)
    keys.append(k)
    passages = fid_format.sorted_passages(ex)[:n_context]
    suffixes.extend(
        f" {fid_format.TITLE_PREFIX} {p.title} {fid_format.PASSAGE_PREFIX} "
        f"{p.text}" for p in passages)
    if not passages:
      suffixes.append("")
    splits.append(len(suffixes))
  return keys, suffixes, splits


def join_retrieval(dataset: tf.data.Dataset, retrieval_path: str, *,
                   n_context: int | None = None,
                   key: str | None = None) -> tf.data.Dataset:
  """Adds ``passages`` to each question from a retrieval results file.

  Each example's ``question`` (or ``id``) is looked up among the file's
  records; its passage strings are ``"question: Q title: T context: P"``
  with the dataset's own question text, best score first, at most
  ``n_context`` of them (``["question: Q"]`` for a record without
  passages). A question missing from the file fails the iteration with an
  error naming it and the file.

  Args:
    dataset: examples with ``question`` and ``id`` strings.
    retrieval_path: FiD JSON/JSONL from ``jaxfid retrieve``; read now.
    n_context: passages to keep per question (default: gin
      :func:`tasks.config.fid_n_context`).
    key: ``"question"`` or ``"id"`` (default: gin
      :func:`tasks.config.fid_join_key`).
  """
  n_context = config.fid_n_context() if n_context is None else n_context
  key = config.fid_join_key() if key is None else key
  if key not in config.JOIN_KEYS:
    raise ValueError(f"key must be one of {config.JOIN_KEYS}, got {key!r}")
  keys, suffixes, splits = load_retrieval(retrieval_path, n_context, key)
  table = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(
          tf.constant(keys, tf.string),
          tf.range(len(keys), dtype=tf.int64)), default_value=-1)
  flat = tf.constant(suffixes, tf.string)
  row_splits = tf.constant(splits, tf.int64)
  prefix = fid_format.QUESTION_PREFIX + " "
  message = f"not in the retrieval results {retrieval_path} ({key}):"

  def fn(ex):
    lookup = (_normalize_question_tf(ex["question"]) if key == "question"
              else ex["id"])
    row = table.lookup(lookup)
    check = tf.debugging.Assert(row >= 0, [message, lookup])
    with tf.control_dependencies([check]):
      row = tf.identity(row)
    found = flat[row_splits[row]:row_splits[row + 1]]
    passages = tf.strings.join([prefix + ex["question"], found])
    return {**ex, "passages": passages}
  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


class RetrievalTfdsSource(seqio.TfdsDataSource):
  """A TFDS question set joined with retrieval results per split.

  Args:
    tfds_name: e.g. ``"natural_questions_open:1.0.0"``.
    splits: the TFDS splits offered.
    dataset: ``nq``, ``trivia_qa`` or ``squad`` (feature mapping and the
      retrieval subdirectory).
    task_name: the task, for :func:`tasks.config.retrieval_file`.
  """

  def __init__(self, tfds_name: str, splits, dataset: str, task_name: str):
    if dataset not in DATASETS:
      raise ValueError(f"unknown dataset {dataset!r}")
    super().__init__(tfds_name=tfds_name, splits=splits)
    self._dataset = dataset
    self._task_name = task_name

  def get_dataset(self, split: str = "train", shuffle: bool = True,
                  seed: int | None = None, shard_info=None, *,
                  sequence_length: Mapping[str, int] | None = None,
                  use_cached: bool = False,
                  num_epochs: int | None = 1) -> tf.data.Dataset:
    # Find the retrieval file first: a missing one is reported before TFDS
    # is asked for data.
    path = config.retrieval_file(self._task_name, self._dataset, split)
    ds = super().get_dataset(split=split, shuffle=shuffle, seed=seed,
                             shard_info=shard_info,
                             sequence_length=sequence_length,
                             use_cached=use_cached, num_epochs=num_epochs)
    return join_retrieval(tfds_to_common(ds, self._dataset), path)
