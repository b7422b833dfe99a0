"""seqio tasks of ReFusion's few-shot classification (`tasks/lmbff.py`).

LM-BFF tasks read small directories written here (and the seed-13 samples
in ``tests/data/lmbff``); the TFDS-backed GLUE prompt tasks run on in-memory
datasets shaped like the TFDS features. Nothing is downloaded.
"""
import builtins
import pathlib

import gin
import numpy as np
import pytest
import seqio
import tensorflow as tf

import tasks
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer, encode_padded
from tasks import lmbff as lmbff_tasks

DATA = pathlib.Path(__file__).parent / "data" / "lmbff"
EOS = 1


@pytest.fixture(scope="module")
def tokenizer():
  return Tokenizer()


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding="utf-8")


@pytest.fixture
def kshot(tmp_path, monkeypatch):
  """A k-shot root with SST-2 seed 21, trec seed 87 and MNLI seed 100."""
  root = tmp_path / "k-shot"
  sst = root / "SST-2" / "16-21"
  _write(sst / "train.tsv", "sentence\tlabel\na gem .\t1\na mess .\t0\n")
  _write(sst / "dev.tsv", "sentence\tlabel\nloved it .\t1\n")
  _write(sst / "test.tsv", "sentence\tlabel\n" + " ".join(
      ["very"] * 60) + " long .\t0\n")
  _write(root / "trec" / "16-87" / "train.csv",
         '5,How far is it ?\n3,"Who, then ?"\n')
  header = "\t".join(["index", "promptID", "pairID", "genre", "s1b", "s2b",
                      "s1p", "s2p", "sentence1", "sentence2", "label1",
                      "gold_label"])
  row = "\t".join(["0"] * 8 + ["The cat sat.", "A cat is sitting.",
                               "entailment", "entailment"])
  bad = "\t".join(["0"] * 8 + ["The cat sat.", "Dogs fly.", "x", "neutral"])
  mnli = root / "MNLI" / "16-100"
  _write(mnli / "train.tsv", f"{header}\n{row}\n")
  _write(mnli / "dev_matched.tsv", f"{header}\n{bad}\n")
  _write(mnli / "test_mismatched.tsv", f"{header}\n{row}\n")
  monkeypatch.setenv(lmbff_tasks.LMBFF_DIR_ENV, str(root))
  return root


def _examples(task, split="train", lengths=None, **kwargs):
  kwargs.setdefault("shuffle", False)
  kwargs.setdefault("seed", 0)
  ds = seqio.get_mixture_or_task(task).get_dataset(
      lengths or {"inputs": 64, "targets": 4}, split=split, **kwargs)
  return list(ds.as_numpy_iterator())


def _text(b):
  return b.decode("utf-8")


# ---------------------------------------------------------------- registry


