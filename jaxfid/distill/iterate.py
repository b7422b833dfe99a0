"""FiD-KD's rounds (``jaxfid distill iterate``): reader, scores, retriever, index.

Izacard & Grave (2021), each output in the work directory ``W`` a file of
the single-step commands: round 0 is a BM25 index ``W/round_0/index`` and its
retrieval (dev at ``max(top_k, 100)``); round ``r >= 1`` trains the reader
``W/round_r/reader`` on round ``r-1``'s retrieval, scores every retrieved
training passage (``train_scored.json``), trains the retriever
``W/round_r/retriever`` on each question's N_CONTEXT best by score (FiD's
``sort_data``), indexes the corpus with it and retrieves again. A round ends
with ``W/round_r/round.json`` (atomic, last: ``{"round", "retriever",
"recall@1", ..., "recall@100", "eval_em"}``), appended to
``W/rounds.jsonl``; a rerun skips finished rounds, resumes an unfinished
one, and is refused with other inputs (``W/distill_iterate.json``).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable

from jaxfid.checkpoints.load import checkpoint_passage_eos, load_checkpoint
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import load_tokenizer
from jaxfid.distill.scored_data import write_scored_data
from jaxfid.dual_encoder.index import build_dense_index
from jaxfid.reader import predict as predict_lib
from jaxfid.reader.examples import read_fid_examples
from jaxfid.retrieval import evaluate
from jaxfid.retrieval.bm25.index import build_bm25_index
from jaxfid.retrieval.search import retrieve_to_file
from jaxfid.retrieval.store.queries import read_queries
from jaxfid.training import rounds
from jaxfid.training.metrics_log import read_records

STATE_FILE = "distill_iterate.json"
ROUNDS_LOG = "rounds.jsonl"
RECALL_KS = (1, 5, 20, 100)
DEV_TOP_K = 100  # dev questions' passages: enough for recall@100


@dataclasses.dataclass(frozen=True)
class Round:
  """Round ``number``'s files under the work directory."""
  number: int
  directory: str

  def path(self, name: str) -> str:
    return os.path.join(self.directory, name)

  @property
  def record(self) -> str:
    return self.path("round.json")

  @property
  def train(self) -> str:
    return self.path("train.json")

  @property
  def dev(self) -> str:
    return self.path("dev.json")

  @property
  def index(self) -> str:
    return self.path("index")

  @property
  def reader(self) -> str:
    return self.path("reader")

  @property
  def retriever(self) -> str:
    return self.path("retriever")

  @property
  def scored(self) -> str:
    return self.path("train_scored.json")


def plan_rounds(work_dir: str, rounds_: int) -> list[Round]:
  """Rounds 0 (BM25) to ``rounds_``."""
  return [Round(r, os.path.join(work_dir, f"round_{r}"))
          for r in range(rounds_ + 1)]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the rounds need of the two gin runs (their macros)."""
  reader_steps: int
  reader_n_context: int
  text_maxlength: int
  retriever_steps: int
  retriever_n_context: int


def check_inputs(*, corpus: str, train: str, dev: str, rounds_: int,
                 top_k: int, settings: Settings) -> None:
  """Refuses bad arguments before anything is written (one-line errors)."""
  for name, value in (("--rounds", rounds_), ("--top-k", top_k)):
    if value < 1:
      raise InputError(name, f"must be at least 1, got {value}")
  for name, path in (("--corpus", corpus), ("--train", train),
                     ("--dev", dev)):
    if not os.path.isfile(path):
      raise InputError(path, f"no such file ({name})")
  for name, path in (("--train", train), ("--dev", dev)):
    queries = read_queries(path)
    if not queries:
      raise InputError(path, f"no questions ({name})")
    for position, q in enumerate(queries):
      if not q.answers:
        raise InputError(path, f"question {q.id!r} has no answers: {name} "
                         "must be QA JSONL ('question', 'answers')",
                         where=f"record {position + 1}")
  for name, n in (("reader", settings.reader_n_context),
                  ("retriever", settings.retriever_n_context)):
    if n > top_k:
      raise InputError("--top-k", f"{top_k} is below the {name}'s N_CONTEXT "
                       f"{n}: it would read fewer passages than it expects")


def _last_eval_em(model_dir: str, max_step: int) -> float | None:
  value = None
  for record in read_records(model_dir):
    if "eval_em" in record and record.get("step", 0) <= max_step:
      value = record["eval_em"]
  return value


def _retrieve(index: str, rnd: Round, train: str, dev: str, top_k: int,
              progress: bool | None) -> None:
  for queries, out, k in ((train, rnd.train, top_k),
                          (dev, rnd.dev, max(top_k, DEV_TOP_K))):
    if not os.path.exists(out):  # the writer is atomic
      retrieve_to_file(index, queries, k, out, progress=progress)


def _record(rnd: Round, retriever: str, dev: str,
            eval_em: float | None) -> dict:
  """The round's record: answer recall of its dev retrieval."""
  recall = evaluate.evaluate_with_answers(rnd.dev, dev, ks=RECALL_KS)
  return {"round": rnd.number, "retriever": retriever,
          **{f"recall@{k}": round(recall[f"R@{k}"], 6) for k in RECALL_KS},
          "eval_em": None if eval_em is None else round(eval_em, 6)}


