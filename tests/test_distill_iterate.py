"""`jaxfid distill iterate`: FiD-KD's rounds on a tiny world.

The world is tiny_fid's ("what is thing i?", passage "the thing i is
<answer>") as a DPR TSV corpus with distractors. Two rounds of two
training steps each (tiny reader, tiny distilled dual encoder) write one
record per round with the contract's fields; a rerun skips every round and
``--rounds 3`` on the same work directory runs round 3 alone. Bad input is
one line with exit status 2 and writes nothing.
"""
from __future__ import annotations

import json
import os

import pytest

from jaxfid.cli import main
from jaxfid.commands.gin_flags import GinRun
from jaxfid.distill import commands as distill
from jaxfid.distill import iterate as distill_iterate
from jaxfid.training import rounds
from tiny_fid import WORDS

FIELDS = ["round", "retriever", "recall@1", "recall@5", "recall@20",
          "recall@100", "eval_em"]
READER = ["TRAIN_STEPS=2", "BATCH_SIZE=2", "N_CONTEXT=2",
          "TEXT_MAXLENGTH=16", "ANSWER_MAXLENGTH=4", "EVAL_EVERY=2",
          "CHECKPOINT_EVERY=2", "LOG_EVERY=1", "EVAL_MAX_EXAMPLES=4",
          "MESH='data=1'", "loop.train.progress=False"]
