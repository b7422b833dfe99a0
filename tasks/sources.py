"""Data sources of the FiD QA tasks: FiD files, and TFDS questions + retrieval.

Sources yield raw fields in retrieval order: ``question``, ``answers``
(string ``[k]``), ``target`` and ``id`` (``""`` when absent), ``titles``,
``texts`` (string ``[n]``) and ``scores`` (float64 ``[n]``, NaN when
missing). :class:`FidFileSource` reads ``{data dir}/{subdir}/{split}.json[l]``
(validated; training records need a target or an answer).
:class:`RetrievalTfdsSource` maps a TFDS question set to these fields
(:func:`tfds_to_common`; TriviaQA targets title-cased when all upper case)
and joins the split's retrieval file (:func:`join_retrieval`) in
``get_dataset``. Nothing is read before ``get_dataset``.
"""
from __future__ import annotations

import math
import re
from typing import Iterator, Mapping

import numpy as np
import seqio
import tensorflow as tf

from jaxfid.core.errors import InputError
from jaxfid.reader import examples as fid_format
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader.examples import FidExample, Passage
from tasks import config

NQ = "nq"
TRIVIA_QA = fid_format.TRIVIA_QA
SQUAD = "squad"
DATASETS = (NQ, TRIVIA_QA, SQUAD)

# RE2's \s, used on both sides so that Python and TensorFlow keys agree.
_SPACE_RUN = r"[\t\n\f\r ]+"

OUTPUT_SIGNATURE = {
    "id": tf.TensorSpec([], tf.string),
    "question": tf.TensorSpec([], tf.string),
    "answers": tf.TensorSpec([None], tf.string),
    "target": tf.TensorSpec([], tf.string),
    "titles": tf.TensorSpec([None], tf.string),
    "texts": tf.TensorSpec([None], tf.string),
    "scores": tf.TensorSpec([None], tf.float64),
}


def _strings(values) -> np.ndarray:
  out = np.empty([len(values)], dtype=object)
  out[:] = [v.encode("utf-8") for v in values]
  return out


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def example_features(example: FidExample) -> dict[str, np.ndarray]:
  """The raw fields of an example (see the module docstring)."""
  return {
      "id": np.bytes_((example.id or "").encode("utf-8")),
      "question": np.bytes_(example.question.encode("utf-8")),
      "answers": _strings(example.answers),
      "target": np.bytes_((example.target or "").encode("utf-8")),
      "titles": _strings([p.title for p in example.ctxs]),
      "texts": _strings([p.text for p in example.ctxs]),
      "scores": np.asarray([math.nan if p.score is None else p.score
                            for p in example.ctxs], np.float64),
  }


def example_from_features(features: Mapping[str, object]) -> FidExample:
  """The ``FidExample`` of an example's raw fields (NumPy values, as
  ``as_numpy_iterator`` gives them); inverse of :func:`example_features`
  (``""`` targets and ids become None)."""
  target = _text(features["target"])
  ident = _text(features["id"])
  scores = np.asarray(features["scores"], np.float64).reshape(-1)
  ctxs = tuple(
      Passage(title=_text(title), text=_text(text),
              score=None if math.isnan(score) else float(score))
      for title, text, score in zip(np.asarray(features["titles"]).reshape(-1),
                                    np.asarray(features["texts"]).reshape(-1),
                                    scores))
  return FidExample(
      question=_text(features["question"]),
      answers=tuple(_text(a) for a in
                    np.asarray(features["answers"]).reshape(-1)),
      target=target or None, ctxs=ctxs, id=ident or None)


def fid_file_dataset(path: str, require_answers: bool = False
                     ) -> tf.data.Dataset:
  """A FiD JSON/JSONL file (read lazily) as a dataset of the raw fields.

  Raises InputError for a missing file; malformed records fail the iteration.
  """
  if not tf.io.gfile.exists(path):
    raise InputError(path, "no such file")

  def generate():
    for ex in fid_format.iter_fid_examples(path,
                                           require_answers=require_answers):
      yield example_features(ex)
  return tf.data.Dataset.from_generator(generate,
                                        output_signature=OUTPUT_SIGNATURE)


