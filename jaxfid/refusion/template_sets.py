"""The template sets of ReFusion's tasks (``TEMPLATES``) other than the paper's.

``'paper'`` (default) is ReFusion's Table 5 (:data:`jaxfid.refusion.lmbff.
TASKS`). :func:`overrides` replaces fields for ``'original'`` (the original
RoBERTa script's templates) and ``'original_t5'`` (its T5 script's
mask-free instruction templates, verbatim, and label words). Pure data.
"""
from __future__ import annotations

TEMPLATE_SETS = ("paper", "original", "original_t5")

_ORIGINAL = {
    "cola": {"template": "{x} This is {mask}."},   # Table 5: "It was"
    "trec": {"template": "{mask}: {x}"},           # Table 5: no colon
}


def _t5(template: str, *words: str) -> dict:
  return {"template": template, "label_words": tuple(words)}


_SENTIMENT_T5 = _t5("Does the following sentence have a positive or negative "
                    "sentiment ? {x} The answer is", "negative", "positive")
_PAIR_T5 = "{x1} ?, {x2}"
_ORIGINAL_T5 = {
    "sst-2": _SENTIMENT_T5, "mr": _SENTIMENT_T5, "cr": _SENTIMENT_T5,
    "mpqa": _SENTIMENT_T5,
    "sst-5": _t5("What sentiment does this sentence have? terrible, bad, "
                 "okay, good or great{x} The answer is",
                 "terrible", "bad", "okay", "good", "great"),
    "subj": _t5("Is this a subjective or objective description ? {x} The "
                "answer is", "subjective", "objective"),
    "trec": _t5("Which category best describes the following question: {x} "
                "Choose from the following list: description, entity, "
                "expression, person, location, quantity. The answer is",
                "description", "entity", "expression", "person", "location",
                "quantity"),
    "cola": _t5("The following sentence is either acceptable, meaning it is "
                "grammatically correct and makes sense, or unacceptable. "
                "Which is it?{x} The answer is", "unacceptable", "acceptable"),
    # The label words in the order of the tasks' labels (lmbff.TASKS):
    # contradiction, entailment, neutral / entailment, not_entailment / 0, 1.
    **{name: _t5(_PAIR_T5, "No", "Yes", "Maybe")
       for name in ("mnli", "mnli-mm", "snli")},
    **{name: _t5(_PAIR_T5, "Yes", "No") for name in ("qnli", "rte")},
    "mrpc": _t5(_PAIR_T5, "No", "Yes"), "qqp": _t5(_PAIR_T5, "No", "Yes"),
}


def input_eos(templates: str) -> bool:
  """Whether the encoder inputs end with EOS: not under ``'original_t5'``
  (its ``tokenize_input_encoder_decoder`` encodes the source with
  ``add_special_tokens=False``), as T5 inputs otherwise do."""
  if templates not in TEMPLATE_SETS:
    raise ValueError(f"template set {templates!r}: one of {TEMPLATE_SETS}")
  return templates != "original_t5"


def overrides(task: str, templates: str) -> dict:
  """The TaskSpec fields (``template``; ``label_words`` for
  ``'original_t5'``) template set ``templates`` changes for ``task``."""
  if templates not in TEMPLATE_SETS:
    raise ValueError(f"template set {templates!r}: one of {TEMPLATE_SETS}")
  return {"paper": {}, "original": _ORIGINAL.get(task, {}),
          "original_t5": _ORIGINAL_T5.get(task, {})}[templates]
