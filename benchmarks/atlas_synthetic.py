"""Atlas on FiD-KD's synthetic world: does the in-loop retriever's recall rise?

Writes the world of ``distill_world.py`` (its defaults: 1,800
training and 96 dev questions, 1,896 passages; a question paraphrases its
relation, so BM25 ties the entity's six passages), then builds what Atlas
starts from, a reader that reads and a retriever that matches words but
knows nothing of the task:

* the reader: a tiny FiD reader trained on BM25's top 6 (:data:`READER`
  over ``gin/fid/tiny.gin``; FiD-KD's round-1 reader as
  ``distill_synthetic.py`` first trained it; dev EM about 0.8);
* the retriever (Atlas starts from Contriever): a tiny dual encoder trained
  on BM25's top 6 with *equal* gold scores (FiD-KD's objective with
  in-batch negatives, :data:`RETRIEVER`): it learns to find the question's
  entity, nothing about which of its passages answers.

Every model reads ``--prompt-format``'s rows and targets (``PROMPT_FORMAT``,
:mod:`jaxfid.atlas.prompts`; default 'atlas', gin/atlas/tiny.gin's): under
'atlas' the reader is trained on BM25's top 6 rewritten as Atlas's QA prompt
(the question "Q answer: <extra_id_0>", whose FiD row is Atlas's "question:
Q answer: <extra_id_0> title: T context: P", and the answers "<extra_id_0>
A", so its dev EM compares like with like), with 3 more row tokens
(:data:`PROMPT_LENGTHS`: the prompt's "answer: <extra_id_0>") and one more
target token (the sentinel); the retriever is trained and searched with the
prompt's query ("question: Q answer: <extra_id_0>").

Then it runs ``jaxfid train --gin_file=gin/atlas/tiny.gin`` (in process)
from them (``INIT_CHECKPOINT`` the reader, ``INIT_RETRIEVER`` the
retriever) once per entry of :data:`RUNS`: each ``RETRIEVER_LOSS``, the
control ``'none'``, ``QUERY_SIDE_ONLY``, and the same ``adist`` from a
random retriever; :data:`ATLAS` holds the shared bindings.

Printed per run and evaluation step: the in-loop retriever's dev answer
recall (``eval_recall@1/5/20`` of metrics.jsonl), ``eval_em``, and what
answer recall cannot tell apart in this world, where six entities share
each answer: ``gold@1`` (the question's own passage is the first hit),
``rel@1`` (the first hit is a passage of the question's relation, of any
entity) and ``ent@6`` (the share of the first six hits that are the
question's entity's). The benchmark computes these three from the same
hits as eval_recall by wrapping :func:`jaxfid.atlas.evaluation.
retrieval_recall` (they are logged as ``eval_gold@1``, ``eval_rel@1``,
``eval_ent@6``). Step 0 is the starting retriever (exact search). Then how
the readers' gold scores rank the hits (:func:`gold_ranking`: how often
the passage with the answer is the gold scores' best, as docs/atlas.md
measures it), the hardware, the load, and a JSON line of everything.

  python benchmarks/atlas_synthetic.py --output /tmp/atlas_synthetic

20 minutes on 2 CPU cores shared with other work (load average about 11):
the reader, the retriever and 7 joint runs of 1,000 steps.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import jax  # noqa: E402

import cpu_host  # noqa: E402
from distill_synthetic import (READER_GIN, RETRIEVER_GIN,  # noqa: E402
                               reader_bindings, retriever_bindings)
from jaxfid.atlas import evaluation as atlas_evaluation  # noqa: E402
from jaxfid.atlas import prompts  # noqa: E402
from jaxfid.atlas import gold as gold_lib  # noqa: E402
from jaxfid.atlas.batches import with_retrieved  # noqa: E402
from jaxfid.atlas.retrieval import read_passages  # noqa: E402
from jaxfid.checkpoints.load import (checkpoint_passage_eos,  # noqa: E402
                                     load_checkpoint)
from jaxfid.cli import main as cli_main  # noqa: E402
from jaxfid.core.tokenization import encode_padded, load_tokenizer  # noqa: E402
from jaxfid.dual_encoder.checkpoint import load_dual_encoder  # noqa: E402
from jaxfid.dual_encoder.model import passage_text  # noqa: E402
import distill_world  # noqa: E402
from jaxfid.reader import inputs as fid_inputs  # noqa: E402
from jaxfid.reader.examples import FidExample  # noqa: E402
from jaxfid.retrieval.bm25.index import build_bm25_index  # noqa: E402
from jaxfid.retrieval.search import retrieve_to_file  # noqa: E402
from jaxfid.retrieval.text.answer_match import has_answer  # noqa: E402

TOP_K = 6  # the entity's passages: what BM25 ties, what the reader reads
# the reader and retriever Atlas starts from: FiD-KD's round 1 as this
# benchmark was measured (tiny.gin's 2 encoder layers, 1,500 steps)
READER = reader_bindings(TOP_K, steps=1500, learning_rate=2e-3,
                         encoder_layers=2)
RETRIEVER = retriever_bindings(TOP_K)
STEPS = 1000
ATLAS_GIN = os.path.join(ROOT, "gin/atlas/tiny.gin")
# One learning rate for reader and retriever (jaxfid's Atlas); 1e-4, not
# tiny.gin's 1e-3: at 1e-3 and 3e-4 the retriever loses the entity within
# 300 steps (docs/atlas.md). Temperature of the retriever's scores: 1, the
# temperature the starting retriever was trained at.
ATLAS = [
    "LEARNING_RATE=1e-4", "N_CONTEXT=6",
    "TEXT_MAXLENGTH=28", "ANSWER_MAXLENGTH=4", "QUERY_MAXLENGTH=16",
    "PASSAGE_MAXLENGTH=12", "REFRESH_EVERY=50", "EVAL_EVERY=100",
    "EVAL_MAX_EXAMPLES=96", "LOG_EVERY=100",
    "DROPOUT_RATE=0.0", "TEMPERATURE_SCORE=1.0", "INDEX_BATCH_SIZE=256",
    "config.T5Config.tie_word_embeddings=True", "MESH='data=1'",
    "loop.train.progress=False"]
# TEMPERATURE_GOLD: a third of the spread (max - min) of a question's gold
# scores on the starting hits (measured: adist 0.0072, pdist 2.2, loop
# 1.6), so the target is neither flat nor one-hot; emdr2's divides the
# reader's logits: 1.
# the rows' and targets' tokens per prompt format: 'fid' as first measured;
# 'atlas' with room for "answer: <extra_id_0>" (3 tokens) and the sentinel
PROMPT_LENGTHS = {"fid": {"TEXT_MAXLENGTH": 28, "ANSWER_MAXLENGTH": 4},
                  "atlas": {"TEXT_MAXLENGTH": 31, "ANSWER_MAXLENGTH": 5}}


def length_bindings(prompt_format: str) -> list[str]:
  return [f"{k}={v}" for k, v in PROMPT_LENGTHS[prompt_format].items()]


RUNS = {
    "none": ("none", []),
    "adist": ("adist", ["TEMPERATURE_GOLD=0.0025"]),
    "pdist": ("pdist", ["TEMPERATURE_GOLD=0.7"]),
    "loop": ("loop", ["TEMPERATURE_GOLD=0.5"]),
    "emdr2": ("emdr2", ["TEMPERATURE_GOLD=1.0"]),
    "adist_query_side": ("adist", ["TEMPERATURE_GOLD=0.0025",
                                   "QUERY_SIDE_ONLY=True"]),
    "adist_random_retriever": ("adist", ["TEMPERATURE_GOLD=0.0025"]),
}


def _cli(argv: list[str], what: str) -> None:
  with contextlib.redirect_stdout(io.StringIO()):
    code = cli_main(argv)
  if code != 0:
    raise SystemExit(f"{what} failed with exit code {code}")


def _records(model_dir: str) -> list[dict]:
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def prompted(run_file: str, prompt_format: str) -> str:
  """``run_file`` (FiD JSON) whose questions and answers are
  ``prompt_format``'s (module docstring); the file itself for 'fid'."""
  if prompt_format == "fid":
    return run_file
  out = run_file.replace(".json", f"_{prompt_format}.json")
  with open(run_file) as f:
    records = json.load(f)
  for r in records:
    r["question"] = prompts.reader_example(
        FidExample(r["question"], ()), prompt_format).question
    r["answers"] = [prompts.target(a, prompt_format) for a in r["answers"]]
  with open(out, "w") as f:
    json.dump(records, f)
  return out


