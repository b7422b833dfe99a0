"""The kinds of task `jaxfid eval` evaluates come from a registry that
tasks/ fills; an evaluator names the kinds it accepts."""
from __future__ import annotations

import pytest

import tasks  # noqa: F401 (registers the tasks and their kinds)
from jaxfid.commands import seqio_eval
from jaxfid.evaluation import task_kinds
from jaxfid.evaluation.task_kinds import NOT_OF_KIND, TaskKind


def test_tasks_register_the_qa_and_prompt_kinds():
  kind, spec = task_kinds.kind_of("nq_open_fid")
  assert kind.name == "qa" and spec is None
  kind, spec = task_kinds.kind_of("lmbff_sst_2_16_13")
  assert kind.name == "classification" and spec.label_words
  assert task_kinds.kind_of("no_such_task") is None


def test_a_new_kind_is_one_registration(monkeypatch):
  monkeypatch.setattr(task_kinds, "TASK_KINDS", task_kinds.Registry("task kind"))
  kind = task_kinds.register_task_kind(TaskKind(
      "ranking", lambda name: "spec" if name == "my_task" else NOT_OF_KIND,
      lambda evaluator: None))
  assert task_kinds.kind_of("my_task") == (kind, "spec")
  assert task_kinds.kind_of("nq_open_fid") is None


@pytest.mark.parametrize("method", ["fid", "refusion"])
def test_each_evaluator_names_registered_kinds(method):
  import jaxfid.methods  # noqa: F401 (registers the evaluators)
  evaluator = seqio_eval.METHODS.get(method)
  assert evaluator.kinds and all(
      k in task_kinds.TASK_KINDS for k in evaluator.kinds)
