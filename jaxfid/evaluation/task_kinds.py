"""Kinds of seqio task that ``jaxfid eval`` evaluates, registered by ``tasks/``.

A kind has ``spec(task_name)`` (None when the task is not of this kind, else
the spec passed to the evaluator's ``prepare``) and ``converter(evaluator)``
(its feature converter). ``tasks/qa.py`` registers ``"qa"``,
``tasks/lmbff.py`` ``"classification"``; evaluators name the kinds they
accept.
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
