"""The tiny FiD task the command-line tests train on, and its train command.

Question ``i`` is "what is thing i?", its answer word ``i`` of WORDS
(cycling); passage 0 says "the thing i is <answer>", the other passages name
other words. ``jaxfid train`` on gin/fid/tiny.gin learns it in a few dozen
steps; the tests of the CLI (test_train_cli.py), of faults during training
(test_faults_training.py) and of multi-host runs (test_multihost.py) train
on it, each at its own sizes.
"""
from __future__ import annotations

import json
import os

WORDS = "red green blue paris london dog cat bread rice golf".split()


def examples(n: int, passages: int, offset: int = 0) -> list[dict]:
  """``n`` questions (from number ``offset``) with ``passages`` passages."""
  out = []
  for i in range(offset, offset + n):
    answer = WORDS[i % len(WORDS)]
    ctxs = [{"title": f"doc {j}", "text": f"the thing {i} is "
             f"{answer if j == 0 else WORDS[(i + j) % len(WORDS)]}",
             "score": 1.0 - j / 10} for j in range(passages)]
    out.append({"question": f"what is thing {i}?", "answers": [answer],
                "ctxs": ctxs})
  return out


def write_json(path, records: list[dict]):
  """``records`` as one JSON list (the FiD repository's format)."""
  path.write_text(json.dumps(records))
  return path


def write_jsonl(path, records: list[dict]):
  """``records`` one JSON object a line."""
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def train_argv(model_dir, train_data, steps: int, eval_data=None,
               gin=(), extra=()) -> list[str]:
  """``jaxfid train`` on gin/fid/tiny.gin: MODEL_DIR, TRAIN_DATA, EVAL_DATA
  (when given) and TRAIN_STEPS, then ``--gin.B`` for each binding ``B``
  (``"BATCH_SIZE=8"``) of ``gin``, then the arguments ``extra``."""
  argv = ["train", "--gin_file=gin/fid/tiny.gin",
          f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.TRAIN_DATA='{train_data}'"]
  if eval_data is not None:
    argv.append(f"--gin.EVAL_DATA='{eval_data}'")
  argv.append(f"--gin.TRAIN_STEPS={steps}")
  return argv + [f"--gin.{b}" for b in gin] + list(extra)


def records(model_dir) -> list[dict]:
  """The lines of a run's metrics.jsonl."""
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def losses(model_dir) -> dict[int, float]:
  """Training loss by step, from metrics.jsonl."""
  return {r["step"]: r["loss"] for r in records(model_dir) if "loss" in r}


def checkpoint_steps(model_dir) -> list[int]:
  """The steps of a run's committed checkpoints."""
  return sorted(int(s) for s in os.listdir(os.path.join(model_dir,
                                                        "checkpoints"))
                if s.isdigit())