def bm25_reader(paths: dict, work_dir: str, prompt_format: str) -> dict:
  """BM25's top 6 for the training and dev questions, and the reader
  trained on them in ``prompt_format``: ``{"model_dir", "eval_em"}``."""
  index = os.path.join(work_dir, "bm25")
  if not os.path.exists(os.path.join(index, "meta.json")):
    build_bm25_index(paths["corpus.tsv"], index, progress=False)
  runs = {}
  for split in ("train", "dev"):
    runs[split] = os.path.join(work_dir, f"bm25_{split}.json")
    if not os.path.exists(runs[split]):
      retrieve_to_file(index, paths[f"{split}.jsonl"], TOP_K, runs[split],
                       progress=False)
  model_dir = os.path.join(work_dir, f"reader_{prompt_format}")
  if not os.path.exists(os.path.join(model_dir, "metrics.jsonl")):
    data = {split: prompted(runs[split], prompt_format) for split in runs}
    _cli(["train", f"--gin_file={READER_GIN}", f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.TRAIN_DATA='{data['train']}'",
          f"--gin.EVAL_DATA='{data['dev']}'",
          *[f"--gin.{b}" for b in READER + length_bindings(prompt_format)]],
         "the reader's training")
  em = [m["eval_em"] for m in _records(model_dir) if "eval_em" in m]
  return {"model_dir": model_dir, "eval_em": em[-1]}


