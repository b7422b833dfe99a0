"""seqio FiD QA tasks (`tasks/`): sources, preprocessors, converter, metrics.

Everything runs on small FiD files written to tmp_path and on in-memory
datasets shaped like the TFDS features; nothing is downloaded.
"""
import json
import os

import gin
import numpy as np
import pytest
import seqio
import tensorflow as tf

import tasks
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import EOS_ID, Tokenizer, encode_padded
from jaxfid.reader import examples as fid_format
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader import task as fid_task
from jaxfid.reader.batches import FidBatcher
from tasks import config, fid_examples, metrics, sources
from tasks.feature_converter import FidFeatureConverter, fid_feature_converter

LENGTHS = {"inputs": (3, 12), "targets": 6}
LONG = ("the quick brown fox jumps over the lazy dog while the band plays "
        "on and on")


@pytest.fixture(scope="module")
def tokenizer():
  return Tokenizer()


def _write(path, records, as_list=False):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    if as_list:
      json.dump(records, f)
    else:
      for r in records:
        f.write(json.dumps(r) + "\n")


# one answer or an explicit target each: the target cannot depend on the draw
NQ_RECORDS = [
    {"id": "q0", "question": "who wrote hamlet",
     "answers": ["William Shakespeare"],
     "ctxs": [{"title": "Low", "text": "low score", "score": 1.0},
              {"title": "High", "text": LONG, "score": "9.5"},
              {"title": "Mid", "text": "middle", "score": 5},
              {"title": "Unscored", "text": "no score"},
              {"title": "Lower", "text": "lowest", "score": -2}]},
    {"question": "question with no passages", "answers": ["blue whale"]},
    {"id": "q2", "question": "what is the target", "target": "given target",
     "answers": ["an answer", "another"],
     "ctxs": [{"title": "Only", "text": "one passage", "score": 0.5},
              {"title": "Tie", "text": "same score", "score": 0.5}]},
]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
  root = tmp_path / "fid"
  _write(root / "nq" / "train.jsonl", NQ_RECORDS)
  _write(root / "nq" / "dev.json", NQ_RECORDS, as_list=True)
  monkeypatch.setenv(config.DATA_DIR_ENV, str(root))
  return root


def _examples(task, split="train", lengths=LENGTHS, **kwargs):
  kwargs.setdefault("shuffle", False)
  kwargs.setdefault("seed", 0)
  ds = seqio.get_mixture_or_task(task).get_dataset(lengths, split=split,
                                                   **kwargs)
  return list(ds.as_numpy_iterator())


def _text(b):
  return b.decode("utf-8")


# ---------------------------------------------------------------- registry


def test_tasks_registered_without_data(monkeypatch):
  monkeypatch.delenv(config.DATA_DIR_ENV, raising=False)
  monkeypatch.delenv(config.RETRIEVAL_DIR_ENV, raising=False)
  names = tasks.register_tasks()
  assert tasks.register_tasks() == names  # re-registration replaces
  assert set(names) == {"nq_open_fid", "trivia_qa_fid", "squad_open_fid",
                        "natural_questions_open_fid",
                        "trivia_qa_unfiltered_fid", "squad_v1_1_fid"}
  for name in names:
    task = seqio.TaskRegistry.get(name)
    assert task.output_features["inputs"].rank == 2
    assert [m.__name__ for m in task.metric_fns] == ["exact_match", "f1"]
  assert seqio.TaskRegistry.get(
      "squad_v1_1_fid").source.splits == ("train", "validation")
  with pytest.raises(InputError, match="JAXFID_DATA_DIR"):
    _examples("nq_open_fid")


def test_tfds_task_reports_missing_retrieval_before_tfds(monkeypatch):
  monkeypatch.delenv(config.RETRIEVAL_DIR_ENV, raising=False)

  def no_tfds(*args, **kwargs):
    raise AssertionError("TFDS was asked for data")
  monkeypatch.setattr(seqio.TfdsDataSource, "get_dataset", no_tfds)
  with pytest.raises(InputError, match="JAXFID_RETRIEVAL_DIR"):
    _examples("natural_questions_open_fid", split="validation")


