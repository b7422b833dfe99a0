"""The input FiD data again, each read passage's ``score`` the reader's.

``jaxfid predict --passage-scores --scored-data OUT.json`` writes it: the
training data of a retriever distilled from the reader (FiD-KD, Izacard & Grave
2021). The original FiD's ``test_reader.py --write_crossattention_scores``
reads each question's ``n_context`` best passages by the input's score
(``src.data.Dataset.__init__`` calls ``sort_data``, which sorts ``ctxs`` by
``float(score)``, descending and stable, in place: FiD
``src/data.py:24,64-68``; ``__getitem__`` then takes ``ctxs[:n_context]``,
``src/data.py:45``), sets ``example['ctxs'][j]['score'] =
crossattention_scores[k, j]`` for those (``test_reader.py:61-62``), leaves the
others' scores as they were, and writes the records back
(``test_reader.py:138``, ``src/util.py:187-209``). jaxfid's reader reads the
same passages (:func:`jaxfid.reader.examples.sorted_passages`: the same sort), and
this writes the same scores with the write atomic (a crash leaves no
half-written file). The one difference: the original writes each record's
``ctxs`` in that sorted order, this keeps the input's order of records, keys
and passages (only ``score`` values change); the distillation data sorts again
by score (:mod:`jaxfid.dual_encoder.distill_data`, as FiD's
``train_retriever.py``), so it reads the same passages either way.
:func:`write_scored_data` counts the examples whose read passages were not
their first ones in file order (an input not sorted by score). The passages
beyond ``n_context`` keep their input score, which is on the retriever's scale,
not the reader's, and they take part in the retriever's sort (as in the
original): score every passage (``--n-context`` at least the number of
passages, as the FiD README's ``--n_context 100`` on 100-passage data) to train
on the reader's scores alone.
"""
from __future__ import annotations

import json
import math
import os
from typing import Sequence

from jaxfid.core.errors import InputError
from jaxfid.core.textio import (iter_json_lines, read_json_document,
                                starts_json_array)
from jaxfid.reader.examples import FidExample
from jaxfid.runtime.files import atomic_write


def same_file(a: str, b: str) -> bool:
  """Whether two paths name one file (the same path, or a link to it)."""
  if os.path.abspath(a) == os.path.abspath(b):
    return True
  try:
    return os.path.samefile(a, b)
  except OSError:
    return False


def read_order(example: FidExample) -> list[int]:
  """Indices of ``example.ctxs`` in the order the reader reads them.

  The key of :func:`jaxfid.reader.examples.sorted_passages`: by score,
  descending and stable, unscored passages last in file order.
  """
  return sorted(range(len(example.ctxs)),
                key=lambda j: (-example.ctxs[j].score
                               if example.ctxs[j].score is not None
                               else math.inf))


def write_scored_data(path: str, source: str,
                      examples: Sequence[FidExample],
                      scores: Sequence[Sequence[float]]) -> tuple[int, int]:
  """Writes ``source`` again with the reader's ``scores``.

  Returns:
    (unread, reordered): how many examples had passages the reader did not
    read (their scores unchanged), and how many of those had read passages
    that were not their first ones in file order (an input not sorted by
    score).

  Args:
    path: the output (a JSON list when ``source`` is one, else JSON lines).
    source: the FiD JSON / JSONL file ``examples`` were read from.
    examples: its examples, as :func:`read_fid_examples` read them.
    scores: per example, the scores of its first passages in read order.

  Raises:
    InputError: ``source`` is not FiD JSON / JSONL with passages.
  """
  as_list = starts_json_array(source)
  if as_list:
    records = read_json_document(source)
  else:
    records = [r for _, r in iter_json_lines(source)]
  if len(records) != len(examples) or not all(
      isinstance(r, dict) and isinstance(r.get("ctxs", []), list)
      and len(r.get("ctxs", [])) == len(e.ctxs)
      for r, e in zip(records, examples)):
    raise InputError(source, "--scored-data needs FiD JSON or JSONL records "
                     "with their passages in 'ctxs'")
  unread = reordered = 0
  for record, example, row in zip(records, examples, scores):
    order = read_order(example)
    for j, score in zip(order, row):
      record["ctxs"][j]["score"] = float(score)
    unread += len(order) > len(row)
    reordered += sorted(order[:len(row)]) != list(range(len(row)))
  with atomic_write(path) as f:
    if as_list:
      json.dump(records, f, ensure_ascii=False)
      f.write("\n")
    else:
      for record in records:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
  return unread, reordered