def score_passages(reader: str, data: str, output: str, *, n_context: int,
                   text_maxlength: int, batch_size: int = 8) -> None:
  """``jaxfid predict --passage-scores --scored-data``'s scores and file
  (logits, the original's) without the answers, which the round does not
  use."""
  examples = read_fid_examples(data)
  model, params, spiece = load_checkpoint(reader)
  tokenizer = load_tokenizer(os.path.dirname(spiece) if spiece else None)
  scores = predict_lib.passage_scores(
      model, params, tokenizer, examples, n_context=n_context,
      text_maxlength=text_maxlength, batch_size=batch_size, mode="logits",
      passage_eos=checkpoint_passage_eos(reader))
  write_scored_data(output, data, examples, scores)


def write_log(work_dir: str) -> list[dict]:
  """Rewrites ``W/rounds.jsonl`` from the finished rounds' records (rounds
  0, 1, ... up to the first unfinished one, so a rerun with a smaller
  ``--rounds`` keeps the later rounds' lines)."""
  records = []
  while True:
    record = rounds.read_record(
        Round(len(records), os.path.join(work_dir, f"round_{len(records)}")
              ).record)
    if record is None:
      break
    records.append(record)
  rounds.write_jsonl(os.path.join(work_dir, ROUNDS_LOG), records)
  return records


def run_rounds(settings: Settings, *,
               train_reader: Callable[[Round, str, str, str | None], int],
               train_retriever: Callable[[Round, str, str | None], int],
               identity: dict, work_dir: str, corpus: str, train: str,
               dev: str, rounds_: int, top_k: int,
               continue_reader: bool = False,
               continue_retriever: bool = True,
               progress: bool | None = None,
               emit: Callable[[dict], None] | None = None) -> dict:
  """Runs (or resumes) rounds 0..``rounds_``; returns the summary.

  ``train_reader(round, train_data, eval_data, init_checkpoint)`` and
  ``train_retriever(round, train_data, init_checkpoint)`` train the round's
  models from ``init_checkpoint`` (the previous round's, or None: the gin
  run's) and return the step reached (below TRAIN_STEPS after SIGTERM: the
  summary says ``"complete": False``). ``emit`` receives each round's record
  (finished ones ``"skipped": True``), then the summary. ``identity``: the
  run's inputs and gin, which the work directory must belong to.
  """
  emit = emit or (lambda record: None)
  check_inputs(corpus=corpus, train=train, dev=dev, rounds_=rounds_,
               top_k=top_k, settings=settings)
  rounds.claim_work_dir(work_dir, STATE_FILE, identity, "distill iterate")
  t0 = time.time()
  skipped, complete = 0, True
  plan = plan_rounds(work_dir, rounds_)
  for rnd in plan:
    record = rounds.read_record(rnd.record)
    if record is not None:
      skipped += 1
      emit({**record, "skipped": True})
      continue
    if rnd.number == 0:
      if not os.path.exists(os.path.join(rnd.index, "meta.json")):
        build_bm25_index(corpus, rnd.index, progress=progress)
      _retrieve(rnd.index, rnd, train, dev, top_k, progress)
      record = _record(rnd, "bm25", dev, None)
    else:
      before = plan[rnd.number - 1]
      continued = rnd.number > 1
      if rounds.latest_step(rnd.reader) < settings.reader_steps:
        init = before.reader if continue_reader and continued else None
        if (train_reader(rnd, before.train, before.dev, init)
            < settings.reader_steps):
          complete = False
          break
      if not os.path.exists(rnd.scored):
        score_passages(rnd.reader, before.train, rnd.scored,
                       n_context=top_k, text_maxlength=settings.text_maxlength)
      if rounds.latest_step(rnd.retriever) < settings.retriever_steps:
        init = before.retriever if continue_retriever and continued else None
        if (train_retriever(rnd, rnd.scored, init)
            < settings.retriever_steps):
          complete = False
          break
      if not os.path.exists(os.path.join(rnd.index, "meta.json")):
        build_dense_index(rnd.retriever, corpus, rnd.index,
                          progress=progress)
      _retrieve(rnd.index, rnd, train, dev, top_k, progress)
      record = _record(rnd, rnd.retriever, dev,
                       _last_eval_em(rnd.reader, settings.reader_steps))
    rounds.write_record(rnd.record, record)
    write_log(work_dir)
    emit({**record, "skipped": False})
  write_log(work_dir)  # one written before a crash may lack the last round
  summary = {"complete": complete, "rounds": rounds_, "skipped": skipped,
             "work_dir": work_dir,
             "rounds_log": os.path.join(work_dir, ROUNDS_LOG),
             "minutes": round((time.time() - t0) / 60, 2)}
  if not complete:
    print("the training stopped early: rerun to resume", file=sys.stderr)
  emit(summary)
  return summary