def test_names_and_registration_opens_nothing(monkeypatch):
  assert lmbff_tasks.lmbff_task_name("SST-2", 13) == "lmbff_sst_2_16_13"
  assert lmbff_tasks.lmbff_task_name("mnli_mm", 100) == (
      "lmbff_mnli_mm_16_100")
  assert lmbff_tasks.glue_task_name("mnli-mm") == "glue_mnli_mm_prompt"
  monkeypatch.delenv(lmbff_tasks.LMBFF_DIR_ENV, raising=False)

  def refuse(*args, **kwargs):
    raise AssertionError("registration opened a file or asked TFDS")
  monkeypatch.setattr(builtins, "open", refuse)
  monkeypatch.setattr(seqio.TfdsDataSource, "get_dataset", refuse)
  monkeypatch.setattr(tf.io.gfile, "exists", refuse)
  lmbff_tasks.output_features.cache_clear()  # the vocabulary is lazy too
  names = tasks.register_lmbff_tasks()
  assert tasks.register_lmbff_tasks() == names  # re-registration replaces
  monkeypatch.undo()
  assert len(names) == len(set(names)) == 15 * 5 + 9
  assert tuple(names) == tasks.LMBFF_TASK_NAMES
  assert {n for n in names if n.startswith("glue_")} == {
      "glue_sst_2_prompt", "glue_cola_prompt", "glue_mnli_prompt",
      "glue_mnli_mm_prompt", "glue_qnli_prompt", "glue_rte_prompt",
      "glue_mrpc_prompt", "glue_qqp_prompt", "glue_snli_prompt"}
  for name in ("lmbff_cola_16_42", "lmbff_sst_5_16_87", "glue_qqp_prompt"):
    task = seqio.TaskRegistry.get(name)
    assert set(task.output_features) == {"inputs", "targets"}
    assert task.output_features["inputs"].vocabulary.extra_ids == 100
    assert len(task.metric_fns) == 1
  assert seqio.TaskRegistry.get("lmbff_cola_16_42").metric_fns[
      0].__name__ == "classification_mcc"
  assert seqio.TaskRegistry.get("lmbff_qqp_16_13").source.splits == (
      "train", "validation", "test")
  # the QA tasks are still there
  assert "nq_open_fid" in seqio.TaskRegistry.names()
  with pytest.raises(InputError, match="JAXFID_LMBFF_DIR"):
    _examples("lmbff_sst_2_16_13")


# ------------------------------------------------------------ LM-BFF files


def test_sst2_features(kshot, tokenizer):
  got = _examples("lmbff_sst_2_16_21")
  assert [_text(ex["inputs_pretokenized"]) for ex in got] == [
      "a gem . It was <extra_id_0>.", "a mess . It was <extra_id_0>."]
  assert [_text(ex["targets_pretokenized"]) for ex in got] == [
      "great", "terrible"]
  assert [int(ex["label"]) for ex in got] == [1, 0]
  assert [_text(ex["id"]) for ex in got] == ["train.tsv:2", "train.tsv:3"]
  assert [_text(ex["text_a"]) for ex in got] == ["a gem .", "a mess ."]
  assert got[0]["text_b"] == b""
  for ex in got:
    np.testing.assert_array_equal(ex["inputs"], tokenizer.encode(
        _text(ex["inputs_pretokenized"])) + [EOS])
    np.testing.assert_array_equal(ex["targets"], tokenizer.encode(
        _text(ex["targets_pretokenized"])) + [EOS])
    assert ex["inputs"].dtype == np.int32
  (dev,) = _examples("lmbff_sst_2_16_21", split="validation")
  assert _text(dev["id"]) == "dev.tsv:2"


def test_long_input_keeps_the_mask(kshot, tokenizer):
  (ex,) = _examples("lmbff_sst_2_16_21", split="test",
                    lengths={"inputs": 16, "targets": 4})
  text = _text(ex["inputs_pretokenized"])
  assert text.startswith("very very") and text.endswith(
      " It was <extra_id_0>.")
  assert len(ex["inputs"]) <= 16 and ex["inputs"][-1] == EOS
  assert tokenizer.sentinel_id(0) in ex["inputs"].tolist()
  (full,) = _examples("lmbff_sst_2_16_21", split="test",
                      lengths={"inputs": 512, "targets": 4})
  assert _text(full["inputs_pretokenized"]).count("very") == 60


def test_csv_and_pair_tasks(kshot):
  got = _examples("lmbff_trec_16_87")
  assert [_text(ex["inputs_pretokenized"]) for ex in got] == [
      "<extra_id_0> How far is it ?", "<extra_id_0> Who, then ?"]
  assert [_text(ex["targets_pretokenized"]) for ex in got] == [
      "Number", "Human"]
  (ex,) = _examples("lmbff_mnli_mm_16_100", split="test")
  assert _text(ex["inputs_pretokenized"]) == (
      "The cat sat ? <extra_id_0>, a cat is sitting.")
  assert _text(ex["targets_pretokenized"]) == "Yes"
  assert int(ex["label"]) == 1
  assert (_text(ex["text_a"]), _text(ex["text_b"])) == (
      "The cat sat.", "A cat is sitting.")
  assert _text(ex["id"]) == "test_mismatched.tsv:2"
  # mnli-mm validates on dev_matched.tsv, as LM-BFF's k-shot data does
  (dev,) = _examples("lmbff_mnli_mm_16_100", split="validation")
  assert _text(dev["targets_pretokenized"]) == "Maybe"


