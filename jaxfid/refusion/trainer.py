"""The ReFusion trainer, top to bottom: data, retrieval, model, search, eval.

gin configures :func:`train` (``gin/refusion/*.gin``; macros ``MODEL_DIR``,
``TASK``, ``DATA_DIR``, ``RETRIEVAL_DB``, ``TOP_K``, ``FUSION_MODULES``,
``SEARCH``, ``TRAIN_STEPS``, ``SEED``, ...). Nothing below the top reads gin.

Phases:
  * with ``search`` (and fusion modules), steps ``[0, train_steps)`` are the
    bi-level search: each step first updates the architecture weights on a
    dev batch (model weights frozen), then the model weights on a train batch
    (architecture weights frozen) — first-order alternation, each group with
    its own optimizer, the other group's update exactly zero. Then every
    module takes its argmax scheme; the structure is written to
    ``MODEL_DIR/refusion_structure.json`` and logged. With ``retrain`` the
    discrete structure is trained again from the initial weights for
    ``train_steps`` more steps (fresh optimizer), as DARTS does;
  * without search, every fusion module uses ``fusion_scheme`` (or there are
    none: ``FUSION_MODULES='none'`` is the plain prompt-tuned backbone).

Evaluation is rank classification over the label words with the discrete
structure and the expected ordered mask: ``eval_*`` on the dev set every
``eval_every`` steps, and at the end a line with ``test_accuracy`` (plus the
task's own metric, ``test_f1`` or ``test_mcc``) and ``flops_per_example``
(XLA's count for scoring one example). The last checkpoint is the result (the
paper's setting). Batches and dropout are functions of (seed, step) and
checkpoints hold both optimizers, so a rerun resumes step for step.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfid.core.errors import InputError
from jaxfid.t5.config import T5Config
from jaxfid.refusion import batches as batch_lib
from jaxfid.refusion import fusion as fusion_lib
from jaxfid.evaluation.classification import classification_metrics
from jaxfid.refusion.model import ReFusionModel, is_arch_path
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.training import optim
from jaxfid.training import loop as loop_lib
from jaxfid.training.metrics_log import MetricsLog, read_records
from jaxfid.training.step import make_train_step
from jaxfid.fid.trainer import (
    Preemption, checked_mesh, global_batch, make_shardings)

STRUCTURE_FILE = "refusion_structure.json"
ARCH_SEED_OFFSET = 7919  # the architecture step's own dropout stream


# ---- pieces ---------------------------------------------------------------------


def _atomic_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def read_structure(model_dir: str) -> dict | None:
  path = os.path.join(model_dir, STRUCTURE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def group_optimizers(params: dict, model_opt: optax.GradientTransformation,
                     arch_learning_rate: float):
  """(model step's optimizer, architecture step's optimizer) over all params.

  Each updates its own group and leaves the other exactly unchanged.
  """
  labels = jax.tree_util.tree_map_with_path(
      lambda path, _: "arch" if is_arch_path(path) else "model", params)
  zero = optax.set_to_zero()
  return (optax.multi_transform({"model": model_opt, "arch": zero}, labels),
          optax.multi_transform({"model": zero,
                                 "arch": optax.adam(arch_learning_rate)}, labels))


def initial_params(model: ReFusionModel, init_checkpoint: str | None,
                   seed: int) -> dict:
  """Fresh fusion parameters over the INIT_CHECKPOINT backbone (or fresh T5)."""
  params = model.init_params(seed)
  if not init_checkpoint:
    return params
  from jaxfid.checkpoints.load import load_checkpoint
  other, backbone, _ = load_checkpoint(init_checkpoint)
  plain = lambda c: dataclasses.replace(c, dropout_rate=0.0, dtype="float32",
                                        remat="none")
  if plain(other.config) != plain(model.config):
    diff = [f.name for f in dataclasses.fields(model.config)
            if getattr(plain(model.config), f.name) != getattr(plain(other.config), f.name)]
    raise InputError(init_checkpoint, "INIT_CHECKPOINT's model differs from "
                     f"the run's in {', '.join(diff)}; list the matching "
                     "gin/models file")

  def merge(mine: dict, theirs: dict, path: str) -> dict:
    out = dict(mine)
    for key, value in theirs.items():
      where = f"{path}/{key}" if path else key
      if key not in mine:
        raise InputError(init_checkpoint, f"unexpected parameter {where}")
      if isinstance(value, dict):
        out[key] = merge(mine[key], value, where)
      else:
        out[key] = jnp.asarray(value, jnp.float32)
    return out

  return merge(params, jax.device_get(backbone), "")


def make_step(model: ReFusionModel, model_opt: optax.GradientTransformation,
              arch_opt: optax.GradientTransformation, *, seed: int,
              with_arch: bool):
  """``step(state, train_batch, dev_batch) -> (state, metrics)``.

  With ``with_arch`` (the search): the architecture step on ``dev_batch``
  (its optimizer leaves the model weights exactly as they are), then the
  model step on ``train_batch`` (leaving the architecture weights as they
  are). Without it, only the model step (``dev_batch`` unused).
  """
  loss_fn = lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm)
  model_step = make_train_step(loss_fn, model_opt, seed=seed)
  arch_step = make_train_step(loss_fn, arch_opt, seed=seed + ARCH_SEED_OFFSET)

  def step_fn(state, batch, dev_batch):
    metrics = {}
    params, arch_finite = state["params"], jnp.ones((), jnp.float32)
    if with_arch:
      arch_state, arch_metrics = arch_step(
          {"step": state["step"], "params": params,
           "opt_state": state["arch_opt_state"]}, dev_batch)
      params = arch_state["params"]
      metrics["arch_loss"] = arch_metrics["loss"]
      arch_finite = arch_metrics["finite"]
    new, model_metrics = model_step(
        {"step": state["step"], "params": params,
         "opt_state": state["opt_state"]}, batch)
    out = dict(new)
    if with_arch:
      out["arch_opt_state"] = arch_state["opt_state"]
    metrics.update(model_metrics)
    metrics["finite"] = model_metrics["finite"] * arch_finite
    return out, metrics

  return step_fn


def completed_result(model_dir: str, latest: int | None,
                     final_step: int) -> dict | None:
  """The recorded test line when the run already finished, else None."""
  if latest != final_step:
    return None
  found = [r for r in read_records(model_dir)
           if r.get("step") == final_step and "test_accuracy" in r]
  return found[-1] if found else None


def opt_state_shardings(sh, optimizer: optax.GradientTransformation,
                        model: ReFusionModel):
  """Optimizer-state shardings: a leaf mirroring a parameter is sharded like
  it (found by its parameter path inside the state's key path), any other
  leaf (counts, masked groups' placeholders) is replicated."""
  flat = {}
  jax.tree_util.tree_map_with_path(
      lambda path, s: flat.setdefault(_names(path), s), sh.params)
  shapes = {}
  jax.tree_util.tree_map_with_path(
      lambda path, a: shapes.setdefault(_names(path), a.shape),
      model.abstract_params())

  def pick(path, leaf):
    names = _names(path)
    for i in range(len(names)):
      if names[i:] in flat and shapes[names[i:]] == leaf.shape:
        return flat[names[i:]]
    return sh.replicated

  abstract = jax.eval_shape(optimizer.init, model.abstract_params())
  return jax.tree_util.tree_map_with_path(pick, abstract)


def _names(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def without_arch(state_sh: dict) -> dict:
  return {k: v for k, v in state_sh.items() if k != "arch_opt_state"}


def flops_per_example(fn, *args, batch_size: int) -> float | None:
  """XLA's FLOP count of ``fn(*args)`` per example (None where unavailable)."""
  try:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  except Exception:  # pylint: disable=broad-except  # backend without it
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"]) / batch_size


# ---- the trainer --------------------------------------------------------------------


def train(*, model_dir: str, task: str, data_dir: str,
          retrieval_db: str | None = None, top_k: int = 64,
          fusion_modules: str = "key,value", search: bool = True,
          fusion_scheme: str = "reranker", retrain: bool = False,
          concat_neighbours: bool = False, neighbour_cache: str | None = None,
          retrieval_mode: str = "input",
          mask_temperature: float = 5.0,
          model_config: T5Config = T5Config(), init_checkpoint: str | None = None,
          train_steps: int = 1000, batch_size: int = 32, max_length: int = 128,
          learning_rate: float = 1e-5, arch_learning_rate: float = 1e-4,
          optimizer: str = "adamw", schedule: str = "constant",
          warmup_steps: int = 0, weight_decay: float = 0.0,
          clip_norm: float = 1.0, eval_every: int = 100,
          eval_batch_size: int = 32, checkpoint_every: int = 500,
          keep_checkpoints: int = 1, log_every: int = 10, seed: int = 42,
          mesh: str = "", on_nan: str = "stop", progress: bool = True) -> dict:
  """Train (and search) ReFusion on one few-shot task; returns the test line."""
  from jaxfid.refusion import lmbff
  from jaxfid.core.tokenization import load_tokenizer
  if on_nan not in ("stop", "skip"):
    raise InputError("ON_NAN", f"must be 'stop' or 'skip', got {on_nan!r}")
  try:
    targets = fusion_lib.parse_targets(fusion_modules)
  except ValueError as e:
    raise InputError("FUSION_MODULES", str(e)) from None
  search = search and bool(targets)
  if (targets or concat_neighbours) and not retrieval_db:
    raise InputError("RETRIEVAL_DB", "required with fusion modules or "
                     "CONCAT_NEIGHBOURS (build one with `jaxfid index dense`)")
  if top_k < 1 and (targets or concat_neighbours):
    raise InputError("TOP_K", f"must be at least 1, got {top_k}")
  if retrieval_mode not in ("input", "hidden"):
    raise InputError("RETRIEVAL_MODE", f"'input' or 'hidden', got "
                     f"{retrieval_mode!r}")
  hidden = retrieval_mode == "hidden" and bool(targets)
  if hidden and jax.process_count() > 1:
    raise InputError("RETRIEVAL_MODE", "'hidden' runs on one host")

  # 1. Data: read and validate every split before any work.
  spec = lmbff.get_task(task)
  splits = {s: lmbff.read_split(spec, data_dir, s)
            for s in ("train", "dev", "test")}
  spiece_dir = init_checkpoint if init_checkpoint and os.path.isfile(
      os.path.join(init_checkpoint, "spiece.model")) else None
  tokenizer = load_tokenizer(spiece_dir)
  label_tokens = batch_lib.label_token_matrix(spec.label_words, tokenizer)
  count_tokens = lambda text: len(tokenizer.encode(text))

  # 2. Retrieval, once per split (cached beside the database for reuse).
  neighbours, db_dim = {}, 0
  if targets or concat_neighbours:
    from jaxfid.refusion import neighbours as nb_lib
    db_dim = nb_lib.db_width(retrieval_db)
    if hidden and db_dim != model_config.d_model:
      raise InputError(retrieval_db, f"RETRIEVAL_MODE 'hidden' queries the "
                       f"database with the model's {model_config.d_model}-d "
                       f"hidden states, but it holds {db_dim}-d vectors: "
                       "build it with `jaxfid index dense --checkpoint` of "
                       "this backbone")
    for name, examples in splits.items():
      if hidden and not concat_neighbours:
        continue  # retrieved on-line, batch by batch
      neighbours[name] = nb_lib.retrieve_neighbours(
          retrieval_db, [lmbff.segments(spec, ex) for ex in examples], top_k,
          cache_dir=neighbour_cache, progress=progress, with_vectors=False)
  arrays = {}
  for name, examples in splits.items():
    # The prompt is fitted to MAX_LENGTH by shortening the sentences, so the
    # mask (often at the end of the template) is never truncated away.
    inputs = [lmbff.render_fitted(spec, ex, max_length - 1, count_tokens)
              for ex in examples]
    if concat_neighbours:
      inputs = batch_lib.with_neighbour_texts(inputs, nb_lib.neighbour_texts(
          retrieval_db, neighbours[name].rows))
    arrays[name] = batch_lib.encode_split(
        inputs, [ex.label for ex in examples], label_tokens, tokenizer,
        max_length)
    if targets and not hidden:  # rows only: vectors are gathered per batch
      arrays[name]["neighbour_rows"] = neighbours[name].rows

  # 3. Model, optimizers, mesh.
  saved = read_structure(model_dir)
  fusion = fusion_lib.FusionConfig(
      targets=targets, top_k=max(top_k, 1), db_dim=max(db_dim, 1),
      search=search, scheme=fusion_scheme, mask_temperature=mask_temperature)
  model = ReFusionModel(model_config, fusion)
  base_opt, lr_schedule = optim.make_optimizer(
      learning_rate, optimizer=optimizer, schedule=schedule,
      warmup_steps=warmup_steps, total_steps=train_steps,
      weight_decay=weight_decay, clip_norm=clip_norm)
  model_opt, arch_opt = group_optimizers(model.abstract_params(), base_opt,
                                         arch_learning_rate)
  device_mesh = checked_mesh(mesh, batch_size)
  sh = make_shardings(device_mesh, model, base_opt)
  state_sh = {"step": sh.replicated, "params": sh.params,
              "opt_state": opt_state_shardings(sh, model_opt, model)}
  if search:
    state_sh["arch_opt_state"] = opt_state_shardings(sh, arch_opt, model)

  # 4. Run directory.
  os.makedirs(model_dir, exist_ok=True)
  checkpointing.write_run_config(model_dir, {
      "method": "refusion", "model": model_config.to_dict(),
      "fusion": fusion.to_dict(), "task": spec.name, "max_length": max_length,
      "label_words": list(spec.label_words), "retrieval_db": retrieval_db,
      "concat_neighbours": concat_neighbours, "search": search,
      "retrieval_mode": "hidden" if hidden else "input",
      "retrain": retrain, "train_steps": train_steps})
  if not os.path.exists(os.path.join(model_dir, "spiece.model")):
    shutil.copyfile(tokenizer.path, os.path.join(model_dir, "spiece.model"))
  ckpts = checkpointing.RunCheckpoints(model_dir, keep=keep_checkpoints)
  final_step = train_steps * (2 if search and retrain else 1)
  pidx, pcount = jax.process_index(), jax.process_count()

  def state_of(params, with_arch: bool, start_step: int = 0) -> dict:
    """The train state over ``params``: fresh optimizers (and the search's)."""
    return {"step": jnp.asarray(start_step, jnp.int32), "params": params,
            "opt_state": model_opt.init(params),
            **({"arch_opt_state": arch_opt.init(params)} if with_arch else {})}

  def fresh_state(with_arch: bool, start_step: int = 0) -> dict:
    params = jax.device_put(initial_params(model, init_checkpoint, seed),
                            sh.params)
    out_sh = state_sh if with_arch else without_arch(state_sh)
    return jax.jit(lambda p: state_of(p, with_arch, start_step),
                   out_shardings=out_sh)(params)

  def restore(step: int, with_arch: bool) -> dict:
    abstract = jax.eval_shape(
        lambda: state_of(model.abstract_params(), with_arch))
    out_sh = state_sh if with_arch else without_arch(state_sh)
    abstract = jax.tree.map(lambda s, shard: jax.ShapeDtypeStruct(
        s.shape, s.dtype, sharding=shard), abstract, out_sh)
    return ckpts.restore(abstract, step)

  # Each batch's neighbour vectors: 'input' mode gathers the stored vectors
  # of the cached rows (only rows stay in memory: a 10k-example test set at
  # k = 64, width 768 would otherwise hold 2-4 GB); 'hidden' mode searches
  # with the backbone's current mean-pooled encoder states.
  searcher = nb_lib.open_database(retrieval_db) if targets else None
  pooled = jax.jit(model.pooled_hidden)

  def add_neighbours(params, host: dict) -> dict:
    """A host batch with its ``neighbours`` vectors [B, S, K, R]."""
    if "neighbour_rows" in host:  # 'input' mode: the cached rows' vectors
      host = dict(host)
      return dict(host, neighbours=nb_lib.gather_vectors(
          searcher, host.pop("neighbour_rows")))
    if not hidden:
      return host
    queries = np.asarray(jax.device_get(pooled(
        params, jax.device_put(host["encoder_input_tokens"], sh.replicated))),
        np.float32)
    return dict(host, neighbours=nb_lib.online_neighbours(
        searcher, queries, top_k))

  # 5. Steps: the model step, and the search's architecture step.
  def compiled_steps(net_model: ReFusionModel, with_arch: bool):
    out_sh = state_sh if with_arch else without_arch(state_sh)
    return jax.jit(make_step(net_model, model_opt, arch_opt, seed=seed,
                             with_arch=with_arch),
                   in_shardings=(out_sh, sh.batch, sh.batch),
                   out_shardings=(out_sh, sh.replicated), donate_argnums=0)

  classifiers: dict = {}

  def evaluate(params, structure_model: ReFusionModel, split: str) -> dict:
    key = structure_model.fusion
    if key not in classifiers:
      classifiers[key] = jax.jit(
          lambda p, b: structure_model.classify(p, b, jnp.asarray(label_tokens)))
    preds = []
    for b, real in batch_lib.eval_batches(arrays[split], eval_batch_size):
      b = jax.device_put(add_neighbours(params, b), sh.replicated)
      preds.append(np.asarray(jax.device_get(classifiers[key](params, b)))[:real])
    preds = np.concatenate(preds) if preds else np.zeros((0,), np.int32)
    return classification_metrics(spec.metric, preds.tolist(),
                                  arrays[split]["labels"].tolist())

  def discrete_model(params) -> tuple[ReFusionModel, tuple[str, ...] | None]:
    if not search:
      return model, None
    structure = model.discretize(params)
    return model.with_fusion(dataclasses.replace(
        fusion, search=False, structure=structure)), structure

  # 6. The loop (one or two phases).
  log = None
  last: dict = {}
  t0 = time.time()
  done = completed_result(model_dir, ckpts.latest_step(), final_step)
  if done is not None:
    ckpts.close()
    print(f"{model_dir} is complete (step {final_step}); nothing to do",
          file=sys.stderr)
    return done
  with jax.set_mesh(device_mesh), Preemption() as preemption:
    latest = ckpts.latest_step()
    start = latest or 0
    log = MetricsLog(model_dir, resume_step=start)
    if latest is None:
      state = fresh_state(search)
    elif latest <= train_steps:
      state = restore(latest, search)
    else:
      state = None  # the retrain phase: restored below
    phases = [("search" if search else "train", 0, train_steps, search)]
    if search and retrain:
      phases.append(("retrain", train_steps, final_step, False))
    loop = loop_lib.StepLoop(total=final_step, start=start, desc="train",
                             progress=progress, on_nan=on_nan)
    step = start
    eval_model = model
    try:
      for phase, begin, end, with_arch in phases:
        if step > end:
          continue  # a finished search (its structure is on disk)
        if phase == "retrain":
          structure = tuple((saved or read_structure(model_dir))["structure"])
          eval_model = model.with_fusion(dataclasses.replace(
              fusion, search=False, structure=structure))
          state = (restore(step, False) if step > train_steps
                   else fresh_state(False, train_steps))
        step_fn = compiled_steps(eval_model if phase == "retrain" else model,
                                 with_arch)
        loop.restart_clock()
        ran = step < end
        while step < end:
          batch = global_batch(add_neighbours(state["params"], batch_lib.train_batch(
              arrays["train"], step, batch_size, seed, pidx, pcount)),
              sh.batch, batch_size)
          dev = global_batch(add_neighbours(state["params"], batch_lib.train_batch(
              arrays["dev"], step, batch_size, seed + 1, pidx, pcount)),
              sh.batch, batch_size) if with_arch else batch
          state, metrics = step_fn(state, batch, dev)
          step += 1
          metrics = loop.finished_step(step, metrics)
          if step % log_every == 0 or step == end:
            last = {k: float(metrics[k]) for k in (
                "loss", "token_accuracy", "grad_norm", "arch_loss")
                if k in metrics}
            last["learning_rate"] = float(lr_schedule(step - begin - 1))
            last["examples_per_sec"] = loop.rate(batch_size)
            log.write(step, last)
            loop.show(loss=f"{last['loss']:.4f}")
          if step % eval_every == 0 or step == end:
            current, structure = (discrete_model(state["params"])
                                  if phase != "retrain" else (eval_model, None))
            scores = evaluate(state["params"], current, "dev")
            record = {f"eval_{k}": v for k, v in scores.items()}
            if structure is not None:
              record.update({f"structure_{s}": structure.count(s)
                             for s in fusion_lib.SCHEMES})
            log.write(step, record)
            last.update(record)
          if step % checkpoint_every == 0 or step == end:
            ckpts.save(step, state, force=step == end)
          if preemption.requested:
            ckpts.save(step, state, force=True)
            print(f"SIGTERM: saved step {step} to {model_dir}; exiting",
                  file=sys.stderr)
            return {"step": step, "preempted": True}
        if phase == "search" and step == end and (
            ran or read_structure(model_dir) is None):
          eval_model, structure = discrete_model(state["params"])
          record = {"step": end, "paths": ["/".join(p) for p in model.paths],
                    "structure": list(structure),
                    "arch_weights": [w for _, w in model.arch_weights(
                        jax.device_get(state["params"]))]}
          if pidx == 0:
            _atomic_json(os.path.join(model_dir, STRUCTURE_FILE), record)
          log.write(end, {"structure": ",".join(
              f"{p}={s}" for p, s in zip(record["paths"], structure))})
          print("searched structure: " + ", ".join(
              f"{p}={s}" for p, s in zip(record["paths"], structure)),
              file=sys.stderr)
          saved = record
        elif phase == "search":
          eval_model, _ = discrete_model(state["params"])

      # 7. Test: rank classification with the discrete structure.
      if state is None:  # resumed after the very end of the retrain phase
        state = restore(step, False)
      scores = evaluate(state["params"], eval_model, "test")
      result = {f"test_{k}": v for k, v in scores.items()}
      result["test_examples"] = len(splits["test"])
      one = add_neighbours(state["params"], {
          k: v[:1] for k, v in arrays["test"].items() if k != "labels"})
      flops = flops_per_example(
          lambda p, b: eval_model.label_scores(p, b, jnp.asarray(label_tokens)),
          state["params"], jax.device_put(one, sh.replicated), batch_size=1)
      if flops is not None:
        result["flops_per_example"] = flops
      log.write(step, result)
      last.update(result)
    finally:
      loop.close()
      log.close()
      ckpts.close()
  last["step"] = step
  last["train_time_s"] = time.time() - t0
  return last
