"""ReAtt's iterative training as explicit rounds (``jaxfid reatt iterate``).

With ``W = RETRIEVAL_WARMUP_STEPS``, ``S`` steps per iteration and work
directory ``DIR`` (default ``MODEL_DIR/iterate``), iteration ``i``:

1. trains MODEL_DIR to step ``W + (i+1) * S`` on TRAIN_DATA (``i = 0``) or
   ``DIR/train_{i-1}.json``, resuming from its latest checkpoint;
2. indexes the corpus into ``DIR/index_i``;
3. retrieves the training queries' close documents into ``DIR/train_i.json``;
4. writes ``DIR/iteration_i.json`` last (step, files, retrieval accuracy,
   answer recall, share of changed close documents); a rerun skips
   iterations whose record exists.

Rounds bind ``ITERATION_STEPS = S`` without a retrieval corpus so the
schedule matches the in-trainer loop; a schedule spanning the whole run, a
set ``RETRIEVAL_CORPUS`` or another ``ITERATION_STEPS`` is refused, as is a
rerun whose settings differ from ``DIR/iterate.json``.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable

from jaxfid.core.errors import InputError
from jaxfid.reader import examples as fid_format
from jaxfid.reatt import index_build
from jaxfid.retrieval import evaluate
from jaxfid.retrieval.search import retrieve_to_file
from jaxfid.retrieval.store.queries import read_queries
from jaxfid.runtime import multihost
from jaxfid.training import rounds
from jaxfid.training.metrics_log import read_records

STATE_FILE = "iterate.json"
DEFAULT_WORK_DIR = "iterate"  # under MODEL_DIR
# The run's settings iterate needs: gin macro -> settings key.
SETTINGS = {"MODEL_DIR": "model_dir", "TRAIN_DATA": "train_data",
            "TRAIN_STEPS": "train_steps",
            "RETRIEVAL_WARMUP_STEPS": "retrieval_warmup_steps",
            "ITERATION_STEPS": "iteration_steps",
            "RETRIEVAL_CORPUS": "retrieval_corpus", "N_CONTEXT": "n_context",
            "TOKEN_TOP_K": "token_top_k", "RERANK_TOP_K": "rerank_top_k",
            "SCHEDULE": "schedule",
            "RESTART_SCHEDULE": "restart_schedule",
            "WARMUP_FRACTION": "warmup_fraction",
            "INDEX_BATCH_SIZE": "index_batch_size"}


def round_overrides(it: "Iteration", steps_per_iteration: int) -> dict:
  """The gin macros a round's training binds over the user's run."""
  return {"TRAIN_STEPS": it.end_step, "TRAIN_DATA": it.train_data,
          "ITERATION_STEPS": steps_per_iteration, "RETRIEVAL_CORPUS": None}
ANSWER_KS = (1, 5, 20, 100)


@dataclasses.dataclass(frozen=True)
class Iteration:
  """One round: train ``[start_step, end_step)`` on ``train_data``, then refresh."""
  number: int
  start_step: int
  end_step: int
  train_data: str
  index_dir: str
  train_file: str
  record: str

  def finished(self) -> bool:
    return (os.path.exists(self.record) and os.path.exists(self.train_file)
            and os.path.exists(os.path.join(self.index_dir, "meta.json")))


def plan_iterations(train_data: str, work_dir: str, iterations: int,
                    steps_per_iteration: int,
                    retrieval_warmup_steps: int) -> list[Iteration]:
  """The rounds of a run; round ``i`` ends at ``W + (i+1) * S``."""
  out = []
  for i in range(iterations):
    out.append(Iteration(
        number=i,
        start_step=0 if i == 0 else (retrieval_warmup_steps
                                     + i * steps_per_iteration),
        end_step=retrieval_warmup_steps + (i + 1) * steps_per_iteration,
        train_data=train_data if i == 0 else out[-1].train_file,
        index_dir=os.path.join(work_dir, f"index_{i}"),
        train_file=os.path.join(work_dir, f"train_{i}.json"),
        record=os.path.join(work_dir, f"iteration_{i}.json")))
  return out


# ------------------------------------------------------------------ settings


def check_settings(settings: dict, steps_per_iteration: int) -> None:
  """Refuses gin configs whose own iteration or schedule would fight the
  rounds (each value's own range is checked with the gin run:
  :class:`jaxfid.reatt.task.ReAttTraining`)."""
  if settings["retrieval_corpus"]:
    raise InputError("RETRIEVAL_CORPUS", "drives the trainer's own refresh; "
                     "`reatt iterate` re-indexes --corpus itself: leave "
                     "RETRIEVAL_CORPUS unset (None)")
  if settings["iteration_steps"] not in (0, steps_per_iteration):
    raise InputError("ITERATION_STEPS", f"is {settings['iteration_steps']} "
                     f"but --steps-per-iteration is {steps_per_iteration}: "
                     "bind ITERATION_STEPS=0 (or the same value) with "
                     "`reatt iterate`")
  if not settings["restart_schedule"]:
    if settings["schedule"] != "constant":
      raise InputError("SCHEDULE", f"{settings['schedule']!r} decays over the "
                       "whole run, which one round does not know: use "
                       "RESTART_SCHEDULE=True (a warm-up and decay per "
                       "iteration, the paper's recipe) or SCHEDULE='constant'")
    if settings["warmup_fraction"] is not None:
      raise InputError("WARMUP_FRACTION", "is a share of the whole run, which "
                       "one round does not know: use RESTART_SCHEDULE=True "
                       "or WARMUP_STEPS")


def check_queries(path: str) -> int:
  """The training queries must all carry answers (they become TRAIN_DATA)."""
  queries = read_queries(path)
  if not queries:
    raise InputError(path, "no queries")
  for position, q in enumerate(queries):
    if not q.answers:
      raise InputError(path, f"query {q.id!r} has no answers: training "
                       "queries need them (QA JSONL with 'answers')",
                       where=f"record {position + 1}")
  return len(queries)


def claim_work_dir(work_dir: str, identity: dict) -> None:
  """Writes DIR/iterate.json, or checks that DIR belongs to this run."""
  rounds.claim_work_dir(work_dir, STATE_FILE, identity, "reatt iterate")


# ---------------------------------------------------------------- the rounds


latest_step = rounds.latest_step


def resume_step(it: Iteration, model_dir: str) -> int:
  """MODEL_DIR's step, checked to lie within round ``it``."""
  step = latest_step(model_dir)
  if step > it.end_step:
    raise InputError(model_dir, f"its latest checkpoint (step {step}) is past "
                     f"the end of iteration {it.number} (step {it.end_step}), "
                     f"whose outputs are missing from "
                     f"{os.path.dirname(it.record)}; use a new MODEL_DIR or "
                     "--work-dir")
  if step < it.start_step:
    raise InputError(model_dir, f"its latest checkpoint (step {step}) is "
                     f"before the end of iteration {it.number - 1} (step "
                     f"{it.start_step}), which the finished outputs come "
                     "from; use a new --work-dir")
  return step


