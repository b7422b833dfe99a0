"""A FiD reader loaded for answering, the same for ``jaxfid predict`` and
``jaxfid serve``: :func:`load_reader` (model, parameters, tokenizer, passage
EOS of any checkpoint format), :func:`add_decode_flags` and
:func:`decode_config` (one flag per
:class:`~jaxfid.reader.config.DecodeConfig` field, defaulting to the
checkpoint's run config, then the field's default).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Iterable

from jaxfid.checkpoints.load import checkpoint_passage_eos, load_checkpoint
from jaxfid.checkpoints.model_dir import (CONFIG_FILE, chosen_checkpoint,
                                          read_method_config)
from jaxfid.core import paths
from jaxfid.core.config import field_docs, field_types
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer, load_tokenizer
from jaxfid.reader import config as config_lib

PASSAGE_EOS = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class LoadedReader:
  """A reader checkpoint in memory: ``model``, ``params``, ``tokenizer``
  and ``passage_eos`` (passages end with EOS, as it was trained)."""
  model: Any
  params: Any
  tokenizer: Tokenizer
  passage_eos: bool


def load_reader(checkpoint: str, *, which: str = "auto",
                dtype: str | None = None,
                passage_eos: str = "auto") -> LoadedReader:
  """Loads ``checkpoint`` (``which``: a MODEL_DIR's best, latest or auto;
  ``passage_eos``: on, off or auto from the run config), saying on stderr
  which checkpoint of a MODEL_DIR; InputError for one not there."""
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


def flag_names(name: str) -> tuple[str, ...]:
  """The flags of DecodeConfig field ``name`` (``--field-name`` unless
  :data:`~jaxfid.reader.config.FLAGS` says otherwise)."""
  return config_lib.FLAGS.get(name, ("--" + name.replace("_", "-"),))


def _boolean(text: str) -> bool:
  if text.lower() not in ("true", "false", "1", "0", "on", "off"):
    raise argparse.ArgumentTypeError(f"not true or false: {text!r}")
  return text.lower() in ("true", "1", "on")


def _decode_fields(cls, skip: Iterable[str]) -> list[str]:
  return [f.name for f in dataclasses.fields(cls) if f.name not in skip]


def add_decode_flags(parser: argparse.ArgumentParser, *,
                     skip: Iterable[str] = (),
                     cls: type | None = None) -> None:
  """One flag per field of ``cls`` (the DecodeConfig) but ``skip``, with no
  default: :func:`decode_config` takes the checkpoint's."""
  cls = cls or config_lib.DecodeConfig
  docs, types_ = field_docs(cls), field_types(cls)
  for name in _decode_fields(cls, skip):
    default = {f.name: f.default for f in dataclasses.fields(cls)}[name]
    kind, flags = types_[name][0], flag_names(name)
    parser.add_argument(
        *flags, type=_boolean if kind is bool else kind, default=None,
        dest=name, metavar=flags[0][2:].replace("-", "_").upper(),
        help=f"{docs.get(name, '').rstrip('.')} (not given: the checkpoint's "
        f"run config, else {default})")


def run_config_of(checkpoint: str) -> dict:
  """A MODEL_DIR's run config; {} for other checkpoints."""
  if paths.exists(paths.join(checkpoint, CONFIG_FILE)):
    return read_method_config(checkpoint)
  return {}


def decode_config(args: argparse.Namespace, *, cls: type | None = None):
  """The DecodeConfig of ``args.checkpoint``'s run config with the flags
  given (:func:`add_decode_flags`') applied over it."""
  cls = cls or config_lib.DecodeConfig
  given = {n: getattr(args, n) for n in _decode_fields(cls, ())
           if hasattr(args, n)}
  return cls.from_run_config(run_config_of(args.checkpoint)).override(
      given, names={n: flag_names(n)[0] for n in given})