class FidFileSource(seqio.FunctionDataSource):
  """``{fid_data_dir}/{subdir}/{split}.json[l]`` (see :mod:`tasks.config`).

  :meth:`fid_examples` reads the same file without TensorFlow (jaxfid's
  trainer).
  """

  def __init__(self, subdir: str):
    self.subdir = subdir

    def dataset_fn(split: str, shuffle_files: bool, seed=None):
      del shuffle_files, seed  # one file per split
      return fid_file_dataset(config.fid_file(subdir, split),
                              require_answers=split == "train")
    dataset_fn.__name__ = f"fid_{subdir}_dataset"
    super().__init__(dataset_fn, splits=config.SPLITS)

  def fid_examples(self, split: str) -> Iterator[FidExample]:
    if split not in config.SPLITS:
      raise InputError(split, f"unknown split; expected one of "
                       f"{', '.join(config.SPLITS)}")
    return fid_format.iter_fid_examples(config.fid_file(self.subdir, split),
                                        require_answers=split == "train")


def fid_file_source(subdir: str) -> FidFileSource:
  """A seqio source reading ``{fid_data_dir}/{subdir}/{split}.json[l]``."""
  return FidFileSource(subdir)


def source_examples(source: seqio.DataSource, split: str, name: str = ""
                    ) -> list[FidExample]:
  """Every example of a FiD task's source split, in order, unshuffled.

  FiD files are read directly; any other source is iterated (its TensorFlow
  errors become :class:`InputError` naming ``name``).
  """
  if isinstance(source, FidFileSource):
    return list(source.fid_examples(split))
  dataset = source.get_dataset(split=split, shuffle=False)
  try:
    return [example_from_features(f) for f in dataset.as_numpy_iterator()]
  except tf.errors.OpError as e:
    reason = (e.message or str(e)).strip().splitlines()[0]
    raise InputError(name or split, f"{split}: {reason}") from None


# --------------------------------------------------------------- TFDS + join


def _title_case_if_upper_tf(text: tf.Tensor) -> tf.Tensor:
  """``jaxfid.reader.inputs.title_case_if_upper`` of a scalar string tensor."""
  out = tf.numpy_function(
      lambda b: np.bytes_(fid_inputs.title_case_if_upper(
          b.decode("utf-8")).encode("utf-8")), [text], tf.string,
      stateful=False)
  out.set_shape([])
  return out


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
              "target": _title_case_if_upper_tf(ex["answer"]["value"]),
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
                   ) -> tuple[list[str], list[Passage], list[int]]:
  """Reads a retrieval results file for :func:`join_retrieval`.

  Returns ``(keys, passages, row_splits)``: one key per distinct question (the
  first record wins); record ``i``'s ``n_context`` best passages are
  ``passages[row_splits[i]:row_splits[i + 1]]``. Raises InputError for a
  malformed file or, with ``key == "id"``, a record without id.
  """
  keys, passages, splits, seen = [], [], [0], set()
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
    passages.extend(fid_format.sorted_passages(ex)[:n_context])
    splits.append(len(passages))
  return keys, passages, splits


def join_retrieval(dataset: tf.data.Dataset, retrieval_path: str, *,
                   n_context: int | None = None,
                   key: str | None = None) -> tf.data.Dataset:
  """Adds each question's retrieved ``titles``, ``texts`` and ``scores``.

  Each example's ``question`` (or ``id``, per ``key``) gets its record's
  ``n_context`` best passages; a question missing from the file fails the
  iteration naming it and the file. ``n_context`` and ``key`` default to the
  gin settings.
  """
  n_context = config.fid_n_context() if n_context is None else n_context
  key = config.fid_join_key() if key is None else key
  if key not in config.JOIN_KEYS:
    raise ValueError(f"key must be one of {config.JOIN_KEYS}, got {key!r}")
  keys, passages, splits = load_retrieval(retrieval_path, n_context, key)
  table = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(
          tf.constant(keys, tf.string),
          tf.range(len(keys), dtype=tf.int64)), default_value=-1)
  titles = tf.constant(_strings([p.title for p in passages]), tf.string)
  texts = tf.constant(_strings([p.text for p in passages]), tf.string)
  scores = tf.constant(np.asarray(
      [math.nan if p.score is None else p.score for p in passages],
      np.float64), tf.float64)
  row_splits = tf.constant(splits, tf.int64)
  message = f"not in the retrieval results {retrieval_path} ({key}):"

  def fn(ex):
    lookup = (_normalize_question_tf(ex["question"]) if key == "question"
              else ex["id"])
    row = table.lookup(lookup)
    check = tf.debugging.Assert(row >= 0, [message, lookup])
    with tf.control_dependencies([check]):
      row = tf.identity(row)
    begin, end = row_splits[row], row_splits[row + 1]
    return {**ex, "titles": titles[begin:end], "texts": texts[begin:end],
            "scores": scores[begin:end]}
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
