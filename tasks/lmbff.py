"""seqio tasks for ReFusion's few-shot classification (LM-BFF prompts on T5).

* ``lmbff_<task>_16_<seed>`` (e.g. ``lmbff_sst_2_16_13``): LM-BFF's 16-shot
  splits of the 15 tasks and seeds 13, 21, 42, 87, 100, read from
  ``<root>/<lmbff_dir>/16-<seed>/`` (``dev`` is ``validation``); the root is
  :func:`lmbff_data_dir` (gin ``tasks.lmbff.lmbff_data_dir.path`` or
  ``$JAXFID_LMBFF_DIR``; gin wins).
* ``glue_<task>_prompt``: full GLUE (and SNLI) sets from TFDS with the same
  prompts, TFDS class indices mapped to the task's; hidden test labels stay
  -1 with an empty target; SNLI examples without a gold label are dropped.

Examples have ``inputs`` (prompt) and ``targets`` (label word) with EOS,
their ``*_pretokenized`` strings, ``label`` (int32), ``text_a``/``text_b``
and ``id``. Prompts are fitted to ``sequence_length["inputs"]`` by cutting
the sentences, never the template (:func:`render_prompts`). The predict
metric maps generated text to a class (a label word, any case; else -1) and
reports :func:`jaxfid.evaluation.classification.classification_metrics`.
Registration opens no file; :func:`register_tasks` may be called again.
"""
from __future__ import annotations

import functools
import os
from typing import Mapping

import gin
import numpy as np
import seqio
import tensorflow as tf

from jaxfid.core.errors import InputError
from jaxfid.evaluation import classification as class_metrics
from jaxfid.evaluation.task_kinds import NOT_OF_KIND, TaskKind, register_task_kind
from jaxfid.refusion import lmbff
from jaxfid.core.tokenization import Tokenizer
from tasks.vocabulary import seqio_vocabulary

LMBFF_DIR_ENV = "JAXFID_LMBFF_DIR"
SEEDS = lmbff.SEEDS
# seqio split -> LM-BFF split
SPLIT_FILES = {"train": "train", "validation": "dev", "test": "test"}

# TFDS tasks: task -> (TFDS name, (field a, field b), the task's raw label of
# each TFDS class, {seqio split: TFDS split}, drop unlabelled examples)
_GLUE_SPLITS = {"train": "train", "validation": "validation", "test": "test"}
_NLI_TFDS = ("entailment", "neutral", "contradiction")
TFDS_TASKS = {
    "sst-2": ("glue/sst2:2.0.0", ("sentence", None), ("0", "1"),
              _GLUE_SPLITS, False),
    "cola": ("glue/cola:2.0.0", ("sentence", None), ("0", "1"),
             _GLUE_SPLITS, False),
    "mnli": ("glue/mnli:2.0.0", ("premise", "hypothesis"), _NLI_TFDS,
             {"train": "train", "validation": "validation_matched",
              "test": "test_matched"}, False),
    "mnli-mm": ("glue/mnli:2.0.0", ("premise", "hypothesis"), _NLI_TFDS,
                {"train": "train", "validation": "validation_mismatched",
                 "test": "test_mismatched"}, False),
    "qnli": ("glue/qnli:2.0.0", ("question", "sentence"),
             ("entailment", "not_entailment"), _GLUE_SPLITS, False),
    "rte": ("glue/rte:2.0.0", ("sentence1", "sentence2"),
            ("entailment", "not_entailment"), _GLUE_SPLITS, False),
    "mrpc": ("glue/mrpc:2.0.0", ("sentence1", "sentence2"), ("0", "1"),
             _GLUE_SPLITS, False),
    "qqp": ("glue/qqp:2.0.0", ("question1", "question2"), ("0", "1"),
            _GLUE_SPLITS, False),
    "snli": ("snli:1.1.0", ("premise", "hypothesis"), _NLI_TFDS,
             _GLUE_SPLITS, True),
}


def _slug(name: str) -> str:
  return name.replace("-", "_")


def lmbff_task_name(task: str, seed: int) -> str:
  """``lmbff_<task>_16_<seed>`` (``-`` in the task name becomes ``_``)."""
  return f"lmbff_{_slug(lmbff.get_task(task).name)}_{lmbff.SHOTS}_{seed}"


