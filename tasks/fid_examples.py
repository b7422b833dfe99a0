"""jaxfid's FiD trainer on a seqio task or mixture: the ``seqio`` example source.

With ``MIXTURE_OR_TASK_NAME``, :class:`jaxfid.reader.task.ReaderTask` asks
``EXAMPLE_SOURCES["seqio"]`` (:func:`read_components`) for every FiD QA task
of the mixture's source examples, in file order, with its rate; the trainer
then batches them as it batches FiD files, so a task over a file trains on
exactly the batches ``TRAIN_DATA=<that file>`` gives.
"""
from __future__ import annotations

import seqio

from jaxfid.core.errors import InputError
from jaxfid.reader.task import EXAMPLE_SOURCES, SEQIO, Component
from tasks import qa, sources

WHERE = "MIXTURE_OR_TASK_NAME"


def tasks_and_rates(name: str) -> list[tuple[seqio.Task, float]]:
  """The tasks of mixture or task ``name`` with their mixing rates."""
  try:
    provider = seqio.get_mixture_or_task(name)
  except ValueError:
    raise InputError(WHERE, f"no seqio task or mixture {name!r} is "
                     "registered (FiD tasks: "
                     f"{', '.join(sorted(qa.FID_TASKS))})") from None
  if isinstance(provider, seqio.Task):
    return [(provider, 1.0)]
  return [(task, float(provider.get_rate(task))) for task in provider.tasks]


def read_components(name: str, split: str) -> list[Component]:
  """``[Component(task, rate, dataset, examples), ...]`` of ``name``'s
  ``split``, one per FiD QA task of the mixture (or the task itself).

  Raises:
    InputError: an unknown name, a task that is not a FiD QA task, a split
      the task lacks, or a bad source file.
  """
  components = []
  for task, rate in tasks_and_rates(name):
    if task.name not in qa.FID_TASKS:
      raise InputError(WHERE, f"{name!r}: task {task.name!r} is not a FiD "
                       "QA task (register it with tasks.qa.add_fid_task)")
    if split not in task.splits:
      raise InputError(WHERE, f"task {task.name!r} has no {split!r} split "
                       f"(it has {', '.join(task.splits)})")
    components.append(Component(
        task.name, rate, qa.FID_TASKS[task.name],
        sources.source_examples(task.source, split, task.name)))
  return components


EXAMPLE_SOURCES.register(SEQIO, read_components)
