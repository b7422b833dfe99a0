"""LM-BFF few-shot data, T5 prompts and classification metrics (pure Python).

Reads the seed-13 samples in ``tests/data/lmbff`` (real LM-BFF files; see the
README there) and small files written to tmp_path.
"""
import collections
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jaxfid.core.errors import InputError
from jaxfid.evaluation import classification as class_metrics
from jaxfid.refusion import lmbff
from jaxfid.evaluation.classification import classification_metrics, primary
from jaxfid.core.tokenization import Tokenizer

DATA = pathlib.Path(__file__).parent / "data" / "lmbff"
MASK = lmbff.SENTINEL
# blank sentences that LM-BFF's own files contain (kept, see lmbff's docstring)
BLANK_ROWS = {("cr", "train.csv:3")}
# tasks whose test file the source copy lacks (each is over 4 MiB)
NO_TEST = {"mnli", "mnli-mm", "snli", "qqp"}

TABLE_5 = {  # ReFusion Appendix A, Table 5: raw label -> label word
    "sst-2": {"0": "terrible", "1": "great"},
    "sst-5": {"0": "terrible", "1": "bad", "2": "okay", "3": "good",
              "4": "great"},
    "mr": {"0": "terrible", "1": "great"},
    "cr": {"0": "terrible", "1": "great"},
    "mpqa": {"0": "terrible", "1": "great"},
    "subj": {"0": "subjective", "1": "objective"},
    "trec": {"0": "Description", "1": "Entity", "2": "Expression",
             "3": "Human", "4": "Location", "5": "Number"},
    "cola": {"0": "incorrect", "1": "correct"},
    "mnli": {"contradiction": "No", "entailment": "Yes", "neutral": "Maybe"},
    "mnli-mm": {"contradiction": "No", "entailment": "Yes",
                "neutral": "Maybe"},
    "snli": {"contradiction": "No", "entailment": "Yes", "neutral": "Maybe"},
    "qnli": {"not_entailment": "No", "entailment": "Yes"},
    "rte": {"not_entailment": "No", "entailment": "Yes"},
    "mrpc": {"0": "No", "1": "Yes"},
    "qqp": {"0": "No", "1": "Yes"},
}


def _dir(name):
  return lmbff.seed_dir(DATA, lmbff.TASKS[name], 13)


def _write(path, text, encoding="utf-8"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding=encoding, newline="") as f:
    f.write(text)


# -------------------------------------------------------------- the tasks


def test_fifteen_tasks_with_table_5_label_words():
  assert lmbff.TASK_NAMES == tuple(TABLE_5)
  for name, spec in lmbff.TASKS.items():
    assert spec.name == name
    assert dict(zip(spec.labels, spec.label_words)) == TABLE_5[name]
    # single, distinct words
    assert all(w and len(w.split()) == 1 and w == w.strip()
               for w in spec.label_words)
    assert len(set(spec.label_words)) == len(spec.label_words)
    assert spec.pair == ("{x1}" in spec.template)
    assert spec.template.count("{mask}") == 1
    assert spec.metric in class_metrics.METRICS
  assert {n for n, s in lmbff.TASKS.items() if s.metric == "f1"} == {
      "mrpc", "qqp"}
  assert {n for n, s in lmbff.TASKS.items() if s.metric == "mcc"} == {"cola"}
  assert {n for n, s in lmbff.TASKS.items() if s.pair} == {
      "mnli", "mnli-mm", "snli", "qnli", "rte", "mrpc", "qqp"}


@pytest.mark.parametrize("alias,name", [
    ("SST-2", "sst-2"), ("sst2", "sst-2"), ("sst_2", "sst-2"),
    ("SST5", "sst-5"), ("CoLA", "cola"), ("MNLI-m", "mnli"),
    ("mnli_mm", "mnli-mm"), ("MNLI-MM", "mnli-mm"), (" trec ", "trec")])
def test_get_task_aliases(alias, name):
  assert lmbff.get_task(alias) is lmbff.TASKS[name]


def test_get_task_unknown():
  with pytest.raises(InputError) as e:
    lmbff.get_task("sts-b")
  assert str(e.value).startswith("TASK: unknown task 'sts-b'; one of sst-2,")


