"""seqio tasks for Fusion-in-Decoder open-domain QA.

FiD-format files under :func:`tasks.config.fid_data_dir`:

=================  ==================================================
``nq_open_fid``    ``{data_dir}/nq/{train,validation|dev,test}.json[l]``
``trivia_qa_fid``  ``{data_dir}/trivia_qa/...``
``squad_open_fid`` ``{data_dir}/squad/...``
=================  ==================================================

TFDS question sets joined with ``jaxfid retrieve`` results
(:func:`tasks.config.fid_retrieval_dir` / ``fid_retrieval_files``):

=============================  ========================================
``natural_questions_open_fid``  ``natural_questions_open:1.0.0``
``trivia_qa_unfiltered_fid``    ``trivia_qa/unfiltered.nocontext:1.1.0``
``squad_v1_1_fid``              ``squad/v1.1:3.0.0``
=============================  ========================================

Every task outputs ``inputs`` (passages x tokens) and ``targets`` via
:func:`tasks.preprocessors.encode_fid`, with ``exact_match`` and ``f1``
metrics. Batch with :func:`tasks.feature_converter.fid_feature_converter`.
:data:`FID_TASKS` maps each task to its dataset. Registration opens no file;
:func:`register_tasks` may be called again.
"""
from __future__ import annotations

import functools

import gin
import seqio

from jaxfid.evaluation.task_kinds import NOT_OF_KIND, TaskKind, register_task_kind
from tasks import metrics, preprocessors, sources
from tasks.feature_converter import FidFeatureConverter
from tasks.vocabulary import seqio_vocabulary

# FiD-file tasks: name -> dataset (its subdirectory of the data directory)
FID_FILE_TASKS = {
    "nq_open_fid": sources.NQ,
    "trivia_qa_fid": sources.TRIVIA_QA,
    "squad_open_fid": sources.SQUAD,
}
# TFDS tasks: name -> (dataset, TFDS name, TFDS splits)
TFDS_TASKS = {
    "natural_questions_open_fid": (sources.NQ, "natural_questions_open:1.0.0",
                                   ("train", "validation")),
    "trivia_qa_unfiltered_fid": (sources.TRIVIA_QA,
                                 "trivia_qa/unfiltered.nocontext:1.1.0",
                                 ("train", "validation", "test")),
    "squad_v1_1_fid": (sources.SQUAD, "squad/v1.1:3.0.0",
                       ("train", "validation")),
}
TASK_NAMES = tuple(FID_FILE_TASKS) + tuple(TFDS_TASKS)


@functools.lru_cache(maxsize=1)
def output_features() -> dict[str, seqio.Feature]:
  """``inputs`` (rank 2) and ``targets``, T5's vocabulary, EOS on both."""
  vocab = seqio_vocabulary()
  return {"inputs": seqio.Feature(vocabulary=vocab, add_eos=True, rank=2),
          "targets": seqio.Feature(vocabulary=vocab, add_eos=True)}


def task_preprocessors(dataset: str) -> list:
  """The preprocessors of a task over ``dataset`` (nq, trivia_qa, squad)."""
  return [functools.partial(preprocessors.encode_fid, dataset_name=dataset)]


# every registered FiD QA task -> its dataset (filled by add_fid_task)
FID_TASKS: dict[str, str] = {}


def add_fid_task(name: str, source: seqio.DataSource,
                 dataset: str) -> seqio.Task:
  """(Re-)registers a FiD QA task over ``source``, which must yield the raw
  fields of :mod:`tasks.sources`; ``dataset`` is nq, trivia_qa or squad."""
  if dataset not in sources.DATASETS:
    raise ValueError(f"unknown dataset {dataset!r}; expected one of "
                     f"{sources.DATASETS}")
  seqio.TaskRegistry.remove(name)
  task = seqio.TaskRegistry.add(
      name, source=source, output_features=output_features(),
      preprocessors=task_preprocessors(dataset),
      postprocess_fn=metrics.postprocess_answer,
      metric_fns=[metrics.exact_match, metrics.f1])
  FID_TASKS[name] = dataset
  return task


def register_tasks() -> list[str]:
  """(Re-)registers every FiD QA task; returns their names."""
  for name, dataset in FID_FILE_TASKS.items():
    add_fid_task(name, sources.fid_file_source(dataset), dataset)
  for name, (dataset, tfds_name, splits) in TFDS_TASKS.items():
    add_fid_task(name, sources.RetrievalTfdsSource(tfds_name, splits, dataset,
                                                   name), dataset)
  return list(TASK_NAMES)


def _converter(evaluator) -> FidFeatureConverter:
  """The checkpoint's passage format reaches the tasks' preprocessing and
  the converter (``evaluator.passage_eos``)."""
  passage_eos = evaluator.passage_eos
  gin.bind_parameter("tasks.config.fid_passage_eos.passage_eos", passage_eos)
  return FidFeatureConverter(passage_eos=passage_eos)


register_tasks()
register_task_kind(TaskKind(
    "qa", lambda name: None if name in FID_TASKS else NOT_OF_KIND, _converter))
