"""`jaxfid demo`: SIGTERM stops it (no evaluation of a half-trained model as
the full run) and the same command resumes; the remaining-time estimate."""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

import fault_tools
from jaxfid.cli import build_parser
from jaxfid.commands import shell
from jaxfid.fid.commands import demo
from subprocess_env import default_xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 200


def _command(out):
  return [sys.executable, "-m", "jaxfid.cli", "demo", "--output", str(out),
          "--steps", str(STEPS), "--batch-size", "8", "--train-entities", "20",
          "--dev-questions", "40", "--test-questions", "40"]


def _env(tmp_path):
  # XLA's defaults, as a user's demo runs: the suite's -O0 and 8 devices
  # make its steps about twice as slow (subprocess_env.py)
  return default_xla_env(PYTHONPATH=ROOT,
                         JAXFID_COMPILATION_CACHE=str(tmp_path / "xla"))


@pytest.mark.slow
def test_sigterm_interrupts_the_demo_and_the_same_command_resumes(tmp_path):
  out = tmp_path / "demo"
  log = tmp_path / "stderr.log"
  # SIGTERM lands in training, once step 1 is done, whatever the host's speed
  proc = fault_tools.hold_at(
      "jaxfid.training.loop:StepLoop.finished_step", "after", 1,
      _command(out)[3:], log, until_signal=True, env=_env(tmp_path))
  proc.send_signal(signal.SIGTERM)
  stdout = proc.communicate(timeout=600)[0].decode()
  err = log.read_text(errors="replace")
  assert proc.returncode == demo.INTERRUPTED_EXIT, err[-3000:]
  lines = [l for l in err.splitlines() if "interrupted (SIGTERM)" in l]
  assert len(lines) == 1, err[-3000:]
  stopped = int(re.search(r"at step (\d+) of", lines[0]).group(1))
  assert 1 <= stopped < STEPS
  assert "EM on" not in err and "[3/3]" not in err
  assert stdout.strip() == ""  # no summary of a run that did not finish
  assert not os.path.exists(out / "test_predictions.jsonl")

  again = subprocess.run(_command(out), cwd=ROOT, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"resumed from step {stopped}" in again.stderr
  summary = json.loads(again.stdout.strip().splitlines()[-1])
  assert summary["steps"] == STEPS and summary["test_questions"] == 40
  assert os.path.exists(out / "test_predictions.jsonl")


def test_a_signal_in_training_stops_the_demo_and_it_resumes_in_process(
    tmp_path, monkeypatch, capsys):
  """The fast tier's variant of the test above: a 4-step demo in this
  process, SIGTERM raised right after the checkpoint of step 2 (so it lands
  in training on any machine), then the same command resumes and finishes."""
  from jaxfid.checkpoints import model_dir as model_dir_lib
  from jaxfid.cli import main
  out = tmp_path / "demo"
  argv = ["demo", "--output", str(out), "--steps", "4", "--batch-size", "8",
          "--train-entities", "20", "--dev-questions", "40",
          "--test-questions", "40"]
  real_save = model_dir_lib.RunCheckpoints.save
  saves = []

  def save_then_sigterm(self, step, *args, **kwargs):
    real_save(self, step, *args, **kwargs)
    saves.append(step)
    if len(saves) == 1:
      # The loop's handler turns it into a flag (never pytest's death).
      assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
      signal.raise_signal(signal.SIGTERM)

  monkeypatch.setattr(model_dir_lib.RunCheckpoints, "save", save_then_sigterm)
  assert main(argv) == demo.INTERRUPTED_EXIT
  stdout, err = capsys.readouterr()
  lines = [l for l in err.splitlines() if "interrupted (SIGTERM)" in l]
  assert len(lines) == 1, err[-3000:]
  stopped = int(re.search(r"at step (\d+) of", lines[0]).group(1))
  assert 2 <= stopped < 4
  assert "EM on" not in err and "[3/3]" not in err
  assert stdout.strip() == ""
  assert not os.path.exists(out / "test_predictions.jsonl")

  monkeypatch.undo()
  assert main(argv) == 0
  stdout, err = capsys.readouterr()
  assert f"resumed from step {stopped}" in err
  summary = json.loads(stdout.strip().splitlines()[-1])
  assert summary["steps"] == 4 and summary["test_questions"] == 40
  assert os.path.exists(out / "test_predictions.jsonl")
  assert summary["dev_questions"] == 40 and summary["checkpoint_step"] in (
      2, 4)
  # the checkpoint is chosen on dev: its evaluations read dev questions only
  evaluated = _evaluated_ids(out / "model")
  assert evaluated and all(i.startswith("q-dev") for i in evaluated)
  with open(out / "data" / "test.json") as f:
    test_ids = {ex["id"] for ex in json.load(f)}
  with open(out / "data" / "dev.json") as f:
    dev = json.load(f)
  assert not test_ids & {ex["id"] for ex in dev}
  assert not {_entity(ex) for ex in dev} & {
      _entity(ex) for ex in json.load(open(out / "data" / "test.json"))}
  # it ends with the commands that answer with and serve what it trained,
  # each naming an executable that exists from here
  *_, predict_line, serve_line = err.strip().splitlines()
  for line, prefix in [(predict_line, "try"),
                       (serve_line, "look at it (API and page)")]:
    head, _, command = line.partition(": ")
    assert head == prefix, line
    words = shlex.split(command)
    _assert_runs_jaxfid(words)
  words = shlex.split(serve_line.partition(": ")[2])
  served = build_parser().parse_args(words[words.index("serve"):])
  assert (served.checkpoint, served.index) == (str(out / "model"),
                                               str(out / "data" / "bm25"))
  assert (served.n_context, served.text_maxlength,
          served.decode_maxlength) == (4, 40, 6)
  words = shlex.split(predict_line.partition(": ")[2])
  predicted = build_parser().parse_args(words[words.index("predict"):])
  assert (predicted.checkpoint, predicted.data) == (
      str(out / "model"), str(out / "data" / "test.json"))


def test_without_the_serve_extra_the_demo_prints_its_install_first(
    monkeypatch):
  monkeypatch.setitem(sys.modules, "starlette", None)  # import fails
  lines = demo.next_steps("m", "test.json", "bm25", n_context=4,
                          text_maxlength=40, answer_maxlength=6)
  assert [l.split(":")[0] for l in lines] == [
      "try", "to serve it, first", "look at it (API and page)"]
  assert shell.install_command("serve") in lines[1]
  assert "(starlette is not installed)" in lines[1]
  monkeypatch.undo()  # installed: no install line
  assert len(demo.next_steps("m", "t", "i", n_context=4, text_maxlength=40,
                             answer_maxlength=6)) == 2


def _entity(example) -> str:
  return example["question"].rsplit(" of ", 1)[1]


def _evaluated_ids(model_dir) -> set:
  ids = set()
  for root, _, files in os.walk(model_dir / "eval"):
    for name in files:
      if name.endswith(".jsonl"):
        with open(os.path.join(root, name)) as f:
          ids |= {json.loads(l)["id"] for l in f if l.strip()}
  return ids


def _assert_runs_jaxfid(words) -> None:
  """``words`` start with a jaxfid that runs from the current directory:
  ``jaxfid`` on the PATH, a path to an executable, or ``python -m jaxfid``."""
  if words[0] == "jaxfid":
    assert shutil.which("jaxfid"), "jaxfid is not on the PATH"
  elif words[1:3] == ["-m", "jaxfid"]:
    assert os.access(words[0], os.X_OK), words
  else:
    assert os.path.basename(words[0]) == "jaxfid", words
    assert os.path.isfile(words[0]) and os.access(words[0], os.X_OK), words


def test_remaining_time_from_the_second_training_record(tmp_path):
  path = tmp_path / "metrics.jsonl"
  timer = demo.RemainingTime(str(path), total_steps=300, batch_size=10)
  assert timer.estimate() is None  # no file yet
  path.write_text(json.dumps({"step": 33, "eval_em": 0.1}) + "\n")
  assert timer.estimate() is None  # evaluations carry no speed
  with open(path, "a") as f:  # the first record's speed includes compiling
    f.write(json.dumps({"step": 25, "loss": 2.5, "examples_per_sec": 5.0})
            + "\n")
  assert timer.estimate() is None
  with open(path, "a") as f:
    f.write(json.dumps({"step": 50, "loss": 2.0, "examples_per_sec": 20.0})
            + "\n")
    f.write('{"step": 10')  # a record being written
  # 250 steps left at 2 steps/s, then the answering.
  assert timer.estimate() == 125.0 + demo.ANSWER_SECONDS