# ------------------------------------------------------------- FiD files


def test_nq_arrays_equal_the_fid_file_path(data_dir, tokenizer):
  """The task's token arrays are the FiD-file path's, exactly."""
  got = _examples("nq_open_fid")
  want = fid_format.read_fid_examples(data_dir / "nq" / "train.jsonl")
  assert len(got) == len(want) == 3
  for ex, example in zip(got, want):
    strings = fid_inputs.format_passages(example, 3)
    assert [_text(s) for s in ex["inputs_pretokenized"]] == strings
    tokens, mask = fid_inputs.encode_example(tokenizer, example, 3, 12)
    # the real passages' rows, EOS kept within 12 tokens, padded with 0
    np.testing.assert_array_equal(ex["inputs"], tokens[mask])
    assert ex["inputs"].dtype == np.int32
    assert [_text(a) for a in ex["answers"]] == list(example.answers)
    target = fid_inputs.choose_target(example, np.random.default_rng(0))
    assert _text(ex["targets_pretokenized"]) == target
    np.testing.assert_array_equal(
        ex["targets"], [t for t in fid_inputs.encode_target(
            tokenizer, target, 6) if t])
    assert set(ex) == {"id", "question", "answers", "target", "inputs",
                       "inputs_pretokenized", "targets",
                       "targets_pretokenized"}
  # sorted by score (numeric string too), unscored last, cut to n_context
  assert [_text(s).split(" title: ")[1].split(" context:")[0]
          for s in got[0]["inputs_pretokenized"]] == ["High", "Mid", "Low"]
  assert [_text(s) for s in got[1]["inputs_pretokenized"]] == [
      "question: question with no passages"]
  assert got[0]["inputs"][0, -1] == EOS_ID  # the long passage, cut

  # model features == FidBatcher's batch rows of the same examples
  model = list(fid_feature_converter(
      seqio.get_mixture_or_task("nq_open_fid").get_dataset(
          LENGTHS, split="train", shuffle=False, seed=0),
      n_context=3, text_maxlength=12, answer_maxlength=6).as_numpy_iterator())
  batcher = FidBatcher(want, tokenizer, batch_size=3, n_context=3,
                       text_maxlength=12, target_maxlength=6, seed=0)
  try:
    batch, order = batcher.batch(0), batcher.indices(0)
  finally:
    batcher.close()
  assert sorted(order.tolist()) == [0, 1, 2]
  for row, i in enumerate(order):
    for key in ("encoder_input_tokens", "passage_mask",
                "decoder_target_tokens"):
      np.testing.assert_array_equal(model[i][key], batch[key][row])
      assert model[i][key].dtype == batch[key].dtype
  assert model[1]["passage_mask"].tolist() == [True, False, False]


def test_passages_without_eos_follow_gin_and_equal_the_fid_file_path(
    data_dir, tokenizer):
  """gin's fid_passage_eos (what `jaxfid eval` binds to a checkpoint's
  setting): rows cut without EOS, the FiD-file path's ``passage_eos=False``."""
  gin.parse_config("tasks.config.fid_passage_eos.passage_eos = False")
  try:
    got = _examples("nq_open_fid")
    untruncated = _examples("nq_open_fid", lengths=None)
  finally:
    gin.parse_config("tasks.config.fid_passage_eos.passage_eos = True")
  want = fid_format.read_fid_examples(data_dir / "nq" / "train.jsonl")
  for ex, example in zip(got, want):
    tokens, mask = fid_inputs.encode_example(tokenizer, example, 3, 12,
                                             passage_eos=False)
    np.testing.assert_array_equal(ex["inputs"], tokens[mask])
    assert EOS_ID not in ex["inputs"]
    assert ex["targets"].tolist()[-1] == EOS_ID  # targets keep theirs
  assert np.count_nonzero(untruncated[0]["inputs"], axis=1).max() == max(
      len(tokenizer.encode(s)) for s in fid_inputs.format_passages(want[0], 3))
  model = list(FidFeatureConverter(passage_eos=False)(
      tf.data.Dataset.from_tensor_slices(
          {"inputs": tf.ragged.constant([[[5, 6, 7, 8], [9]]], tf.int32),
           "targets": tf.ragged.constant([[5, 1]], tf.int32)}),
      {"inputs": (3, 3), "targets": 3}).as_numpy_iterator())
  np.testing.assert_array_equal(model[0]["encoder_input_tokens"],
                                [[5, 6, 7], [9, 0, 0], [0, 0, 0]])