def uniform_retriever(work_dir: str, prompt_format: str) -> str:
  """The starting retriever (module docstring), its queries
  ``prompt_format``'s: its MODEL_DIR."""
  data = os.path.join(work_dir, f"bm25_train_uniform_{prompt_format}.json")
  with open(os.path.join(work_dir, "bm25_train.json")) as f:
    records = json.load(f)
  for record in records:
    record["question"] = prompts.query(record["question"], prompt_format)
    for c in record["ctxs"]:
      c["score"] = 0.0
  with open(data, "w") as f:
    json.dump(records, f)
  model_dir = os.path.join(work_dir, f"retriever_{prompt_format}")
  if not os.path.exists(os.path.join(model_dir, "metrics.jsonl")):
    _cli(["train", f"--gin_file={RETRIEVER_GIN}",
          f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_DATA='{data}'",
          *[f"--gin.{b}" for b in RETRIEVER]], "the retriever's training")
  return model_dir


# ---- what the hits are ------------------------------------------------------


def _relation(text: str, passage: bool = False) -> str:
  """The relation (its passage words) a question (or a passage) names."""
  for words, paraphrase, _ in distill_world.RELATIONS:
    if (words if passage else paraphrase) in text:
      return words
  raise ValueError(f"no relation in {text!r}")


def hit_stats(passages: list, questions: list[dict], ids) -> dict:
  """Of hits ``ids`` [n, >= 20] (corpus rows, best first) for
  ``questions`` (``{"question", "answers", "gold_id"}``): answer recall at
  1, 5, 20, and gold@1, rel@1, ent@6 (module docstring)."""
  out = {"recall@1": 0, "recall@5": 0, "recall@20": 0, "gold@1": 0,
         "rel@1": 0, "ent@6": 0}
  for q, row in zip(questions, ids):
    hits = [passages[int(i)] for i in row]
    answered = [has_answer(q["answers"], p.text) for p in hits[:20]]
    for k in (1, 5, 20):
      out[f"recall@{k}"] += any(answered[:k])
    out["gold@1"] += hits[0].id == q["gold_id"]
    out["rel@1"] += _relation(q["question"]) in hits[0].text
    name = q["question"].rstrip("?").split()[-1]
    out["ent@6"] += sum(p.title == name for p in hits[:6]) / 6
  return {k: v / len(questions) for k, v in out.items()}


@contextlib.contextmanager
def logging_hit_stats(passages: list, questions: list[dict]):
  """Atlas evaluations also log ``eval_gold@1``, ``eval_rel@1`` and
  ``eval_ent@6`` of the hits their ``eval_recall`` is measured on."""
  by_id = {q["id"]: q for q in questions}
  original = atlas_evaluation.retrieval_recall

  def wrapped(retriever, ids, examples, ks):
    record = original(retriever, ids, examples, ks)
    stats = hit_stats(passages, [by_id[e.id] for e in examples], ids)
    record.update({f"eval_{k}": stats[k] for k in ("gold@1", "rel@1",
                                                   "ent@6")})
    return record

  atlas_evaluation.retrieval_recall = wrapped
  try:
    yield
  finally:
    atlas_evaluation.retrieval_recall = original


