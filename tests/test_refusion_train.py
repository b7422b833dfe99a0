"""ReFusion training end to end on a tiny model (the issue's CLI contract).

A tiny dense database (random tiny T5 encoder over a few sentences) and the
bundled 16-shot SST-2 sample: the search writes its structure, the test
line lands in metrics.jsonl, the structure is restored with the weights,
a crashed run resumes step for step, the baselines run, and the bi-level
step updates each parameter group only in its own half.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hf_reference import make_tiny_hf_checkpoint
from jaxfid.cli import main
from jaxfid.t5.config import preset
from jaxfid.refusion import batches as batch_lib
from jaxfid.refusion import fusion as F
from jaxfid.refusion import search
from jaxfid.refusion.checkpoint import load_refusion
from jaxfid.refusion.model import ReFusionModel, is_arch_path
from jaxfid.dual_encoder.index import build_dense_index
from jaxfid.dual_encoder.checkpoint import load_dual_encoder
from jaxfid.training.step import make_train_step

ROOT = pathlib.Path(__file__).resolve().parents[1]
SST2 = ROOT / "tests" / "data" / "lmbff" / "SST-2" / "16-13"
TINY = ["config.T5Config.d_model=16", "config.T5Config.d_kv=4",
        "config.T5Config.d_ff=32", "config.T5Config.num_heads=2"]
SENTENCES = ["a gorgeous , witty film", "the plot is a mess",
             "one of the best films of the year", "tedious and overlong",
             "a charming comedy", "i was bored from the start",
             "beautifully acted", "an embarrassment for everyone involved",
             "stocks rose on tuesday", "the museum opens at nine"]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
  d = tmp_path_factory.mktemp("refusion_train_db")
  (d / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=8,
                                 d_kv=4, d_ff=16, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  build_dense_index(None, d / "sentences.txt", d / "db",
                          encoder=load_dual_encoder(ckpt), progress=False)
  return d / "db"


def _args(model_dir, db, steps=6, extra=()):
  args = ["train", f"--gin_file={ROOT / 'gin/refusion/tiny.gin'}",
          f"--gin.MODEL_DIR='{model_dir}'", "--gin.TASK='sst-2'",
          f"--gin.DATA_DIR='{SST2}'", f"--gin.RETRIEVAL_DB='{db}'",
          "--gin.TOP_K=4", "--gin.FUSION_MODULES='key,value'",
          "--gin.SEARCH=True", f"--gin.TRAIN_STEPS={steps}", "--gin.SEED=13",
          "--gin.MAX_LENGTH=40", "--gin.EVAL_EVERY=3",
          "--gin.CHECKPOINT_EVERY=2", "--gin.LOG_EVERY=1",
          "--gin.loop.train.progress=False"]
  return args + [f"--gin.{b}" for b in TINY] + list(extra)


def _lines(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(l) for l in f]


@pytest.fixture(scope="module")
def searched(db, tmp_path_factory):
  out = tmp_path_factory.mktemp("refusion_run") / "out"
  assert main(_args(out, db)) == 0
  return out


def test_search_writes_structure_and_test_line(searched):
  lines = _lines(searched)
  test = [l for l in lines if "test_accuracy" in l]
  assert len(test) == 1 and test[0]["step"] == 6
  assert 0.0 <= test[0]["test_accuracy"] <= 1.0
  assert test[0]["test_examples"] == 40 and test[0]["flops_per_example"] > 0
  assert any("eval_accuracy" in l for l in lines)
  assert all("arch_loss" in l for l in lines if "loss" in l)
  saved = json.loads((searched / search.STRUCTURE_FILE).read_text())
  assert len(saved["structure"]) == 4 == len(saved["paths"])   # 2 layers x k, v
  assert set(saved["structure"]) <= set(F.SCHEMES)
  assert any(l.get("structure") for l in lines)


def test_structure_and_weights_restore(searched):
  model, params = load_refusion(str(searched))
  saved = json.loads((searched / search.STRUCTURE_FILE).read_text())
  assert model.fusion.structure == tuple(saved["structure"])
  assert not model.fusion.search
  # The restored model reproduces the recorded test accuracy.
  from jaxfid.refusion import lmbff
  from jaxfid.refusion import neighbours as nb
  from jaxfid.evaluation.classification import classification_metrics
  from jaxfid.core.tokenization import load_tokenizer
  run = json.loads((searched / "jaxfid_config.json").read_text())
  spec = lmbff.get_task("sst-2")
  examples = lmbff.read_split(spec, SST2, "test")
  tok = load_tokenizer(str(searched))
  labels = batch_lib.label_token_matrix(spec.label_words, tok)
  found = nb.retrieve_neighbours(run["retrieval_db"], [lmbff.segments(spec, e)
                                                       for e in examples], 4)
  arrays = batch_lib.encode_split(
      [lmbff.render_fitted(spec, e, 39, lambda t: len(tok.encode(t)))
       for e in examples],
      [e.label for e in examples], labels, tok, 40, found.vectors)
  batch = {k: v for k, v in arrays.items() if k != "labels"}
  preds = np.asarray(model.classify(params, batch, jnp.asarray(labels)))
  acc = classification_metrics("accuracy", preds, arrays["labels"])["accuracy"]
  recorded = [l for l in _lines(searched) if "test_accuracy" in l][0]
  assert acc == pytest.approx(recorded["test_accuracy"])


def test_rerun_of_a_finished_run_changes_nothing(searched, db, capsys):
  before = (searched / "metrics.jsonl").read_text()
  assert main(_args(searched, db)) == 0
  assert (searched / "metrics.jsonl").read_text() == before
  assert "nothing to do" in capsys.readouterr().err


def test_crash_then_rerun_matches_uninterrupted(searched, db, tmp_path,
                                                monkeypatch):
  out = tmp_path / "crashed"
  real = batch_lib.train_batch

  def crash_at_step_5(arrays, step, *a, **k):
    if step == 4:
      raise RuntimeError("simulated crash")
    return real(arrays, step, *a, **k)

  monkeypatch.setattr(batch_lib, "train_batch", crash_at_step_5)
  with pytest.raises(RuntimeError, match="simulated crash"):
    main(_args(out, db))
  monkeypatch.setattr(batch_lib, "train_batch", real)
  assert main(_args(out, db)) == 0
  want = {l["step"]: l for l in _lines(searched) if "loss" in l}
  got = {l["step"]: l for l in _lines(out) if "loss" in l}
  assert sorted(got) == sorted(want) == list(range(1, 7))
  for step in range(1, 7):
    for key in ("loss", "arch_loss"):
      assert got[step][key] == pytest.approx(want[step][key], rel=1e-5)
  test = lambda lines: [l for l in lines if "test_accuracy" in l]
  assert test(_lines(out))[0]["test_accuracy"] == test(
      _lines(searched))[0]["test_accuracy"]
  assert (json.loads((out / search.STRUCTURE_FILE).read_text())["structure"]
          == json.loads((searched / search.STRUCTURE_FILE).read_text())["structure"])


@pytest.mark.slow  # the loop's phase resume with fresh initial parameters is also checked by test_training_loop_guarantees
def test_retrain_resumes_in_its_phase_and_logs_the_structure_once(
    db, tmp_path, monkeypatch):
  """Search 3 steps, then retrain the argmax structure 3 more from the
  initial weights; a crash inside the retrain resumes step for step."""
  extra = ["--gin.RETRAIN=True"]
  whole, out = tmp_path / "whole", tmp_path / "crashed"
  assert main(_args(whole, db, steps=3, extra=extra)) == 0
  real = batch_lib.train_batch

  def crash_at_step_5(arrays, step, *a, **k):
    if step == 4:
      raise RuntimeError("simulated crash")
    return real(arrays, step, *a, **k)

  monkeypatch.setattr(batch_lib, "train_batch", crash_at_step_5)
  with pytest.raises(RuntimeError, match="simulated crash"):
    main(_args(out, db, steps=3, extra=extra))
  monkeypatch.setattr(batch_lib, "train_batch", real)
  assert main(_args(out, db, steps=3, extra=extra)) == 0
  for lines in (_lines(whole), _lines(out)):
    steps = [l for l in lines if "loss" in l]
    assert [l["step"] for l in steps] == list(range(1, 7))
    assert all("arch_loss" in l for l in steps if l["step"] <= 3)
    assert not any("arch_loss" in l for l in steps if l["step"] > 3)
    assert [l["step"] for l in lines if "structure" in l] == [3]
    assert not any("structure_reranker" in l for l in lines
                   if l["step"] > 3)
    test = [l for l in lines if "test_accuracy" in l]
    assert len(test) == 1 and test[0]["step"] == 6
  want = {l["step"]: l["loss"] for l in _lines(whole) if "loss" in l}
  got = {l["step"]: l["loss"] for l in _lines(out) if "loss" in l}
  for step in range(1, 7):
    assert got[step] == pytest.approx(want[step], rel=1e-5)
  test = lambda d: [l for l in _lines(d) if "test_accuracy" in l][0]
  assert test(out)["test_accuracy"] == test(whole)["test_accuracy"]
  model, _ = load_refusion(str(out))
  saved = json.loads((out / search.STRUCTURE_FILE).read_text())
  assert model.fusion.structure == tuple(saved["structure"])
  assert saved["step"] == 3


def test_init_checkpoint_backbone_goes_into_fresh_fusion_params(db, tmp_path):
  from jaxfid.checkpoints.load import load_checkpoint
  from jaxfid.core.errors import InputError
  from jaxfid.refusion.task import ReFusionData, ReFusionTask
  from jaxfid.training.task import Settings
  sizes = dict(vocab_size=32128, d_model=16, d_kv=4, d_ff=32, num_heads=2,
               num_layers=2, num_decoder_layers=2)
  cfg = dataclasses.replace(preset("tiny"), **{
      k: v for k, v in sizes.items() if k != "vocab_size"})
  task = ReFusionTask(data=ReFusionData(
      task="sst-2", data_dir=str(SST2), retrieval_db=str(db), top_k=4,
      max_length=40), model_config=cfg)
  built = dict(vars(task))
  p = task.prepare(Settings(model_dir=str(tmp_path / "run"), train_steps=1,
                            batch_size=8, seed=3, progress=False))
  assert vars(task) == built  # what prepare made is in its frozen value
  ckpt = make_tiny_hf_checkpoint(tmp_path / "hf", **sizes)
  params = task.initial_params(p, str(ckpt))
  backbone = load_checkpoint(str(ckpt))[1]
  fresh = p.model.init_params(3)
  flat = lambda t: {"/".join(str(k.key) for k in p): np.asarray(v) for p, v
                    in jax.tree_util.tree_leaves_with_path(t)}
  got, theirs, mine = flat(params), flat(backbone), flat(fresh)
  assert set(got) == set(mine) and set(theirs) < set(got)
  for name, value in got.items():
    np.testing.assert_array_equal(
        value, theirs[name] if name in theirs else mine[name])
  assert any("fusion_alpha" in n for n in set(got) - set(theirs))
  wider = make_tiny_hf_checkpoint(tmp_path / "hf64", **dict(sizes, d_ff=64))
  with pytest.raises(InputError, match="d_ff"):
    task.initial_params(p, str(wider))


@pytest.mark.slow  # the plain baseline also runs in test_refusion_seqio_eval
def test_baselines_plain_and_concatenation(db, tmp_path):
  plain, concat = tmp_path / "plain", tmp_path / "concat"
  assert main(_args(plain, db, steps=2, extra=[
      "--gin.FUSION_MODULES='none'", "--gin.RETRIEVAL_DB=None"])) == 0
  assert main(_args(concat, db, steps=2, extra=[
      "--gin.FUSION_MODULES='none'", "--gin.CONCAT_NEIGHBOURS=True",
      "--gin.MAX_LENGTH=80"])) == 0
  p = [l for l in _lines(plain) if "test_accuracy" in l][0]
  c = [l for l in _lines(concat) if "test_accuracy" in l][0]
  assert c["flops_per_example"] > p["flops_per_example"]
  assert not (plain / search.STRUCTURE_FILE).exists()
  params = load_refusion(str(plain))[1]
  assert "fusion_alpha" not in json.dumps(jax.tree.map(lambda x: 0, params))


@pytest.mark.parametrize("extra,needle", [
    (["--gin.RETRIEVAL_DB=None"], "RETRIEVAL_DB"),
    (["--gin.FUSION_MODULES='keys'"], "FUSION_MODULES"),
    (["--gin.DATA_DIR='/nonexistent/SST-2'"], "nonexistent"),
    (["--gin.MASK_SAMPLER='hard'"], "MASK_SAMPLER"),
    (["--gin.TEMPLATES='lmbff'"], "TEMPLATES"),
])
def test_bad_settings_are_one_line_errors(db, tmp_path, capsys, extra, needle):
  assert main(_args(tmp_path / "bad", db, extra=extra)) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and needle in err[0]
  assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def test_bilevel_step_updates_each_group_only_in_its_half():
  cfg = dataclasses.replace(preset("tiny"), d_model=16, d_kv=4, d_ff=32,
                            num_heads=2, vocab_size=64, dropout_rate=0.0)
  fusion = F.FusionConfig(modules="key,value", top_k=3,
                          db_dim=5, search=True)
  model = ReFusionModel(cfg, fusion)
  params = model.init_params(0)
  model_opt, arch_opt = search.group_optimizers(params, optax.adam(1e-2), 1e-1)
  rng = np.random.default_rng(0)

  def batch():
    return {"encoder_input_tokens": jnp.asarray(rng.integers(2, 64, (4, 6)),
                                                jnp.int32),
            "decoder_target_tokens": jnp.asarray(rng.integers(2, 64, (4, 2)),
                                                 jnp.int32),
            "neighbours": jnp.asarray(rng.normal(size=(4, 1, 3, 5)), jnp.float32)}

  train, dev = batch(), batch()
  state = {"step": jnp.zeros((), jnp.int32), "params": params,
           "opt_state": model_opt.init(params),
           "arch_opt_state": arch_opt.init(params)}
  # jitted as the loop runs them (op by op, each primitive compiles alone)
  new, metrics = jax.jit(search.make_step(model, model_opt, arch_opt, seed=0,
                                          with_arch=True))(
                                              state, {"train": train,
                                                      "dev": dev})
  assert float(metrics["finite"]) == 1.0
  # The same two halves, run one at a time.
  loss_fn = lambda p, b, r, n: model.loss(p, b, r, normalizer=n)
  arch = jax.jit(make_train_step(loss_fn, arch_opt,
                                 seed=search.ARCH_SEED_OFFSET))(
      {"step": state["step"], "params": params,
       "opt_state": state["arch_opt_state"]}, dev)[0]["params"]
  after = jax.jit(make_train_step(loss_fn, model_opt, seed=0))(
      {"step": state["step"], "params": arch,
       "opt_state": state["opt_state"]}, train)[0]["params"]

  def leaves(tree, arch_only):
    return [np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)
            if is_arch_path(p) == arch_only]

  for a, b in zip(leaves(arch, False), leaves(params, False)):
    np.testing.assert_array_equal(a, b)         # arch step: model frozen
  assert any(not np.array_equal(a, b) for a, b in
             zip(leaves(arch, True), leaves(params, True)))
  for a, b in zip(leaves(after, True), leaves(arch, True)):
    np.testing.assert_array_equal(a, b)         # model step: arch frozen
  assert any(not np.array_equal(a, b) for a, b in
             zip(leaves(after, False), leaves(arch, False)))
  for a, b in zip(jax.tree.leaves(new["params"]), jax.tree.leaves(after)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fusion_lr_scale_and_the_originals_arch_optimizer():
  cfg = dataclasses.replace(preset("tiny"), d_model=16, d_kv=4, d_ff=32,
                            num_heads=2, vocab_size=64)
  params = ReFusionModel(cfg, F.FusionConfig(
      modules="key", top_k=3, db_dim=5,
      search=True)).init_params(0)
  ones = jax.tree.map(jnp.ones_like, params)
  model_opt, arch_opt = search.group_optimizers(
      params, optax.sgd(0.1), search.arch_optimizer(0.5),
      fusion_lr_scale=3.0)
  updates, _ = model_opt.update(ones, model_opt.init(params), params)
  for path, u in jax.tree_util.tree_leaves_with_path(updates):
    want = {"arch": 0.0, "fusion": -0.3, "model": -0.1}[search.param_group(path)]
    np.testing.assert_allclose(np.asarray(u), want, rtol=1e-6)
  names = {str(p[-1].key) for p, _ in jax.tree_util.tree_leaves_with_path(params)
           if search.param_group(p) == "fusion"}
  assert names == {"fusion_rerank", "fusion_beta", "fusion_proj"}
  # The original's: AdamW, linear warm-up over 10 steps, then linear decay
  # to 0 at step 100. With a constant gradient Adam's step is exactly the
  # learning rate, less the decay lr * wd * alpha (alpha < 0, ~2e-3 of it).
  opt = search.arch_optimizer(0.5, kind="adamw", weight_decay=1e-4,
                              warmup_steps=10, total_steps=100)
  alpha = jnp.zeros((3,))
  state, sizes = opt.init(alpha), []
  for _ in range(100):
    u, state = opt.update(jnp.ones((3,)), state, alpha)
    alpha = alpha + u
    sizes.append(float(-u[0]))
  np.testing.assert_allclose([sizes[i] for i in (0, 5, 10, 55)],
                             [0.0, 0.25, 0.5, 0.25], rtol=5e-3, atol=1e-6)
  assert 0 < sizes[99] < 0.01
  with pytest.raises(ValueError, match="sgd"):
    search.arch_optimizer(0.5, kind="sgd")


@pytest.mark.slow  # online hidden-mode retrieval; its database check stays fast
def test_hidden_mode_retrieves_online_with_the_model_states(tmp_path):
  d = tmp_path
  (d / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
  # A database of the backbone's own width (d_model 16), as hidden mode needs.
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=16,
                                 d_kv=4, d_ff=32, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  build_dense_index(None, d / "sentences.txt", d / "db16",
                          encoder=load_dual_encoder(ckpt), progress=False)
  out = d / "hidden"
  assert main(_args(out, d / "db16", steps=2, extra=[
      "--gin.RETRIEVAL_MODE='hidden'"])) == 0
  test = [l for l in _lines(out) if "test_accuracy" in l]
  assert len(test) == 1 and test[0]["step"] == 2
  assert json.loads((out / "jaxfid_config.json").read_text())[
      "retrieval_mode"] == "hidden"
  assert not (d / "db16" / "neighbour_cache").exists()   # nothing offline
  # The on-line neighbours are the database's nearest rows to the queries.
  from jaxfid.refusion import neighbours as nb
  searcher = nb.open_database(d / "db16")
  q = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
  got = nb.online_neighbours(searcher, q, 4)
  allv = searcher.vectors(np.arange(len(SENTENCES)))
  best = np.argsort(-(q @ allv.T), axis=1, kind="stable")[:, :4]
  np.testing.assert_allclose(got[:, 0], allv[best], rtol=1e-6)


@pytest.mark.slow  # two tiny runs: every module searches in the program
def test_layer_mode_retrieves_in_every_module(tmp_path, capsys):
  """Issue #27 item 5: RETRIEVAL_MODE='layer' (the paper's 'Hidden') trains
  and evaluates with each key/value module searching the database with its
  own input; modules whose input is not the hidden state are refused."""
  d = tmp_path
  (d / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
  ckpt = make_tiny_hf_checkpoint(d / "t5", vocab_size=32128, d_model=16,
                                 d_kv=4, d_ff=32, num_heads=2, num_layers=1,
                                 num_decoder_layers=1)
  build_dense_index(None, d / "sentences.txt", d / "db16",
                    encoder=load_dual_encoder(ckpt), progress=False)
  out = d / "layer"
  assert main(_args(out, d / "db16", steps=2, extra=[
      "--gin.RETRIEVAL_MODE='layer'"])) == 0
  test = [l for l in _lines(out) if "test_accuracy" in l]
  assert len(test) == 1 and test[0]["step"] == 2
  assert json.loads((out / "jaxfid_config.json").read_text())[
      "retrieval_mode"] == "layer"
  assert not (d / "db16" / "neighbour_cache").exists()   # nothing offline
  capsys.readouterr()
  assert main(_args(d / "ffn", d / "db16", steps=2, extra=[
      "--gin.RETRIEVAL_MODE='layer'", "--gin.FUSION_MODULES='ffn'"])) == 2
  assert "only query, key, value modules" in capsys.readouterr().err


def test_hidden_mode_needs_a_database_of_the_model_width(db, tmp_path, capsys):
  assert main(_args(tmp_path / "h", db, extra=[
      "--gin.RETRIEVAL_MODE='hidden'"])) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and "hidden" in err[0] and "16-d" in err[0]


def _gin_optimizers(gin_file: str):
  """The run's OptimizerSettings and SearchConfig as ``gin_file`` binds them."""
  import gin
  from jaxfid.commands import gin_flags
  gin_flags.parse_gin([gin_file], ["MODEL_DIR = 'x'", "TASK = 'sst-2'",
                                   f"DATA_DIR = '{SST2}'"])
  try:
    return (gin.query_parameter("loop.train.optimizer").scoped_configurable_fn(),
            gin.query_parameter(
                "refusion_task.ReFusionTask.search").scoped_configurable_fn())
  finally:
    gin.clear_config()


