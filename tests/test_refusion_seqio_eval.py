"""`jaxfid eval` of ReFusion runs on the LM-BFF seqio task: rank classification.

Tiny ReFusion MODEL_DIRs (the run config and checkpoint layout ReFusion's
trainer writes; random weights) are evaluated on `lmbff_sst_2_16_13` with
the bundled 16-shot SST-2 split (jaxfid/assets/lmbff) through the command
line. Every prediction must be the class the model itself ranks first over
the label words, with the run's inputs and fused neighbours computed as the
trainer computes them, and the metrics line the accuracy of those classes.
"""
from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.checkpoints.model_dir import (RunCheckpoints, read_run_config,
                                          write_run_config)
from jaxfid.cli import main
from jaxfid.core.errors import InputError
from jaxfid.core.tokenization import Tokenizer
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.evaluation.classification import classification_metrics
from jaxfid.refusion import batches as batch_lib
from jaxfid.refusion import fusion as fusion_lib
from jaxfid.refusion import lmbff
from jaxfid.refusion import neighbours as nb
from jaxfid.refusion.checkpoint_eval import ReFusionCheckpointEvaluator
from jaxfid.refusion.model import ReFusionModel
from jaxfid.dual_encoder import index as dense
from jaxfid.t5.config import T5Config

ROOT = pathlib.Path(__file__).resolve().parents[1]
LMBFF = ROOT / "jaxfid" / "assets" / "lmbff"
SST2 = LMBFF / "SST-2" / "16-13"
TASK = "lmbff_sst_2_16_13"
MAX_LENGTH = 40
TOP_K = 4
SPLIT_FILES = {"test": "test", "validation": "dev"}
CONFIG = T5Config(d_model=16, d_kv=4, d_ff=32, num_heads=2, num_layers=2,
                  num_decoder_layers=2, feed_forward_proj="gated-gelu",
                  tie_word_embeddings=False, dropout_rate=0.0)
SENTENCES = ["a gorgeous , witty film", "the plot is a mess",
             "one of the best films of the year", "tedious and overlong",
             "a charming comedy", "i was bored from the start",
             "beautifully acted", "an embarrassment for everyone involved"]
SPEC = lmbff.get_task("sst-2")


@pytest.fixture(scope="module", autouse=True)
def lmbff_dir():
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("JAXFID_LMBFF_DIR", str(LMBFF))
    yield


def _model_dir(path, *, fusion_modules="none", db=None, concat=False,
               step=3, seed=0):
  """A ReFusion MODEL_DIR as the trainer leaves it (random weights)."""
  targets = fusion_lib.parse_targets(fusion_modules)
  fusion = fusion_lib.FusionConfig(
      modules=fusion_modules, top_k=TOP_K,
      db_dim=nb.db_width(db) if targets else 1, search=False)
  model = ReFusionModel(CONFIG, fusion)
  params = model.init_params(seed)
  write_run_config(str(path), {
      "method": "refusion", "model": CONFIG.to_dict(),
      "fusion": fusion.to_dict(), "task": SPEC.name,
      "max_length": MAX_LENGTH, "label_words": list(SPEC.label_words),
      "retrieval_db": str(db) if db else None, "concat_neighbours": concat,
      "search": False, "retrieval_mode": "input", "retrain": False,
      "train_steps": step})
  ckpts = RunCheckpoints(str(path))
  ckpts.save(step, {"step": jnp.asarray(step, jnp.int32), "params": params},
             force=True)
  ckpts.close()
  return model, params


def _reference(model, params, split, db=None, concat=False):
  """(classes, labels, arrays): the trainer's way of ranking ``split``."""
  tok = Tokenizer()
  examples = lmbff.read_split(SPEC, SST2, SPLIT_FILES[split])
  labels = batch_lib.label_token_matrix(SPEC.label_words, tok)
  inputs = [lmbff.render_fitted(SPEC, e, MAX_LENGTH - 1,
                                lambda t: len(tok.encode(t)))
            for e in examples]
  found = None
  if db is not None:
    found = nb.retrieve_neighbours(db, [lmbff.segments(SPEC, e)
                                        for e in examples], TOP_K)
  if concat:
    inputs = batch_lib.with_neighbour_texts(
        inputs, nb.neighbour_texts(db, found.rows))
  arrays = batch_lib.encode_split(
      inputs, [e.label for e in examples], labels, tok, MAX_LENGTH,
      found.vectors if found is not None and model.fusion.enabled else None)
  batch = {k: jnp.asarray(v) for k, v in arrays.items() if k != "labels"}
  classes = np.asarray(model.classify(params, batch, jnp.asarray(labels)))
  return classes, labels, arrays