def test_split_paths_follow_lmbff_names():
  def name(task, split):
    return lmbff.split_path(lmbff.TASKS[task], "/d", split).name
  assert name("sst-5", "dev") == "dev.csv"
  assert name("sst-2", "test") == "test.tsv"
  assert name("mnli", "dev") == "dev_matched.tsv"
  assert name("mnli", "test") == "test_matched.tsv"
  assert name("mnli-mm", "dev") == "dev_matched.tsv"
  assert name("mnli-mm", "test") == "test_mismatched.tsv"
  assert name("snli", "dev") == "dev.tsv"
  with pytest.raises(InputError, match="unknown split 'validation'"):
    lmbff.split_path(lmbff.TASKS["mr"], "/d", "validation")


# ------------------------------------------------- the real 16-shot files


@pytest.mark.parametrize("name", lmbff.TASK_NAMES)
def test_every_template_renders_on_the_16_shot_files(name):
  spec = lmbff.TASKS[name]
  n_classes = len(spec.labels)
  splits = ["train", "dev"] + ([] if name in NO_TEST else ["test"])
  for split in splits:
    examples = lmbff.read_split(spec, _dir(name), split)
    if split == "test":
      assert len(examples) == 40
    else:
      counts = collections.Counter(e.label for e in examples)
      assert counts == {k: lmbff.SHOTS for k in range(n_classes)}, split
    file_name = lmbff.split_path(spec, _dir(name), split).name
    for e in examples:
      assert e.guid.startswith(file_name + ":")
      rendered = lmbff.render_input(spec, e)
      assert rendered.count(MASK) == 1
      assert rendered == rendered.strip() and "  " not in rendered
      assert 0 <= e.label < n_classes
      assert (e.text_b is not None) == spec.pair
      texts = [e.text_a] + ([e.text_b] if spec.pair else [])
      if (name, e.guid) in BLANK_ROWS:
        assert e.text_a == ""
        continue
      assert all(texts), e.guid  # no empty field
      assert all(t == t.strip() for t in texts)
      assert lmbff.segments(spec, e) == texts
      assert len(lmbff.render_input(spec, e, mask="[MASK]")) == len(
          rendered) - len(MASK) + len("[MASK]")
  if name in NO_TEST:
    with pytest.raises(InputError, match="missing; DATA_DIR must hold"):
      lmbff.read_split(spec, _dir(name), "test")


def test_rendered_examples_match_lmbff_templates():
  def first(name, split="train"):
    spec = lmbff.TASKS[name]
    return lmbff.render_input(spec, lmbff.read_split(spec, _dir(name),
                                                     split)[0])
  assert first("sst-2") == ("nothing happens , and it happens to flat "
                            "characters . It was <extra_id_0>.")
  assert first("mpqa") == "they can not be trusted It was <extra_id_0>."
  assert first("subj", "dev") == (
      "it has been a year since johnny and wayne created the ultimate bra "
      "for samantha's company . This is <extra_id_0>.")
  assert first("trec") == ("<extra_id_0> What 2th-century American poet "
                           "wrote a four-volume biography of Abraham Lincoln "
                           "?")
  assert first("cola", "dev") == ("I've never seen the taller man than my "
                                   "father. It was <extra_id_0>.")
  # pairs: x1 loses its final punctuation, x2 starts in lower case
  assert first("mnli") == (
      "Price caps may sound more attractive with every passing rate case ? "
      "<extra_id_0>, rate cases make price caps sound more attractive.")
  assert first("snli", "dev") == ("An activist boycotting HP regarding "
                                  "pollution ? <extra_id_0>, the activist is "
                                  "protesting.")
  assert first("qnli").startswith(
      "Sanskrit is the primary sacred language of which religion ? "
      "<extra_id_0>, sanskrit (/ˈsænskrɪt/;")
  # MRPC and QQP: x1 keeps its punctuation (LM-BFF's *sent_0*, issue #27)
  assert first("qqp") == ("Can I develope mobile apps with c++? <extra_id_0>, "
                          "how can I develop mobile apps with C++?")
  assert first("mrpc", "dev").startswith(
      "The retailer said it came to the decision after hearing the opinions "
      "of customers and associates . <extra_id_0>, the decision came after \" "
      "listening")


