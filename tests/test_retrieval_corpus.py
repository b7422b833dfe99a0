"""Corpus readers, the passage splitter and the memory-mapped passage store."""
import gzip
import json

import numpy as np
import pytest

from jaxfid.core.errors import InputError
from jaxfid.retrieval.store import passage_store as passage_store_module
from jaxfid.retrieval.store.corpus import Passage, detect_format, read_corpus
from jaxfid.retrieval.store.passage_store import (
    PassageStore, PassageStoreWriter, write_passage_store)
from jaxfid.retrieval.store.splitter import (
    split_document, split_into_passages, write_dpr_tsv)


def _write(path, text, gz=False):
  data = text.encode("utf-8")
  if gz:
    data = gzip.compress(data)
  path.write_bytes(data)
  return path


def _passages(path):
  return [p for _, p in read_corpus(path)]


def test_beir_jsonl_and_dpr_jsonl(tmp_path):
  beir = _write(tmp_path / "corpus.jsonl",
                '{"_id": "d1", "title": "T", "text": "hello", "metadata": {}}\n'
                '\n{"_id": "d2", "text": "no title"}\n')
  assert _passages(beir) == [Passage("d1", "T", "hello"),
                             Passage("d2", "", "no title")]
  dpr = _write(tmp_path / "psgs.jsonl",
               '{"id": 7, "title": "Ünï", "text": "cödé ✓"}\n')
  assert _passages(dpr) == [Passage("7", "Ünï", "cödé ✓")]


def test_dpr_tsv_with_quotes_any_column_order_and_gzip(tmp_path):
  text = ('id\ttext\ttitle\n'
          '1\t"Aaron ( or ; ""Ahärôn"") is a prophet"\tAaron\n'
          '2\tplain text\t\n')
  expected = [Passage("1", "Aaron", 'Aaron ( or ; "Ahärôn") is a prophet'),
              Passage("2", "", "plain text")]
  assert _passages(_write(tmp_path / "p.tsv", text)) == expected
  assert _passages(_write(tmp_path / "p.tsv.gz", text, gz=True)) == expected
  # gzip is detected by content, the format by the first line
  assert _passages(_write(tmp_path / "p.data", text, gz=True)) == expected
  swapped = _write(tmp_path / "s.tsv", "title\tid\ttext\nT\tx\ty\n")
  assert _passages(swapped) == [Passage("x", "T", "y")]
  assert detect_format(_write(tmp_path / "c.txt", '{"id": 1}\n')) == "jsonl"


@pytest.mark.parametrize("name, content, line, reason", [
    ("a.jsonl", '{"_id": "1", "text": "x"}\n{"_id": "2", "text": \n', 2,
     "bad JSON"),
    ("b.jsonl", '{"_id": "1", "text": "x"}\n\n{"title": "t", "text": "y"}\n',
     3, "missing passage id"),
    ("c.jsonl", '{"_id": "1"}\n', 1, "missing 'text'"),
    ("d.jsonl", '{"_id": "a b", "text": "x"}\n', 1, "whitespace"),
    ("e.jsonl", '["not", "an", "object"]\n', 1, "expected a JSON object"),
    ("e2.json", '[\n{"_id": "1", "text": "x"}\n]\n', 1, "JSON array"),
    ("f.tsv", "id\ttext\ttitle\n1\tx\tT\n2\tonly two\n", 3,
     "expected 3 tab-separated columns"),
    ("g.tsv", "1\tsome text\tTitle\n", 1, "header"),
    ("h.tsv", 'id\ttext\n1\t"unclosed quote\n', 2, "malformed TSV"),
    ("i.jsonl", '{"_id": "", "text": "x"}\n', 1, "empty id"),
])
def test_malformed_corpus_names_file_and_line(tmp_path, name, content, line,
                                              reason):
  path = _write(tmp_path / name, content)
  with pytest.raises(InputError) as e:
    _passages(path)
  assert str(e.value).startswith(f"{path}:{line}: ")
  assert reason in str(e.value)
  assert "\n" not in str(e.value)


def test_invalid_utf8_names_the_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_bytes(b'{"_id": "1", "text": "ok"}\n'
                   b'{"_id": "2", "text": "\xff"}\n')
  with pytest.raises(InputError, match=r"bad.jsonl:2: not valid UTF-8"):
    _passages(path)


