"""jaxfid.reader.examples: reading, validation, passage strings, tensors."""
import gzip
import json
import os

import numpy as np
import pytest

from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import EOS_ID, Tokenizer
from jaxfid.reader.examples import (FidExample, Passage, read_fid_examples,
                                 sorted_passages, write_fid_examples)
from jaxfid.reader.inputs import (
    choose_target, decoder_inputs_from_targets, encode_example,
    encode_examples, encode_target, format_passages)

RECORDS = [
    {"id": "q1", "question": "who wrote hamlet?", "answers": ["Shakespeare"],
     "ctxs": [
         {"title": "Hamlet", "text": "Hamlet is a tragedy.", "score": 1.5,
          "id": "p1"},
         {"title": "Macbeth", "text": "Macbeth is a play.", "score": "3.25"},
         {"text": "untitled passage", "score": 2},
     ]},
    {"id": 7, "question": "capital of france?", "target": "Paris",
     "answers": ["Paris", "paris, france"], "ctxs": []},
    {"question": "question only", "answer": ["NQ-open style"]},
]


@pytest.fixture(scope="module")
def tok():
  return Tokenizer()


def write_jsonl(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records),
                  encoding="utf-8")
  return path


def test_json_jsonl_and_gzip_read_the_same(tmp_path):
  a = tmp_path / "a.json"
  a.write_text(json.dumps(RECORDS, indent=2), encoding="utf-8")
  b = write_jsonl(tmp_path / "b.jsonl", RECORDS)
  c = tmp_path / "c.jsonl.gz"
  c.write_bytes(gzip.compress(b.read_bytes()))
  d = tmp_path / "d.data"  # the name does not matter, the content does
  d.write_bytes(b"\xef\xbb\xbf\n  \n" + a.read_bytes())  # BOM + blank lines
  e = tmp_path / "e.jsonl"  # JSONL with blank lines and no final newline
  e.write_text("\n" + json.dumps(RECORDS[0]) + "\n\n" + json.dumps(RECORDS[1])
               + "\n" + json.dumps(RECORDS[2]), encoding="utf-8")
  expected = read_fid_examples(a)
  assert len(expected) == 3
  for p in (b, c, d, e, str(b)):
    assert read_fid_examples(p) == expected


def test_fields_and_defaults(tmp_path):
  ex = read_fid_examples(write_jsonl(tmp_path / "x.jsonl", RECORDS))
  assert ex[0] == FidExample(
      question="who wrote hamlet?", answers=("Shakespeare",), target=None,
      id="q1", ctxs=(Passage("Hamlet", "Hamlet is a tragedy.", 1.5, "p1"),
                     Passage("Macbeth", "Macbeth is a play.", 3.25, None),
                     Passage("", "untitled passage", 2.0, None)))
  assert ex[1].id == "7" and ex[1].target == "Paris" and ex[1].ctxs == ()
  assert ex[2] == FidExample(question="question only",
                             answers=("NQ-open style",))
  with pytest.raises(Exception):
    ex[0].question = "frozen"


def test_limit_and_n_context(tmp_path):
  path = write_jsonl(tmp_path / "x.jsonl", RECORDS)
  assert len(read_fid_examples(path, limit=2)) == 2
  first = read_fid_examples(path, n_context=2)[0]
  assert [p.title for p in first.ctxs] == ["Macbeth", ""]


def _error(path, **kwargs) -> str:
  with pytest.raises(InputError) as e:
    read_fid_examples(path, **kwargs)
  message = str(e.value)
  assert "\n" not in message
  assert str(path) in message
  return message


