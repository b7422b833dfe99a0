"""``bench compile --search --search-log``: a stopped search resumes.

The log on a made-up compiler (no libtpu): a rerun takes the logged
reports, a changed configuration compiles again, a failed compile is tried
again, a line cut short by a crash is skipped; and a stopped search, rerun
with its log, compiles only what it had not.
"""
import json

import pytest

from jaxfid.aot import search, search_log
from jaxfid.aot.search_log import SearchLog
from jaxfid.core.errors import InputError
from test_bench_compile import _made_up_run

SEARCH = {"topology": "v5e-4", "slices": 1, "program": "train",
          "gin": "BATCH_SIZE = 8", "jaxfid": "0", "jax": "0", "libtpu": "0"}


def _counting():
  calls = []

  def compile_fn(macros, flops=None):
    calls.append(dict(macros))
    if macros.get("REMAT") == "crash":
      raise search.CompileFailed("the compile was killed by SIGKILL")
    return {"fits": True, "per_chip_gb": len(calls), "flops": flops}
  return compile_fn, calls


def test_a_rerun_takes_the_logged_reports(tmp_path):
  path = str(tmp_path / "search.jsonl")
  fn, calls = _counting()
  first = SearchLog(path, SEARCH).cached(fn)
  a, b = first({"REMAT": "none"}, [1.0]), first({"REMAT": "full"}, [1.0])
  assert len(calls) == 2
  log = SearchLog(path, SEARCH)
  again = log.cached(fn)
  assert again({"REMAT": "none"}, [1.0]) == a
  assert again({"REMAT": "full"}, [1.0]) == b
  assert len(calls) == 2 and log.reused == 2
  # another configuration (gin, slice or versions) is another key
  other = SearchLog(path, {**SEARCH, "gin": "BATCH_SIZE = 16"}).cached(fn)
  other({"REMAT": "none"}, [1.0])
  assert len(calls) == 3


def test_a_failed_compile_is_not_logged_and_a_cut_line_is_skipped(tmp_path):
  path = tmp_path / "search.jsonl"
  fn, calls = _counting()
  cached = SearchLog(str(path), SEARCH).cached(fn)
  with pytest.raises(search.CompileFailed):
    cached({"REMAT": "crash"})
  cached({"REMAT": "none"})
  assert len(path.read_text().splitlines()) == 1
  with open(path, "a") as f:   # a crash while writing a line
    f.write('{"key": "abc", "rep')
  log = SearchLog(str(path), SEARCH)
  with pytest.raises(search.CompileFailed):
    log.cached(fn)({"REMAT": "crash"})        # tried again
  log.cached(fn)({"REMAT": "dots"})
  lines = path.read_text().splitlines()
  assert lines[1] == '{"key": "abc", "rep'    # ended, not joined to the next
  assert json.loads(lines[2])["macros"] == {"REMAT": "dots"}
  assert len(calls) == 4


def test_a_log_that_cannot_be_written_is_one_line(tmp_path):
  with pytest.raises(InputError, match="--search-log"):
    SearchLog(str(tmp_path / "missing" / "search.jsonl"), SEARCH)


def test_a_stopped_search_resumes_compiling_only_what_it_had_not(tmp_path):
  """The search stopped after its third compile (a Ctrl-C): rerun with the
  same log it compiles the rest and ends as an uninterrupted search."""
  def compiler(stop_after=None):
    done = []

    def compile_fn(macros, flops):
      if stop_after is not None and len(done) == stop_after:
        raise KeyboardInterrupt
      done.append((macros["MESH"], macros["REMAT"], macros["SCAN_LAYERS"]))
      need = {"none": 30.0, "dots": 12.0, "full": 8.0}[macros["REMAT"]]
      step = {"none": 1.0, "dots": 1.1, "full": 1.3}[macros["REMAT"]]
      return {"fits": need <= 16.0, "per_chip_gb": need,
              "roofline_step_s": step, "examples_per_sec_at_roofline": 1.0}
    return compile_fn, done

  whole_fn, whole = compiler()
  want = search.search(whole_fn, lambda: [1.0], *_made_up_run(8, 4),
                       "train")
  path = str(tmp_path / "search.jsonl")
  stopped_fn, stopped = compiler(stop_after=3)
  with pytest.raises(KeyboardInterrupt):
    search.search(SearchLog(path, SEARCH).cached(stopped_fn),
                  lambda: [1.0], *_made_up_run(8, 4), "train")
  rest_fn, rest = compiler()
  log = SearchLog(path, SEARCH)
  got = search.search(log.cached(rest_fn), lambda: [1.0],
                      *_made_up_run(8, 4), "train")
  assert log.reused == 3 and stopped + rest == whole
  assert got == want


def test_the_key_holds_jaxfids_source(tmp_path, monkeypatch):
  """An edit to jaxfid's code changes what is compiled, not its version:
  the digest of its source is part of every search's key."""
  first = search_log.versions()
  assert first["jaxfid_source"] == search_log.versions()["jaxfid_source"]
  package = tmp_path / "jaxfid"
  (package / "aot").mkdir(parents=True)
  here = package / "aot" / "search_log.py"
  here.write_text("# one\n")
  monkeypatch.setattr(search_log, "__file__", str(here))
  one = search_log._source_digest()
  here.write_text("# two\n")
  assert search_log._source_digest() != one