def test_t5_base_optimizers_are_the_originals():
  """Issue #27 item 3 (``create_optimizer_and_scheduler`` and ``train_nas``
  of the original's ``run_glue_encoder_decoder.py``): the model's AdamW
  decays every weight by 1e-4 except the layer norms, warms up over 100
  steps then decays linearly to 0, and neither step clips its gradients."""
  optimizer, options = _gin_optimizers("gin/refusion/t5_base.gin")
  cfg = dataclasses.replace(preset("tiny"), d_model=8, d_kv=4, d_ff=8,
                            num_heads=2, vocab_size=16, num_layers=1,
                            num_decoder_layers=1)
  rng = np.random.default_rng(0)
  params = jax.tree.map(                       # the tree, any values but 0
      lambda a: rng.uniform(1.0, 2.0, a.shape).astype(np.float32),
      ReFusionModel(cfg, F.FusionConfig(modules="key", top_k=3, db_dim=5,
                                        search=True)).abstract_params())
  schedule, model_opt, _ = search.optimizers(params, optimizer, options, 1000)
  lr = 1e-5
  np.testing.assert_allclose(schedule(np.array([0, 50, 100, 550, 1000])),
                             [0.0, lr / 2, lr, lr / 2, 0.0], rtol=1e-6, atol=1e-12)
  # Zero gradients: Adam's step is 0, what is left is the decay -lr * wd * p
  # (the 51st update's rate is schedule(50)).
  zeros = jax.tree.map(np.zeros_like, params)
  update = jax.jit(model_opt.update)
  state = model_opt.init(params)
  for _ in range(51):
    updates, state = update(zeros, state, params)
  decayed = 0
  for path, u in jax.tree_util.tree_leaves_with_path(updates):
    name, p = str(path[-1].key), params
    for k in path:
      p = p[k.key]
    want = (0.0 if name == "scale" or search.param_group(path) == "arch"
            else -lr / 2 * 1e-4 * np.asarray(p))
    np.testing.assert_allclose(np.asarray(u), want, rtol=1e-4, atol=1e-16)
    decayed += name != "scale" and search.param_group(path) != "arch"
  assert decayed and any(str(p[-1].key) == "scale" for p, _ in
                         jax.tree_util.tree_leaves_with_path(params))
  # No clipping: the arch step equals unclipped AdamW on gradients whose
  # norms vary (clipping at 1 would change Adam's normalised steps).
  arch = {"a": jnp.zeros((3,))}
  arch_only = search.arch_optimizer(
      1e-4, kind="adamw", weight_decay=1e-4, warmup_steps=100,
      total_steps=1000, clip_norm=options.arch_clip_norm)
  grads = [jnp.array([30.0, -40.0, 0.0]), jnp.array([0.1, 0.2, -0.3])]

  def run(opt):
    @jax.jit
    def steps(p):
      s = opt.init(p)
      for g in grads * 3:
        u, s = opt.update({"a": g}, s, p)
        p = optax.apply_updates(p, u)
      return p["a"]
    return np.asarray(steps(arch))
  schedule_arch = optax.join_schedules(
      [optax.linear_schedule(0.0, 1e-4, 100),
       optax.linear_schedule(1e-4, 0.0, 900)], [100])
  unclipped = run(optax.adamw(schedule_arch, weight_decay=1e-4))
  np.testing.assert_allclose(run(arch_only), unclipped, rtol=1e-6)
  assert options.arch_warmup_steps == 100 and options.arch_weight_decay == 1e-4
  clipped = search.arch_optimizer(
      1e-4, kind="adamw", weight_decay=1e-4, warmup_steps=100,
      total_steps=1000, clip_norm=1.0)
  assert not np.allclose(run(clipped), unclipped, rtol=1e-3)
  assert optimizer.clip_norm in (None, 0)


