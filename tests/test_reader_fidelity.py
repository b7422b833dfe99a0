"""FiD reader fidelity: passage EOS per checkpoint, target vs decoding lengths,
the passage-score mode of `jaxfid predict`."""
from __future__ import annotations

import dataclasses
import json

import gin
import jax.numpy as jnp
import numpy as np
import pytest

from hf_reference import make_fid_wrapper_checkpoint, make_tiny_hf_checkpoint
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.checkpoints.load import checkpoint_passage_eos, load_checkpoint
from jaxfid.cli import main
from jaxfid.commands import gin_flags
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import EOS_ID, Tokenizer
from jaxfid.fid.task import FidTask
from jaxfid.reader import examples as fid_format
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader.checkpoint_eval import FidCheckpointEvaluator
from jaxfid.reader.config import DecodeConfig
from jaxfid.reader.config import FidReaderConfig
from jaxfid.reader.config import Lengths
from jaxfid.reader.examples import FidExample, Passage
from jaxfid.training.task import Settings, train_state

TOK = Tokenizer()
LONG = " ".join(["word"] * 40)


def _examples():
  return [FidExample(question=f"what is thing {i}?", answers=(a,), id=str(i),
                     ctxs=(Passage("doc", f"thing {i} is {a}", 2.0),
                           Passage("long", LONG, 1.0)))
          for i, a in enumerate(["red", "the green house by the river",
                                 "BLUE SKY"])]


def _write_data(path, examples):
  fid_format.write_fid_examples(path, examples)
  return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """A tiny HF T5 with T5's vocabulary and the same weights as an original
  FiD reader."""
  root = tmp_path_factory.mktemp("fidelity_ckpts")
  hf = make_tiny_hf_checkpoint(root / "hf", version="1.0", vocab_size=32128)
  fid = make_fid_wrapper_checkpoint(hf, root / "fid_reader")
  return hf, fid


# -------------------------------------------------------------- passage EOS


def test_passages_with_and_without_eos():
  ex = _examples()[0]
  with_eos, mask = fid_inputs.encode_example(TOK, ex, 3, 24)
  without, mask2 = fid_inputs.encode_example(TOK, ex, 3, 24, passage_eos=False)
  np.testing.assert_array_equal(mask, [True, True, False])
  np.testing.assert_array_equal(mask, mask2)
  strings = fid_inputs.format_passages(ex, 3)
  short, long_ = (TOK.encode(s) for s in strings)
  assert len(short) < 23 and len(long_) > 24
  # the short row: its ids, then EOS or not
  assert with_eos[0, :len(short) + 1].tolist() == short + [EOS_ID]
  assert without[0, :len(short) + 1].tolist() == short + [0]
  # the long row: cut at 23 + EOS, or at 24 without
  assert with_eos[1].tolist() == long_[:23] + [EOS_ID]
  assert without[1].tolist() == long_[:24]
  assert not np.any(without == EOS_ID)


def test_checkpoint_passage_eos(checkpoints, tmp_path):
  hf, fid = checkpoints
  assert checkpoint_passage_eos(str(hf)) is True
  assert checkpoint_passage_eos(str(fid)) is False     # the original readers
  for fields, want in (({}, True), ({"passage_eos": False}, False),
                       ({"passage_eos": True}, True)):
    d = tmp_path / f"run{len(fields)}{want}"
    d.mkdir()
    checkpointing.write_run_config(str(d), {"method": "fid", **fields})
    assert checkpoint_passage_eos(str(d)) is want    # old runs: EOS