def _eval(model_dir, output_dir, split):
  assert main(["eval", "--gin_file=gin/evaluation.gin",
               f"--gin.CHECKPOINT_PATH='{model_dir}'",
               f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'",
               f"--gin.EVAL_SPLIT='{split}'",
               f"--gin.EVAL_OUTPUT_DIR='{output_dir}'",
               "--gin.EVAL_BATCH_SIZE=64"]) == 0


def _lines(path):
  return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines()]


def _check(output_dir, split, step, classes, arrays):
  """The metrics line and predictions file of an evaluation."""
  (record,) = _lines(output_dir / "metrics.jsonl")
  accuracy = classification_metrics("accuracy", classes.tolist(),
                                    arrays["labels"].tolist())["accuracy"]
  assert record == {"task": TASK, "split": split, "step": step,
                    "accuracy": pytest.approx(accuracy)}
  preds = _lines(output_dir / f"{TASK}-{step}.jsonl")
  assert [p["prediction"] for p in preds] == classes.tolist()
  assert [p["output"] for p in preds] == [SPEC.label_words[c]
                                          for c in classes]
  assert [p["target"] for p in preds] == [p["label"] for p in preds] == (
      arrays["labels"].tolist())
  return record


def test_plain_run_ranks_the_label_words(tmp_path, capsys):
  out, ev = tmp_path / "plain", tmp_path / "ev"
  model, params = _model_dir(out)
  _eval(out, ev, "test")
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  classes, _, arrays = _reference(model, params, "test")
  assert len(classes) == 872 and len(set(classes.tolist())) == 2
  record = _check(ev, "test", 3, classes, arrays)
  assert printed["metrics"][TASK]["accuracy"] == record["accuracy"]
  assert printed["step"] == 3
  assert (ev / "tb" / TASK).is_dir()
  # a ReFusion run classifies; it does not answer questions
  assert main(["eval", "--gin_file=gin/evaluation.gin",
               f"--gin.CHECKPOINT_PATH='{out}'",
               "--gin.MIXTURE_OR_TASK_NAME='trivia_qa_fid'",
               f"--gin.EVAL_OUTPUT_DIR='{ev}'"]) == 2
  assert "evaluates classification tasks" in capsys.readouterr().err


@pytest.fixture(scope="module")
def db(tmp_path_factory):
  d = tmp_path_factory.mktemp("refusion_eval_db")
  (d / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=8,
                                 d_kv=4, d_ff=16, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  dense.build_dense_index(None, d / "sentences.txt", d / "db",
                          encoder=load_dual_encoder(ckpt), progress=False)
  return d / "db"


def test_fused_run_ranks_with_its_neighbours(db, tmp_path):
  out, ev = tmp_path / "fused", tmp_path / "ev"
  model, params = _model_dir(out, fusion_modules="key,value", db=db)
  _eval(out, ev, "validation")
  classes, labels, arrays = _reference(model, params, "validation", db=db)
  _check(ev, "validation", 3, classes, arrays)

  evaluator = ReFusionCheckpointEvaluator(str(out))
  assert evaluator.fused and not evaluator.hidden and evaluator.step == 3
  examples = [{"text_a": e.text_a.encode(), "text_b": b"",
               "inputs_pretokenized": b""}
              for e in lmbff.read_split(SPEC, SST2, "dev")]
  evaluator.prepare(examples, SPEC)
  index = np.arange(len(examples))
  np.testing.assert_array_equal(
      evaluator.predict(index, {"encoder_input_tokens":
                                arrays["encoder_input_tokens"]}),
      labels[classes])
  # score(): the gold label word's log-likelihood, as label_scores ranks it
  scores = evaluator.score(index, {
      "encoder_input_tokens": arrays["encoder_input_tokens"],
      "decoder_target_tokens": arrays["decoder_target_tokens"]})
  batch = {k: jnp.asarray(v) for k, v in arrays.items() if k != "labels"}
  table = np.asarray(model.label_scores(params, batch, jnp.asarray(labels)))
  np.testing.assert_allclose(scores, table[index, arrays["labels"]],
                             rtol=1e-5, atol=1e-5)
  # A run trained on another template (TEMPLATES='original' for CoLA)
  # cannot be scored on prompts it never saw.
  other = ReFusionCheckpointEvaluator(str(out), run_config={
      **read_run_config(str(out)), "template": "{x} This is {mask}."})
  with pytest.raises(InputError, match="trained on the template"):
    other.prepare(examples, SPEC)


def test_concatenation_baseline_appends_the_neighbours(db, tmp_path):
  out, ev = tmp_path / "concat", tmp_path / "ev"
  model, params = _model_dir(out, db=db, concat=True, seed=1)
  _eval(out, ev, "validation")
  classes, _, arrays = _reference(model, params, "validation", db=db,
                                  concat=True)
  _check(ev, "validation", 3, classes, arrays)
