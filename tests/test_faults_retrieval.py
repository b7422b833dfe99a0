"""Retrieval under faults, through the command line.

* a damaged index (each kind of file truncated or missing) is one line
  naming the file, exit 2, never empty results or a traceback;
* a full disk during `index bm25`, `index dense` and `retrieve` is one line
  naming the output and the cause, exit 1, the earlier index or run intact,
  no temporaries left, and a rerun with space gives the index of an
  uninterrupted build. The disk is a small tmpfs when this process may
  mount one (root), else a limit on the bytes written, injected into the
  writers' ``open``;
* builds killed with SIGKILL at several points (a child process held at a
  patched function, then killed) leave a lock and temporaries that the
  rerun takes over and removes, and the rerun builds identical files;
  while such a build lives, a second build of the same output refuses;
* empty corpus, query and qrels files, and runs that share no query with
  the qrels or QA set, are one-line errors; partial overlaps are counted.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fault_tools import ROOT, SmallDisk, hold_at, kill
from hf_reference import make_tiny_hf_checkpoint
from jaxfid.cli import main
from jaxfid.core.errors import StorageError
from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader.examples import FidExample
from jaxfid.reader.predict import write_predictions
from jaxfid.reatt import token_index
from jaxfid.runtime import processes
from reatt_world import make_world, tiny_model, write_corpus

SAMPLE = ROOT / "tests" / "data" / "retrieval" / "squad_sample"


def _write_jsonl(path: Path, rows) -> Path:
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _tree(directory: Path) -> dict[str, bytes]:
  """Every file under ``directory`` (relative path -> content)."""
  return {str(p.relative_to(directory)): p.read_bytes()
          for p in sorted(directory.rglob("*")) if p.is_file()}


def _cli(argv, capsys) -> tuple[int, str, str]:
  capsys.readouterr()
  rc = main([str(a) for a in argv])
  out = capsys.readouterr()
  return rc, out.out, out.err


def _one_line(err: str) -> str:
  assert err.count("\n") == 1 and err.endswith("\n"), err
  assert "Traceback" not in err
  return err.strip()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("faults_data")
  with open(SAMPLE / "paragraphs.jsonl") as f:
    paragraphs = [json.loads(line) for line in f][:40]
  ids = {p["_id"] for p in paragraphs}
  with open(SAMPLE / "questions.jsonl") as f:
    questions = [q for q in map(json.loads, f) if q["paragraph"] in ids][:8]
  return {"dir": d, "questions": questions,
          "corpus": _write_jsonl(d / "corpus.jsonl", paragraphs),
          "small": _write_jsonl(d / "small.jsonl", paragraphs[:12]),
          "queries": _write_jsonl(d / "queries.jsonl", questions)}


@pytest.fixture(scope="module")
def bm25_index(data):
  """The BM25 index of the corpus, built without interruption."""
  out = data["dir"] / "bm25"
  assert main(["index", "bm25", "--corpus", str(data["corpus"]), "--output",
               str(out)]) == 0
  return out


DENSE_ARGS = ("--shard-size", "16", "--passage-maxlength", "64")


@pytest.fixture(scope="module")
def dense(data):
  """A tiny T5 checkpoint and the dense index of the corpus it builds."""
  d = data["dir"]
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=16,
                                 d_kv=4, d_ff=32, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  out = d / "dense"
  assert main(["index", "dense", "--checkpoint", str(ckpt), "--corpus",
               str(data["corpus"]), "--output", str(out), *DENSE_ARGS]) == 0
  return {"ckpt": ckpt, "index": out}


# --------------------------------------------------------------- a full disk


@pytest.fixture
def disk(tmp_path, monkeypatch):
  small = SmallDisk(tmp_path / "disk", monkeypatch)
  try:
    yield small
  finally:
    small.close()


def _full_disk_builds(disk: SmallDisk, argv, out: Path, earlier: dict,
                      frees, capsys) -> tuple[int, str]:
  """Runs ``argv`` with less and less room, checking every failure.

  Returns (failures, stdout of the first successful build).
  """
  failures = 0
  for free in frees:
    disk.leave(free)
    rc, stdout, err = _cli(argv, capsys)
    if rc == 0:
      return failures, stdout
    failures += 1
    line = _one_line(err)
    assert rc == 1, line
    assert line == (f"jaxfid index: error: {out}: no space left on device"
                    ), line
    assert disk.listing() == [out.name], disk.listing()  # no temporaries
    assert _tree(out) == earlier  # the earlier index is intact
  pytest.fail("the build never succeeded")


def test_index_bm25_on_a_full_disk(data, bm25_index, disk, capsys):
  out = disk.path / "index"
  assert main(["index", "bm25", "--corpus", str(data["small"]), "--output",
               str(out)]) == 0
  earlier = _tree(out)
  argv = ["index", "bm25", "--corpus", data["corpus"], "--output", out]
  failures, _ = _full_disk_builds(disk, argv, out, earlier,
                                  range(0, 1 << 20, 12 << 10), capsys)
  assert failures >= 4  # failed at several stages of the build
  assert _tree(out) == _tree(bm25_index)
  assert disk.listing() == [out.name]


def test_index_dense_on_a_full_disk(data, dense, disk, capsys):
  out = disk.path / "index"
  common = ["index", "dense", "--checkpoint", dense["ckpt"], "--output", out,
            *DENSE_ARGS]
  assert main([str(a) for a in common] + ["--corpus", str(data["small"])]
              ) == 0
  earlier = _tree(out)
  failures, stdout = _full_disk_builds(
      disk, common + ["--corpus", data["corpus"]], out, earlier,
      (0, 16 << 10, 40 << 10, 64 << 10, 1 << 20), capsys)
  assert failures >= 2
  assert json.loads(stdout.splitlines()[-1])["embedded"] == 40
  assert _tree(out) == _tree(dense["index"])
  assert disk.listing() == [out.name]


@pytest.mark.parametrize("name", ["run.trec", "run.json"])
def test_retrieve_output_on_a_full_disk(data, bm25_index, disk, name,
                                        capsys):
  run = disk.path / name
  run.write_text("earlier run\n")
  argv = ["retrieve", "--index", bm25_index, "--queries", data["queries"],
          "--top-k", "5", "--output", run]
  disk.leave(0)
  rc, _, err = _cli(argv, capsys)
  assert rc == 1
  assert _one_line(err) == (f"jaxfid retrieve: error: {run}: no space left "
                            "on device")
  assert run.read_text() == "earlier run\n"
  assert disk.listing() == [name]
  examples = [FidExample("q?", ("a",), id="0")]
  with pytest.raises(StorageError, match="pred.jsonl: no space left"):
    write_predictions(str(disk.path / "pred.jsonl"), examples, ["a"],
                      {"per_example_em": [1.0], "per_example_f1": [1.0]})
  assert disk.listing() == [name]
  disk.unlimited()
  rc, _, _ = _cli(argv, capsys)
  assert rc == 0 and run.read_text() != "earlier run\n"


# ------------------------------------------------------- killed builds, locks

@pytest.mark.parametrize("target, when", [
    ("jaxfid.retrieval.store.passage_store:PassageStoreWriter.close", "after"),
    ("jaxfid.retrieval.bm25.scoring:BM25Index.save", "before"),
    ("jaxfid.runtime.files:replace_directory", "before")])
def test_killed_bm25_build(data, bm25_index, tmp_path, target, when, capsys):
  work = tmp_path / "work"
  out = work / "index"
  assert main(["index", "bm25", "--corpus", str(data["small"]), "--output",
               str(out)]) == 0
  earlier = _tree(out)
  argv = ["index", "bm25", "--corpus", data["corpus"], "--output", out]
  proc = hold_at(target, when, 1, argv, tmp_path / "child.log")
  try:
    rc, _, err = _cli(argv, capsys)  # a second build while the first lives
    assert rc == 2
    assert _one_line(err).startswith(
        f"jaxfid index: error: index {out} is in use by process {proc.pid} "
        f"on host {processes.host_name()} since ")
  finally:
    kill(proc)
  assert _tree(out) == earlier
  left = sorted(os.listdir(work))
  assert ".index.lock" in left and any(
      name.startswith(f".index.{proc.pid}.") for name in left), left
  rc, _, err = _cli(argv, capsys)
  assert (rc, err) == (0, "")
  assert _tree(out) == _tree(bm25_index)
  assert os.listdir(work) == ["index"]


@pytest.mark.parametrize("target, when, count, reused", [
    ("jaxfid.retrieval.dense.embedding_store:ShardWriter.write", "after", 2,
     32),
    ("jaxfid.retrieval.dense.index:replace_directory", "before", 1, 40)])
def test_killed_dense_build(data, dense, tmp_path, target, when, count,
                            reused, capsys):
  work = tmp_path / "work"
  out = work / "index"
  argv = ["index", "dense", "--checkpoint", dense["ckpt"], "--corpus",
          data["corpus"], "--output", out, *DENSE_ARGS]
  proc = hold_at(target, when, count, argv, tmp_path / "child.log")
  kill(proc)
  assert ".index.lock" in os.listdir(work) and not out.exists()
  # an unfinished shard file of the killed build
  stray = work / ".index.partial" / (
      f".embeddings_00002.npy.{proc.pid}.{processes.host_tag()}."
      "0123456789ab.tmp")
  stray.write_bytes(b"\x93NUMPY")
  rc, stdout, err = _cli(argv, capsys)
  assert (rc, err) == (0, "")
  assert json.loads(stdout.splitlines()[-1])["reused"] == reused
  assert _tree(out) == _tree(dense["index"])
  assert os.listdir(work) == ["index"]


# ------------------------------------------------------------ damaged indexes


def _damage(path: Path, how: str) -> None:
  if how == "truncate":
    os.truncate(path, path.stat().st_size // 2)
  else:
    path.unlink()


def _retrieve_damaged(index: Path, name: str, how: str, queries, tmp_path,
                      capsys) -> str:
  copy = tmp_path / "index"
  shutil.copytree(index, copy)
  _damage(copy / name, how)
  run = tmp_path / "run.trec"
  rc, _, err = _cli(["retrieve", "--index", copy, "--queries", queries,
                     "--top-k", "3", "--output", run], capsys)
  line = _one_line(err)
  assert rc == 2, line
  assert not run.exists()
  return line


@pytest.mark.parametrize("name, how", [
    ("passages.bin", "truncate"), ("ids.txt", "truncate"),
    ("offsets.npy", "truncate"), ("id_offsets.npy", "truncate"),
    ("bm25/data.csc.index.npy", "truncate"),
    ("bm25/indices.csc.index.npy", "truncate"),
    ("bm25/indptr.csc.index.npy", "truncate"),
    ("bm25/vocab.index.json", "truncate"), ("bm25/doc_norms.npy", "delete"),
    ("bm25/max_scores.npy", "truncate"),
    ("bm25/impacts.csc.index.npy", "truncate")])
def test_damaged_bm25_index(data, bm25_index, tmp_path, name, how, capsys):
  line = _retrieve_damaged(bm25_index, name, how, data["queries"], tmp_path,
                           capsys)
  path = tmp_path / "index" / name
  reason = "truncated" if how == "truncate" else "missing index file"
  assert line.startswith(f"jaxfid retrieve: error: {path}: {reason}"), line


@pytest.mark.parametrize("name, value, what, says", [
    ("indices.csc.index.npy", 2**31 - 1, "postings", "not ascending rows"),
    ("impacts.csc.index.npy", 2**16 - 1, "impacts", "exceed 4095")])
def test_bm25_postings_out_of_range_are_one_line(data, bm25_index, tmp_path,
                                                 capsys, name, value, what,
                                                 says):
  """Rows or impacts of a full-size but damaged postings file are caught
  when a term is first read (the top-k's compiled scatter does no bounds
  checks, and its uint16 sums must not overflow)."""
  copy = tmp_path / "index"
  shutil.copytree(bm25_index, copy)
  path = copy / "bm25" / name
  np.save(path, np.full_like(np.load(path), value))
  run = tmp_path / "run.trec"
  rc, _, err = _cli(["retrieve", "--index", copy, "--queries",
                     data["queries"], "--top-k", "3", "--output", run],
                    capsys)
  line = _one_line(err)
  assert rc == 2 and not run.exists(), line
  assert line.startswith(f"jaxfid retrieve: error: {copy / 'bm25'}: the "
                         f"{what} of term "), line
  assert says in line and name in line


@pytest.mark.parametrize("name, how, reason", [
    ("embeddings_00001.npy", "truncate", "truncated: "),
    ("embeddings_00002.npy", "delete", "missing index file"),
    ("faiss_00000.index", "truncate", "truncated: "),
    ("faiss_00000.index", "delete", "missing index file")])
def test_damaged_dense_index(data, dense, tmp_path, name, how, reason,
                             capsys):
  index = data["dir"] / "dense_hnsw"
  if not index.exists():
    assert main(["index", "dense", "--checkpoint", str(dense["ckpt"]),
                 "--corpus", str(data["corpus"]), "--output", str(index),
                 "--faiss-factory", "HNSW8", *DENSE_ARGS]) == 0
  line = _retrieve_damaged(index, name, how, data["queries"], tmp_path,
                           capsys)
  path = tmp_path / "index" / name
  assert line.startswith(f"jaxfid retrieve: error: {path}: {reason}"), line


@pytest.fixture(scope="module")
def reatt_index(tmp_path_factory):
  d = tmp_path_factory.mktemp("reatt_faults")
  docs, examples = make_world(num_keys=8, n_context=2)
  write_corpus(d / "corpus.jsonl", docs)
  model = tiny_model(bi_encoder_layers=1)
  encoder = token_index.TokenEncoder.from_model(model, model.init_params(0))
  token_index.build_token_index(
      encoder, Tokenizer(), d / "corpus.jsonl", d / "index", doc_maxlength=16,
      query_maxlength=16, batch_size=8, progress=False)
  queries = d / "queries.tsv"
  queries.write_text("".join(f"q{i}\t{e.question}\n"
                             for i, e in enumerate(examples[:2])))
  return {"index": d / "index", "queries": queries, "encoder": encoder,
          "corpus": d / "corpus.jsonl"}


def test_index_reatt_on_a_full_disk(reatt_index, tmp_path, monkeypatch):
  disk = SmallDisk(tmp_path / "disk", monkeypatch, size="8m")  # 5 MB index
  out = disk.path / "index"

  def build():
    token_index.build_token_index(
        reatt_index["encoder"], Tokenizer(), reatt_index["corpus"], out,
        doc_maxlength=16, query_maxlength=16, batch_size=8, progress=False)

  # fails at: the lock, bi_encoder.npz, spiece.model (injected: keys.f32)
  frees = (0, 16 << 10, 4300 << 10) if disk.mounted else (0, 1 << 10)
  try:
    for free in frees:
      disk.leave(free)
      with pytest.raises(StorageError) as e:
        build()
      assert str(e.value) == f"{out}: no space left on device"
      assert disk.listing() == []
    disk.unlimited()
    build()
    assert _tree(out) == _tree(reatt_index["index"])
  finally:
    disk.close()


@pytest.mark.parametrize("name, reason", [
    ("keys.f32", "truncated: "), ("doc_offsets.npy", "truncated: "),
    ("bi_encoder.npz", "unreadable")])
def test_damaged_reatt_index(reatt_index, tmp_path, name, reason, capsys):
  line = _retrieve_damaged(reatt_index["index"], name, "truncate",
                           reatt_index["queries"], tmp_path, capsys)
  path = tmp_path / "index" / name
  assert line.startswith(f"jaxfid retrieve: error: {path}: {reason}"), line


# ------------------------------------------------- empty and mismatched input


def test_empty_inputs_are_one_line_errors(data, bm25_index, tmp_path,
                                          capsys):
  empty = tmp_path / "empty.jsonl"
  empty.write_text("")
  blank = tmp_path / "blank.tsv"
  blank.write_text("\n\n")
  for corpus in (empty, blank):
    out = tmp_path / "out" / "index"
    rc, _, err = _cli(["index", "bm25", "--corpus", corpus, "--output", out],
                      capsys)
    assert (rc, _one_line(err)) == (2, f"jaxfid index: error: {corpus}: no "
                                    "passages in the corpus")
    assert os.listdir(tmp_path / "out") == []
  rc, _, err = _cli(["retrieve", "--index", bm25_index, "--queries", empty,
                     "--top-k", "3", "--output", tmp_path / "run.trec"],
                    capsys)
  assert (rc, _one_line(err)) == (2, f"jaxfid retrieve: error: {empty}: no "
                                  "queries in the file")
  run = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(bm25_index), "--queries",
               str(data["queries"]), "--top-k", "3", "--output",
               str(run)]) == 0
  qrels = tmp_path / "qrels.txt"
  qrels.write_text("query-id\tcorpus-id\tscore\n")
  rc, _, err = _cli(["eval-retrieval", "--run", run, "--qrels", qrels],
                    capsys)
  assert (rc, _one_line(err)) == (2, f"jaxfid eval-retrieval: error: "
                                  f"{qrels}: no relevance judgements in the "
                                  "file")
  rc, _, err = _cli(["eval-retrieval", "--run", empty, "--qrels", qrels],
                    capsys)
  assert rc == 2 and "Traceback" not in err


def test_runs_that_miss_the_qrels(data, bm25_index, tmp_path, capsys):
  run = tmp_path / "run.trec"
  assert main(["retrieve", "--index", str(bm25_index), "--queries",
               str(data["queries"]), "--top-k", "3", "--output",
               str(run)]) == 0
  questions = data["questions"]
  disjoint = tmp_path / "disjoint.qrels"
  disjoint.write_text("".join(f"x{q['id']} 0 {q['paragraph']} 1\n"
                              for q in questions))
  rc, _, err = _cli(["eval-retrieval", "--run", run, "--qrels", disjoint],
                    capsys)
  assert rc == 2
  assert _one_line(err).startswith(
      f"jaxfid eval-retrieval: error: {run}: no query of the run is in the "
      f"qrels {disjoint} (run: 8 queries, e.g. '{questions[0]['id']}'")
  data_file = tmp_path / "qa.jsonl"
  _write_jsonl(data_file, [{"id": "x" + q["id"], "question": q["question"],
                            "answers": q["answers"]} for q in questions])
  rc, _, err = _cli(["eval-retrieval", "--run", run, "--data", data_file,
                     "--index", bm25_index], capsys)
  assert rc == 2 and "no query of the run is in the QA set" in _one_line(err)
  # some overlap: what did not match is counted
  partial = tmp_path / "partial.qrels"
  partial.write_text(
      "".join(f"{q['id']} 0 {q['paragraph']} 1\n" for q in questions[:5])
      + "unretrieved 0 Super_Bowl_50_0 1\n"
      + f"{questions[0]['id']} 0 not-in-the-corpus 1\n")
  rc, stdout, _ = _cli(["eval-retrieval", "--run", run, "--qrels", partial,
                        "--index", bm25_index], capsys)
  metrics = json.loads(stdout)
  assert rc == 0 and metrics["num_queries"] == 5
  assert metrics["queries_without_results"] == 1
  assert metrics["queries_without_judgments"] == 3
  assert metrics["judged_documents_missing_from_corpus"] == 1
  assert np.isfinite(metrics["nDCG@10"])