def test_pair_columns_found_by_header():
  mnli = lmbff.read_split(lmbff.TASKS["mnli"], _dir("mnli"), "train")[0]
  assert mnli.text_a.startswith("Price caps may sound")
  assert mnli.text_b == ("Rate cases make price caps sound more "
                         "attractive.")
  assert lmbff.TASKS["mnli"].labels[mnli.label] == "entailment"
  assert mnli.guid == "train.tsv:2"
  # SNLI rows with five annotator labels are wider than the header
  snli = lmbff.read_split(lmbff.TASKS["snli"], _dir("snli"), "dev")
  with open(_dir("snli") / "dev.tsv", encoding="utf-8") as f:
    lines = f.read().splitlines()
  wide = [i for i, line in enumerate(lines[1:]) if line.count("\t") == 14]
  assert wide  # the fixture has such rows
  for i in wide:
    fields = lines[i + 1].split("\t")
    assert snli[i].text_a == fields[7] and snli[i].text_b == fields[8]
    assert lmbff.TASKS["snli"].labels[snli[i].label] == fields[-1]
  # MRPC: the header starts with a BOM
  assert (_dir("mrpc") / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbf")
  mrpc = lmbff.read_split(lmbff.TASKS["mrpc"], _dir("mrpc"), "train")[0]
  assert mrpc.text_a.startswith("The court 's 1992 decision")
  assert mrpc.label == 1
  cola = lmbff.read_split(lmbff.TASKS["cola"], _dir("cola"), "train")[0]
  assert cola.text_a.startswith("Bill seems to be obnoxious")
  assert cola.guid == "train.tsv:1"  # no header


def test_lmbffs_blank_cr_sentence_is_kept():
  spec = lmbff.TASKS["cr"]
  examples = lmbff.read_split(spec, _dir("cr"), "train")
  blank = [e for e in examples if not e.text_a]
  assert [e.guid for e in blank] == ["train.csv:3"]
  assert lmbff.render_input(spec, blank[0]) == "It was <extra_id_0>."
  assert lmbff.segments(spec, blank[0]) == [""]
  # a quoted field with a comma is one field
  assert examples[1].text_a.startswith("still , at least from my")


def test_bundled_sst2_split():
  directory = lmbff.bundled_sst2_dir()
  assert directory.parts[-4:] == ("assets", "lmbff", "SST-2", "16-13")
  spec = lmbff.TASKS["sst-2"]
  sizes = {s: len(lmbff.read_split(spec, directory, s)) for s in lmbff.SPLITS}
  assert sizes == {"train": 32, "dev": 32, "test": 872}
  assert (directory / "train.tsv").read_bytes() == (
      _dir("sst-2") / "train.tsv").read_bytes()
  head = (directory / "test.tsv").read_text("utf-8").splitlines()[:41]
  assert head == (_dir("sst-2") / "test.tsv").read_text("utf-8").splitlines()
  assert (directory.parents[1] / "LICENSE.PowerfulPromptFT").is_file()


# -------------------------------------------------------------- bad input


@pytest.mark.parametrize("task,name,text,line,reason", [
    ("mr", "train.csv", "0,fine\n1,a,b\n", 2,
     "expected 2 comma-separated columns, found 3"),
    ("mr", "train.csv", "0,fine\n\n7,bad label\n", 3,
     "label '7' is not one of 0, 1"),
    ("mr", "train.csv", "0,fine\n1,\"open quote\n", 2, "bad CSV"),
    ("trec", "train.csv", "3,who ?\n6,what ?\n", 2,
     "label '6' is not one of 0, 1, 2, 3, 4, 5"),
    ("sst-2", "train.tsv", "sentence\tlabel\ngood\t1\nbad\n", 3,
     "expected 2 tab-separated columns, found 1"),
    ("sst-2", "train.tsv", "sentence\tlabel\ngood\tpositive\n", 2,
     "label 'positive' is not one of 0, 1"),
    ("sst-2", "train.tsv", "text\tlabel\ngood\t1\n", 1,
     "the header has no 'sentence' column (found text, label)"),
    ("qqp", "train.tsv", "\nid\tquestion1\tquestion2\tlabel\n", 2,
     "the header has no 'is_duplicate' column"),
    ("cola", "train.tsv", "src\t1\t\tfine.\nsrc\t1\tfine.\n", 2,
     "expected 4 tab-separated columns, found 3"),
    ("rte", "train.tsv", "index\tsentence1\tsentence2\tlabel\n"
     "0\ta.\tb.\tentailment\t\n", 2,
     "expected 4 tab-separated columns, found 5"),
    ("mnli", "train.tsv", "\t".join(
        ["index"] * 8 + ["sentence1", "sentence2", "label1", "gold_label"])
     + "\n" + "\t".join(["x"] * 8 + ["a.", "b."]) + "\n", 2,
     "expected 12 tab-separated columns, found 10"),
    ("qnli", "train.tsv", "index\tquestion\tsentence\tlabel\n"
     "0\tq?\ts.\tneutral\n", 2,
     "label 'neutral' is not one of entailment, not_entailment"),
])
def test_bad_rows_name_file_and_line(tmp_path, task, name, text, line,
                                     reason):
  _write(tmp_path / name, text)
  with pytest.raises(InputError) as e:
    lmbff.read_split(lmbff.TASKS[task], tmp_path, "train")
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"{tmp_path / name}:{line}: {reason}")
  assert e.value.where == line