@pytest.mark.parametrize("record, reason", [
    ([1, 2], "expected a JSON object"),
    ({"answers": ["x"]}, "\"question\" is missing"),
    ({"question": 5}, "\"question\" must be a string, got number"),
    ({"question": None}, "\"question\" must be a string, got null"),
    ({"question": "q", "answers": "Paris"},
     "\"answers\" must be a list of strings, got string"),
    ({"question": "q", "answers": ["a", 3]},
     "\"answers\"[1] must be a string, got number"),
    ({"question": "q", "target": ["a"]},
     "\"target\" must be a string, got array"),
    ({"question": "q", "ctxs": {"text": "t"}},
     "\"ctxs\" must be a list of passages, got object"),
    ({"question": "q", "ctxs": ["text"]}, "ctxs[0] must be an object"),
    ({"question": "q", "ctxs": [{"text": "t"}, {"title": "t"}]},
     "ctxs[1] has no \"text\""),
    ({"question": "q", "ctxs": [{"text": 1}]},
     "ctxs[0].text must be a string, got number"),
    ({"question": "q", "ctxs": [{"text": "t", "title": 2}]},
     "ctxs[0].title must be a string, got number"),
    ({"question": "q", "ctxs": [{"text": "t", "score": "high"}]},
     "ctxs[0].score must be a number, got 'high'"),
    ({"question": "q", "ctxs": [{"text": "t", "score": True}]},
     "ctxs[0].score must be a number, got boolean"),
    ({"question": "q", "ctxs": [{"text": "t", "score": "nan"}]},
     "ctxs[0].score is NaN"),
    ({"question": "q", "ctxs": [{"text": "t", "id": 1.5}]},
     "ctxs[0].id must be a string or an integer, got number"),
    ({"question": "q", "id": {"a": 1}},
     "\"id\" must be a string or an integer, got object"),
])
def test_record_errors_name_line_and_record(tmp_path, record, reason):
  good = {"question": "fine", "answers": ["ok"]}
  jsonl = write_jsonl(tmp_path / "bad.jsonl", [good, good, record])
  assert _error(jsonl).startswith(f"{jsonl}:3: {reason}")
  as_list = tmp_path / "bad.json"
  as_list.write_text(json.dumps([good, record, good]), encoding="utf-8")
  assert _error(as_list).startswith(f"{as_list}: record 2: {reason}")


def test_file_errors(tmp_path):
  assert "no such file" in _error(tmp_path / "missing.jsonl")
  assert "is a directory" in _error(tmp_path)
  empty = tmp_path / "empty.jsonl"
  empty.write_bytes(b"")
  assert "empty file" in _error(empty)
  blank = tmp_path / "blank.json"
  blank.write_text(" \n\n \t\n")
  assert "empty file" in _error(blank)
  no_records = tmp_path / "none.json"
  no_records.write_text("[]\n")
  assert "no examples" in _error(no_records)


def test_undecodable_bytes(tmp_path):
  jsonl = tmp_path / "latin1.jsonl"
  jsonl.write_bytes(b'{"question": "ok"}\n\n{"question": "caf\xe9"}\n')
  message = _error(jsonl)
  assert message.startswith(f"{jsonl}:3: not UTF-8 text")
  as_list = tmp_path / "latin1.json"
  as_list.write_bytes(b'[\n{"question": "ok"},\n{"question": "caf\xe9"}\n]')
  assert _error(as_list).startswith(f"{as_list}:3: not UTF-8 text")


def test_invalid_json(tmp_path):
  jsonl = tmp_path / "broken.jsonl"
  jsonl.write_text('{"question": "a"}\n{"question": "b",}\n')
  message = _error(jsonl)
  assert message.startswith(f"{jsonl}:2: invalid JSON")
  as_list = tmp_path / "broken.json"
  as_list.write_text('[\n {"question": "a"},\n {"question" "b"}\n]\n')
  assert _error(as_list).startswith(f"{as_list}:3: invalid JSON")
  pretty = tmp_path / "object.json"  # one pretty-printed object, not a list
  pretty.write_text('{\n  "question": "a"\n}\n')
  message = _error(pretty)
  assert message.startswith(f"{pretty}:1: invalid JSON")
  assert "list of records or one per line" in message


