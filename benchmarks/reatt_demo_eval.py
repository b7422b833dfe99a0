"""ReAtt end to end on the demo world: R@k, EM and nDCG@10 through the standard commands.

A CPU-sized evaluation of ReAtt (Retrieval as Attention) against BM25 and
against its own initialisation, using only ``jaxfid`` commands (run
in-process through :func:`jaxfid.cli.main`, their JSON lines parsed):

1. Data: the ``jaxfid demo`` world (:mod:`jaxfid.fid.demo_world`): made-up
   entities with one short document per (entity, relation); held-out
   questions are about entities never seen in training. It suits a
   retrieval evaluation better than the tests' key-value world
   (``tests/reatt_world.py``: one-token questions, a 64-document corpus and
   no held-out entities): a corpus of thousands of passages in which each
   question's gold document shares its entity name with 7 other documents
   and its relation with every other entity's, plus unseen entities to
   generalise to. Written as a BEIR corpus (``corpus.jsonl``), QA JSONL
   queries, and a BEIR copy of the held-out set (``queries.jsonl``,
   ``qrels/test.tsv`` with each question's gold document as relevant).
2. ``jaxfid index bm25`` + ``jaxfid retrieve``: every training question's
   ``N_CONTEXT`` close documents from BM25 (FiD JSON).
3. ``jaxfid train --gin_file=gin/reatt/tiny.gin``: a tiny ReAtt from scratch
   (QA loss, then QA + KL after ``--retrieval-warmup-steps``); the
   "untrained" model is the same run's initialisation (one step at learning
   rate 0, which writes the checkpoint without changing a parameter).
   ``--iterations N > 1`` trains with ``jaxfid reatt iterate`` instead.
4. For BM25, the untrained and the trained ReAtt: ``jaxfid index reatt`` of
   the corpus, ``jaxfid retrieve`` of the held-out questions, ``jaxfid
   eval-retrieval --data`` (answer recall R@1/5/20), ``jaxfid retrieve`` +
   ``jaxfid eval-retrieval --qrels`` on the BEIR copy (nDCG@10, MRR@10, gold
   recall), and ``jaxfid predict`` on the retrieved FiD file (EM; the reader
   is the trained ReAtt for BM25 and ReAtt, the untrained one for itself).

Answer recall counts a passage holding the answer string; in this world
answers are common words shared by many documents (40 words), so it
overstates retrieval. The gold-document metrics (nDCG@10, gold R@k) do not.

Usage (from the repository root):
  python benchmarks/reatt_demo_eval.py --output /tmp/reatt_demo [--steps 600]

Prints the hardware, one line per system and, last, a JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_host import describe, summary  # noqa: E402

from jaxfid.cli import main as jaxfid_main  # noqa: E402
from jaxfid.fid import demo_world as synthetic  # noqa: E402
import jax  # noqa: E402,F401  (describe reports its devices)

TEXT_MAXLENGTH, ANSWER_MAXLENGTH = 40, 6  # as jaxfid demo
KS = "1,5,20"


def jaxfid(*argv: str) -> dict:
  """Runs one jaxfid command in-process; returns its last JSON line."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    rc = jaxfid_main([str(a) for a in argv])
  lines = [x for x in out.getvalue().splitlines() if x.startswith("{")]
  if rc != 0 or not lines:
    raise SystemExit(f"jaxfid {' '.join(map(str, argv[:2]))} failed (rc {rc})")
  return json.loads(lines[-1])


def _write_jsonl(path: str, records) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")


