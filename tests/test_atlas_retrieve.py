"""`jaxfid retrieve --index MODEL_DIR/atlas_index/STEP --device`: bad input
is one line and exit 2 (the search itself: tests/test_atlas_train.py, on a
tiny run, against the in-loop search)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxfid.atlas.index import PassageIndex, save_index
from jaxfid.cli import main
from jaxfid.core import sharding as shd


@pytest.fixture
def files(tmp_path):
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": "",
                                        "text": f"passage {i}"}) + "\n"
                            for i in range(5)))
  queries = tmp_path / "q.tsv"
  queries.write_text("q1\tpassage\n")
  return tmp_path, corpus, queries


def _retrieve(index, queries, out, *extra):
  return main(["retrieve", "--index", str(index), "--queries", str(queries),
               "--top-k", "2", "--output", str(out), *extra])


def _error_line(capsys):
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxfid retrieve: error: "), err
  return err[0]


def _saved_index(directory, corpus, **meta):
  index = PassageIndex(shd.parse_mesh("data=1"), 5, 4, "bfloat16",
                       batch_size=2)
  index.set_rows(np.random.default_rng(0).standard_normal((5, 4)))
  save_index(index, str(directory), step=0, corpus=str(corpus), **meta)


def test_device_search_of_an_index_type_without_one_is_refused(files, capsys):
  tmp, _, queries = files
  other = tmp / "bm25"
  other.mkdir()
  (other / "meta.json").write_text(json.dumps({"type": "bm25"}))
  assert _retrieve(other, queries, tmp / "out.trec", "--device") == 2
  line = _error_line(capsys)
  assert "'bm25' index has no device search (--device)" in line
  assert "atlas" in line  # the types with one


def test_an_interrupted_save_and_an_incomplete_meta_are_refused(files, capsys):
  tmp, corpus, queries = files
  _saved_index(tmp / "ix", corpus)
  (tmp / "ix" / "meta.json").unlink()           # cut short before meta.json
  assert _retrieve(tmp / "ix", queries, tmp / "out.trec", "--device") == 2
  assert "no meta.json" in _error_line(capsys)
  (tmp / "ix" / "meta.json").write_text(json.dumps({"type": "atlas"}))
  assert _retrieve(tmp / "ix", queries, tmp / "out.trec", "--device") == 2
  assert "not an Atlas index (missing num_passages" in _error_line(capsys)


def test_an_index_outside_a_model_dir_or_of_another_corpus_is_refused(
    files, capsys):
  tmp, corpus, queries = files
  _saved_index(tmp / "ix", corpus)
  assert _retrieve(tmp / "ix", queries, tmp / "out.trec", "--device") == 2
  assert "not an Atlas MODEL_DIR" in _error_line(capsys)
  assert _retrieve(tmp / "ix", queries, tmp / "out.trec", "--device",
                   "--search-option", "nprobe=3") == 2
  assert "nprobe: an Atlas index takes checkpoint, which" in _error_line(
      capsys)
  corpus.write_text(corpus.read_text() + json.dumps(
      {"_id": "d5", "title": "", "text": "one more"}) + "\n")
  assert _retrieve(tmp / "ix", queries, tmp / "out.trec") == 2
  assert "6 passages, the index 5" in _error_line(capsys)
  assert not (tmp / "out.trec").exists()