def test_corrupt_gzip(tmp_path):
  path = tmp_path / "x.jsonl.gz"
  data = gzip.compress(b'{"question": "a"}\n' * 100)
  path.write_bytes(data[:len(data) // 2])
  assert "corrupt gzip file" in _error(path)


def test_require_answers(tmp_path):
  path = write_jsonl(tmp_path / "x.jsonl", [
      {"question": "a", "answers": ["x"]}, {"question": "b", "target": "y"},
      {"question": "c", "answers": []}])
  assert len(read_fid_examples(path)) == 3
  message = _error(path, require_answers=True)
  assert message.startswith(f"{path}:3: no \"target\" and no \"answers\"")


def test_sorted_passages_by_score_stable():
  p = lambda t, s: Passage(title=t, text=t, score=s)  # noqa: E731
  ex = FidExample("q", ctxs=(p("a", 1.0), p("b", 3.0), p("c", 1.0),
                             p("d", 2.0), p("e", 3.0)))
  assert [x.title for x in sorted_passages(ex)] == ["b", "e", "d", "a", "c"]
  unscored = FidExample("q", ctxs=tuple(p(t, None) for t in "zyx"))
  assert [x.title for x in sorted_passages(unscored)] == ["z", "y", "x"]
  mixed = FidExample("q", ctxs=(p("u1", None), p("s1", 1.0), p("u2", None),
                                p("s2", 5.0)))
  assert [x.title for x in sorted_passages(mixed)] == ["s2", "s1", "u1", "u2"]


def test_format_passages_exact_strings():
  ex = FidExample("who wrote hamlet?", ctxs=(
      Passage("Hamlet", "A tragedy.", 1.0), Passage("", "No title.", 2.0),
      Passage("Low", "lowest", 0.5)))
  assert format_passages(ex, 2) == [
      "question: who wrote hamlet? title:  context: No title.",
      "question: who wrote hamlet? title: Hamlet context: A tragedy.",
  ]
  assert len(format_passages(ex, 10)) == 3
  assert format_passages(FidExample("just this?"), 5) == ["question: just this?"]
  with pytest.raises(ValueError):
    format_passages(ex, 0)


def test_encode_example_truncation_and_masks(tok):
  long_text = " ".join(["word"] * 100)
  ex = FidExample("who wrote hamlet?", ctxs=(
      Passage("Hamlet", "Hamlet is a tragedy.", 2.0),
      Passage("Long", long_text, 1.0)))
  tokens, mask = encode_example(tok, ex, n_context=4, text_maxlength=24)
  assert tokens.dtype == np.int32 and tokens.shape == (4, 24)
  assert mask.dtype == bool and mask.tolist() == [True, True, False, False]
  strings = format_passages(ex, 4)
  short = tok.encode(strings[0]) + [EOS_ID]
  assert len(short) < 24
  np.testing.assert_array_equal(tokens[0, :len(short)], short)
  assert not tokens[0, len(short):].any()
  # truncated: first 23 ids, then EOS in the last position
  np.testing.assert_array_equal(tokens[1], tok.encode(strings[1])[:23] + [1])
  assert not tokens[2:].any()
  # the question alone fills one row
  q_tokens, q_mask = encode_example(tok, FidExample("why?"), 3, 8)
  assert q_mask.tolist() == [True, False, False]
  assert tok.decode(q_tokens[0]) == "question: why?"
  # a batch equals the examples one by one
  bt, bm = encode_examples(tok, [ex, FidExample("why?")], 4, 24)
  np.testing.assert_array_equal(bt[0], tokens)
  np.testing.assert_array_equal(bm[1], [True, False, False, False])


def test_choose_target():
  rng = np.random.default_rng(0)
  with_target = FidExample("q", answers=("a", "b"), target="the target")
  assert choose_target(with_target, rng) == "the target"
  ex = FidExample("q", answers=("one", "two", "three"))
  draws = [choose_target(ex, rng) for _ in range(60)]
  assert set(draws) == {"one", "two", "three"}
  again = np.random.default_rng(0)
  choose_target(with_target, again)  # consumes no randomness
  assert [choose_target(ex, again) for _ in range(60)] == draws
  upper = FidExample("q", answers=("THE BEATLES",))
  assert choose_target(upper, rng, dataset="trivia_qa") == "The Beatles"
  assert choose_target(upper, rng, dataset="nq") == "THE BEATLES"
  mixed = FidExample("q", answers=("AC/DC band", "NASA"))
  assert choose_target(FidExample("q", answers=("iPhone",)), rng,
                       "trivia_qa") == "iPhone"
  assert choose_target(mixed, np.random.default_rng(1), "trivia_qa") in (
      "AC/DC band", "Nasa")
  explicit = FidExample("q", answers=("X",), target="KEEP AS IS")
  assert choose_target(explicit, rng, "trivia_qa") == "KEEP AS IS"
  with pytest.raises(ValueError):
    choose_target(FidExample("q"), rng)


def test_encode_target_and_decoder_inputs(tok):
  t = encode_target(tok, "Paris", 5)
  np.testing.assert_array_equal(t, tok.encode("Paris") + [1] + [0] * (
      5 - len(tok.encode("Paris")) - 1))
  long = encode_target(tok, "a very long answer with many words", 4)
  assert long.dtype == np.int32 and long.shape == (4,) and long[-1] == EOS_ID
  targets = np.array([[5, 6, 1, 0], [7, 1, -100, -100]])
  np.testing.assert_array_equal(decoder_inputs_from_targets(targets),
                                [[0, 5, 6, 1], [0, 7, 1, 0]])
  assert decoder_inputs_from_targets(targets).dtype == np.int32
  np.testing.assert_array_equal(decoder_inputs_from_targets([9]), [0])


@pytest.mark.parametrize("name", ["out.json", "out.jsonl", "out.json.gz",
                                  "out.jsonl.gz"])
def test_write_round_trip(tmp_path, name):
  src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
  examples = read_fid_examples(src)
  out = tmp_path / name
  write_fid_examples(out, examples)
  assert read_fid_examples(out) == examples
  head = gzip.decompress(out.read_bytes()) if name.endswith(".gz") else (
      out.read_bytes())
  is_list = name in ("out.json", "out.json.gz")
  assert head.lstrip().startswith(b"[") == is_list
  assert sorted(os.listdir(tmp_path)) == sorted(["in.jsonl", name])