def test_missing_empty_and_undecodable_files(tmp_path):
  spec = lmbff.TASKS["mnli-mm"]
  with pytest.raises(InputError) as e:
    lmbff.read_split(spec, tmp_path, "test")
  assert str(e.value) == (
      f"{tmp_path / 'test_mismatched.tsv'}: missing; DATA_DIR must hold the "
      "LM-BFF MNLI files (train.tsv, dev_matched.tsv, test_mismatched.tsv)")
  _write(tmp_path / "dev.tsv", "")
  with pytest.raises(InputError, match="dev.tsv: empty file; expected the "
                     "LM-BFF QQP header line"):
    lmbff.read_split(lmbff.TASKS["qqp"], tmp_path, "dev")
  _write(tmp_path / "dev.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\t"
         "is_duplicate\n\n")
  with pytest.raises(InputError, match="dev.tsv: no examples"):
    lmbff.read_split(lmbff.TASKS["qqp"], tmp_path, "dev")
  with open(tmp_path / "dev.csv", "wb") as f:
    f.write(b"0,caf\xe9\n")
  with pytest.raises(InputError, match=r"dev.csv: not UTF-8 text"):
    lmbff.read_split(lmbff.TASKS["mr"], tmp_path, "dev")
  (tmp_path / "test.csv").mkdir()  # not a file: reported as missing
  with pytest.raises(InputError, match=r"test.csv: missing"):
    lmbff.read_split(lmbff.TASKS["mr"], tmp_path, "test")


def test_blank_lines_skipped_and_line_numbers_kept(tmp_path):
  _write(tmp_path / "train.csv",
         '\n1,"multi\nline"\n\n0,  spaced out  \r\n')
  examples = lmbff.read_split(lmbff.TASKS["subj"], tmp_path, "train")
  assert [(e.guid, e.text_a, e.label) for e in examples] == [
      ("train.csv:2", "multi\nline", 1), ("train.csv:5", "spaced out", 0)]
  assert lmbff.render_input(lmbff.TASKS["subj"], examples[0]) == (
      "multi line This is <extra_id_0>.")


# -------------------------------------------------------------- rendering


def test_pair_rendering_rules():
  spec = lmbff.TASKS["rte"]
  ex = lmbff.Example("It rained!  ", "  Streets are wet.", 0, "x:1")
  assert lmbff.render_input(spec, ex) == (
      "It rained ? <extra_id_0>, streets are wet.")
  # only a final punctuation character goes; x2 keeps the rest of its case
  ex = lmbff.Example("No full stop", "NASA said so", 0, "x:2")
  assert lmbff.render_input(spec, ex) == (
      "No full stop ? <extra_id_0>, nASA said so")
  # MRPC and QQP keep x1's final punctuation (LM-BFF's *sent_0*)
  for name in ("mrpc", "qqp"):
    assert lmbff.render_text(lmbff.TASKS[name], "A b .", "C d .") == (
        "A b . <extra_id_0>, c d .")
  with pytest.raises(ValueError, match="needs a sentence pair"):
    lmbff.render_text(spec, "only one")


def test_the_original_codes_templates_differ_for_cola_and_trec():
  for name in lmbff.TASK_NAMES:
    paper, original = lmbff.get_task(name), lmbff.get_task(name, "original")
    assert paper == lmbff.TASKS[name]
    if name not in ("cola", "trec"):
      assert original == paper
  # Table 5 vs run_roberta_refusion.sh (LM-BFF's manual templates).
  assert lmbff.render_text(lmbff.get_task("cola"), "He left .") == (
      "He left . It was <extra_id_0>.")
  assert lmbff.render_text(lmbff.get_task("cola", "original"), "He left .") == (
      "He left . This is <extra_id_0>.")
  assert lmbff.render_text(lmbff.get_task("trec"), "Who ?") == (
      "<extra_id_0> Who ?")
  assert lmbff.render_text(lmbff.get_task("trec", "original"), "Who ?") == (
      "<extra_id_0>: Who ?")
  with pytest.raises(InputError, match="TEMPLATES"):
    lmbff.get_task("cola", "lmbff")


