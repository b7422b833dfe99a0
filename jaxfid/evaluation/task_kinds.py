"""Kinds of seqio task that ``jaxfid eval`` evaluates, registered by ``tasks/``.

A kind says which registered seqio tasks it covers (``spec(task_name)``:
None when the task is not of this kind, else the kind's per-task spec, which
reaches the evaluator's ``prepare``) and which feature converter turns its
task features into the model's (``converter(evaluator)``, after the
evaluator is built: FiD's converter follows the checkpoint's passage
format). ``tasks/qa.py`` registers ``"qa"``, ``tasks/lmbff.py``
``"classification"``; a method's checkpoint evaluator names the kinds it
accepts (``kinds``), and ``jaxfid eval`` asks this registry, so a new kind
of task is one registration here and one evaluator, not an edit of the
command.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxfid.core.registry import Registry


@dataclasses.dataclass(frozen=True)
class TaskKind:
  """One kind of evaluation task.

  Attributes:
    name: the kind, as evaluators name it (``"qa"``).
    spec: ``task name -> spec``: NOT_OF_KIND when the task is not of this
      kind, else what the evaluator's ``prepare`` gets (None for QA).
    converter: ``evaluator -> seqio.FeatureConverter`` for its tasks.
  """
  name: str
  spec: Callable[[str], Any]
  converter: Callable[[Any], Any]


NOT_OF_KIND = object()

TASK_KINDS: Registry[TaskKind] = Registry(
    "task kind", hint="import tasks, which registers the QA and prompt kinds")


def register_task_kind(kind: TaskKind) -> TaskKind:
  return TASK_KINDS.register(kind.name, kind)


def kind_of(task_name: str) -> tuple[TaskKind, Any] | None:
  """(kind, spec) of a registered seqio task; None when no kind covers it."""
  for _, kind in TASK_KINDS.items():
    spec = kind.spec(task_name)
    if spec is not NOT_OF_KIND:
      return kind, spec
  return None