def test_validation_reads_dev_json_list_and_gin_n_context(data_dir):
  gin.parse_config("tasks.config.fid_n_context.n_context = 2")
  try:
    got = _examples("nq_open_fid", split="validation", lengths=None)
  finally:
    gin.parse_config("tasks.config.fid_n_context.n_context = 100")
  assert [len(ex["inputs"]) for ex in got] == [2, 1, 2]
  # no sequence length: nothing is cut; rows are padded to the longest
  for row in got[0]["inputs"]:
    real = row[:np.count_nonzero(row)]
    assert real[-1] == EOS_ID and EOS_ID not in real[:-1]
  assert np.count_nonzero(got[0]["inputs"][0]) > 12
  assert got[0]["targets"].tolist()[-1] == EOS_ID


def test_split_and_record_errors(data_dir):
  with pytest.raises(InputError, match="no test file"):
    _examples("nq_open_fid", split="test")
  with pytest.raises(ValueError, match="must be a pair"):
    _examples("nq_open_fid", lengths={"inputs": 12, "targets": 6})
  _write(data_dir / "nq" / "train.jsonl",
         NQ_RECORDS + [{"question": "no answers here"}])
  with pytest.raises(tf.errors.OpError, match="nothing to train"):
    _examples("nq_open_fid")
  # prediction splits accept questions without answers
  _write(data_dir / "nq" / "test.jsonl", [{"question": "no answers"}])
  (ex,) = _examples("nq_open_fid", split="test")
  assert ex["targets_pretokenized"] == b"" and ex["answers"].size == 0


def test_target_choice_seeded_per_example_and_epoch(tmp_path, monkeypatch):
  answers = [f"answer {i}" for i in range(20)]
  records = [{"question": f"q{i}", "answers": answers} for i in range(12)]
  _write(tmp_path / "squad" / "train.jsonl", records)
  monkeypatch.setenv(config.DATA_DIR_ENV, str(tmp_path))

  def targets(seed, epochs=1):
    return [_text(ex["targets_pretokenized"]) for ex in _examples(
        "squad_open_fid", seed=seed, num_epochs=epochs)]
  first = targets(seed=7)
  assert first == targets(seed=7)
  assert len(set(first)) > 3 and set(first) <= set(answers)
  assert targets(seed=8) != first
  two = targets(seed=7, epochs=2)
  assert len(two) == 24 and two[:12] != two[12:]


def test_trivia_qa_title_cases_drawn_answers_only(tmp_path, monkeypatch):
  records = [{"question": "band", "answers": ["THE BEATLES"]},
             {"question": "mixed", "answers": ["iPhone"]},
             {"question": "given", "answers": ["X"], "target": "KEEP ME"},
             {"question": "quote", "answers": ["DON'T STOP ME NOW"]}]
  _write(tmp_path / "trivia_qa" / "train.jsonl", records)
  _write(tmp_path / "nq" / "train.jsonl", records)
  monkeypatch.setenv(config.DATA_DIR_ENV, str(tmp_path))
  got = [_text(ex["targets_pretokenized"]) for ex in _examples(
      "trivia_qa_fid")]
  assert got == ["The Beatles", "iPhone", "KEEP ME", "Don'T Stop Me Now"]
  nq = [_text(ex["targets_pretokenized"]) for ex in _examples("nq_open_fid")]
  assert nq[0] == "THE BEATLES"