def dense_hits(checkpoint: str, questions: list[dict], passages: list,
               prompt_format: str, k: int = 20, *, batch_size: int = 256
               ) -> np.ndarray:
  """[n, k]: the exact top ``k`` corpus rows for ``questions`` (as
  ``prompt_format``'s queries) of the dual encoder MODEL_DIR
  ``checkpoint`` (the starting retriever: step 0)."""
  loaded = load_dual_encoder(checkpoint)
  fn = jax.jit(lambda p, t, tower: loaded.encoder.embed(p, t, tower=tower),
               static_argnums=2)

  def embed(texts, tower):
    length = (loaded.encoder.settings.query_maxlength if tower == "query"
              else loaded.encoder.settings.passage_maxlength)
    tokens = encode_padded(loaded.tokenizer, texts, length)       # [n, len]
    out = []
    for start in range(0, len(tokens), batch_size):
      chunk = np.zeros((batch_size, length), np.int32)
      part = tokens[start:start + batch_size]
      chunk[:len(part)] = part
      out.append(np.asarray(fn(loaded.params, chunk, tower))[:len(part)])
    return np.concatenate(out)                                    # [n, D]

  p = embed([passage_text(x.title, x.text) for x in passages], "passage")
  q = embed([prompts.query(x["question"], prompt_format) for x in questions],
            "query")
  return np.argsort(-(q @ p.T), axis=1, kind="stable")[:, :k]


# ---- how the reader's gold scores rank the hits -----------------------------


def gold_ranking(reader_dir: str, passages: list, questions: list[dict],
                 ids, prompt_format: str, *, batch_size: int = 16) -> dict:
  """How ``reader_dir``'s gold scores (adist, pdist, loop; the latest
  checkpoint) rank each question's first six hits ``ids``: per objective,
  ``answer_first`` (of the questions with an answer passage among them,
  the share whose best-scored passage holds the answer), ``gold_first``
  (the same for the question's own passage), ``rel_first`` (the share of
  all questions whose best-scored passage is of the question's relation)
  and ``spread`` (the mean max - min of a question's gold scores)."""
  model, params, spiece = load_checkpoint(reader_dir, which="latest")
  tokenizer = load_tokenizer(os.path.dirname(spiece) if spiece else None)
  eos = checkpoint_passage_eos(reader_dir)
  examples = [with_retrieved(FidExample(q["question"], tuple(q["answers"])),
                             passages, row[:TOP_K], [0.0] * TOP_K)
              for q, row in zip(questions, ids)]
  fns = {"adist": gold_lib.adist_gold, "pdist": gold_lib.pdist_gold,
         "loop": gold_lib.loop_gold}
  jitted = {m: jax.jit(lambda p, t, k, y, f=f: f(model, p, t, k, y))
            for m, f in fns.items()}
  golds = {m: [] for m in fns}
  for start in range(0, len(examples), batch_size):
    part = examples[start:start + batch_size]
    part = part + [part[-1]] * (batch_size - len(part))  # one shape
    lengths = PROMPT_LENGTHS[prompt_format]
    tokens, mask = fid_inputs.encode_examples(
        tokenizer, [prompts.reader_example(e, prompt_format) for e in part],
        TOP_K, lengths["TEXT_MAXLENGTH"], eos)
    targets = np.stack([fid_inputs.encode_target(
        tokenizer, prompts.target(e.answers[0], prompt_format),
        lengths["ANSWER_MAXLENGTH"]) for e in part]).astype(np.int32)  # [b, T]
    for m in fns:
      golds[m].append(np.asarray(jitted[m](params, tokens.astype(np.int32),
                                           mask, targets)))   # [b, K]
  out = {}
  for m in fns:
    g = np.concatenate(golds[m])[:len(examples)]              # [n, K]
    counts = dict(answer=0, answered=0, gold=0, with_gold=0, rel=0)
    for q, e, row in zip(questions, examples, g):
      best = e.ctxs[int(np.argmax(row))]
      counts["rel"] += _relation(q["question"]) in best.text
      if any(has_answer(q["answers"], c.text) for c in e.ctxs):
        counts["answered"] += 1
        counts["answer"] += has_answer(q["answers"], best.text)
      if any(c.id == q["gold_id"] for c in e.ctxs):
        counts["with_gold"] += 1
        counts["gold"] += best.id == q["gold_id"]
    out[m] = {"answer_first": counts["answer"] / max(counts["answered"], 1),
              "gold_first": counts["gold"] / max(counts["with_gold"], 1),
              "rel_first": counts["rel"] / len(examples),
              "questions": counts["answered"],
              "spread": float(np.mean(g.max(-1) - g.min(-1)))}
  return out


# ---- the joint runs ---------------------------------------------------------