def test_file_errors_surface_at_get_dataset(kshot):
  with pytest.raises(InputError, match="test.csv: missing; DATA_DIR must "
                     "hold the LM-BFF trec files"):
    _examples("lmbff_trec_16_87", split="test")
  with pytest.raises(InputError, match="16-13/train.tsv: missing"):
    _examples("lmbff_sst_2_16_13")
  _write(kshot / "SST-2" / "16-21" / "train.tsv",
         "sentence\tlabel\nfine\t1\nbroken\t2\n")
  with pytest.raises(InputError, match=r"train.tsv:3: label '2' is not one"):
    _examples("lmbff_sst_2_16_21")


def test_gin_binding_wins_over_environment(kshot):
  gin.parse_config(f"tasks.lmbff.lmbff_data_dir.path = '{DATA}'")
  try:
    got = _examples("lmbff_cola_16_13", split="validation")
  finally:
    gin.parse_config("tasks.lmbff.lmbff_data_dir.path = None")
  assert len(got) == 32
  assert sorted(int(ex["label"]) for ex in got) == [0] * 16 + [1] * 16
  assert {_text(ex["targets_pretokenized"]) for ex in got} == {
      "correct", "incorrect"}
  assert all(_text(ex["inputs_pretokenized"]).endswith(
      " It was <extra_id_0>.") for ex in got)


# --------------------------------------------------------------- metrics


def test_postprocess_and_metric_fns():
  post = lmbff_tasks.postprocess_fn("mrpc")
  assert post(b"Yes") == 1 and post(" no ") == 0 and post("maybe") == -1
  assert post(b"No", example={"label": np.int32(1)}, is_target=True) == 1
  fn = lmbff_tasks.metric_fn("mrpc")
  assert fn([1, 0, 1, 1], [1, 1, -1, 1]) == pytest.approx(
      {"accuracy": 0.5, "f1": 2 * 2 / (2 * 2 + 1 + 1)})


def test_ranked_label_words_decode_to_their_classes(tokenizer):
  """jaxfid eval's rank classification predicts a label word's ids; the
  task's own decoding and postprocessing must give back its class."""
  from jaxfid.refusion.batches import label_token_matrix
  assert set(lmbff_tasks.TASK_SPECS) == set(tasks.LMBFF_TASK_NAMES)
  assert lmbff_tasks.task_spec("nq_open_fid") is None
  for name in ("lmbff_mnli_16_13", "glue_mrpc_prompt") + tuple(
      lmbff_tasks.lmbff_task_name(t, 13) for t in
      ("sst-2", "sst-5", "mr", "cr", "mpqa", "subj", "trec", "cola", "snli",
       "qnli", "rte", "qqp")):
    task = seqio.TaskRegistry.get(name)
    spec = lmbff_tasks.task_spec(name)
    vocab = task.output_features["targets"].vocabulary
    rows = label_token_matrix(spec.label_words, tokenizer)
    assert [task.postprocess_fn(vocab.decode(row.tolist()))
            for row in rows] == list(range(len(spec.label_words))), name


