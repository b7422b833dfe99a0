"""DecodeConfig: one decoding config from the training run's config to
``jaxfid eval``, ``predict`` and ``serve``; a new field reaches all three."""
from __future__ import annotations

import dataclasses
import json

import pytest

from jaxfid.checkpoints.model_dir import CONFIG_FILE
from jaxfid.cli import build_parser
from jaxfid.core.config import option
from jaxfid.core.errors import InputError
from jaxfid.fid.task import FidTask
from jaxfid.reader import checkpoint_eval
from jaxfid.reader import config as config_lib
from jaxfid.reader.config import DecodeConfig, FidReaderConfig
from jaxfid.reader.load import decode_config
from jaxfid.serving.commands import serve

RUN = {"method": "fid", "n_context": 3, "text_maxlength": 40,
       "decode_maxlength": 7, "target_maxlength": 9, "eval_beams": 2,
       "eval_batch_size": 5}


def _model_dir(tmp_path, run=None):
  path = tmp_path / "model"
  path.mkdir()
  (path / CONFIG_FILE).write_text(json.dumps(RUN if run is None else run))
  return str(path)


def _predict(model_dir, *flags):
  return build_parser().parse_args(["predict", "--checkpoint", model_dir,
                                    "--data", "d.json", "--output", "p.jsonl",
                                    *flags])


def _serve(model_dir, *flags):
  return build_parser().parse_args(["serve", "--checkpoint", model_dir,
                                    "--index", "idx", *flags])


def test_from_run_config_reads_the_runs_decoding():
  assert DecodeConfig.from_run_config(RUN) == DecodeConfig(
      n_context=3, text_maxlength=40, decode_maxlength=7, target_maxlength=9,
      num_beams=2, batch_size=5)
  old = DecodeConfig.from_run_config({"n_context": 2, "answer_maxlength": 4})
  assert (old.decode_length, old.target_length) == (4, 4)
  assert DecodeConfig.from_run_config({}) == DecodeConfig()
  assert DecodeConfig().decode_length == 49
  with pytest.raises(InputError, match="N_CONTEXT: .*got 0"):
    DecodeConfig.from_run_config({"n_context": 0})


def test_override_applies_what_is_given_and_names_the_flag():
  base = DecodeConfig.from_run_config(RUN)
  assert base.override({"n_context": None, "num_beams": 4}) == base.replace(
      num_beams=4)
  assert base.override(DecodeConfig(decode_maxlength=None)).decode_length == 7
  with pytest.raises(InputError, match="^--beam-size: must be an int >= 1"):
    base.override({"num_beams": 0}, names={"num_beams": "--beam-size"})


def test_training_run_config_records_what_decode_config_reads():
  reader = FidReaderConfig(train_data="t.json", n_context=6,
                           text_maxlength=30, decode_maxlength=11,
                           eval_beams=3, eval_batch_size=4)
  run = FidTask(reader=reader).run_config(None)  # the config's alone
  recorded = reader.to_dict()
  assert {k: run[k] for k in recorded} == {**recorded, "answer_maxlength": 11}
  # answer_maxlength: the decoding bound, the key older loaders read
  assert DecodeConfig.from_run_config(run) == DecodeConfig(
      n_context=6, text_maxlength=30, decode_maxlength=11, num_beams=3,
      batch_size=4)


def test_predict_and_serve_default_to_the_checkpoints_run_config(tmp_path):
  model_dir = _model_dir(tmp_path)
  recorded = DecodeConfig.from_run_config(RUN)
  assert decode_config(_predict(model_dir)) == (
      recorded)
  served = serve.serve_config(_serve(model_dir))
  assert (served.n_context, served.text_maxlength, served.decode_maxlength,
          served.beam_size) == (3, 40, 7, 2)
  # flags win, by their old names too
  args = _predict(model_dir, "--n-context", "2", "--answer-maxlength", "5",
                  "--beam-size", "1", "--batch-size", "6")
  assert decode_config(args) == recorded.replace(
      n_context=2, decode_maxlength=5, num_beams=1, batch_size=6)
  served = serve.serve_config(_serve(model_dir, "--decode-maxlength", "3",
                                     "--length-penalty", "1.0"))
  assert (served.decode_maxlength, served.decode.alpha) == (3, 1.0)
  # a checkpoint without a run config: the fields' defaults
  hf = tmp_path / "hf"
  hf.mkdir()
  assert serve.serve_config(_serve(str(hf))).decode == DecodeConfig()
  with pytest.raises(InputError, match="^--n-context: must be an int >= 1"):
    decode_config(_predict(model_dir, "--n-context", "0"))


@dataclasses.dataclass(frozen=True)
class _WithPenalty(DecodeConfig):
  """DecodeConfig with one more option.

  Attributes:
    repetition_penalty: divides the logits of tokens already generated.
  """
  repetition_penalty: float = option(1.0, low=1)


def test_a_new_field_reaches_predict_eval_and_serve(tmp_path, monkeypatch):
  """Adding a decoding option is one field: its flag, its run config value
  and its check come with it in all three commands."""
  monkeypatch.setattr(config_lib, "DecodeConfig", _WithPenalty)
  model_dir = _model_dir(tmp_path, {**RUN, "repetition_penalty": 1.5})
  predicted = decode_config(_predict(model_dir))
  assert predicted.repetition_penalty == 1.5  # the run's
  predicted = decode_config(_predict(model_dir, "--repetition-penalty", "2"))
  assert predicted.repetition_penalty == 2.0  # the flag's
  with pytest.raises(InputError, match="^--repetition-penalty: must be"):
    decode_config(_predict(model_dir, "--repetition-penalty", "0.5"))
  served = serve.serve_config(_serve(model_dir, "--repetition-penalty", "3"))
  assert served.decode.repetition_penalty == 3.0

  class _Model:
    def score(self, params, batch):
      return batch

  monkeypatch.setattr(checkpoint_eval, "load_checkpoint",
                      lambda path, dtype=None: (_Model(), {}, None))
  monkeypatch.setattr(checkpoint_eval, "make_predict_fn",
                      lambda model, **kwargs: kwargs)
  evaluator = checkpoint_eval.FidCheckpointEvaluator(
      model_dir, json.loads((tmp_path / "model" / CONFIG_FILE).read_text()))
  assert evaluator.decode.repetition_penalty == 1.5
  assert evaluator._predict == {"max_decode_len": 7, "num_beams": 2,  # pylint: disable=protected-access
                                "alpha": 0.6}
  evaluator = checkpoint_eval.FidCheckpointEvaluator(
      model_dir, {}, decode=_WithPenalty(n_context=2, repetition_penalty=4.0))
  assert (evaluator.decode.repetition_penalty, evaluator.n_context) == (4.0, 2)
