"""Where the FiD seqio tasks find their files, and how many passages they keep.

Gin configurables, read when a dataset is built (so later bindings apply):

* :func:`fid_data_dir`: FiD-format question files, one subdirectory per
  dataset (``nq``, ``trivia_qa``, ``squad``) with ``{split}.json[l][.gz]``
  (validation may be ``dev``); ``fid_data_dir.path`` or ``JAXFID_DATA_DIR``
  (gin wins).
* :func:`fid_retrieval_dir` / :func:`fid_retrieval_files`: the ``jaxfid
  retrieve`` results the TFDS-backed tasks join (same layout under the
  directory or ``JAXFID_RETRIEVAL_DIR``; an explicit file per task and split
  wins).
* :func:`fid_n_context`: passages per question (default 100).
* :func:`fid_passage_eos`: passage rows end with EOS (default True; ``jaxfid
  eval`` binds the checkpoint's setting).
* :func:`fid_join_key`: ``"question"`` (whitespace-collapsed text, default)
  or ``"id"`` (the TFDS id).
"""
from __future__ import annotations

import os

import gin

from jaxfid.core.errors import InputError

DATA_DIR_ENV = "JAXFID_DATA_DIR"
RETRIEVAL_DIR_ENV = "JAXFID_RETRIEVAL_DIR"
SPLITS = ("train", "validation", "test")
# file stems tried for each split, in order
SPLIT_FILE_STEMS = {"train": ("train",), "validation": ("validation", "dev"),
                    "test": ("test",)}
SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
JOIN_KEYS = ("question", "id")


@gin.configurable
def fid_data_dir(path: str | None = None) -> str:
  """The FiD data directory: ``path`` if bound, else ``$JAXFID_DATA_DIR``.

  Raises:
    InputError: neither is set.
  """
  path = path or os.environ.get(DATA_DIR_ENV)
  if not path:
    raise InputError(DATA_DIR_ENV, "no FiD data directory: bind "
                     "fid_data_dir.path in gin or set $JAXFID_DATA_DIR")
  return os.fspath(path)


@gin.configurable
def fid_retrieval_dir(path: str | None = None) -> str | None:
  """The retrieval results directory: ``path``, else ``$JAXFID_RETRIEVAL_DIR``
  (None when neither is set)."""
  return os.fspath(path) if path else os.environ.get(RETRIEVAL_DIR_ENV) or None


@gin.configurable
def fid_retrieval_files(files: dict | None = None) -> dict:
  """Explicit retrieval files: ``{task_name: {split: path}}``."""
  return dict(files or {})


@gin.configurable
def fid_n_context(n_context: int = 100) -> int:
  """Passages kept per question (the best ones by retrieval score)."""
  if int(n_context) < 1:
    raise ValueError(f"fid_n_context.n_context must be at least 1, got "
                     f"{n_context}")
  return int(n_context)


@gin.configurable
def fid_passage_eos(passage_eos: bool = True) -> bool:
  """Whether each passage row ends with EOS (see
  ``jaxfid.reader.inputs.encode_examples``)."""
  return bool(passage_eos)


@gin.configurable
def fid_join_key(key: str = "question") -> str:
  """What TFDS questions and retrieval records are matched on."""
  if key not in JOIN_KEYS:
    raise ValueError(f"fid_join_key.key must be one of {JOIN_KEYS}, got "
                     f"{key!r}")
  return key


def find_split_file(directory: str, split: str) -> str:
  """``directory/{split}.jsonl`` (or ``.json``, ``.gz``; ``dev`` for
  validation).

  Raises:
    InputError: no such file.
  """
  if split not in SPLIT_FILE_STEMS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
  tried = []
  for stem in SPLIT_FILE_STEMS[split]:
    for suffix in SUFFIXES:
      path = os.path.join(directory, stem + suffix)
      if os.path.isfile(path):
        return path
      tried.append(stem + suffix)
  raise InputError(directory, f"no {split} file: expected one of "
                   f"{', '.join(tried)}")


def fid_file(subdir: str, split: str) -> str:
  """The FiD file of ``split`` for the dataset in ``subdir`` of the data dir."""
  return find_split_file(os.path.join(fid_data_dir(), subdir), split)


def retrieval_file(task_name: str, subdir: str, split: str) -> str:
  """The retrieval results file a TFDS-backed task joins for ``split``.

  Raises:
    InputError: no explicit file, no retrieval directory, or no such file.
  """
  explicit = fid_retrieval_files().get(task_name, {}).get(split)
  if explicit:
    path = os.fspath(explicit)
    if not os.path.isfile(path):
      raise InputError(path, f"no such file (retrieval results of "
                       f"{task_name} {split})")
    return path
  directory = fid_retrieval_dir()
  if directory is None:
    raise InputError(RETRIEVAL_DIR_ENV, f"no retrieval results for "
                     f"{task_name}: bind fid_retrieval_dir.path or "
                     "fid_retrieval_files.files in gin, or set "
                     "$JAXFID_RETRIEVAL_DIR")
  return find_split_file(os.path.join(directory, subdir), split)