# ------------------------------------------------- the trainer's examples


def test_seqio_example_source_reads_tasks_and_mixtures(data_dir):
  assert fid_task.EXAMPLE_SOURCES.get(fid_task.SEQIO) is (
      fid_examples.read_components)
  (component,) = fid_task.read_mixture("nq_open_fid", "train")
  assert component == fid_task.Component(
      "nq_open_fid", 1.0, "nq",
      fid_format.read_fid_examples(data_dir / "nq" / "train.jsonl"))
  _write(data_dir / "trivia_qa" / "validation.jsonl",
         [{"question": "band", "answers": ["THE BEATLES"]}])
  seqio.MixtureRegistry.remove("test_nq_trivia_mixture")
  seqio.MixtureRegistry.add("test_nq_trivia_mixture",
                            [("nq_open_fid", 2.0), ("trivia_qa_fid", 1.0)])
  try:
    got = fid_task.read_mixture("test_nq_trivia_mixture", "validation")
  finally:
    seqio.MixtureRegistry.remove("test_nq_trivia_mixture")
  assert [(c.task, c.rate, c.dataset, len(c.examples)) for c in got] == [
      ("nq_open_fid", 2.0, "nq", 3), ("trivia_qa_fid", 1.0, "trivia_qa", 1)]
  assert got[1].examples[0].answers == ("THE BEATLES",)
  with pytest.raises(InputError, match="MIXTURE_OR_TASK_NAME: no seqio task "
                     "or mixture 'nope'"):
    fid_task.read_mixture("nope", "train")
  with pytest.raises(InputError, match="'lmbff_sst_2_16_13' is not a FiD QA"):
    fid_task.read_mixture("lmbff_sst_2_16_13", "train")
  with pytest.raises(InputError, match="no test file"):
    fid_task.read_mixture("nq_open_fid", "test")


# ------------------------------------------------------ converter, metrics


def test_feature_converter_truncates_and_pads():
  rows = tf.ragged.constant([[[5, 6, 7, 8, 1], [9, 1], [3, 1], [4, 1]],
                             [[2, 2, 1]]], dtype=tf.int32)
  targets = tf.ragged.constant([[5, 6, 7, 1], [8, 1]], dtype=tf.int32)
  ds = tf.data.Dataset.from_tensor_slices(
      {"inputs": rows, "targets": targets})
  ds = ds.map(lambda ex: {"inputs": ex["inputs"],
                          "targets": ex["targets"]})
  got = list(FidFeatureConverter()(ds, {"inputs": (3, 3), "targets": 3})
             .as_numpy_iterator())
  np.testing.assert_array_equal(got[0]["encoder_input_tokens"],
                                [[5, 6, 1], [9, 1, 0], [3, 1, 0]])
  np.testing.assert_array_equal(got[0]["passage_mask"], [True, True, True])
  np.testing.assert_array_equal(got[0]["decoder_target_tokens"], [5, 6, 1])
  np.testing.assert_array_equal(got[1]["encoder_input_tokens"],
                                [[2, 2, 1], [0, 0, 0], [0, 0, 0]])
  np.testing.assert_array_equal(got[1]["passage_mask"], [True, False, False])
  np.testing.assert_array_equal(got[1]["decoder_target_tokens"], [8, 1, 0])
  with pytest.raises(ValueError, match="n_context"):
    FidFeatureConverter()(ds, {"inputs": 3, "targets": 3})


