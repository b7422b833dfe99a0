"""`jaxfid reatt iterate`: rounds of training, re-indexing and re-retrieval.

A tiny ReAtt on the synthetic key-value world (``reatt_world``) runs two
iterations of 2 steps after 1 QA-only step, with a per-iteration linear
schedule (``RESTART_SCHEDULE``). Checked: each round's outputs, that the
close documents of the next round come from the round's token index, that
the learning rate is the one the in-trainer loop would use, that a rerun
skips finished rounds and a longer rerun resumes training, and that bad
arguments are one-line errors.
"""
from __future__ import annotations

import json
import os

import pytest

from jaxfid.cli import main
from jaxfid.core.errors import InputError
from jaxfid.reader import examples as fid_format
from jaxfid.reatt import commands as reatt_commands
from jaxfid.reatt import iterate as reatt_iterate
from jaxfid.reatt import token_index
from jaxfid.reatt.refresh import phase_boundaries
from jaxfid.training import optim
from reatt_world import make_world, write_corpus, write_examples

WARMUP, STEPS = 1, 2


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("reatt_iterate")
  docs, examples = make_world(num_keys=24, n_context=3)
  write_corpus(d / "corpus.jsonl", docs)
  write_examples(d / "train.json", examples)
  with open(d / "queries.jsonl", "w") as f:
    for e in examples:
      f.write(json.dumps({"id": e.id, "question": e.question,
                          "answers": list(e.answers)}) + "\n")
  with open(d / "no_answers.jsonl", "w") as f:
    f.write(json.dumps({"id": "1", "question": "red"}) + "\n")
  return d


def _bindings(model_dir, data) -> list[str]:
  return [f"MODEL_DIR = '{model_dir}'", f"TRAIN_DATA = '{data / 'train.json'}'",
          "BATCH_SIZE = 4", "N_CONTEXT = 3", "TEXT_MAXLENGTH = 16",
          "ANSWER_MAXLENGTH = 4", "CHECKPOINT_EVERY = 100", "LOG_EVERY = 1",
          "MESH = 'data=1'", f"RETRIEVAL_WARMUP_STEPS = {WARMUP}",
          "SCHEDULE = 'linear'", "WARMUP_FRACTION = 0.5",
          "RESTART_SCHEDULE = True", "INDEX_BATCH_SIZE = 8",
          "config.T5Config.num_decoder_layers = 1",
          "config.T5Config.d_model = 32", "config.T5Config.d_ff = 64",
          "loop.train.progress = False"]


def _argv(model_dir, data, iterations=2, extra=()) -> list[str]:
  return ["reatt", "iterate", "--gin_file=gin/reatt/tiny.gin",
          *[f"--gin.{b.replace(' = ', '=')}" for b in _bindings(model_dir, data)],
          "--corpus", str(data / "corpus.jsonl"),
          "--queries", str(data / "queries.jsonl"),
          "--iterations", str(iterations),
          "--steps-per-iteration", str(STEPS), "--token-top-k", "100000",
          *extra]


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("reatt_iterate_run") / "out"
  records = []
  summary = reatt_commands.iterate_gin_run(
      ["gin/reatt/tiny.gin"], _bindings(model_dir, data),
      corpus=str(data / "corpus.jsonl"), queries=str(data / "queries.jsonl"),
      iterations=2, steps_per_iteration=STEPS, token_top_k=100000,
      progress=False, emit=records.append)
  return model_dir, records, summary


def _metrics(model_dir) -> list[dict]:
  with open(model_dir / "metrics.jsonl") as f:
    return [json.loads(line) for line in f if '"loss"' in line]


def test_plan_ends_each_round_after_the_warm_up_plus_its_steps(tmp_path):
  plan = reatt_iterate.plan_iterations("t.json", str(tmp_path), 3, 8000, 3000)
  assert [(p.start_step, p.end_step) for p in plan] == [
      (0, 11000), (11000, 19000), (19000, 27000)]
  assert [os.path.basename(p.train_data) for p in plan] == [
      "t.json", "train_0.json", "train_1.json"]
  assert plan[2].index_dir == str(tmp_path / "index_2")


def test_each_iteration_writes_its_index_and_train_file(run, data):
  model_dir, records, summary = run
  work = model_dir / "iterate"
  assert [r["iteration"] for r in records[:-1]] == [0, 1]
  assert [r["step"] for r in records[:-1]] == [WARMUP + STEPS, WARMUP + 2 * STEPS]
  assert records[1]["trained_on"] == str(work / "train_0.json")
  for i, r in enumerate(records[:-1]):
    assert r["skipped"] is False and r["queries"] == 24
    assert 0 <= r["retrieval_accuracy"] <= 1 and 0 <= r["R@1"] <= r["R@3"] <= 1
    assert (work / f"index_{i}" / "meta.json").exists()
    assert json.load(open(work / f"iteration_{i}.json"))["step"] == r["step"]
    examples = fid_format.read_fid_examples(work / f"train_{i}.json",
                                            require_answers=True)
    assert len(examples) == 24 and all(len(e.ctxs) == 3 for e in examples)
  assert summary == records[-1]
  assert summary["complete"] and summary["step"] == WARMUP + 2 * STEPS
  assert [m["step"] for m in _metrics(model_dir)] == [1, 2, 3, 4, 5]
  # The trainer did no refresh of its own.
  assert not (model_dir / "iterations").exists()
  assert not (model_dir / "index").exists()