def test_predict_reads_the_passage_format_and_writes_either_score(
    checkpoints, tmp_path, capsys):
  hf, fid = checkpoints
  examples = _examples()
  data = _write_data(tmp_path / "dev.jsonl", examples)
  model, params, _ = load_checkpoint(str(fid))
  tokens = {eos: jnp.asarray(fid_inputs.encode_examples(
      TOK, examples, 2, 24, passage_eos=eos)[0]) for eos in (True, False)}

  def predict(checkpoint, mode, *flags):
    out = tmp_path / f"{mode}.jsonl"
    assert main(["predict", "--checkpoint", str(checkpoint), "--data",
                 str(data), "--n-context", "2", "--text-maxlength", "24",
                 "--answer-maxlength", "3", "--output", str(out),
                 "--passage-scores", "--passage-scores-mode", mode,
                 *flags]) == 0
    capsys.readouterr()
    return np.array([json.loads(l)["passage_scores"]
                     for l in out.read_text().splitlines()])

  want = {(mode, eos): np.asarray(model.passage_scores(params, t, mode=mode))
          for mode in ("logits", "probs") for eos, t in tokens.items()}
  for mode in ("logits", "probs"):
    assert not np.allclose(want[mode, True], want[mode, False], rtol=1e-4)
  # the original reader: no EOS; an HF T5 (the same weights): EOS
  np.testing.assert_allclose(predict(fid, "logits"), want["logits", False],
                             rtol=1e-5)
  np.testing.assert_allclose(predict(hf, "logits"), want["logits", True],
                             rtol=1e-5)
  np.testing.assert_allclose(predict(fid, "probs", "--passage-eos", "on"),
                             want["probs", True], rtol=1e-5)
  # probs: each example's attention mass, all on its passages
  np.testing.assert_allclose(want["probs", False].sum(-1), 1.0, rtol=1e-5)


def test_predict_attention_writes_token_shares_of_the_passages(
    checkpoints, tmp_path, capsys):
  """--attention: each record's answer tokens and, per read passage (in
  read order, with its id), the reader's shares of its tokens; the same
  predictions as without; at the first answer token each passage's shares
  sum to its passage score (probs), over all passages to 1."""
  hf, _ = checkpoints
  data = _write_data(tmp_path / "dev.jsonl", _examples())
  argv = ["predict", "--checkpoint", str(hf), "--data", str(data),
          "--n-context", "2", "--text-maxlength", "24", "--answer-maxlength",
          "3", "--passage-scores", "--passage-scores-mode", "probs"]

  def records(name, *flags):
    out = tmp_path / name
    assert main([*argv, "--output", str(out), *flags]) == 0
    capsys.readouterr()
    return [json.loads(l) for l in out.read_text().splitlines()]

  plain, read = records("plain.jsonl"), records("read.jsonl", "--attention")
  assert all("attention" not in r and "answer_tokens" not in r for r in plain)
  assert [r["prediction"] for r in read] == [r["prediction"] for r in plain]
  for record in read:
    passages = record["attention"]
    assert [p["id"] for p in passages] == [None, None]  # no ids in the file
    assert "".join(passages[0]["tokens"]).startswith(
        f" question: {record['question']} title: doc context: thing")
    assert 1 <= len(record["answer_tokens"]) <= 3
    assert [sum(p["by_answer_token"][0]) for p in passages] == pytest.approx(
        record["passage_scores"], abs=1e-5)
    assert sum(p["weight"] for p in passages) == pytest.approx(1, abs=1e-5)
    for p in passages:
      assert sum(p["weights"]) == pytest.approx(p["weight"], abs=1e-5)
      assert len(p["by_answer_token"]) == len(record["answer_tokens"])


# ------------------------------------------------------------------ lengths


def _fid_task(bindings):
  gin_flags.parse_gin(["gin/fid/base.gin"], ["MODEL_DIR = 'x'",
                                            "TRAIN_DATA = 'unread.json'",
                                            *bindings])
  try:
    return gin.query_parameter("%METHOD").scoped_configurable_fn()
  finally:
    gin.clear_config()


def test_answer_maxlength_is_the_shorthand_of_both_lengths():
  # the paper's gin: FiD's defaults (no truncation, decode 49, no EOS)
  task = _fid_task([])
  assert task.lengths == Lengths(None, 49) and task.passage_eos is False
  assert _fid_task(["ANSWER_MAXLENGTH = 6"]).lengths == Lengths(6, 6)
  assert _fid_task(["ANSWER_MAXLENGTH = 6", "TARGET_MAXLENGTH = None"]
                   ).lengths == Lengths(None, 6)
  assert _fid_task(["TARGET_MAXLENGTH = 9", "DECODE_MAXLENGTH = 4"]
                   ).lengths == Lengths(9, 4)
  assert _fid_task(["PASSAGE_EOS = True"]).passage_eos is True
  with pytest.raises(InputError, match="DECODE_MAXLENGTH"):  # checked once
    FidReaderConfig(train_data="t.json", decode_maxlength=0)
  # run configs from before the split: one length for both
  assert Lengths.of_run_config({"answer_maxlength": 7}) == Lengths(7, 7)
  assert Lengths.of_run_config({}) == Lengths(None, 49)
  assert Lengths.of_run_config({"answer_maxlength": 50, "decode_maxlength": 50,
                                "target_maxlength": None}) == Lengths(None, 50)


