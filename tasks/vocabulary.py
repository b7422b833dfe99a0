"""The seqio vocabulary of every task: T5's SentencePiece model, 100 sentinels.

It matches :class:`jaxfid.core.tokenization.Tokenizer` (the same model and
sentinel ids), which jaxfid uses outside seqio.
"""
from __future__ import annotations

import os

import seqio

from jaxfid.core.tokenization import NUM_EXTRA_IDS, bundled_vocab_path


def seqio_vocabulary(path: str | os.PathLike | None = None
                     ) -> seqio.SentencePieceVocabulary:
  """A ``seqio.SentencePieceVocabulary`` (100 extra ids) for seqio tasks."""
  return seqio.SentencePieceVocabulary(
      str(path) if path is not None else bundled_vocab_path(),
      extra_ids=NUM_EXTRA_IDS)