RETRIEVER = ["TRAIN_STEPS=2", "BATCH_SIZE=2", "N_CONTEXT=2",
             "QUERY_MAXLENGTH=16", "PASSAGE_MAXLENGTH=16",
             "CHECKPOINT_EVERY=2", "LOG_EVERY=1",
             "MESH='data=1'", "loop.train.progress=False"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  d = tmp_path_factory.mktemp("distill_world")
  with open(d / "corpus.tsv", "w") as f:
    f.write("id\ttext\ttitle\n")
    for i in range(12):
      for j in range(2):  # the answer, then a distractor
        word = WORDS[(i + 3 * j) % len(WORDS)]
        f.write(f"{2 * i + j}\tthe thing {i} is {word}\tdoc {i}\n")
  for name, numbers in (("train", range(8)), ("dev", range(8, 12))):
    with open(d / f"{name}.jsonl", "w") as f:
      for i in numbers:
        f.write(json.dumps({"id": str(i), "question": f"what is thing {i}?",
                            "answers": [WORDS[i % len(WORDS)]]}) + "\n")
  (d / "no_answers.jsonl").write_text(
      json.dumps({"id": "1", "question": "what is thing 1?"}) + "\n")
  return d


def _argv(world, work_dir, rounds, extra=()) -> list[str]:
  return ["distill", "iterate", "--work-dir", str(work_dir),
          "--corpus", str(world / "corpus.tsv"),
          "--train", str(world / "train.jsonl"),
          "--dev", str(world / "dev.jsonl"), "--rounds", str(rounds),
          "--top-k", "3", "--reader-gin_file=gin/fid/tiny.gin",
          "--retriever-gin_file=gin/retrieval/distill_tiny.gin",
          *[f"--reader.{b}" for b in READER],
          *[f"--retriever.{b}" for b in RETRIEVER], *extra]


def _lines(capsys) -> list[dict]:
  return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _log(work_dir) -> list[dict]:
  with open(work_dir / "rounds.jsonl") as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_rounds_record_recall_and_resume(world, tmp_path, capsys,
                                         monkeypatch):
  work = tmp_path / "w"
  trained = []  # (gin files, the macros the round bound) of each training
  real_train = GinRun.train

  def spy(run, macros=None):
    trained.append((run.files[0], dict(macros)))
    return real_train(run, macros)
  monkeypatch.setattr(GinRun, "train", spy)
  assert main(_argv(world, work, 2)) == 0
  out = _lines(capsys)
  log = _log(work)
  assert [r["round"] for r in log] == [0, 1, 2]
  for r in log:
    assert list(r) == FIELDS
    for k in (1, 5, 20, 100):
      assert 0.0 <= r[f"recall@{k}"] <= 1.0
  assert log[0]["retriever"] == "bm25" and log[0]["eval_em"] is None
  for r in log[1:]:
    assert r["retriever"] == str(work / f"round_{r['round']}" / "retriever")
    assert 0.0 <= r["eval_em"] <= 1.0
    assert os.path.exists(os.path.join(r["retriever"], "metrics.jsonl"))
  # BM25 finds each question's own passage (its number is the rare term)
  assert log[0]["recall@1"] == 1.0
  # each round's reader reads the previous round's retrieval; the retriever
  # of round 2 starts from round 1's, round 1's from the gin run's own
  r = [str(work / f"round_{n}") for n in range(3)]
  assert trained == [
      ("gin/fid/tiny.gin", {"MODEL_DIR": f"{r[1]}/reader",
                            "TRAIN_DATA": f"{r[0]}/train.json",
                            "EVAL_DATA": f"{r[0]}/dev.json"}),
      ("gin/retrieval/distill_tiny.gin", {
          "MODEL_DIR": f"{r[1]}/retriever",
          "TRAIN_DATA": f"{r[1]}/train_scored.json"}),
      ("gin/fid/tiny.gin", {"MODEL_DIR": f"{r[2]}/reader",
                            "TRAIN_DATA": f"{r[1]}/train.json",
                            "EVAL_DATA": f"{r[1]}/dev.json"}),
      ("gin/retrieval/distill_tiny.gin", {
          "MODEL_DIR": f"{r[2]}/retriever",
          "TRAIN_DATA": f"{r[2]}/train_scored.json",
          "INIT_CHECKPOINT": f"{r[1]}/retriever"})]
  assert [{k: v for k, v in r.items() if k != "skipped"} for r in out[:-1]
          ] == log and out[-1]["complete"]
  # the scored data carries the reader's scores for every retrieved passage
  with open(work / "round_1" / "train_scored.json") as f:
    scored = json.load(f)
  assert len(scored) == 8 and all(len(e["ctxs"]) == 3 for e in scored)

  # a rerun skips every round
  assert main(_argv(world, work, 2)) == 0
  out = _lines(capsys)
  assert [r.get("skipped") for r in out[:-1]] == [True] * 3
  assert out[-1]["skipped"] == 3 and _log(work) == log

  # --rounds 3 runs round 3 alone, from round 2's retrieval
  mtime = os.path.getmtime(work / "round_2" / "round.json")
  assert main(_argv(world, work, 3)) == 0
  out = _lines(capsys)
  assert [r["skipped"] for r in out[:-1]] == [True, True, True, False]
  assert [m["TRAIN_DATA"] for _, m in trained[4:]] == [
      str(work / "round_2" / "train.json"),
      str(work / "round_3" / "train_scored.json")]
  assert [r["round"] for r in _log(work)] == [0, 1, 2, 3]
  assert _log(work)[:3] == log
  assert os.path.getmtime(work / "round_2" / "round.json") == mtime


def _fake_round(work, number, recall):
  os.makedirs(work / f"round_{number}", exist_ok=True)
  record = {"round": number, "retriever": "bm25" if number == 0 else "r",
            **{f"recall@{k}": recall for k in (1, 5, 20, 100)},
            "eval_em": None if number == 0 else 0.5}
  with open(work / f"round_{number}" / "round.json", "w") as f:
    json.dump(record, f)
  return record


def _claim(world, work, argv_bindings=True):
  """Writes the state file the command's run would (its identity)."""
  reader = GinRun(("gin/fid/tiny.gin",), tuple(READER))
  retriever = GinRun(("gin/retrieval/distill_tiny.gin",), tuple(RETRIEVER))
  identity = distill.run_identity(
      reader, retriever, corpus=str(world / "corpus.tsv"),
      train=str(world / "train.jsonl"), dev=str(world / "dev.jsonl"),
      top_k=3)
  rounds.claim_work_dir(str(work), distill_iterate.STATE_FILE, identity,
                        "distill iterate")


def test_finished_rounds_are_skipped_and_other_runs_refused(world, tmp_path,
                                                            capsys):
  """Finished rounds (pre-written records): nothing trains, indexes or
  retrieves, the log is rewritten from the records in order; a directory of
  another run, or not a work directory, is refused in one line."""
  work = tmp_path / "w"
  _claim(world, work)
  records = [_fake_round(work, 0, 0.25), _fake_round(work, 1, 0.75)]
  assert main(_argv(world, work, 1)) == 0
  out = _lines(capsys)
  assert [r["skipped"] for r in out[:-1]] == [True, True]
  assert out[-1]["complete"] and out[-1]["skipped"] == 2
  assert _log(work) == records
  assert sorted(os.listdir(work)) == sorted([
      distill_iterate.STATE_FILE, "round_0", "round_1", "rounds.jsonl"])

  # a smaller --rounds later keeps the later rounds' lines
  records.append(_fake_round(work, 2, 1.0))
  assert main(_argv(world, work, 1)) == 0
  capsys.readouterr()
  assert _log(work) == records

  assert main(_argv(world, work, 1, ["--top-k", "4"])) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "belongs to another run (top_k" in err[0]
  assert main(_argv(world, work, 1, ["--reader-init", "continue"])) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "another run (reader_init" in err[0]

  other = tmp_path / "other"
  other.mkdir()
  (other / "file").write_text("x")
  assert main(_argv(world, other, 1)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "not a `distill iterate` work directory" in err[0]


def test_bad_input_is_one_line_and_writes_nothing(world, tmp_path, capsys):
  work = tmp_path / "w"
  base = _argv(world, work, 2)

  def replaced(flag, value):
    argv = list(base)
    argv[argv.index(flag) + 1] = value
    return argv

  cases = [
      (replaced("--rounds", "0"), "--rounds"),
      (replaced("--top-k", "1"), "N_CONTEXT"),
      (replaced("--corpus", str(tmp_path / "missing.tsv")), "missing.tsv"),
      (replaced("--dev", str(world / "no_answers.jsonl")), "no answers"),
      (base + ["--reader.NO_SUCH_MACRO=1"], "--reader.NO_SUCH_MACRO=1:"),
      (base + ["--retriever.TRAIN_STEPS=0"], "TRAIN_STEPS"),
      (base + ["--retriever.TRAIN_STEPS=("], "--retriever.TRAIN_STEPS=(:"),
      ([a.replace("gin/fid/tiny.gin", "gin/reatt/tiny.gin") for a in base],
       "not a FiD run"),
      ([a.replace("gin/retrieval/distill_tiny.gin", "gin/fid/tiny.gin")
        for a in base if not a.startswith("--retriever.")],
       "not a distillation run"),
  ]
  for argv, message in cases:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxfid distill: error:"), err
    assert message in err[0], err
    assert not work.exists()


def test_a_training_stopped_early_leaves_the_round_unfinished(world,
                                                               tmp_path):
  """A trainer that stops before TRAIN_STEPS (SIGTERM) ends the run
  incomplete: round 0 (BM25) is finished and logged, round 1 is not."""
  work = tmp_path / "w"
  settings = distill_iterate.Settings(
      reader_steps=2, reader_n_context=2, text_maxlength=16,
      retriever_steps=2, retriever_n_context=2)
  calls = []

  def stopped(rnd, train_data, eval_data, init):
    calls.append((rnd.number, train_data, eval_data, init))
    return 1  # saved at step 1 and stopped
  emitted = []
  summary = distill_iterate.run_rounds(
      settings, train_reader=stopped,
      train_retriever=lambda *a: pytest.fail("the reader did not finish"),
      identity={"run": 1}, work_dir=str(work),
      corpus=str(world / "corpus.tsv"), train=str(world / "train.jsonl"),
      dev=str(world / "dev.jsonl"), rounds_=2, top_k=3, progress=False,
      emit=emitted.append)
  assert not summary["complete"] and summary["skipped"] == 0
  assert calls == [(1, str(work / "round_0" / "train.json"),
                    str(work / "round_0" / "dev.json"), None)]
  assert [r["round"] for r in _log(work)] == [0]
  assert [r.get("round") for r in emitted] == [0, None]
  assert not (work / "round_1" / "round.json").exists()


@pytest.mark.parametrize("continue_reader,continue_retriever",
                         [(False, True), (True, False)])
def test_each_round_starts_from_what_the_flags_say(
    world, tmp_path, monkeypatch, continue_reader, continue_retriever):
  """Round 2's reader starts from round 1's with ``--reader-init
  continue`` (else from its gin run's own initialisation, the original's
  train_reader.py without --model_path), its retriever from round 1's
  unless ``--retriever-init restart``; round 1's from the gin runs'.
  Scoring, indexing and dense retrieval are stubbed (round 0's retrieval
  again): only the initialisations are under test."""
  work = tmp_path / "w"
  settings = distill_iterate.Settings(
      reader_steps=2, reader_n_context=2, text_maxlength=16,
      retriever_steps=2, retriever_n_context=2)
  def score(reader, data, out, **kw):
    os.makedirs(os.path.dirname(out), exist_ok=True)
    open(out, "w").close()
  monkeypatch.setattr(distill_iterate, "score_passages", score)
  monkeypatch.setattr(distill_iterate, "build_dense_index",
                      lambda ckpt, corpus, index, **kw: os.makedirs(index))
  real_retrieve = distill_iterate._retrieve

  def retrieve(index, rnd, train, dev, top_k, progress):
    if rnd.number == 0:
      return real_retrieve(index, rnd, train, dev, top_k, progress)
    for name in ("train.json", "dev.json"):
      os.link(work / "round_0" / name, os.path.join(rnd.directory, name))
  monkeypatch.setattr(distill_iterate, "_retrieve", retrieve)
  inits = []

  def trainer(kind):
    def train(rnd, *args):
      inits.append((kind, rnd.number, args[-1]))
      return 2
    return train
  summary = distill_iterate.run_rounds(
      settings, train_reader=trainer("reader"),
      train_retriever=trainer("retriever"), identity={"run": 1},
      work_dir=str(work), corpus=str(world / "corpus.tsv"),
      train=str(world / "train.jsonl"), dev=str(world / "dev.jsonl"),
      rounds_=2, top_k=3, continue_reader=continue_reader,
      continue_retriever=continue_retriever, progress=False)
  assert summary["complete"]
  r1 = work / "round_1"
  assert inits == [
      ("reader", 1, None), ("retriever", 1, None),
      ("reader", 2, str(r1 / "reader") if continue_reader else None),
      ("retriever", 2, str(r1 / "retriever") if continue_retriever
       else None)]