def test_untruncated_targets_pad_to_the_longest_and_the_run_records_it(
    tmp_path, capsys):
  examples = _examples()
  train = _write_data(tmp_path / "train.json", examples)
  task = FidTask(reader=FidReaderConfig(
      train_data=str(train), n_context=2, text_maxlength=16,
      dataset="trivia_qa", passage_eos=False))
  built = dict(vars(task))
  p = task.prepare(Settings(model_dir=str(tmp_path / "run"), train_steps=1,
                            batch_size=3, progress=False))
  assert vars(task) == built  # what prepare made is in its frozen value
  with pytest.raises(dataclasses.FrozenInstanceError):
    p.target_length = 1
  try:
    longest = max(len(TOK.encode(t)) for t in (
        "red", "the green house by the river", "Blue Sky")) + 1
    assert p.target_length == longest
    assert "targets padded to" in capsys.readouterr().err
    batch = task.batch(p, 0, slice(0, 3), None)
    assert batch["decoder_target_tokens"].shape == (3, longest)
    # every target complete: its ids and EOS (no truncation)
    for row in batch["decoder_target_tokens"]:
      ids = row[row > 0].tolist()
      assert ids[-1] == EOS_ID and TOK.decode(ids) in (
          "red", "the green house by the river", "Blue Sky")
    assert not np.any(batch["encoder_input_tokens"] == EOS_ID)
    run = task.run_config(p)
    assert (run["passage_eos"], run["target_maxlength"],
            run["decode_maxlength"], run["answer_maxlength"]) == (
                False, None, 49, 49)
  finally:
    task.close()


def _model_dir(path, checkpoint, run_fields):
  model, params, _ = load_checkpoint(str(checkpoint))
  checkpointing.write_run_config(str(path), {
      "method": "fid", "model": model.config.to_dict(), **run_fields})
  saver = checkpointing.RunCheckpoints(str(path))
  saver.save(3, train_state(params, 3))
  saver.close()
  return path


def test_eval_reads_passage_eos_and_lengths_from_the_checkpoint(
    checkpoints, tmp_path):
  hf, fid = checkpoints
  new = _model_dir(tmp_path / "new", hf, {
      "n_context": 2, "text_maxlength": 16, "answer_maxlength": 5,
      "target_maxlength": None, "decode_maxlength": 5, "passage_eos": False})
  old = _model_dir(tmp_path / "old", hf, {
      "n_context": 2, "text_maxlength": 16, "answer_maxlength": 4})
  ev = FidCheckpointEvaluator(str(new), checkpointing.read_run_config(new))
  assert (ev.passage_eos, ev.decode_maxlength, ev.target_maxlength) == (
      False, 5, 5)
  ev = FidCheckpointEvaluator(str(old), checkpointing.read_run_config(old))
  assert (ev.passage_eos, ev.decode_maxlength, ev.target_maxlength) == (
      True, 4, 4)
  ev = FidCheckpointEvaluator(str(fid), {}, decode=DecodeConfig(
      n_context=2, text_maxlength=16))
  assert (ev.passage_eos, ev.decode_maxlength) == (False, 49)
  assert ev.sequence_length() == {"inputs": (2, 16), "targets": 49}
  # gin's lengths win over the run's
  ev = FidCheckpointEvaluator(str(old), checkpointing.read_run_config(old),
                              decode=DecodeConfig(decode_maxlength=3,
                                                  target_maxlength=8))
  assert (ev.decode_maxlength, ev.target_maxlength) == (3, 8)


