"""The input FiD data again, each read passage's ``score`` the reader's
(``jaxfid predict --passage-scores --scored-data OUT.json``): FiD-KD's
retriever training data (Izacard & Grave 2021).

As FiD's ``test_reader.py --write_crossattention_scores``: the reader reads
each question's ``n_context`` best passages by input score (``sort_data``,
descending and stable; :func:`jaxfid.reader.examples.sorted_passages`), their
``score`` becomes the cross-attention score (``test_reader.py:61-62``) and
the others keep theirs. Unlike FiD, records, keys and passages keep the
input's order (the distillation data sorts again by score), and the write is
atomic. Passages beyond ``n_context`` keep a retriever-scale score and enter
the retriever's sort, as in FiD: score every passage (``--n-context`` at
least the passages per question) to train on the reader's scores alone.
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
  """Indices of ``example.ctxs`` in the order the reader reads them (by
  score, descending and stable, unscored last: ``sorted_passages``' key)."""
  return sorted(range(len(example.ctxs)),
                key=lambda j: (-example.ctxs[j].score
                               if example.ctxs[j].score is not None
                               else math.inf))


def write_scored_data(path: str, source: str,
                      examples: Sequence[FidExample],
                      scores: Sequence[Sequence[float]]) -> tuple[int, int]:
  """Writes ``source`` (FiD JSON / JSONL, else InputError) again to ``path``
  in its format, the first passages in read order of each of ``examples``
  scored by ``scores``. Returns (unread, reordered): the examples with
  passages the reader did not read, and those of them whose read passages
  were not their first ones in file order (an input not sorted by score)."""
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
