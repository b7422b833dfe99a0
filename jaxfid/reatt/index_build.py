"""``jaxfid index reatt``: a ReAtt MODEL_DIR's token index, on every process.

Every process runs :func:`build_from_checkpoint` with the same arguments and
encodes on every device of the job; process 0 reads the corpus, writes the
index and tells the others each batch's passage counts; the others read the
same corpus file (same path on every host). Every process returns once the
index is published, or stops with one line when any failed. The index equals
a single process's.
"""
from __future__ import annotations

import itertools
import os
from typing import Iterable, Iterator

import jax

from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer, load_tokenizer
from jaxfid.reatt import token_index
from jaxfid.reatt.checkpoint import load_reatt
from jaxfid.retrieval.store.corpus import read_corpus
from jaxfid.runtime import multihost

ANNOUNCE_GROUP = 16  # batches announced (and checked) at a time


def build_from_checkpoint(checkpoint: str, corpus: str, output: str, *,
                          doc_maxlength: int | None = None,
                          query_maxlength: int | None = None,
                          which: str = "auto", **kwargs) -> dict:
  """``jaxfid index reatt``: index a corpus with a ReAtt MODEL_DIR's model.

  ``kwargs`` go to :func:`jaxfid.reatt.token_index.build_token_index`.
  Returns the index's ``meta.json`` (with several processes, on process 0;
  the others return ``{"index", "process"}``).
  """
  def load():
    model, params, spiece = load_reatt(checkpoint, which=which)
    run = checkpointing.read_run_config(checkpoint)
    tokenizer = load_tokenizer(os.path.dirname(spiece) if spiece else None)
    encoder = token_index.TokenEncoder.from_model(model, params,
                                                  jax.devices())
    return model, int(run.get("text_maxlength", 250)), tokenizer, encoder
  model, length, tokenizer, encoder = multihost.run_agreed(
      load, "loading the model")
  kwargs.update(doc_maxlength=doc_maxlength or length,
                query_maxlength=(query_maxlength or model.reatt.query_maxlength
                                 or length))
  if multihost.process_count() == 1:
    return _build(encoder, tokenizer, corpus, output, checkpoint, **kwargs)
  channel = multihost.Channel("building the token index")
  if not multihost.is_leader():
    _follow(encoder, tokenizer, corpus, channel, kwargs["doc_maxlength"],
            kwargs.get("batch_size", 64), kwargs.get("encoding", "utf-8"))
    return {"index": str(output), "process": multihost.process_index()}
  with channel.leading():
    return _build(encoder, tokenizer, corpus, output, checkpoint,
                  announce=lambda chunks: _announced(chunks, channel),
                  **kwargs)


def _build(encoder, tokenizer, corpus, output, checkpoint, **kwargs) -> dict:
  return token_index.build_token_index(
      encoder, tokenizer, corpus, output,
      extra_meta={"checkpoint": os.path.abspath(checkpoint),
                  **kwargs.pop("extra_meta", {})}, **kwargs)


def _announced(chunks: Iterable[list], channel: multihost.Channel
               ) -> Iterator[list]:
  """Process 0's batches of (line, Passage), each group of
  :data:`ANNOUNCE_GROUP` announced (their sizes) and agreed on first."""
  chunks = iter(chunks)
  while group := list(itertools.islice(chunks, ANNOUNCE_GROUP)):
    channel.send({"batches": [len(chunk) for chunk in group]})
    multihost.agree(None, "reading the corpus")
    yield from group


def _follow(encoder: token_index.TokenEncoder, tokenizer: Tokenizer,
            corpus: str, channel: multihost.Channel, doc_maxlength: int,
            batch_size: int, encoding: str) -> None:
  """A process other than 0: encodes what process 0 announces, from its own
  reading of the corpus, until process 0 has published the index."""
  passages = None
  while "batches" in (message := channel.receive()):
    group, error = [], None
    try:
      if passages is None:
        passages = iter(read_corpus(corpus, encoding=encoding))
      for size in message["batches"]:
        group.append(list(itertools.islice(passages, size)))
        if len(group[-1]) != size:
          raise InputError(corpus, "holds fewer passages here than on "
                           "process 0; every process must read the same "
                           "corpus")
    except OSError as e:
      error = InputError(corpus, f"cannot be read here ({e}); every process "
                         "reads the corpus")
    except InputError as e:
      error = e
    multihost.agree(error, "reading the corpus")
    for chunk in group:
      encoder.encode(token_index.document_batch(
          tokenizer, chunk, doc_maxlength, batch_size), queries=False)


__all__ = ["ANNOUNCE_GROUP", "build_from_checkpoint"]