def test_predict_writes_the_data_again_with_the_readers_scores(
    checkpoints, tmp_path, capsys):
  """--scored-data: the same records in the same order, only the read
  passages' ``score`` changed, to the original's score (logits); the passage
  beyond --n-context keeps its input score (FiD's test_reader.py)."""
  _, fid = checkpoints
  records = [{"id": f"q{i}", "question": f"what is thing {i}?",
              "answers": [a], "extra": {"kept": i},
              "ctxs": [{"id": "1", "title": "long", "text": LONG,
                        "score": "1.5", "has_answer": False},
                       {"id": "2", "title": "other", "text": "a cat is here",
                        "score": 0.5, "has_answer": False},
                       {"id": "3", "title": "doc", "text": f"thing {i} is {a}",
                        "score": 2.0, "has_answer": True}]}
             for i, a in enumerate(["red", "the green house"])]
  data = tmp_path / "train.json"
  data.write_text(json.dumps(records, indent=2))
  out, scored = tmp_path / "pred.jsonl", tmp_path / "train_scored.json"
  argv = ["predict", "--checkpoint", str(fid), "--data", str(data),
          "--n-context", "2", "--text-maxlength", "24",
          "--answer-maxlength", "3", "--output", str(out), "--passage-scores"]
  assert main([*argv, "--scored-data", str(scored)]) == 0
  err = capsys.readouterr().err
  assert "2 examples have more than 2 passages" in err
  # the reader read "doc" and "long", not the first two in file order
  assert "2 examples' passages are not sorted by score" in err
  preds = [json.loads(l)["passage_scores"]
           for l in out.read_text().splitlines()]
  got = json.loads(scored.read_text())
  assert isinstance(got, list) and len(got) == len(records)
  model, params, _ = load_checkpoint(str(fid))
  tokens = fid_inputs.encode_examples(
      TOK, fid_format.read_fid_examples(data), 2, 24, passage_eos=False)[0]
  want = np.asarray(model.passage_scores(params, jnp.asarray(tokens),
                                         mode="logits"))
  np.testing.assert_allclose(preds, want, rtol=1e-5)    # the default: logits
  for before, after, row in zip(records, got, preds):
    # read order: "doc" (2.0), then "long" ("1.5"); "other" was not read
    assert [c["score"] for c in after["ctxs"]] == [row[1], 0.5, row[0]]
    for c in after["ctxs"]:
      c.pop("score")
    for c in before["ctxs"]:
      c.pop("score")
    assert after == before
  # JSON lines in, JSON lines out
  lines = tmp_path / "train.jsonl"
  lines.write_text("".join(json.dumps(r) + "\n" for r in got))
  again = tmp_path / "again.jsonl"
  assert main([*argv[:4], str(lines), *argv[5:], "--n-context", "3",
               "--passage-scores-mode", "probs", "--scored-data",
               str(again)]) == 0
  assert "passages" not in capsys.readouterr().err   # all read: no note
  rows = [json.loads(l) for l in again.read_text().splitlines()]
  assert len(rows) == 2 and all(len(r["ctxs"]) == 3 for r in rows)
  for row in rows:   # probs: every passage read, the mass sums to 1
    np.testing.assert_allclose(sum(c["score"] for c in row["ctxs"]), 1.0,
                               rtol=1e-5)


@pytest.mark.parametrize("flags, message", [
    (["--scored-data", "{tmp}/s.json"], "--scored-data: needs --passage-scores"),
    (["--passage-scores", "--scored-data", "{tmp}/dev.jsonl"],
     "--scored-data: must not be the input --data"),
    (["--passage-scores", "--scored-data", "{tmp}/./dev.jsonl"],
     "--scored-data: must not be the input --data"),
])
def test_predict_scored_data_bad_combinations(tmp_path, capsys, flags,
                                              message):
  data = _write_data(tmp_path / "dev.jsonl", _examples())
  flags = [f.format(tmp=tmp_path) for f in flags]
  assert main(["predict", "--checkpoint", str(tmp_path / "none"), "--data",
               str(data), "--n-context", "2", "--text-maxlength", "24",
               "--answer-maxlength", "3", "--output", str(tmp_path / "p"),
               *flags]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"jaxfid predict: error: {message}"]
  assert not (tmp_path / "s.json").exists()