def _close_sets(path: str, n_context: int) -> dict:
  """question id (or text) -> the set of its best ``n_context`` passages."""
  out = {}
  examples = fid_format.iter_fid_examples(path)
  try:
    for e in examples:
      best = fid_format.sorted_passages(e)[:n_context]
      out[e.id if e.id is not None else e.question] = frozenset(
          (p.title, p.text) for p in best)
  finally:
    examples.close()
  return out


def changed_share(before: str, after: str, n_context: int) -> float | None:
  """Share of the questions in both files whose close documents differ."""
  old, new = _close_sets(before, n_context), _close_sets(after, n_context)
  both = [k for k in new if k in old]
  if not both:
    return None
  return sum(old[k] != new[k] for k in both) / len(both)


def last_logged(model_dir: str, name: str, max_step: int) -> float | None:
  """The last value of ``name`` in MODEL_DIR/metrics.jsonl at or before a step."""
  value = None
  for record in read_records(model_dir):
    if name in record and record.get("step", 0) <= max_step:
      value = record[name]
  return value


def refresh_round(it: Iteration, *, model_dir: str, corpus: str,
                  queries: str, top_k: int, token_top_k: int,
                  index_batch_size: int, progress: bool | None,
                  rerank_top_k: int = 0) -> None:
  """Index with MODEL_DIR's latest checkpoint, retrieve the new TRAIN_DATA
  (``rerank_top_k`` > 0: the token index's candidate cut, RERANK_TOP_K).

  Multi-host: every process builds the index (process 0 writes it), then
  process 0 retrieves while the others wait for it.
  """
  indexed = multihost.on_leader(
      lambda: os.path.exists(os.path.join(it.index_dir, "meta.json")),
      f"checking {it.index_dir}")
  if not indexed:
    index_build.build_from_checkpoint(
        model_dir, corpus, it.index_dir, which="latest",
        batch_size=index_batch_size, progress=progress)

  def retrieve() -> None:
    cut = {"rerank_top_k": rerank_top_k} if rerank_top_k else {}
    retrieve_to_file(it.index_dir, queries, top_k, it.train_file,
                     progress=progress, token_top_k=token_top_k, **cut)
  multihost.on_leader(retrieve, f"retrieving into {it.train_file}")


def finished_record(it: Iteration) -> dict | None:
  """The record of a finished iteration (None if it is not finished)."""
  if not it.finished():
    return None
  return rounds.read_record(it.record)


def write_record(it: Iteration, **kwargs) -> dict:
  """Writes (and returns) :func:`iteration_record`: the round is finished."""
  return rounds.write_record(it.record, iteration_record(it, **kwargs))


def iteration_record(it: Iteration, *, model_dir: str, top_k: int,
                     n_context: int, seconds: float) -> dict:
  ks = sorted({k for k in ANSWER_KS if k < top_k} | {top_k})
  recall = evaluate.evaluate_with_answers(it.train_file, ks=ks)
  changed = changed_share(it.train_data, it.train_file, n_context)
  return {"iteration": it.number, "step": it.end_step,
          "trained_on": it.train_data, "index": it.index_dir,
          "train_file": it.train_file, "queries": recall["num_queries"],
          "retrieval_accuracy": last_logged(model_dir, "retrieval_accuracy",
                                            it.end_step),
          **{k: round(v, 6) for k, v in recall.items() if k.startswith("R@")},
          "close_documents_changed": (None if changed is None
                                      else round(changed, 6)),
          "seconds": round(seconds, 1)}


