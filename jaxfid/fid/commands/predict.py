"""``jaxfid predict``: a checkpoint and a FiD file -> PRED.jsonl and the EM.

  jaxfid predict --checkpoint DIR --data FILE --output PRED.jsonl
      [--n-context N] [--text-maxlength L] [--decode-maxlength T]
      [--batch-size B] [--beam-size K] [--length-penalty A]
      [--passage-scores [--passage-scores-mode probs|logits]
       [--scored-data OUT.json]] [--attention] [--passage-eos auto|on|off]

DIR: any checkpoint :func:`~jaxfid.reader.load.load_reader` reads. The
decoding flags are :class:`~jaxfid.reader.config.DecodeConfig`'s fields
(``--answer-maxlength``: ``--decode-maxlength``), defaulting to the run
config's. ``--attention`` adds each answer's tokens and the reader's
attention over each passage's tokens (:mod:`jaxfid.reader.attention`).
"""
from __future__ import annotations

import json
import sys

from jaxfid.checkpoints.model_dir import WHICH
from jaxfid.commands.registry import Command
from jaxfid.core.errors import InputError
from jaxfid.distill.scored_data import same_file, write_scored_data
from jaxfid.reader import attention as attention_lib
from jaxfid.reader import predict as predict_lib
from jaxfid.reader.examples import read_fid_examples
from jaxfid.reader.load import (PASSAGE_EOS, add_decode_flags, decode_config,
                               load_reader)


SKIPPED = ("target_maxlength",)  # DecodeConfig fields predict does not use


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("predict", help="answer the questions of a FiD file")
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--data", required=True, help="FiD JSON or JSONL")
  p.add_argument("--output", required=True, help="PRED.jsonl")
  add_decode_flags(p, skip=SKIPPED)
  p.add_argument("--dtype", default=None, help="activation dtype override")
  p.add_argument("--passage-scores", action="store_true",
                 help="also write each passage's cross-attention score")
  p.add_argument("--which", choices=WHICH, default="auto",
                 help="a MODEL_DIR's checkpoint: the best-EM one, the latest, "
                      "or auto (best if there is one, else latest)")
  p.add_argument("--passage-scores-mode", choices=("probs", "logits"),
                 default=None,
                 help="probs: attention mass after the softmax; logits: the "
                 "original FiD's pre-softmax logits averaged over tokens "
                 "(default: logits with --scored-data, else probs)")
  p.add_argument("--scored-data", default=None, metavar="OUT.json",
                 help="with --passage-scores: write --data again, each read "
                 "passage's score the reader's (FiD's "
                 "--write_crossattention_scores); the passages beyond "
                 "--n-context keep theirs")
  p.add_argument("--attention", action="store_true",
                 help="also write the answer's tokens and, per passage, the "
                 "reader's cross-attention over its tokens while it "
                 "generated them (one more forward pass; docs/fid.md)")
  p.add_argument("--passage-eos", choices=PASSAGE_EOS,
                 default="auto",
                 help="passages end with EOS (auto: as the checkpoint was "
                 "trained)")
  p.set_defaults(func=run)


def run(args) -> int:
  decode = decode_config(args)
  if args.scored_data is not None:
    if not args.passage_scores:
      raise InputError("--scored-data", "needs --passage-scores")
    if same_file(args.scored_data, args.data):
      raise InputError("--scored-data", "must not be the input --data")
  mode = args.passage_scores_mode or (
      "logits" if args.scored_data is not None else "probs")
  # Validate the data before loading anything heavy.
  examples = read_fid_examples(args.data)
  reader = load_reader(args.checkpoint, which=args.which, dtype=args.dtype,
                       passage_eos=args.passage_eos)
  model, params, tokenizer = reader.model, reader.params, reader.tokenizer
  passage_eos = reader.passage_eos
  generate = (attention_lib.generate_with_attention if args.attention else
              predict_lib.generate)
  generated = generate(
      model, params, tokenizer, examples, n_context=decode.n_context,
      text_maxlength=decode.text_maxlength,
      answer_maxlength=decode.decode_length, batch_size=decode.batch_size,
      num_beams=decode.num_beams, alpha=decode.alpha,
      passage_eos=passage_eos)
  preds, attention = generated if args.attention else (generated, None)
  scores = predict_lib.score(examples, preds)
  extra = None
  if args.passage_scores:
    extra = predict_lib.passage_scores(
        model, params, tokenizer, examples, n_context=decode.n_context,
        text_maxlength=decode.text_maxlength, batch_size=decode.batch_size,
        mode=mode, passage_eos=passage_eos)
  predict_lib.write_predictions(args.output, examples, preds, scores,
                                passage_scores=extra, attention=attention)
  if args.scored_data is not None:
    unread, reordered = write_scored_data(args.scored_data, args.data,
                                          examples, extra)
    if unread:
      print(f"{unread} examples have more than {decode.n_context} passages: "
            f"those beyond keep their input score (as FiD's test_reader.py)",
            file=sys.stderr)
    if reordered:
      print(f"{reordered} examples' passages are not sorted by score: the "
            f"reader read their {decode.n_context} best by score, as FiD's "
            f"sort_data (the output keeps the input's order)",
            file=sys.stderr)
  print(json.dumps({"em": round(scores["em"], 6), "f1": round(scores["f1"], 6),
                    "examples": len(examples), "output": args.output}))
  print(f"EM {100 * scores['em']:.2f} on {len(examples)} examples",
        file=sys.stderr)
  return 0


COMMAND = Command("predict", add_parser, order=20, model=True)
