"""Splitting documents into passages, and writing DPR passage TSV files.

:func:`split_into_passages` cuts each text into consecutive chunks of
``words`` whitespace-separated words (as DPR's ``psgs_w100.tsv``), each with
the document's title. Ids are ``{doc_id}_{k}``, or ``1, 2, ...`` with
``sequential_ids=True``.
"""
from __future__ import annotations

import csv
import gzip
import io
import os
from typing import Iterable, Iterator

from jaxfid.retrieval.store.corpus import Passage
from jaxfid.runtime.files import atomic_write

DPR_TSV_HEADER = ("id", "text", "title")


def split_document(doc: Passage, words: int = 100) -> list[tuple[str, str]]:
  """Splits a document into (title, text) chunks of at most ``words`` words."""
  if words < 1:
    raise ValueError(f"words must be positive, got {words}")
  tokens = doc.text.split()
  return [(doc.title, " ".join(tokens[i:i + words]))
          for i in range(0, len(tokens), words)]


def split_into_passages(docs: Iterable[Passage], words: int = 100,
                        sequential_ids: bool = False) -> Iterator[Passage]:
  """Yields every document's passages of ``words`` words, in order.

  Ids are ``{doc_id}_{k}``, or 1, 2, ... with ``sequential_ids``.
  """
  counter = 0
  for doc in docs:
    for k, (title, text) in enumerate(split_document(doc, words)):
      counter += 1
      pid = str(counter) if sequential_ids else f"{doc.id}_{k}"
      yield Passage(pid, title, text)


def write_dpr_tsv(path: str | os.PathLike,
                  passages: Iterable[Passage]) -> int:
  """Writes passages atomically as a DPR TSV file (``id text title``;
  ``.gz``: gzipped); returns the count."""
  count = 0
  with atomic_write(path, "wb") as raw:
    compressed = (gzip.GzipFile(fileobj=raw, mode="wb", mtime=0)
                  if str(path).endswith(".gz") else None)
    f = io.TextIOWrapper(compressed or raw, encoding="utf-8", newline="")
    writer = csv.writer(f, delimiter="\t", lineterminator="\n")
    writer.writerow(DPR_TSV_HEADER)
    for p in passages:
      writer.writerow((p.id, p.text, p.title))
      count += 1
    f.flush()
    f.detach()  # the files below are closed by their owners
    if compressed is not None:
      compressed.close()
  return count
