"""Load on ``jaxfid serve``, beside the same questions through ``jaxfid
predict`` in one batch.

  python benchmarks/serve_load.py --checkpoint demo_out/model \\
      --index demo_out/data/bm25 \\
      --questions demo_out/data/test_questions.jsonl --n-context 4 \\
      --text-maxlength 40 --decode-maxlength 6 \\
      [--clients 16] [--seconds 30] [--max-batch 16] [--max-wait-ms 10]

1. Starts ``jaxfid serve`` (``--port 0``) and times it until its ready line.
2. ``--clients`` threads each post ``POST /v1/answer`` in a loop for
   ``--seconds``, the questions in turn: requests/s, latency p50/p95/p99,
   errors (any answer but 200; must be 0), the mean device batch (from
   ``/metrics``), the server's peak resident memory (VmHWM); then SIGTERM,
   which must end it with status 0.
3. ``jaxfid retrieve`` + ``jaxfid predict --passage-scores`` answer the same
   questions in one batch (``--batch-size`` = their number): wall time,
   questions/s and peak memory of each process, and how many served answers
   differ from predict's (must be 0).

Prints the hardware, one line per side and a final JSON line with both.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from cpu_host import describe  # noqa: E402


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--index", required=True)
  p.add_argument("--questions", required=True,
                 help="queries as jaxfid retrieve reads them")
  p.add_argument("--n-context", type=int, default=10)
  p.add_argument("--text-maxlength", type=int, default=250)
  p.add_argument("--decode-maxlength", type=int, default=20)
  p.add_argument("--clients", type=int, default=16)
  p.add_argument("--seconds", type=float, default=30.0)
  p.add_argument("--max-batch", type=int, default=16)
  p.add_argument("--max-wait-ms", type=float, default=10.0)
  p.add_argument("--limit", type=int, default=None,
                 help="use the first LIMIT questions")
  return p.parse_args(argv)


def _command(*args) -> list[str]:
  return [sys.executable, "-m", "jaxfid.cli", *map(str, args)]


def _env() -> dict:
  return dict(os.environ, PYTHONPATH=os.pathsep.join(
      [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def hardware() -> dict:
  """The host, and the devices JAX gives a jaxfid process here (this
  process does not start JAX: the server and predict run in children)."""
  probe = subprocess.run(
      [sys.executable, "-c", "import jaxfid, jax; d = jax.devices(); "
       "print(jax.default_backend(), len(d), d[0].device_kind)"],
      capture_output=True, text=True, env=_env(), cwd=ROOT)
  backend = probe.stdout.strip() or probe.stderr.strip()[-200:]
  return {**describe(), "jax_backend_devices_kind": backend}


def _questions(path: str, limit: int | None) -> list[dict]:
  # the queries as `jaxfid retrieve` reads them (jaxfid from this checkout)
  sys.path.insert(0, ROOT)
  # pylint: disable-next=import-outside-toplevel
  from jaxfid.retrieval.store import queries as reader
  queries = reader.read_queries(path)[:limit]
  return [{"id": q.id, "question": q.text} for q in queries]


def _percentile(values: list[float], q: float) -> float:
  ordered = sorted(values)
  if not ordered:
    return float("nan")
  k = (len(ordered) - 1) * q
  lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
  return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _vm_hwm_gb(pid: int) -> float | None:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 2**20
  except OSError:
    pass
  return None


def _post(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
  request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                   method="POST", headers={
                                       "content-type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, {"error": e.read().decode(errors="replace")}


def serve_side(args, questions: list[dict], log_path: str) -> dict:
  start = time.perf_counter()
  log = open(log_path, "w")
  proc = subprocess.Popen(
      _command("serve", "--checkpoint", args.checkpoint, "--index",
               args.index, "--port", 0, "--n-context", args.n_context,
               "--text-maxlength", args.text_maxlength, "--decode-maxlength",
               args.decode_maxlength, "--max-batch", args.max_batch,
               "--max-wait-ms", args.max_wait_ms),
      stdout=subprocess.PIPE, stderr=log, text=True, env=_env(), cwd=ROOT)
  line = proc.stdout.readline()
  match = re.match(r"jaxfid serve: ready at (\S+)", line)
  if not match:
    proc.kill()
    raise SystemExit(f"the server did not start:\n{open(log_path).read()}")
  url, ready_s = match.group(1), time.perf_counter() - start
  latencies: list[float] = []
  errors: list[str] = []
  answers: dict[str, str] = {}
  lock = threading.Lock()
  stop_at = time.perf_counter() + args.seconds

  def client(k: int) -> None:
    i = k
    while time.perf_counter() < stop_at:
      q = questions[i % len(questions)]
      i += args.clients
      t0 = time.perf_counter()
      try:
        status, body = _post(url + "v1/answer", {"question": q["question"]})
      except OSError as e:
        status, body = 0, {"error": str(e)}
      seconds = time.perf_counter() - t0
      with lock:
        if status == 200:
          latencies.append(seconds)
          answers[q["id"]] = body["answer"]
        else:
          errors.append(f"{status}: {body.get('error')}")

  threads = [threading.Thread(target=client, args=(k,))
             for k in range(args.clients)]
  t0 = time.perf_counter()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  wall = time.perf_counter() - t0
  with urllib.request.urlopen(url + "metrics") as r:
    metrics = r.read().decode()
  count = re.search(r"^jaxfid_serve_batch_size_count (\d+)", metrics, re.M)
  total = re.search(r"^jaxfid_serve_batch_size_sum (\S+)", metrics, re.M)
  peak = _vm_hwm_gb(proc.pid)
  proc.send_signal(signal.SIGTERM)
  code = proc.wait(timeout=120)
  log.close()
  done = len(latencies)
  return {"clients": args.clients, "seconds": round(wall, 2),
          "ready_s": round(ready_s, 2), "requests": done + len(errors),
          "requests_per_s": round(done / wall, 2),
          "p50_ms": round(1000 * _percentile(latencies, 0.50), 2),
          "p95_ms": round(1000 * _percentile(latencies, 0.95), 2),
          "p99_ms": round(1000 * _percentile(latencies, 0.99), 2),
          "errors": len(errors), "first_errors": errors[:3],
          "mean_batch": (round(float(total.group(1)) / int(count.group(1)), 2)
                         if count and int(count.group(1)) else None),
          "peak_rss_gb": None if peak is None else round(peak, 3),
          "sigterm_exit": code, "answers": answers}


def _timed(argv: list[str], work: str) -> tuple[float, float]:
  """(wall seconds, peak RSS GB) of one jaxfid process (os.wait4's usage
  of that process alone)."""
  log = os.path.join(work, "process.log")
  t0 = time.perf_counter()
  with open(log, "w") as out:
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                            env=_env(), cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
  wall = time.perf_counter() - t0
  if proc.returncode != 0:
    with open(log) as f:
      raise SystemExit(f"{' '.join(argv)} failed:\n{f.read()[-3000:]}")
  return wall, usage.ru_maxrss / 2**20


def predict_side(args, questions: list[dict], work: str) -> dict:
  queries = os.path.join(work, "questions.jsonl")
  with open(queries, "w") as f:
    for q in questions:
      f.write(json.dumps(q) + "\n")
  run = os.path.join(work, "run.json")
  pred = os.path.join(work, "pred.jsonl")
  retrieve_s, _ = _timed(_command(
      "retrieve", "--index", args.index, "--queries", queries, "--top-k",
      args.n_context, "--output", run, "--threads", 1), work)
  predict_s, peak = _timed(_command(
      "predict", "--checkpoint", args.checkpoint, "--data", run,
      "--n-context", args.n_context, "--text-maxlength", args.text_maxlength,
      "--decode-maxlength", args.decode_maxlength, "--batch-size",
      len(questions), "--passage-scores", "--output", pred), work)
  with open(pred) as f:
    answers = {str(json.loads(l)["id"]): json.loads(l)["prediction"]
               for l in f}
  wall = retrieve_s + predict_s
  return {"questions": len(questions), "batch_size": len(questions),
          "retrieve_s": round(retrieve_s, 2), "predict_s": round(predict_s, 2),
          "questions_per_s": round(len(questions) / wall, 2),
          "predict_peak_rss_gb": round(peak, 3), "answers": answers}


def main(argv=None) -> int:
  args = parse_args(argv)
  hw = hardware()
  print("hardware:", json.dumps(hw), flush=True)
  questions = _questions(args.questions, args.limit)
  with tempfile.TemporaryDirectory() as work:
    served = serve_side(args, questions, os.path.join(work, "serve.log"))
    print(f"serve: {served['requests_per_s']} requests/s with "
          f"{args.clients} clients for {served['seconds']} s, p50 "
          f"{served['p50_ms']} ms, p95 {served['p95_ms']} ms, p99 "
          f"{served['p99_ms']} ms, {served['errors']} errors, mean batch "
          f"{served['mean_batch']}, peak RSS {served['peak_rss_gb']} GB, "
          f"ready after {served['ready_s']} s, SIGTERM exit "
          f"{served['sigterm_exit']}", flush=True)
    batch = predict_side(args, questions, work)
    print(f"predict: {batch['questions']} questions in one batch, retrieve "
          f"{batch['retrieve_s']} s + predict {batch['predict_s']} s "
          f"(loading and compiling included) = {batch['questions_per_s']} "
          f"questions/s, predict's peak RSS {batch['predict_peak_rss_gb']} GB",
          flush=True)
  differ = sorted(k for k, a in served.pop("answers").items()
                  if batch["answers"].get(k) != a)
  batch.pop("answers")
  print(f"served answers that differ from predict's: {len(differ)}",
        flush=True)
  print(json.dumps({"hardware": hw, "config": {
      k: getattr(args, k) for k in ("n_context", "text_maxlength",
                                    "decode_maxlength", "max_batch",
                                    "max_wait_ms")},
      "serve": served, "predict": batch, "answers_differing": len(differ)}))
  ok = served["errors"] == 0 and not differ and served["sigterm_exit"] == 0
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