def glue_task_name(task: str) -> str:
  """``glue_<task>_prompt``."""
  return f"glue_{_slug(lmbff.get_task(task).name)}_prompt"


LMBFF_TASK_NAMES = tuple(lmbff_task_name(t, s) for t in lmbff.TASK_NAMES
                         for s in SEEDS)
GLUE_TASK_NAMES = tuple(glue_task_name(t) for t in TFDS_TASKS)
TASK_NAMES = LMBFF_TASK_NAMES + GLUE_TASK_NAMES


@gin.configurable
def lmbff_data_dir(path: str | None = None) -> str:
  """LM-BFF's ``k-shot`` root: ``path`` if bound, else ``$JAXFID_LMBFF_DIR``.

  Raises:
    InputError: neither is set.
  """
  path = path or os.environ.get(LMBFF_DIR_ENV)
  if not path:
    raise InputError(LMBFF_DIR_ENV, "no LM-BFF data directory: bind "
                     "tasks.lmbff.lmbff_data_dir.path in gin or set "
                     "$JAXFID_LMBFF_DIR to LM-BFF's k-shot directory")
  return os.fspath(path)


@functools.lru_cache(maxsize=1)
def output_features() -> dict[str, seqio.Feature]:
  """``inputs`` and ``targets`` in T5's vocabulary, EOS on both."""
  vocab = seqio_vocabulary()
  return {"inputs": seqio.Feature(vocabulary=vocab, add_eos=True),
          "targets": seqio.Feature(vocabulary=vocab, add_eos=True)}


# ------------------------------------------------------------------ sources


def examples_dataset(examples: list[lmbff.Example]) -> tf.data.Dataset:
  """LM-BFF examples as a dataset of ``text_a``, ``text_b``, ``label``, ``id``.
  """
  return tf.data.Dataset.from_tensor_slices({
      "text_a": tf.constant([e.text_a for e in examples], tf.string),
      "text_b": tf.constant([e.text_b or "" for e in examples], tf.string),
      "label": np.array([e.label for e in examples], np.int32),
      "id": tf.constant([e.guid for e in examples], tf.string),
  })


def lmbff_source(task: str, seed: int) -> seqio.FunctionDataSource:
  """The 16-shot files of ``task``/``seed`` under :func:`lmbff_data_dir`.

  The files are read (and checked, raising ``InputError``) each time a split
  is asked for.
  """
  spec = lmbff.get_task(task)
  data_seed = int(seed)

  def dataset_fn(split: str, shuffle_files: bool,
                 seed: int | None = None) -> tf.data.Dataset:
    del shuffle_files, seed  # one small file per split; seqio shuffles
    directory = lmbff.seed_dir(lmbff_data_dir(), spec, data_seed)
    return examples_dataset(
        lmbff.read_split(spec, directory, SPLIT_FILES[split]))
  return seqio.FunctionDataSource(dataset_fn, splits=tuple(SPLIT_FILES))


def tfds_to_common(dataset: tf.data.Dataset, task: str) -> tf.data.Dataset:
  """TFDS GLUE/SNLI examples of ``task`` as ``text_a``, ``text_b``,
  ``label`` (the task's class; -1 for none) and ``id``.

  Works on any dataset shaped like the TFDS features (the two text fields of
  :data:`TFDS_TASKS`, an int ``label``, optionally ``idx``).
  """
  spec = lmbff.get_task(task)
  _, (field_a, field_b), tfds_classes, _, drop_unlabelled = TFDS_TASKS[
      spec.name]
  table = tf.constant([spec.labels.index(c) for c in tfds_classes], tf.int32)

  def fn(ex):
    raw = tf.cast(ex["label"], tf.int32)
    return {
        "text_a": tf.strings.strip(ex[field_a]),
        "text_b": (tf.strings.strip(ex[field_b]) if field_b else
                   tf.constant("", tf.string)),
        "label": tf.where(raw >= 0, tf.gather(table, tf.maximum(raw, 0)),
                          -1),
        "id": (tf.strings.as_string(ex["idx"]) if "idx" in ex else
               tf.constant("", tf.string)),
    }
  dataset = dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)
  if drop_unlabelled:
    dataset = dataset.filter(lambda ex: ex["label"] >= 0)
  return dataset


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
  return Tokenizer()