def run_iterations(settings: dict, train_round: Callable[["Iteration"], int],
                   *, corpus: str, queries: str, iterations: int,
                   steps_per_iteration: int, top_k: int | None = None,
                   token_top_k: int | None = None,
                   work_dir: str | None = None,
                   progress: bool | None = None,
                   emit: Callable[[dict], None] | None = None) -> dict:
  """Runs (or resumes) ``iterations`` rounds; returns the summary.

  ``train_round(iteration)`` trains to the round's end and returns the step
  reached; ``emit`` gets each record (earlier ones with ``"skipped": True``)
  and then the summary (``"complete": False`` when training stopped early).
  Multi-host: every process trains and indexes; process 0 alone decides which
  rounds are finished, retrieves and writes the records.
  """
  emit = emit or (lambda record: None)

  def check() -> int:
    for name, value in (("--iterations", iterations),
                        ("--steps-per-iteration", steps_per_iteration),
                        ("--top-k", top_k), ("--token-top-k", token_top_k)):
      if value is not None and value < 1:
        raise InputError(name, f"must be at least 1, got {value}")
    for name, path in (("--corpus", corpus), ("--queries", queries)):
      if not os.path.isfile(path):
        raise InputError(path, f"no such file ({name})")
    num = check_queries(queries)
    for name in ("model_dir", "train_data"):
      if not settings[name]:
        raise InputError("gin", f"{name.upper()} is required "
                         f"(--gin.{name.upper()}=\"'...'\")")
    check_settings(settings, steps_per_iteration)
    return num
  # every process checks its own view of the inputs; all stop if one fails
  num_queries = multihost.run_agreed(check, "checking the inputs")
  n_context = settings["n_context"]
  top_k = top_k or n_context
  if top_k < n_context:
    raise InputError("--top-k", f"{top_k} is below N_CONTEXT {n_context}: "
                     "training would get fewer close documents than it reads")
  token_top_k = token_top_k or settings["token_top_k"]
  model_dir = settings["model_dir"]
  work_dir = work_dir or os.path.join(model_dir, DEFAULT_WORK_DIR)
  warmup = settings["retrieval_warmup_steps"]
  identity = {
      "model_dir": os.path.abspath(model_dir),
      "train_data": os.path.abspath(settings["train_data"]),
      "corpus": os.path.abspath(corpus), "queries": os.path.abspath(queries),
      "retrieval_warmup_steps": warmup,
      "steps_per_iteration": steps_per_iteration, "top_k": top_k,
      "token_top_k": token_top_k}
  rerank_top_k = settings.get("rerank_top_k") or 0
  if rerank_top_k:  # (work directories of runs without the cut stay valid)
    identity["rerank_top_k"] = rerank_top_k
  multihost.on_leader(lambda: claim_work_dir(work_dir, identity),
                      f"claiming {work_dir}")
  plan = plan_iterations(settings["train_data"], work_dir, iterations,
                         steps_per_iteration, warmup)
  final_step = plan[-1].end_step

  t0 = time.time()
  skipped, complete, noted = 0, True, False
  for it in plan:
    record = multihost.on_leader(lambda: finished_record(it),
                                 f"reading {it.record}")
    if record is not None:
      skipped += 1
      emit({**record, "skipped": True})
      continue
    t_round = time.time()
    if multihost.on_leader(lambda: resume_step(it, model_dir),
                           f"reading {model_dir}") < it.end_step:
      if (not noted and settings["train_steps"] != final_step
          and multihost.is_leader()):
        print(f"note: TRAIN_STEPS ({settings['train_steps']}) is not used: "
              "`reatt iterate` trains to RETRIEVAL_WARMUP_STEPS + iterations "
              f"x steps = {final_step}", file=sys.stderr)
      noted = True
      if train_round(it) < it.end_step:
        complete = False  # the trainer saved and stopped (SIGTERM)
        break
    refresh_round(it, model_dir=model_dir, corpus=corpus, queries=queries,
                  top_k=top_k, token_top_k=token_top_k,
                  rerank_top_k=rerank_top_k,
                  index_batch_size=settings["index_batch_size"],
                  progress=progress)
    record = multihost.on_leader(lambda: write_record(
        it, model_dir=model_dir, top_k=top_k, n_context=n_context,
        seconds=time.time() - t_round), f"writing {it.record}")
    emit({**record, "skipped": False})
  summary = {"complete": complete, "iterations": iterations,
             "skipped": skipped, "step": latest_step(model_dir),
             "final_step": final_step, "queries": num_queries,
             "model_dir": model_dir, "work_dir": work_dir,
             "index": plan[-1].index_dir, "train_file": plan[-1].train_file,
             "minutes": round((time.time() - t0) / 60, 2)}
  emit(summary)
  return summary