@pytest.mark.slow  # a tiny run end to end, scored by generation
def test_original_t5_protocol_trains_and_scores_by_generation(db, tmp_path):
  """Issue #27 item 4: TEMPLATES='original_t5' with SCORING='generate' (the
  original T5 script's protocol) runs end to end and records its scoring."""
  out = tmp_path / "t5_protocol"
  assert main(_args(out, db, steps=2, extra=[
      "--gin.TEMPLATES='original_t5'", "--gin.SCORING='generate'",
      "--gin.EVAL_EVERY=2"])) == 0
  last = _lines(out)[-1]
  assert 0.0 <= last["test_accuracy"] <= 1.0 and "flops_per_example" in last
  assert any("eval_accuracy" in line for line in _lines(out))
  config = json.loads((out / "jaxfid_config.json").read_text())
  assert config["scoring"] == "generate"
  assert config["label_words"] == ["negative", "positive"]
  assert "{mask}" not in config["template"]


def test_layer_mode_is_refused_where_its_database_cannot_follow(tmp_path):
  """'layer' retrieval keeps its database in the programs: `jaxfid bench
  compile` (no database read) and `jaxfid eval` (which rebuilds the
  neighbours itself) refuse it in one line."""
  from jaxfid.core.errors import InputError
  from jaxfid.refusion.checkpoint_eval import ReFusionCheckpointEvaluator
  from jaxfid.refusion.task import ReFusionData, ReFusionTask
  task = ReFusionTask(data=ReFusionData(task="sst-2", data_dir="d",
                                        retrieval_db="db",
                                        retrieval_mode="layer"))
  with pytest.raises(InputError, match="not compiled ahead of time"):
    task.prepare_shapes(None)
  with pytest.raises(InputError, match="RETRIEVAL_MODE 'layer' run"):
    ReFusionCheckpointEvaluator(str(tmp_path), {
        "method": "refusion", "max_length": 8, "fusion": {}, "model": {},
        "retrieval_mode": "layer"})