T5_SCRIPT = {  # run_t5_refusion.sh's MAPPING: raw label -> label word
    "sst-2": {"0": "negative", "1": "positive"},
    "sst-5": {"0": "terrible", "1": "bad", "2": "okay", "3": "good",
              "4": "great"},
    "subj": {"0": "subjective", "1": "objective"},
    "trec": {"0": "description", "1": "entity", "2": "expression",
             "3": "person", "4": "location", "5": "quantity"},
    "cola": {"0": "unacceptable", "1": "acceptable"},
    "mnli": {"contradiction": "No", "entailment": "Yes", "neutral": "Maybe"},
    "rte": {"not_entailment": "No", "entailment": "Yes"},
    "mrpc": {"0": "No", "1": "Yes"},
}


def test_the_original_t5_scripts_templates_and_label_words():
  """Issue #27 item 4: TEMPLATES='original_t5' is run_t5_refusion.sh's
  TEMPLATE (up to *sep*) and MAPPING; every label word is one T5 token
  (the original asserts it), and the pair rules are the tasks' own."""
  t5 = {name: lmbff.get_task(name, "original_t5") for name in lmbff.TASK_NAMES}
  for name, words in T5_SCRIPT.items():
    assert dict(zip(t5[name].labels, t5[name].label_words)) == words, name
  for name in ("mr", "cr", "mpqa"):
    assert t5[name].label_words == ("negative", "positive")
  tokenizer = Tokenizer()
  assert all(len(tokenizer.encode(w)) == 1
             for spec in t5.values() for w in spec.label_words)
  assert all("{mask}" not in spec.template for spec in t5.values())
  render = lambda name, *texts: lmbff.render_text(t5[name], *texts)
  assert render("sst-2", "A fine film .") == (
      "Does the following sentence have a positive or negative sentiment ? "
      "A fine film . The answer is")
  assert render("sst-5", "A fine film .") == (   # no space: as the script
      "What sentiment does this sentence have? terrible, bad, okay, good or "
      "greatA fine film . The answer is")
  assert render("subj", "It is .") == (
      "Is this a subjective or objective description ? It is . The answer is")
  assert render("trec", "Who ?") == (
      "Which category best describes the following question: Who ? Choose "
      "from the following list: description, entity, expression, person, "
      "location, quantity. The answer is")
  assert render("cola", "He left .") == (
      "The following sentence is either acceptable, meaning it is "
      "grammatically correct and makes sense, or unacceptable. Which is "
      "it?He left . The answer is")
  assert render("rte", "It rained!", "Streets are wet.") == (
      "It rained ?, streets are wet.")                  # *sent-_0*
  assert render("qqp", "Is it?", "Was it?") == "Is it? ?, was it?"  # *sent_0*
  # the other tasks' examples are unchanged by the choice
  assert lmbff.get_task("sst-2", "original") is lmbff.TASKS["sst-2"]


def test_label_words_and_back():
  spec = lmbff.TASKS["trec"]
  assert [lmbff.label_word(spec, i) for i in range(6)] == list(
      spec.label_words)
  with pytest.raises(ValueError, match="classes 0...5, got 6"):
    lmbff.label_word(spec, 6)
  with pytest.raises(ValueError):
    lmbff.label_word(spec, -1)
  assert lmbff.word_label(spec, "Human") == 3
  assert lmbff.word_label(spec, " human ") == 3
  assert lmbff.word_label(spec, "Person") == -1
  assert lmbff.word_label(lmbff.TASKS["mnli"], "Maybe") == 2


def _count_words(text):
  return len(text.split())