def render_prompts(dataset: tf.data.Dataset, task: str,
                   sequence_length: Mapping | None = None) -> tf.data.Dataset:
  """Adds ``inputs`` (the prompt) and ``targets`` (the label word; ``""``
  for label -1).

  With ``sequence_length["inputs"]`` set, the sentences are cut word by word
  so that the prompt and EOS fit (:func:`jaxfid.refusion.lmbff.
  render_text_fitted`, counting T5 tokens): trimming the tokens afterwards
  would cut off the mask.
  """
  spec = lmbff.get_task(task)
  length = (sequence_length or {}).get("inputs")

  def render(a: bytes, b: bytes, label: np.int32):
    text_a = a.decode("utf-8")
    text_b = b.decode("utf-8") if spec.pair else None
    if length is None:
      inputs = lmbff.render_text(spec, text_a, text_b)
    else:
      inputs = lmbff.render_text_fitted(
          spec, text_a, text_b, int(length) - 1,
          lambda text: len(_tokenizer().encode(text)))
    target = lmbff.label_word(spec, int(label)) if label >= 0 else ""
    return np.bytes_(inputs.encode("utf-8")), np.bytes_(
        target.encode("utf-8"))

  def fn(ex):
    inputs, targets = tf.numpy_function(
        render, [ex["text_a"], ex["text_b"], ex["label"]],
        [tf.string, tf.string], stateful=False)
    inputs.set_shape([])
    targets.set_shape([])
    return {**ex, "inputs": inputs, "targets": targets}
  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


# ------------------------------------------------------------------ metrics


def postprocess_fn(task: str):
  """seqio ``postprocess_fn``: generated text -> class (-1 for no label word);
  for a target, the example's ``label``."""
  spec = lmbff.get_task(task)

  def postprocess(output, example=None, is_target: bool = False) -> int:
    if is_target and example is not None and "label" in example:
      return int(np.asarray(example["label"]))
    text = output.decode("utf-8") if isinstance(output, bytes) else output
    return lmbff.word_label(spec, str(text))
  return postprocess


def metric_fn(task: str):
  """seqio predict metric ``fn(targets, predictions)`` of the task's metric."""
  metric = lmbff.get_task(task).metric

  def classification(targets, predictions) -> dict[str, float]:
    return class_metrics.classification_metrics(metric, predictions, targets)
  classification.__name__ = f"classification_{metric}"
  return classification


# ------------------------------------------------------------- registration


# every registered prompt task -> its LM-BFF task name (filled by _add)
TASK_SPECS: dict[str, str] = {}


def task_spec(name: str) -> lmbff.TaskSpec | None:
  """The LM-BFF spec (label words, template, metric) of registered prompt
  task ``name``; None for any other task."""
  return lmbff.get_task(TASK_SPECS[name]) if name in TASK_SPECS else None


def _add(name: str, source, task: str, first=()) -> None:
  TASK_SPECS[name] = task
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=source, output_features=output_features(),
      preprocessors=list(first) + [
          functools.partial(render_prompts, task=task),
          functools.partial(seqio.preprocessors.tokenize,
                            copy_pretokenized=True, with_eos=False),
          seqio.preprocessors.append_eos_after_trim],
      postprocess_fn=postprocess_fn(task), metric_fns=[metric_fn(task)])


def register_tasks() -> list[str]:
  """(Re-)registers every LM-BFF and GLUE prompt task; returns their names."""
  for task in lmbff.TASK_NAMES:
    for seed in SEEDS:
      _add(lmbff_task_name(task, seed), lmbff_source(task, seed), task)
  for task, (tfds_name, _, _, splits, _) in TFDS_TASKS.items():
    _add(glue_task_name(task), seqio.TfdsDataSource(tfds_name, splits=splits),
         task, first=[functools.partial(tfds_to_common, task=task)])
  return list(TASK_NAMES)


register_tasks()
register_task_kind(TaskKind(
    "classification",
    lambda name: task_spec(name) if name in TASK_SPECS else NOT_OF_KIND,
    lambda evaluator: seqio.EncDecFeatureConverter(pack=False)))