def atlas_run(name: str, loss: str, extra: list[str], paths: dict,
              work_dir: str, reader: str, retriever: str | None,
              prompt_format: str, steps: int = STEPS) -> list:
  """One joint run (``steps`` steps); its evaluation records."""
  model_dir = os.path.join(work_dir, f"atlas_{prompt_format}", name)
  if not os.path.exists(os.path.join(model_dir, "metrics.jsonl")):
    init = [f"INIT_RETRIEVER='{retriever}'"] if retriever else []
    _cli(["train", f"--gin_file={ATLAS_GIN}", f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.CORPUS='{paths['corpus.tsv']}'",
          f"--gin.TRAIN_DATA='{paths['train.jsonl']}'",
          f"--gin.EVAL_DATA='{paths['dev.jsonl']}'",
          f"--gin.RETRIEVER_LOSS='{loss}'", f"--gin.INIT_CHECKPOINT='{reader}'",
          *[f"--gin.{b}" for b in ATLAS + length_bindings(prompt_format)
            + [f"PROMPT_FORMAT='{prompt_format}'"] + init + extra],
          f"--gin.TRAIN_STEPS={steps}", f"--gin.CHECKPOINT_EVERY={steps}"],
         f"run {name}")
  return [m for m in _records(model_dir) if "eval_em" in m]


COLUMNS = ("recall@1", "recall@5", "recall@20", "em", "gold@1", "rel@1",
           "ent@6")


def print_table(start: dict, runs: dict) -> None:
  print(f"{'run':<23} {'step':>5} " + " ".join(f"{c:>9}" for c in COLUMNS))
  for name, rows in runs.items():
    first = dict(start[name], step=0)
    for r in [first, *rows]:
      print(f"{name:<23} {r['step']:>5} " + " ".join(
          f"{r[c]:>9.3f}" if r.get(c) is not None else f"{'':>9}"
          for c in COLUMNS))


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--output", required=True, help="work directory")
  p.add_argument("--seed", type=int, default=0, help="the world's seed")
  p.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
  p.add_argument("--steps", type=int, default=STEPS,
                 help="steps of each joint run")
  p.add_argument("--prompt-format", default="atlas",
                 choices=prompts.PROMPT_FORMATS,
                 help="what the readers and retrievers read (PROMPT_FORMAT)")
  args = p.parse_args(argv)
  t0, load = time.time(), os.getloadavg()
  paths = distill_world.write_world(distill_world.make_world(seed=args.seed),
                                    os.path.join(args.output, "world"))
  passages = read_passages(paths["corpus.tsv"])
  with open(paths["dev.jsonl"]) as f:
    dev = [json.loads(line) for line in f]
  fmt = args.prompt_format
  reader = bm25_reader(paths, args.output, fmt)
  retriever = uniform_retriever(args.output, fmt)
  start_ids = dense_hits(retriever, dev, passages, fmt)
  start = hit_stats(passages, dev, start_ids)
  diagnostics = {"start": gold_ranking(reader["model_dir"], passages, dev,
                                       start_ids, fmt)}
  runs, starts = {}, {}
  with logging_hit_stats(passages, dev):
    for name in args.runs:
      loss, extra = RUNS[name]
      from_random = name.endswith("random_retriever")
      records = atlas_run(name, loss, extra, paths, args.output,
                          reader["model_dir"],
                          None if from_random else retriever, fmt,
                          args.steps)
      runs[name] = [{"step": r["step"], "em": r["eval_em"],
                     **{k: r[f"eval_{k}"] for k in COLUMNS if k != "em"}}
                    for r in records]
      starts[name] = {"em": None, **(
          {k: None for k in COLUMNS if k != "em"} if from_random else start)}
  print(f"reader (BM25 top 6): dev EM {reader['eval_em']:.3f}")
  print_table(starts, runs)
  print("gold scores of the starting reader on the starting retriever's "
        "hits:")
  for m, d in diagnostics["start"].items():
    print(f"  {m}: answer first {d['answer_first']:.3f} (of "
          f"{d['questions']}), own passage first {d['gold_first']:.3f}, "
          f"relation first {d['rel_first']:.3f}, spread {d['spread']:.4f}")
  minutes = round((time.time() - t0) / 60, 2)
  print(cpu_host.summary())
  print(f"load average at start {load[0]:.2f}, at end "
        f"{os.getloadavg()[0]:.2f}; {minutes} minutes")
  print(json.dumps({"prompt_format": fmt, "reader_em": reader["eval_em"],
                    "start": start,
                    "runs": runs, "diagnostics": diagnostics,
                    "minutes": minutes, "hardware": cpu_host.describe(),
                    "load_start": load[0]}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