def test_split_document_edge_cases():
  doc = Passage("d", "Title", " ".join(f"w{i}" for i in range(250)))
  chunks = split_document(doc, words=100)
  assert [len(t.split()) for _, t in chunks] == [100, 100, 50]
  assert all(title == "Title" for title, _ in chunks)
  assert chunks[1][1].split()[0] == "w100"  # non-overlapping, in order
  # short, empty and whitespace-only documents
  assert split_document(Passage("s", "", "just three words")) == [
      ("", "just three words")]
  assert split_document(Passage("e", "T", "")) == []
  assert split_document(Passage("w", "T", " \n\t ")) == []
  # unicode text and whitespace normalisation
  uni = Passage("u", "Ünïcode", "naïve\u3000café\n\n日本語  ✓")
  assert split_document(uni, words=2) == [("Ünïcode", "naïve café"),
                                         ("Ünïcode", "日本語 ✓")]
  with pytest.raises(ValueError):
    split_document(doc, words=0)


def test_split_ids_and_dpr_tsv_round_trip(tmp_path):
  docs = [Passage("a", "A", "one two three four five"),
          Passage("b", "", "six"), Passage("c", "C", "")]
  passages = list(split_into_passages(docs, words=2))
  assert [p.id for p in passages] == ["a_0", "a_1", "a_2", "b_0"]
  numbered = list(split_into_passages(docs, words=2, sequential_ids=True))
  assert [p.id for p in numbered] == ["1", "2", "3", "4"]
  tricky = passages + [Passage("q", 'say "hi"\tthere', 'quote " inside')]
  out = tmp_path / "psgs.tsv"
  assert write_dpr_tsv(out, tricky) == 5
  assert out.read_text().splitlines()[0] == "id\ttext\ttitle"
  assert _passages(out) == tricky
  zipped = tmp_path / "psgs.tsv.gz"
  write_dpr_tsv(zipped, tricky)
  assert zipped.read_bytes()[:2] == b"\x1f\x8b"
  assert _passages(zipped) == tricky


def test_passage_store_round_trip(tmp_path):
  passages = [Passage("doc-10", "Title", "text ✓"),
              Passage("doc-2", "", ""),
              Passage("ünï", "日本", "naïve café \U0001f600"),
              Passage("a", "T", "x" * 1000)]
  assert write_passage_store(tmp_path, passages) == 4
  store = PassageStore(tmp_path)
  assert len(store) == 4
  assert list(store) == passages
  assert store[-1] == passages[-1]
  assert store.title(2) == "日本" and store.text(1) == ""
  assert store.ids([3, 0]) == ["a", "doc-10"]
  for i, p in enumerate(passages):
    assert store.index_of(p.id) == i
  assert "missing" not in store and "a" in store
  with pytest.raises(KeyError):
    store.index_of("doc-1")
  with pytest.raises(IndexError):
    store[4]
  # ranks follow the bytewise id order: a < doc-10 < doc-2 < ünï
  assert list(store.id_rank) == [1, 2, 3, 0]
  assert isinstance(store.offsets, np.ndarray)


def test_passage_store_sorts_in_python_for_huge_ids(tmp_path, monkeypatch):
  monkeypatch.setattr(passage_store_module, "_MAX_SORT_BYTES", 0)
  write_passage_store(tmp_path, [Passage(i, "", i) for i in "cab"])
  store = PassageStore(tmp_path)
  assert [store.index_of(i) for i in "abc"] == [1, 2, 0]
  with pytest.raises(InputError, match="duplicate id 'c'"):
    write_passage_store(tmp_path / "dup", [Passage(i, "", i) for i in "cac"])


def test_duplicate_ids_name_the_corpus_line(tmp_path):
  corpus = _write(tmp_path / "c.jsonl", "".join(
      json.dumps({"_id": i, "text": "t"}) + "\n" for i in ["x", "y", "x"]))
  with pytest.raises(InputError) as e:
    with PassageStoreWriter(tmp_path / "store", source=corpus) as writer:
      for lineno, passage in read_corpus(corpus):
        writer.add(passage, lineno)
  assert str(e.value) == (f"{corpus}:3: duplicate id 'x' (first seen on "
                          "line 1)")


def test_empty_store(tmp_path):
  write_passage_store(tmp_path, [])
  store = PassageStore(tmp_path)
  assert len(store) == 0 and list(store) == []
  with pytest.raises(KeyError):
    store.index_of("x")


def test_not_a_store(tmp_path):
  with pytest.raises(InputError, match="not an index directory"):
    PassageStore(tmp_path)