def test_close_documents_come_from_the_rounds_token_index(run, data):
  model_dir, records, _ = run
  work = model_dir / "iterate"
  initial = {e.id: {p.id for p in e.ctxs}
             for e in fid_format.read_fid_examples(data / "train.json")}
  for i in (0, 1):
    examples = fid_format.read_fid_examples(work / f"train_{i}.json")
    meta = json.load(open(work / f"index_{i}" / "meta.json"))
    searcher = token_index.TokenSearcher(work / f"index_{i}", meta)
    hits = searcher.search([e.question for e in examples], 3,
                           token_top_k=100000)
    for e, h in zip(examples, hits):
      assert [p.id for p in e.ctxs] == searcher.store.ids([r for r, _ in h])
    assert any({p.id for p in e.ctxs} != initial[e.id] for e in examples)
  assert records[0]["close_documents_changed"] > 0
  # Index 1 was built by the model after round 1, not the one of round 0.
  keys = [open(work / f"index_{i}" / "keys.f32", "rb").read() for i in (0, 1)]
  assert keys[0] != keys[1]


def test_rounds_follow_the_in_trainer_loops_schedule(run):
  model_dir, _, _ = run
  # The uninterrupted gin loop: 5 steps, phases [0,1), [1,3), [3,5).
  full = optim.learning_rate_schedule(
      1e-3, schedule="linear", warmup_steps=0, warmup_fraction=0.5,
      total_steps=WARMUP + 2 * STEPS,
      restarts=[WARMUP, *phase_boundaries(
          WARMUP + 2 * STEPS, WARMUP, STEPS)])
  logged = {m["step"]: m["learning_rate"] for m in _metrics(model_dir)}
  assert logged == pytest.approx({s: float(full(s - 1)) for s in range(1, 6)})
  assert logged[4] == 0.0 < logged[3]  # round 1 restarted its warm-up


def test_rerun_skips_finished_rounds_and_a_longer_run_resumes(run, data,
                                                              capsys):
  model_dir, records, _ = run
  work = model_dir / "iterate"
  stamp = os.path.getmtime(work / "train_1.json")
  assert main(_argv(model_dir, data)) == 0
  lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
  assert [x["skipped"] for x in lines[:2]] == [True, True]
  assert lines[1]["R@1"] == records[1]["R@1"] and lines[2]["skipped"] == 2
  assert os.path.getmtime(work / "train_1.json") == stamp
  assert [m["step"] for m in _metrics(model_dir)] == [1, 2, 3, 4, 5]

  assert main(_argv(model_dir, data, iterations=3)) == 0
  lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
  assert [x["skipped"] for x in lines[:3]] == [True, True, False]
  assert lines[2]["trained_on"] == str(work / "train_1.json")
  assert lines[3]["step"] == WARMUP + 3 * STEPS
  assert [m["step"] for m in _metrics(model_dir)] == [1, 2, 3, 4, 5, 6, 7]
  assert (work / "train_2.json").exists()


def _error(argv, capsys) -> str:
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1, err
  return err


@pytest.mark.parametrize("extra, message", [
    (["--gin.ITERATION_STEPS=5"], "ITERATION_STEPS"),
    (["--gin.RETRIEVAL_CORPUS='c.jsonl'"], "RETRIEVAL_CORPUS"),
    (["--gin.RESTART_SCHEDULE=False"], "RESTART_SCHEDULE=True"),
    (["--top-k", "2"], "below N_CONTEXT"),
    (["--token-top-k", "0"], "--token-top-k"),
])
def test_bad_settings_are_one_line_errors(data, tmp_path, capsys, extra,
                                          message):
  assert message in _error(_argv(tmp_path / "m", data, extra=extra), capsys)
  assert not (tmp_path / "m").exists()


def test_bad_files_and_runs_are_one_line_errors(run, data, tmp_path, capsys):
  model_dir, _, _ = run
  argv = _argv(tmp_path / "m", data)
  bad = argv[:argv.index("--queries") + 1] + [str(data / "no_answers.jsonl")] + \
      argv[argv.index("--queries") + 2:]
  assert "has no answers" in _error(bad, capsys)
  fid = [a if not a.startswith("--gin_file") else "--gin_file=gin/fid/tiny.gin"
         for a in argv if "loop.train" not in a and "RETRIEVAL" not in a
         and "SCHEDULE" not in a and "WARMUP_FRACTION" not in a
         and "INDEX_BATCH" not in a]
  assert "not a ReAtt run" in _error(fid, capsys)
  assert "--iterations" in _error(
      argv[:argv.index("--iterations") + 1] + ["0"]
      + argv[argv.index("--iterations") + 2:], capsys)
  # The finished run's work dir, with other settings.
  other = _argv(model_dir, data, extra=["--top-k", "4"])
  assert "belongs to another run" in _error(other, capsys)
  # A fresh work dir for a MODEL_DIR that is already past round 0.
  fresh = _argv(model_dir, data, extra=["--work-dir", str(tmp_path / "w")])
  assert "past the end of iteration 0" in _error(fresh, capsys)
  with pytest.raises(InputError, match="no such file"):
    reatt_commands.iterate_gin_run(
        ["gin/reatt/tiny.gin"], _bindings(tmp_path / "m", data),
        corpus=str(tmp_path / "missing.jsonl"),
        queries=str(data / "queries.jsonl"), iterations=1,
        steps_per_iteration=1)
