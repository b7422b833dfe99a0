"""The T5 SentencePiece vocabulary, bundled, with T5's special ids.

32,000 pieces with ``pad=0, eos=1, unk=2``, no BOS; sentinels 32000..32099
are ``<extra_id_99>`` .. ``<extra_id_0>`` (id 32099 is ``<extra_id_0>``),
added as seqio does; the embedding has 32,128 rows. Encoding agrees with
``seqio.SentencePieceVocabulary`` and never adds EOS; :func:`encode_padded`
adds it as an HF tokenizer with ``truncation=True`` does. Decoding stops at
EOS, drops PAD and UNK and keeps sentinels as text.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from importlib import resources

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from jaxfid.core.errors import InputError

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
DECODER_START_ID = 0  # T5 starts decoding from the PAD id.
NUM_EXTRA_IDS = 100
SPIECE_FILENAME = "spiece.model"


def bundled_vocab_path() -> str:
  """Path of the T5 ``spiece.model`` shipped inside the package."""
  return str(resources.files("jaxfid") / "assets" / SPIECE_FILENAME)


@functools.lru_cache(maxsize=8)
def _extended_model(path: str, num_extra_ids: int) -> tuple[bytes, int]:
  """Serialized model with sentinel pieces appended, and the base size."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise InputError(path, f"cannot read the SentencePiece model: "
                     f"{e.strerror or e}") from e
  model = sentencepiece_model_pb2.ModelProto()
  try:
    model.ParseFromString(data)
  except Exception as e:  # protobuf raises DecodeError (not exported stably)
    raise InputError(path, "not a SentencePiece model file") from e
  base_size = len(model.pieces)
  if base_size == 0:
    raise InputError(path, "not a SentencePiece model file (no pieces)")
  user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
  for i in reversed(range(num_extra_ids)):
    model.pieces.add(piece=f"▁<extra_id_{i}>", score=0.0, type=user_defined)
  return model.SerializeToString(), base_size


class Tokenizer:
  """T5 SentencePiece tokenizer (``path``: its ``spiece.model``) with
  ``vocab_size`` pieces and ``num_extra_ids`` (100) sentinels after them."""

  def __init__(self, path: str | os.PathLike | None = None,
               num_extra_ids: int = NUM_EXTRA_IDS):
    self.path = str(path) if path is not None else bundled_vocab_path()
    self.num_extra_ids = int(num_extra_ids)
    proto, self.vocab_size = _extended_model(self.path, self.num_extra_ids)
    self._sp = spm.SentencePieceProcessor()
    self._sp.LoadFromSerializedProto(proto)
    if (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id()) != (
        PAD_ID, EOS_ID, UNK_ID):
      raise InputError(
          self.path, "not a T5 vocabulary: expected pad=0, eos=1, unk=2, got "
          f"pad={self._sp.pad_id()}, eos={self._sp.eos_id()}, "
          f"unk={self._sp.unk_id()}")

  def __reduce__(self):
    # SentencePieceProcessor does not pickle portably; reload from the path.
    return (Tokenizer, (self.path, self.num_extra_ids))

  def __repr__(self) -> str:
    return (f"Tokenizer(path={self.path!r}, vocab_size={self.vocab_size}, "
            f"num_extra_ids={self.num_extra_ids})")

  @property
  def size_with_extra_ids(self) -> int:
    """Pieces plus sentinels (32100); ids at or above it have no text."""
    return self.vocab_size + self.num_extra_ids

  def sentinel_id(self, n: int) -> int:
    """Id of ``<extra_id_n>`` (``<extra_id_0>`` is the last sentinel id)."""
    if not 0 <= n < self.num_extra_ids:
      raise ValueError(f"sentinel {n} out of range [0, {self.num_extra_ids})")
    return self.size_with_extra_ids - 1 - n

  def encode(self, text: str) -> list[int]:
    """Token ids of ``text``, without EOS."""
    return self._sp.EncodeAsIds(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without EOS (SentencePiece runs it threaded)."""
    texts = list(texts)
    if not texts:
      return []
    return self._sp.EncodeAsIds(texts)

  def _clean(self, ids: Iterable[int]) -> list[int]:
    out = []
    limit = self.size_with_extra_ids
    arr = np.asarray(ids, dtype=np.int64)
    if arr.ndim > 1:
      raise ValueError(f"decode takes 1-D ids, got shape {arr.shape}; "
                       "use decode_batch for 2-D arrays")
    for i in arr.reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i in (PAD_ID, UNK_ID) or i < 0 or i >= limit:
        continue
      out.append(i)
    return out

  def decode(self, ids: Iterable[int]) -> str:
    """Text of ``ids`` up to the first EOS: PAD, UNK, negative and
    out-of-range ids dropped, sentinels as ``<extra_id_N>``."""
    return self._sp.DecodeIds(self._clean(ids))

  def pieces(self, ids: Iterable[int]) -> list[str]:
    """Each id's SentencePiece piece, one string per id (EOS ``</s>``, PAD
    ``<pad>``, a sentinel ``▁<extra_id_N>``, an id past them ``<unused>``)."""
    limit = self.size_with_extra_ids
    return [self._sp.IdToPiece(i) if 0 <= i < limit else "<unused>"
            for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist()]

  def decode_batch(self, ids: Iterable[Iterable[int]]) -> list[str]:
    """:meth:`decode` of each row of a 2-D array or list of lists."""
    return [self.decode(row) for row in ids]


def load_tokenizer(checkpoint_dir: str | os.PathLike | None = None
                  ) -> Tokenizer:
  """The tokenizer of ``checkpoint_dir/spiece.model``, else the bundled one."""
  if checkpoint_dir is not None:
    own = os.path.join(os.fspath(checkpoint_dir), SPIECE_FILENAME)
    if os.path.isfile(own):
      return Tokenizer(own)
  return Tokenizer()


def pad_ids(token_lists: Sequence[Sequence[int]], max_length: int,
            add_eos: bool = True) -> np.ndarray:
  """Id lists right-padded and truncated to int32 ``[N, max_length]``; with
  ``add_eos`` each row ends with EOS inside ``max_length``."""
  if max_length < 1:
    raise ValueError(f"max_length must be at least 1, got {max_length}")
  out = np.zeros((len(token_lists), max_length), dtype=np.int32)
  for row, ids in enumerate(token_lists):
    ids = list(ids)
    if add_eos:
      ids = ids[:max_length - 1] + [EOS_ID]
    else:
      ids = ids[:max_length]
    out[row, :len(ids)] = ids
  return out


def encode_padded(tokenizer: Tokenizer, texts: Sequence[str], max_length: int,
                  add_eos: bool = True) -> np.ndarray:
  """``texts`` as int32 ``[len(texts), max_length]`` as an HF T5 tokenizer
  with ``truncation=True, padding="max_length"`` (EOS kept, 0-padded)."""
  return pad_ids(tokenizer.encode_batch(texts), max_length, add_eos=add_eos)
