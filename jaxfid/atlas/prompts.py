"""What the reader and the retriever read, and the answer read back
(``PROMPT_FORMAT``).

'atlas' (the released code's QA task, facebookresearch/atlas 0ec8889):

* the query: ``--qa_prompt_format`` "question: {question} answer:
  <extra_id_0>" (``src/options.py:365-369``, ``src/tasks/qa.py:21-22,37``);
* the reader's row per passage: ``--encoder_format`` "{query} title:
  {title} context: {text}" (``src/options.py:301-305``, ``append_query``
  ``src/atlas.py:184-185``), tokenised with EOS and cut at TEXT_MAXLENGTH
  (``encode_passages``, ``src/atlas.py:26-39,278``). It is FiD's row of
  the question "{question} answer: <extra_id_0>" (:func:`reader_example`);
* the target: "<extra_id_0> {answer}" (``src/tasks/qa.py:39``) with
  "</s>" appended and no other special token (``src/atlas.py:218-227``):
  the sentinel, the answer, EOS. The reader's loss and the gold scores
  (PDist's and LOOP's means, EMDR^2's tokens) count the sentinel;
* the retriever's query: the same query string (``retriever_tokenize(query)``,
  ``src/atlas.py:187-199,257``), here tokenised by the run's T5 vocabulary
  (the sentinel is one token) where Atlas's Contriever uses BERT's;
* the answer: the generated text without sentinels (Atlas decodes with
  ``skip_special_tokens=True``, ``evaluate.py:139``) before EM.

'fid': FiD's rows "question: Q title: T context: P", the answer alone as
target, the bare question to the retriever.
"""
from __future__ import annotations

import dataclasses
import re

from jaxfid.reader.examples import FidExample

PROMPT_FORMATS = ("atlas", "fid")
QA_PROMPT = "question: {question} answer: <extra_id_0>"
ENCODER_FORMAT = "{query} title: {title} context: {text}"
TARGET_FORMAT = "<extra_id_0> {target}"
_SENTINEL = re.compile(r"\s*<extra_id_\d+>\s*")


def query(question: str, prompt_format: str) -> str:
  """The retriever's query text of ``question``."""
  if prompt_format == "atlas":
    return QA_PROMPT.format(question=question)
  return question


def reader_example(example: FidExample, prompt_format: str) -> FidExample:
  """``example`` whose FiD rows (:func:`jaxfid.reader.inputs.format_passages`)
  are the reader's rows: under 'atlas' its question is "{question} answer:
  <extra_id_0>", so "question: {question} answer: <extra_id_0> title: T
  context: P" is ``ENCODER_FORMAT`` of ``QA_PROMPT``."""
  if prompt_format == "atlas":
    return dataclasses.replace(
        example, question=QA_PROMPT.format(question=example.question)[
            len("question: "):])
  return example


def target(answer: str, prompt_format: str) -> str:
  """The target text of ``answer`` (EOS is added when tokenised)."""
  if prompt_format == "atlas":
    return TARGET_FORMAT.format(target=answer)
  return answer


def answer(generated: str, prompt_format: str) -> str:
  """The answer in the generated text: under 'atlas' without sentinels."""
  if prompt_format == "atlas":
    return _SENTINEL.sub(" ", generated).strip()
  return generated