def test_seqio_evaluator_with_fixed_predictions(kshot, tokenizer):
  _write(kshot / "MRPC" / "16-13" / "dev.tsv",
         "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
         "1\t1\t2\tA b .\tC d .\n0\t3\t4\tE f .\tG h .\n"
         "1\t5\t6\tI j .\tK l .\n")
  evaluator = seqio.Evaluator(
      "lmbff_mrpc_16_13", seqio.EncDecFeatureConverter(pack=False),
      eval_split="validation",
      sequence_length={"inputs": 32, "targets": 4},
      async_compute_metrics=False)
  predictions = encode_padded(tokenizer, ["Yes", "Yes", "nonsense"], 4)

  def predict_fn(ds):
    return [(int(i), predictions[int(i)]) for i, _ in ds.as_numpy_iterator()]
  result, _ = evaluator.evaluate(compute_metrics=True, predict_fn=predict_fn)
  scores = result.result()["lmbff_mrpc_16_13"]
  # labels 1, 0, 1 vs predictions 1, 1, -1: TP 1, FP 1, FN 1
  assert scores["accuracy"] == pytest.approx(1 / 3)
  assert scores["f1"] == pytest.approx(0.5)


# ------------------------------------------------------------ TFDS prompts


def _glue_like(name):
  if name == "mnli":
    return tf.data.Dataset.from_tensor_slices({
        "premise": ["The cat sat.", "It rained!", "Birds sing."],
        "hypothesis": ["A cat sits.", "Nothing fell.", "Some birds sing."],
        "label": np.array([0, 2, 1], np.int64), "idx": [7, 8, 9]})
  if name == "snli":
    return tf.data.Dataset.from_tensor_slices({
        "premise": ["A dog runs.", "Nobody agreed."],
        "hypothesis": ["An animal moves.", "Unclear."],
        "label": np.array([0, -1], np.int64)})
  return tf.data.Dataset.from_tensor_slices({  # glue/sst2
      "sentence": ["a gem . ", "hidden label ."],
      "label": np.array([1, -1], np.int64), "idx": [0, 1]})


@pytest.fixture
def fake_tfds(monkeypatch):
  asked = []

  def load(name, split, **kwargs):  # tfds.load, after seqio maps the split
    asked.append((name, split))
    return _glue_like("mnli" if "mnli" in name else
                      "snli" if "snli" in name else "sst2")
  monkeypatch.setattr(seqio.utils.tfds, "load", load)
  monkeypatch.setattr(seqio.TfdsDataSource, "num_input_examples",
                      lambda self, split: None)
  return asked


def test_glue_mnli_maps_labels_and_splits(fake_tfds):
  got = _examples("glue_mnli_mm_prompt", split="validation")
  assert fake_tfds == [("glue/mnli:2.0.0", "validation_mismatched")]
  # TFDS: entailment 0, neutral 1, contradiction 2; LM-BFF: contradiction 0,
  # entailment 1, neutral 2
  assert [int(ex["label"]) for ex in got] == [1, 0, 2]
  assert [_text(ex["targets_pretokenized"]) for ex in got] == [
      "Yes", "No", "Maybe"]
  assert [_text(ex["inputs_pretokenized"]) for ex in got] == [
      "The cat sat ? <extra_id_0>, a cat sits.",
      "It rained ? <extra_id_0>, nothing fell.",
      "Birds sing ? <extra_id_0>, some birds sing."]
  assert [_text(ex["id"]) for ex in got] == ["7", "8", "9"]
  _examples("glue_mnli_prompt", split="test")
  assert fake_tfds[-1] == ("glue/mnli:2.0.0", "test_matched")


def test_glue_hidden_labels_kept_snli_unlabelled_dropped(fake_tfds):
  got = _examples("glue_sst_2_prompt", split="test")
  assert [_text(ex["inputs_pretokenized"]) for ex in got] == [
      "a gem . It was <extra_id_0>.", "hidden label . It was <extra_id_0>."]
  assert [_text(ex["targets_pretokenized"]) for ex in got] == ["great", ""]
  assert [int(ex["label"]) for ex in got] == [1, -1]
  assert got[1]["targets"].tolist() == [EOS]
  got = _examples("glue_snli_prompt", split="train")
  assert fake_tfds[-1] == ("snli:1.1.0", "train")
  assert [_text(ex["targets_pretokenized"]) for ex in got] == ["Yes"]
  assert _text(got[0]["text_b"]) == "An animal moves."
  assert got[0]["id"] == b""