def test_metrics_direct():
  targets = [["Paris", "City of Paris"], ["blue whale"], []]
  predictions = ["the paris", "whale", "anything"]
  assert metrics.exact_match(targets, predictions) == {"exact_match": 0.5}
  assert metrics.f1(targets, predictions)["f1"] == pytest.approx(
      (1.0 + 2 / 3) / 2)
  assert np.isnan(metrics.exact_match([[]], ["x"])["exact_match"])
  ex = {"answers": np.array([b"a", b"b"]), "target": b"t"}
  assert metrics.postprocess_answer("t", example=ex, is_target=True) == [
      "a", "b"]
  ex = {"answers": np.zeros([0], object), "target": b"t"}
  assert metrics.postprocess_answer("t", example=ex, is_target=True) == ["t"]
  assert metrics.postprocess_answer(b" x ", is_target=False) == "x"


def test_seqio_evaluator_with_fixed_predictions(data_dir, tokenizer):
  evaluator = seqio.Evaluator(
      "nq_open_fid", FidFeatureConverter(), eval_split="validation",
      sequence_length=LENGTHS, async_compute_metrics=False)
  # fixed-length (padded) token rows: ragged ones break under NumPy 2
  predictions = encode_padded(
      tokenizer, ["william shakespeare!", "whale", "no match"], 8)
  seen = []

  def predict_fn(ds):
    out = []
    for index, features in ds.as_numpy_iterator():
      seen.append(features["encoder_input_tokens"].shape)
      out.append((int(index), predictions[int(index)]))
    return out
  result, _ = evaluator.evaluate(compute_metrics=True, predict_fn=predict_fn)
  scores = result.result()["nq_open_fid"]
  assert seen == [(3, 12)] * 3
  assert scores["exact_match"] == pytest.approx(1 / 3)
  # F1: 1, 2/3 ("whale" vs "blue whale"), 0 (target "given target")
  assert scores["f1"] == pytest.approx((1 + 2 / 3) / 3)


# ------------------------------------------------------- TFDS + retrieval


def _tfds_like(name):
  if name == "nq":
    return tf.data.Dataset.from_tensor_slices({
        "question": ["who wrote hamlet", "where is  paris"],
        "answer": tf.ragged.constant([["Shakespeare"], ["France", "FR"]])})
  if name == "trivia_qa":
    return tf.data.Dataset.from_tensor_slices({
        "question": ["who wrote hamlet", "where is  paris"],
        "question_id": ["tq1", "tq2"],
        "answer": {"aliases": tf.ragged.constant([["Bard", "WS"],
                                                   ["France"]]),
                   "normalized_aliases": tf.ragged.constant([["bard", "ws"],
                                                              ["france"]]),
                   "value": ["WILLIAM SHAKESPEARE", "France"],
                   "normalized_value": ["william shakespeare", "france"],
                   "type": ["WikipediaEntity"] * 2}})
  return tf.data.Dataset.from_tensor_slices({
      "id": ["s1", "s2"], "title": ["Hamlet", "Paris"],
      "context": ["...", "..."],
      "question": ["who wrote hamlet", "where is  paris"],
      "answers": {"text": tf.ragged.constant([["Shakespeare"],
                                              ["France", "France"]]),
                  "answer_start": tf.ragged.constant([[0], [3, 3]])}})


RETRIEVAL = [
    {"id": "s2", "question": "where is paris ", "answers": [],
     "ctxs": [{"title": "P1", "text": "paris text", "score": 2.0},
              {"title": "P2", "text": "more paris", "score": 3.0},
              {"title": "P3", "text": "third", "score": 1.0}]},
    {"id": "s1", "question": "who wrote hamlet", "ctxs": []},
]


@pytest.mark.parametrize("name,key", [("nq", "question"),
                                      ("trivia_qa", "question"),
                                      ("squad", "id")])