def write_data(out: str, args: argparse.Namespace) -> dict:
  """The demo world as a BEIR corpus, QA queries and a BEIR held-out set."""
  world = synthetic.make_demo_data(
      num_train_entities=args.train_entities,
      num_test_entities=-(-args.test_questions // len(synthetic.RELATIONS)),
      seed=args.seed)
  data = os.path.join(out, "data")
  os.makedirs(os.path.join(data, "beir", "qrels"), exist_ok=True)
  paths = {"corpus": os.path.join(data, "corpus.jsonl"),
           "train_questions": os.path.join(data, "train_questions.jsonl"),
           "test_questions": os.path.join(data, "test_questions.jsonl"),
           "beir_queries": os.path.join(data, "beir", "queries.jsonl"),
           "qrels": os.path.join(data, "beir", "qrels", "test.tsv")}
  docs = world["train_docs"] + world["test_docs"]
  _write_jsonl(paths["corpus"], ({"_id": d.id, "title": d.title,
                                  "text": d.text} for d in docs))
  test = world["test_questions"][:args.test_questions]
  for name, questions in (("train_questions", world["train_questions"]),
                          ("test_questions", test)):
    _write_jsonl(paths[name], ({"id": q["id"], "question": q["question"],
                                "answers": q["answers"]} for q in questions))
  _write_jsonl(paths["beir_queries"], ({"_id": q["id"], "text": q["question"]}
                                       for q in test))
  with open(paths["qrels"], "w") as f:
    f.write("query-id\tcorpus-id\tscore\n")
    f.writelines(f"{q['id']}\t{q['gold_id']}\t1\n" for q in test)
  paths.update(documents=len(docs), train=len(world["train_questions"]),
               test=len(test))
  return paths


def gin_args(model_dir: str, train_data: str, args: argparse.Namespace,
             steps: int, learning_rate: float) -> list[str]:
  return ["--gin_file=gin/reatt/tiny.gin", f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.TRAIN_DATA='{train_data}'", "--gin.EVAL_DATA=None",
          f"--gin.TRAIN_STEPS={steps}", f"--gin.BATCH_SIZE={args.batch_size}",
          f"--gin.N_CONTEXT={args.n_context}",
          f"--gin.TEXT_MAXLENGTH={TEXT_MAXLENGTH}",
          f"--gin.ANSWER_MAXLENGTH={ANSWER_MAXLENGTH}",
          f"--gin.LEARNING_RATE={learning_rate}", "--gin.WARMUP_STEPS=100",
          f"--gin.KL_WEIGHT={args.kl_weight}",
          f"--gin.RETRIEVAL_WARMUP_STEPS={args.retrieval_warmup_steps}",
          "--gin.DROPOUT_RATE=0.0", f"--gin.SEED={args.seed}",
          "--gin.MESH='data=1'", f"--gin.CHECKPOINT_EVERY={max(steps, 1)}",
          "--gin.LOG_EVERY=50", "--gin.loop.train.progress=False"]


def train(out: str, paths: dict, train_data: str, args) -> dict:
  """The trained ReAtt (``jaxfid train`` or ``reatt iterate``) and its init."""
  trained, untrained = (os.path.join(out, n) for n in ("reatt", "untrained"))
  t0 = time.time()
  jaxfid("train", *gin_args(untrained, train_data, args, 1, 0.0))
  if args.iterations == 1:
    last = jaxfid("train", *gin_args(trained, train_data, args, args.steps,
                                     args.learning_rate))
  else:
    per = (args.steps - args.retrieval_warmup_steps) // args.iterations
    jaxfid("reatt", "iterate", *gin_args(trained, train_data, args, args.steps,
                                         args.learning_rate),
           "--corpus", paths["corpus"], "--queries", paths["train_questions"],
           "--iterations", args.iterations, "--steps-per-iteration", per,
           "--token-top-k", args.token_top_k)
    with open(os.path.join(trained, "metrics.jsonl")) as f:
      last = [json.loads(x) for x in f if '"loss"' in x][-1]
  return {"trained": trained, "untrained": untrained,
          "train_minutes": (time.time() - t0) / 60,
          "final_loss": last.get("loss"), "final_qa_loss": last.get("qa_loss"),
          "final_kl_loss": last.get("kl_loss"),
          "retrieval_accuracy": last.get("retrieval_accuracy"),
          "steps": last.get("step")}


def evaluate(name: str, index: str, reader: str, paths: dict, out: str,
             args) -> dict:
  """R@k, nDCG@10 and EM of one retriever (+ reader) on the held-out set."""
  options = [] if name == "bm25" else ["--token-top-k", args.token_top_k]
  fid = os.path.join(out, f"test_{name}.json")
  trec = os.path.join(out, f"beir_{name}.trec")
  t0 = time.time()
  jaxfid("retrieve", "--index", index, "--queries", paths["test_questions"],
         "--top-k", 20, "--output", fid, *options)
  jaxfid("retrieve", "--index", index, "--queries", paths["beir_queries"],
         "--top-k", 100, "--output", trec, *options)
  retrieve_s = time.time() - t0
  answers = jaxfid("eval-retrieval", "--run", fid, "--data",
                   paths["test_questions"], "--k", KS)
  gold = jaxfid("eval-retrieval", "--run", trec, "--qrels", paths["qrels"],
                "--k", KS)
  pred = jaxfid("predict", "--checkpoint", reader, "--data", fid,
                "--n-context", args.n_context,
                "--text-maxlength", TEXT_MAXLENGTH,
                "--answer-maxlength", ANSWER_MAXLENGTH, "--batch-size", 50,
                "--output", os.path.join(out, f"pred_{name}.jsonl"))
  return {**{f"answer_{k}": answers[k] for k in answers if k.startswith("R@")},
          "nDCG@10": gold["nDCG@10"], "MRR@10": gold["MRR@10"],
          **{f"gold_{k}": gold[k] for k in gold if k.startswith("R@")},
          "em": pred["em"], "reader": os.path.basename(reader),
          "retrieve_seconds": round(retrieve_s, 1)}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--output", required=True)
  p.add_argument("--steps", type=int, default=600)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--n-context", type=int, default=4)
  p.add_argument("--learning-rate", type=float, default=2e-3)
  p.add_argument("--kl-weight", type=float, default=8.0)
  p.add_argument("--retrieval-warmup-steps", type=int, default=100)
  p.add_argument("--iterations", type=int, default=1,
                 help=">1: train with `jaxfid reatt iterate`")
  p.add_argument("--token-top-k", type=int, default=2048)
  p.add_argument("--train-entities", type=int, default=400)
  p.add_argument("--test-questions", type=int, default=200)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  t0 = time.time()
  out = os.path.abspath(args.output)
  hw = describe()
  print(f"hardware: {summary(hw)}; {hw['platform']}", flush=True)
  paths = write_data(out, args)
  print(f"data: {paths['documents']} documents, {paths['train']} training "
        f"questions, {paths['test']} held-out questions (unseen entities)",
        flush=True)
  bm25 = os.path.join(out, "bm25")
  jaxfid("index", "bm25", "--corpus", paths["corpus"], "--output", bm25)
  train_data = os.path.join(out, "train_bm25.json")
  jaxfid("retrieve", "--index", bm25, "--queries", paths["train_questions"],
         "--top-k", args.n_context, "--output", train_data)
  run = train(out, paths, train_data, args)
  print(f"trained {run['steps']} steps in {run['train_minutes']:.1f} min: "
        f"loss {run['final_loss']:.3f} (QA {run['final_qa_loss']:.3f}, KL "
        f"{run['final_kl_loss']:.3f}), in-batch retrieval accuracy "
        f"{run['retrieval_accuracy']:.3f}", flush=True)
  results = {}
  for name, model in (("bm25", None), ("reatt_untrained", run["untrained"]),
                      ("reatt", run["trained"])):
    index = bm25
    if model is not None:
      index = os.path.join(out, f"index_{name}")
      jaxfid("index", "reatt", "--checkpoint", model, "--corpus",
             paths["corpus"], "--output", index, "--which", "latest")
    reader = run["untrained"] if name == "reatt_untrained" else run["trained"]
    results[name] = evaluate(name, index, reader, paths, out, args)
    r = results[name]
    print(f"{name}: R@1/5/20 {100 * r['answer_R@1']:.1f} / "
          f"{100 * r['answer_R@5']:.1f} / {100 * r['answer_R@20']:.1f}; "
          f"gold R@1/5/20 {100 * r['gold_R@1']:.1f} / {100 * r['gold_R@5']:.1f}"
          f" / {100 * r['gold_R@20']:.1f}; nDCG@10 {100 * r['nDCG@10']:.1f}; "
          f"EM {100 * r['em']:.1f} (reader: {r['reader']})", flush=True)
  print(json.dumps({"hardware": hw, "args": vars(args), "train": run,
                    "results": results,
                    "minutes": round((time.time() - t0) / 60, 2)}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
