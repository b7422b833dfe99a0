"""`jaxfid convert`: any supported checkpoint -> HF safetensors (or T5X).

Reads HF, original FiD readers, T5X (msgpack + TensorStore or orbax) and
jaxfid MODEL_DIRs; writes a HF ``T5ForConditionalGeneration`` directory or a
T5X ``checkpoint_<step>``, copying a ``spiece.model`` found beside the input
(or ``--spiece``) to HF output.
"""
from __future__ import annotations

import argparse

from jaxfid.checkpoints import describe, load_flat, write_hf, write_t5x
from jaxfid.checkpoints.detect import detect_format
from jaxfid.commands.registry import Command


def add_parser(subparsers) -> argparse.ArgumentParser:
  p = subparsers.add_parser(
      "convert", help="convert a T5/FiD checkpoint (HF, FiD, T5X) to HF "
      "safetensors or T5X",
      description=__doc__.split("\n\n")[0])
  p.add_argument("--from", dest="source", required=True, metavar="PATH",
                 help="input checkpoint (HF dir, FiD reader dir, T5X "
                 "checkpoint_<step> or model dir)")
  p.add_argument("--to", dest="dest", required=True, metavar="PATH",
                 help="output directory (HF) or T5X model directory")
  p.add_argument("--to-format", choices=("hf", "t5x"), default="hf",
                 help="output format (default: hf)")
  p.add_argument("--spiece", default=None, metavar="FILE",
                 help="SentencePiece model to copy into HF output (default: "
                 "spiece.model beside the input, if any)")
  p.add_argument("--step", type=int, default=0,
                 help="step number of the T5X output (default: 0)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace an existing non-empty output")
  p.set_defaults(func=run)
  return p


def run(args) -> int:
  fmt = detect_format(args.source)
  fields, flat, spiece = load_flat(args.source)
  if args.to_format == "hf":
    write_hf(args.dest, fields, flat, args.spiece or spiece,
             overwrite=args.overwrite)
    where = args.dest
  else:
    where = write_t5x(args.dest, fields, flat, step=args.step,
                      overwrite=args.overwrite)
  print(f"converted {fmt} checkpoint {args.source} -> {args.to_format} "
        f"{where}: {describe(fields)}")
  return 0


COMMAND = Command("convert", add_parser, order=10)
