"""ReFusion's few-shot classification tasks: LM-BFF files, prompts, label words.

The 15 LM-BFF tasks (Gao et al., 2021) as ReFusion evaluates them: the
task's template with the mask as T5's ``<extra_id_0>`` is the input, the
label word the target, and label words are ranked by log-likelihood.
``data_dir`` is LM-BFF's ``data/k-shot/<TASK>/16-<seed>/`` (names and
columns per task: :data:`_LAYOUTS`; TSV split on tabs, no quoting; blank
sentences kept, as in LM-BFF's CR). Prompts have whitespace runs collapsed
and are never cut at a token limit (:func:`render_text_fitted` drops words).
"""
from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
import unicodedata
from collections.abc import Callable
from importlib import resources

from jaxfid.core.errors import InputError
from jaxfid.refusion import template_sets
from jaxfid.refusion.template_sets import TEMPLATE_SETS

SENTINEL = "<extra_id_0>"
SEEDS = (13, 21, 42, 87, 100)
SHOTS = 16
SPLITS = ("train", "dev", "test")
METRICS = ("accuracy", "f1", "mcc")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One LM-BFF task: where its files are, its classes, prompt and metric.

  Attributes:
    name: canonical lower-case name (``'sst-2'``, ``'mnli-mm'``, ...).
    lmbff_dir: the task's directory in LM-BFF's ``k-shot`` tree.
    labels: the raw label values of the files, in class-index order.
    label_words: the label word of each class.
    template: ``{x}`` or ``{x1}``/``{x2}`` (pairs) and ``{mask}``.
    metric: ``'accuracy'``, ``'f1'`` (MRPC, QQP) or ``'mcc'`` (CoLA).
    pair: whether examples are sentence pairs.
    keep_x1_punctuation: pairs: ``x1`` keeps its final punctuation.
  """
  name: str
  lmbff_dir: str
  labels: tuple[str, ...]
  label_words: tuple[str, ...]
  template: str
  metric: str
  pair: bool
  keep_x1_punctuation: bool = False


@dataclasses.dataclass(frozen=True)
class Example:
  """One labelled example; ``guid`` is ``"<file name>:<line number>"``."""
  text_a: str
  text_b: str | None
  label: int
  guid: str


# -------------------------------------------------------------------- tasks

_SENTIMENT = ("terrible", "great")
_IT_WAS = "{x} It was {mask}."
_NLI = "{x1} ? {mask}, {x2}"
_PARAPHRASE = "{x1} {mask}, {x2}"
_NLI3 = ("contradiction", "entailment", "neutral")
_NLI3_WORDS = ("No", "Yes", "Maybe")
_NLI2 = ("entailment", "not_entailment")
_NLI2_WORDS = ("Yes", "No")


def _spec(name, lmbff_dir, labels, words, template, metric="accuracy",
          keep_x1=False):
  return TaskSpec(name=name, lmbff_dir=lmbff_dir, labels=tuple(labels),
                  label_words=tuple(words), template=template, metric=metric,
                  pair="{x1}" in template, keep_x1_punctuation=keep_x1)


TASKS: dict[str, TaskSpec] = {s.name: s for s in (
    _spec("sst-2", "SST-2", "01", _SENTIMENT, _IT_WAS),
    _spec("sst-5", "sst-5", "01234",
          ("terrible", "bad", "okay", "good", "great"), _IT_WAS),
    _spec("mr", "mr", "01", _SENTIMENT, _IT_WAS),
    _spec("cr", "cr", "01", _SENTIMENT, _IT_WAS),
    _spec("mpqa", "mpqa", "01", _SENTIMENT, _IT_WAS),
    _spec("subj", "subj", "01", ("subjective", "objective"),
          "{x} This is {mask}."),
    _spec("trec", "trec", "012345",
          ("Description", "Entity", "Expression", "Human", "Location",
           "Number"), "{mask} {x}"),
    _spec("cola", "CoLA", "01", ("incorrect", "correct"), _IT_WAS, "mcc"),
    _spec("mnli", "MNLI", _NLI3, _NLI3_WORDS, _NLI),
    _spec("mnli-mm", "MNLI", _NLI3, _NLI3_WORDS, _NLI),
    _spec("snli", "SNLI", _NLI3, _NLI3_WORDS, _NLI),
    _spec("qnli", "QNLI", _NLI2, _NLI2_WORDS, _NLI),
    _spec("rte", "RTE", _NLI2, _NLI2_WORDS, _NLI),
    # LM-BFF's *sent_0* (Table 5 too): x1 keeps its final punctuation
    _spec("mrpc", "MRPC", "01", ("No", "Yes"), _PARAPHRASE, "f1", True),
    _spec("qqp", "QQP", "01", ("No", "Yes"), _PARAPHRASE, "f1", True),
)}
TASK_NAMES = tuple(TASKS)

_ALIASES = {
    "sst2": "sst-2", "sst5": "sst-5", "mnli-m": "mnli",
    "mnli-matched": "mnli", "mnlim": "mnli", "mnli-mismatched": "mnli-mm",
    "mnlimm": "mnli-mm",
}


def get_task(name: str, templates: str = "paper") -> TaskSpec:
  """The task called ``name`` (any case, ``_`` for ``-``, ``sst2``,
  ``mnli-m``) with ``templates`` ``'paper'`` (Table 5), ``'original'`` or
  ``'original_t5'`` (the original RoBERTa / T5 scripts'); InputError for an
  unknown task or set."""
  key = str(name).strip().lower().replace("_", "-")
  key = _ALIASES.get(key, key)
  if key not in TASKS:
    raise InputError("TASK", f"unknown task {name!r}; one of "
                     f"{', '.join(TASK_NAMES)}")
  if templates not in TEMPLATE_SETS:
    raise InputError("TEMPLATES", f"one of {TEMPLATE_SETS}, got "
                     f"{templates!r}")
  changes = template_sets.overrides(key, templates)
  return dataclasses.replace(TASKS[key], **changes) if changes else TASKS[key]


# ------------------------------------------------------------------ layouts

LAST = -1  # the label is the last column of the row


@dataclasses.dataclass(frozen=True)
class _Layout:
  """A task's file names and ``columns`` (text_a, text_b, label): header
  names with ``header``, else 0-based positions (``LAST``: the last)."""
  files: tuple[str, str, str]  # train, dev, test
  csv: bool
  header: bool
  columns: tuple
  width: int = 0


def _names(suffix: str) -> tuple[str, str, str]:
  return tuple(f"{split}.{suffix}" for split in SPLITS)


_CSV = _Layout(_names("csv"), csv=True, header=False, columns=(1, None, 0),
               width=2)
_MNLI_FILES = ("train.tsv", "dev_matched.tsv")
_NLI_COLUMNS = ("sentence1", "sentence2", LAST)
_LAYOUTS = {
    "sst-2": _Layout(_names("tsv"), False, True, ("sentence", None, "label")),
    "cola": _Layout(_names("tsv"), False, False, (3, None, 1), width=4),
    "mnli": _Layout(_MNLI_FILES + ("test_matched.tsv",), False, True,
                    _NLI_COLUMNS),
    "mnli-mm": _Layout(_MNLI_FILES + ("test_mismatched.tsv",), False, True,
                       _NLI_COLUMNS),
    "snli": _Layout(_names("tsv"), False, True, _NLI_COLUMNS),
    "qnli": _Layout(_names("tsv"), False, True,
                    ("question", "sentence", "label")),
    "rte": _Layout(_names("tsv"), False, True,
                   ("sentence1", "sentence2", "label")),
    "mrpc": _Layout(_names("tsv"), False, True,
                    ("#1 String", "#2 String", "Quality")),
    "qqp": _Layout(_names("tsv"), False, True,
                   ("question1", "question2", "is_duplicate")),
}
for _name in ("sst-5", "mr", "cr", "mpqa", "subj", "trec"):
  _LAYOUTS[_name] = _CSV


def seed_dir(root, spec: TaskSpec, seed: int, shots: int = SHOTS
             ) -> pathlib.Path:
  """``root/<lmbff_dir>/<shots>-<seed>``: one split of LM-BFF's k-shot tree."""
  return pathlib.Path(root) / spec.lmbff_dir / f"{shots}-{seed}"


def bundled_sst2_dir() -> pathlib.Path:
  """The SST-2 16-shot seed-13 files shipped in ``jaxfid/assets/lmbff``."""
  return pathlib.Path(str(resources.files("jaxfid") / "assets" / "lmbff" /
                          "SST-2" / "16-13"))


def split_path(spec: TaskSpec, data_dir, split: str) -> pathlib.Path:
  """The file of ``split`` (``train``/``dev``/``test``, else InputError) in
  ``data_dir``."""
  if split not in SPLITS:
    raise InputError(os.fspath(data_dir), f"unknown split {split!r}; one of "
                     f"{', '.join(SPLITS)}")
  return pathlib.Path(data_dir) / _LAYOUTS[spec.name].files[
      SPLITS.index(split)]


def _rows(path: pathlib.Path, layout: _Layout):
  """``(line number, fields)`` of each non-blank line (CSV or TSV)."""
  # csv needs newline=""; TSV lines end at "\n" only (a stray "\r" is text)
  with open(path, encoding="utf-8-sig",
            newline="" if layout.csv else "\n") as f:
    if layout.csv:
      reader = csv.reader(f, strict=True)
      start = 1
      try:
        for row in reader:
          if any(field.strip() for field in row):
            yield start, row
          start = reader.line_num + 1
      except csv.Error as e:
        raise InputError(path, f"bad CSV: {e}", where=reader.line_num) from e
    else:
      for number, line in enumerate(f, 1):
        line = line.rstrip("\n").rstrip("\r")
        if line.strip():
          yield number, line.split("\t")


def _column_index(path, header: list[str], name, spec: TaskSpec,
                  line: int) -> int:
  if name == LAST:
    return LAST
  stripped = [h.strip() for h in header]
  if name not in stripped:
    raise InputError(path, f"the header has no {name!r} column (found "
                     f"{', '.join(stripped)}); expected the LM-BFF "
                     f"{spec.lmbff_dir} layout", where=line)
  return stripped.index(name)


def read_split(spec: TaskSpec, data_dir, split: str) -> list[Example]:
  """The examples of ``split`` of the task in ``data_dir``; InputError for
  a missing file or a bad header, row or label."""
  layout = _LAYOUTS[spec.name]
  path = split_path(spec, data_dir, split)
  if not path.is_file():
    raise InputError(path, f"missing; DATA_DIR must hold the LM-BFF "
                     f"{spec.lmbff_dir} files ({', '.join(layout.files)})")
  labels = {label: i for i, label in enumerate(spec.labels)}
  examples = []
  try:
    rows = _rows(path, layout)
    width, columns = layout.width, layout.columns
    if layout.header:
      header = next(rows, None)
      if header is None:
        raise InputError(path, f"empty file; expected the LM-BFF "
                         f"{spec.lmbff_dir} header line")
      line, header = header
      width = len(header)
      columns = tuple(None if c is None else
                      _column_index(path, header, c, spec, line)
                      for c in columns)
    wide_ok = columns[2] == LAST
    for number, row in rows:
      if len(row) < width or (len(row) > width and not wide_ok):
        sep = "comma" if layout.csv else "tab"
        raise InputError(path, f"expected {width} {sep}-separated columns, "
                         f"found {len(row)}", where=number)
      a, b, lab = columns
      raw = row[lab].strip()
      if raw not in labels:
        raise InputError(path, f"label {raw!r} is not one of "
                         f"{', '.join(spec.labels)}", where=number)
      examples.append(Example(
          text_a=row[a].strip(),
          text_b=None if b is None else row[b].strip(),
          label=labels[raw], guid=f"{path.name}:{number}"))
  except UnicodeDecodeError as e:
    raise InputError(path, f"not UTF-8 text ({e.reason} at byte "
                     f"{e.start})") from e
  except OSError as e:
    raise InputError(path, f"cannot read: {e.strerror or e}") from e
  if not examples:
    raise InputError(path, "no examples")
  return examples


# ---------------------------------------------------------------- rendering


def _drop_final_punctuation(text: str) -> str:
  """LM-BFF's ``*sent-_0*``: the text without its last (punctuation) char."""
  text = text.rstrip()
  if text and unicodedata.category(text[-1]).startswith("P"):
    text = text[:-1]
  return text.rstrip()


def _lower_first(text: str) -> str:
  """LM-BFF's ``*+sentl_1*``: the first character in lower case."""
  text = text.lstrip()
  return text[:1].lower() + text[1:]


def render_text(spec: TaskSpec, text_a: str, text_b: str | None = None,
                mask: str = SENTINEL) -> str:
  """The task's template filled with ``text_a`` (``text_b``) and ``mask``;
  ValueError for a pair task without ``text_b``."""
  if spec.pair:
    if text_b is None:
      raise ValueError(f"task {spec.name} needs a sentence pair")
    x1 = (text_a.strip() if spec.keep_x1_punctuation
          else _drop_final_punctuation(text_a))
    out = spec.template.format(x1=x1, x2=_lower_first(text_b), mask=mask)
  else:
    out = spec.template.format(x=text_a.strip(), mask=mask)
  return " ".join(out.split())


def render_input(spec: TaskSpec, example: Example,
                 mask: str = SENTINEL) -> str:
  """The encoder input of ``example``: the template with ``mask`` in it."""
  return render_text(spec, example.text_a, example.text_b, mask)


def render_text_fitted(spec: TaskSpec, text_a: str, text_b: str | None,
                       max_tokens: int, count_tokens: Callable[[str], int],
                       mask: str = SENTINEL) -> str:
  """:func:`render_text` with every sentence cut to the most words ``L``
  (bisection) that fit ``max_tokens`` by ``count_tokens``, so the template
  and mask survive; ValueError if the bare template does not fit."""
  rendered = render_text(spec, text_a, text_b, mask)
  if count_tokens(rendered) <= max_tokens:
    return rendered
  words = [text_a.split()] + ([(text_b or "").split()] if spec.pair else [])

  def render_cut(limit: int) -> str:
    cut = [" ".join(w[:limit]) for w in words]
    return render_text(spec, cut[0], cut[1] if spec.pair else None, mask)
  low, high = 0, max(len(w) for w in words)  # render_cut(high) is too long
  if count_tokens(render_cut(0)) > max_tokens:
    raise ValueError(f"the {spec.name} template alone is longer than "
                     f"{max_tokens} tokens")
  while high - low > 1:
    middle = (low + high) // 2
    if count_tokens(render_cut(middle)) <= max_tokens:
      low = middle
    else:
      high = middle
  return render_cut(low)


def render_fitted(spec: TaskSpec, example: Example, max_tokens: int,
                  count_tokens: Callable[[str], int],
                  mask: str = SENTINEL) -> str:
  """:func:`render_input` within ``max_tokens`` (see
  :func:`render_text_fitted`)."""
  return render_text_fitted(spec, example.text_a, example.text_b, max_tokens,
                            count_tokens, mask)


def label_word(spec: TaskSpec, label: int) -> str:
  """The label word (decoder target) of class ``label``; ValueError for
  another value."""
  if not 0 <= int(label) < len(spec.label_words):
    raise ValueError(f"task {spec.name} has classes 0..."
                     f"{len(spec.label_words) - 1}, got {label}")
  return spec.label_words[int(label)]


def word_label(spec: TaskSpec, text: str) -> int:
  """The class whose label word is ``text`` (stripped; then ignoring
  case), -1 for none."""
  text = " ".join(str(text).split())
  if text in spec.label_words:
    return spec.label_words.index(text)
  folded = [w.casefold() for w in spec.label_words]
  return folded.index(text.casefold()) if text.casefold() in folded else -1


def segments(spec: TaskSpec, example: Example) -> list[str]:
  """ReFusion's retrieval queries, one per sentence: ``[text_a]`` or
  ``[text_a, text_b]`` (a blank sentence gives an empty query)."""
  if spec.pair:
    return [example.text_a, example.text_b or ""]
  return [example.text_a]
