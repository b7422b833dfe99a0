"""A FiD reader loaded for answering: what ``jaxfid predict`` and ``jaxfid
serve`` both read questions with.

:func:`load_reader` turns a ``--checkpoint`` (an HF T5 directory, an
original-FiD reader, a T5X checkpoint or a jaxfid MODEL_DIR, whose best-EM
checkpoint is taken, else the latest) into the model, its parameters, its
tokenizer (the checkpoint's spiece.model wins over the bundled vocabulary)
and whether its passages end with EOS, once, so that the two commands cannot
drift apart in how they load one.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from jaxfid.checkpoints.load import checkpoint_passage_eos, load_checkpoint
from jaxfid.checkpoints.model_dir import CONFIG_FILE, chosen_checkpoint
from jaxfid.core import paths
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer, load_tokenizer

PASSAGE_EOS = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class LoadedReader:
  """A reader checkpoint in memory.

  Attributes:
    model: the encoder-decoder (``predict`` and ``passage_scores``).
    params: its parameters.
    tokenizer: its vocabulary.
    passage_eos: passages end with EOS (as the checkpoint was trained).
  """
  model: Any
  params: Any
  tokenizer: Tokenizer
  passage_eos: bool


def load_reader(checkpoint: str, *, which: str = "auto",
                dtype: str | None = None,
                passage_eos: str = "auto") -> LoadedReader:
  """Loads ``checkpoint`` (``which``: a MODEL_DIR's best, latest or auto);
  ``passage_eos``: on, off or auto (a MODEL_DIR's run config; none for
  original FiD readers). Says on stderr which checkpoint of a MODEL_DIR
  it loads.

  Raises:
    InputError: a MODEL_DIR without the checkpoint asked for (and what
      :func:`~jaxfid.checkpoints.load.load_checkpoint` raises).
  """
  if passage_eos not in PASSAGE_EOS:
    raise ValueError(f"passage_eos must be one of {PASSAGE_EOS}, got "
                     f"{passage_eos!r}")
  if paths.exists(paths.join(checkpoint, CONFIG_FILE)):
    chosen = chosen_checkpoint(checkpoint, which)
    if chosen is None:
      raise InputError(checkpoint, f"no {which} checkpoint" if
                       which != "auto" else "no checkpoint")
    print(f"loading the {chosen[0]} checkpoint (step {chosen[1]}) of "
          f"{checkpoint}", file=sys.stderr)
  model, params, spiece = load_checkpoint(checkpoint, dtype=dtype,
                                          which=which)
  tokenizer = load_tokenizer(os.path.dirname(spiece) if spiece else None)
  eos = (checkpoint_passage_eos(checkpoint) if passage_eos == "auto"
         else passage_eos == "on")
  return LoadedReader(model, params, tokenizer, eos)