def test_join_retrieval_on_tfds_shaped_data(tmp_path, name, key):
  path = tmp_path / "dev.jsonl"
  _write(path, RETRIEVAL)
  ds = sources.join_retrieval(sources.tfds_to_common(_tfds_like(name), name),
                              str(path), n_context=2, key=key)
  got = list(ds.as_numpy_iterator())
  assert got[0]["titles"].size == got[0]["texts"].size == 0
  # the record's 2 best passages, best first; the dataset's own question
  assert [_text(t) for t in got[1]["titles"]] == ["P2", "P1"]
  assert got[1]["scores"].tolist() == [3.0, 2.0]
  paris = fid_format.FidExample(
      question="where is  paris",
      ctxs=tuple(fid_format.Passage(c["title"], c["text"], c["score"])
                 for c in RETRIEVAL[0]["ctxs"]))
  assert fid_inputs.format_passages(
      sources.example_from_features(got[1]), 2) == (
          fid_inputs.format_passages(paris, 2))
  if name == "trivia_qa":
    assert [_text(a) for a in got[0]["answers"]] == ["Bard", "WS"]
    assert _text(got[0]["target"]) == "William Shakespeare"
    assert _text(got[1]["id"]) == "tq2"
  else:
    assert got[0]["target"] == b""
  if name == "squad":
    assert [_text(a) for a in got[1]["answers"]] == ["France", "France"]


def test_join_reports_missing_question(tmp_path):
  path = tmp_path / "dev.jsonl"
  _write(path, RETRIEVAL[1:])
  ds = sources.join_retrieval(sources.tfds_to_common(_tfds_like("nq"), "nq"),
                              str(path), n_context=2, key="question")
  with pytest.raises(tf.errors.InvalidArgumentError, match="where is paris"):
    list(ds.as_numpy_iterator())
  _write(path, [{"question": "who wrote hamlet"}])
  with pytest.raises(InputError, match="record 1: record has no \"id\""):
    sources.join_retrieval(_tfds_like("squad"), str(path), n_context=2,
                           key="id")


def test_tfds_task_end_to_end(tmp_path, monkeypatch):
  _write(tmp_path / "runs" / "nq" / "dev.jsonl", RETRIEVAL)
  monkeypatch.setenv(config.RETRIEVAL_DIR_ENV, str(tmp_path / "runs"))
  asked = []

  def fake_tfds(self, split="train", **kwargs):
    asked.append((self.tfds_dataset.name, split))
    return _tfds_like("nq")
  monkeypatch.setattr(seqio.TfdsDataSource, "get_dataset", fake_tfds)
  monkeypatch.setattr(seqio.TfdsDataSource, "num_input_examples",
                      lambda self, split: None)
  got = _examples("natural_questions_open_fid", split="validation")
  assert asked == [("natural_questions_open:1.0.0", "validation")]
  assert [len(ex["inputs"]) for ex in got] == [1, 3]
  assert _text(got[1]["inputs_pretokenized"][0]).endswith("more paris")
  assert _text(got[1]["targets_pretokenized"]) in ("France", "FR")
  # the trainer reads the same source (no TensorFlow-side formatting)
  (component,) = fid_task.read_mixture("natural_questions_open_fid",
                                       "validation")
  assert component.dataset == "nq"
  assert [e.question for e in component.examples] == [
      "who wrote hamlet", "where is  paris"]
  assert [p.title for p in component.examples[1].ctxs] == ["P2", "P1", "P3"]
  assert component.examples[1].answers == ("France", "FR")
  # an explicit file per task and split wins over the directory
  _write(tmp_path / "other.jsonl", RETRIEVAL[1:] + [
      {"question": "where is paris", "ctxs": [{"title": "X", "text": "x"}]}])
  gin.parse_config("tasks.config.fid_retrieval_files.files = "
                   f"{{'natural_questions_open_fid': {{'validation': "
                   f"'{tmp_path / 'other.jsonl'}'}}}}")
  try:
    got = _examples("natural_questions_open_fid", split="validation")
  finally:
    gin.parse_config("tasks.config.fid_retrieval_files.files = None")
  assert _text(got[1]["inputs_pretokenized"][0]).endswith("title: X context: x")