def test_render_fitted_cuts_sentences_not_template():
  spec = lmbff.TASKS["sst-2"]
  ex = lmbff.Example("one two three four five six seven", None, 1, "x:1")
  # "<words> It was <extra_id_0>." has 3 template words
  assert lmbff.render_fitted(spec, ex, 10, _count_words) == (
      lmbff.render_input(spec, ex))
  assert lmbff.render_fitted(spec, ex, 6, _count_words) == (
      "one two three It was <extra_id_0>.")
  assert lmbff.render_fitted(spec, ex, 3, _count_words) == (
      "It was <extra_id_0>.")
  with pytest.raises(ValueError, match="template alone is longer than 2"):
    lmbff.render_fitted(spec, ex, 2, _count_words)
  # pairs: the longer sentence is cut first
  spec = lmbff.TASKS["rte"]
  ex = lmbff.Example("a b c d e f g h.", "Short one.", 0, "x:2")
  got = lmbff.render_fitted(spec, ex, 8, _count_words)
  assert got == "a b c d ? <extra_id_0>, short one."  # 8 words
  got = lmbff.render_fitted(spec, ex, 5, _count_words)
  assert got == "a ? <extra_id_0>, short"


def test_render_fitted_with_t5_tokens():
  tokenizer = Tokenizer()
  spec = lmbff.TASKS["mnli"]
  for ex in lmbff.read_split(spec, _dir("mnli"), "dev"):
    text = lmbff.render_fitted(spec, ex, 24,
                               lambda s: len(tokenizer.encode(s)))
    ids = tokenizer.encode(text)
    assert len(ids) <= 24
    assert ids.count(tokenizer.sentinel_id(0)) == 1
    assert ", " in text and " ? " in text


# ---------------------------------------------------------------- metrics


def test_accuracy_and_f1_by_hand():
  # TP = 2 (0, 3), FP = 1 (1), FN = 1 (4), TN = 2 (2, 5)
  predictions = [1, 1, 0, 1, 0, 0]
  labels = [1, 0, 0, 1, 1, 0]
  scores = classification_metrics("f1", predictions, labels)
  assert scores == pytest.approx({"accuracy": 4 / 6, "f1": 2 * 2 / (
      2 * 2 + 1 + 1)})
  assert set(classification_metrics("accuracy", predictions, labels)) == {
      "accuracy"}
  # -1 (no label word) is wrong and not positive
  assert classification_metrics("f1", [-1, 1], [1, 1]) == pytest.approx(
      {"accuracy": 0.5, "f1": 2 / 3})
  # no positive anywhere: F1 is 0, not NaN
  assert classification_metrics("f1", [0, 0], [0, 0]) == {
      "accuracy": 1.0, "f1": 0.0}


def test_mcc_by_hand():
  predictions = [1, 1, 0, 1, 0, 0]
  labels = [1, 0, 0, 1, 1, 0]
  # (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (4 - 1) / 9
  got = classification_metrics("mcc", predictions, labels)
  assert got == pytest.approx({"accuracy": 4 / 6, "mcc": 1 / 3})
  assert classification_metrics("mcc", labels, labels)["mcc"] == 1.0
  assert classification_metrics("mcc", [1 - x for x in labels], labels)[
      "mcc"] == pytest.approx(-1.0)
  assert classification_metrics("mcc", [1] * 6, labels)["mcc"] == 0.0
  # three classes: s=4, c=2, p=(2,1,1), t=(1,2,1): (8-5)/sqrt(10*10) = 0.3
  assert classification_metrics("mcc", [0, 1, 2, 0], [0, 1, 1, 2])[
      "mcc"] == pytest.approx(0.3)
  assert isinstance(got["mcc"], float)


def test_metric_errors_and_primary():
  with pytest.raises(ValueError, match="unknown metric 'auc'"):
    classification_metrics("auc", [1], [1])
  with pytest.raises(ValueError, match="2 predictions for 1 labels"):
    classification_metrics("accuracy", [1, 0], [1])
  with pytest.raises(ValueError, match="no examples"):
    classification_metrics("accuracy", [], [])
  scores = classification_metrics("mcc", np.array([0, 1]), np.array([0, 1]))
  assert primary("mcc", scores) == 1.0
  assert primary("accuracy", scores) == 1.0
  with pytest.raises(KeyError, match="no 'f1'"):
    primary("f1", scores)
  with pytest.raises(ValueError, match="unknown metric"):
    primary("F1", scores)


def test_imports_stay_light():
  code = ("import sys\nimport jaxfid.refusion.lmbff, "
          "jaxfid.evaluation.classification\nprint(' '.join(sys.modules))")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(pathlib.Path(__file__).parents[1])] +
      [p for p in [os.environ.get("PYTHONPATH")] if p]))
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       capture_output=True, text=True, timeout=60).stdout
  for heavy in ("tensorflow", "seqio", "jax", "torch"):
    assert heavy not in out.split(), heavy
