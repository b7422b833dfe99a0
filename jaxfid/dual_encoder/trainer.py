"""DPR-style training of the T5 dual encoder (``jaxfid train`` via gin).

Each step embeds B questions and, for each, its positive passage and H hard
negatives (:class:`~jaxfid.dual_encoder.data.PairBatcher`). Every
question is scored against *all* B*(1+H) passages of the batch — its own
positive, the other questions' positives and everyone's hard negatives (DPR's
in-batch negatives) — and the loss is the cross-entropy of picking its
positive: ``softmax(q . p / temperature)``. The batch is sharded over the
``data`` mesh axis; the similarity matrix is global, so negatives come from
every device.

Questions and passages share one encoder by default (GTR); ``shared=False``
gives questions their own tower (DPR). AdamW with warmup and linear decay,
gradient clipping; a non-finite loss never reaches the parameters.

``MODEL_DIR`` is a jaxfid model directory: ``jaxfid_config.json`` (``"method":
"dual_encoder"``, the T5 config without decoder layers, the pooling and
towers), ``spiece.model``, ``checkpoints/<step>/`` (latest train states, the
run resumes from them), ``best/`` (the parameters with the best
``eval_top1`` when EVAL_DATA is given) and ``metrics.jsonl``. Its encoder is
what ``jaxfid index dense --checkpoint MODEL_DIR`` loads.

Metrics: ``loss``, ``accuracy`` (the positive scores highest among the batch's
passages), ``mean_rank``; with eval data, ``eval_top1``/``eval_top5``: the
positive's rank among all eval questions' passages.
"""
from __future__ import annotations

import os
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxfid.core import sharding as shd
from jaxfid.core.errors import InputError
from jaxfid.t5.config import T5Config
from jaxfid.dual_encoder.data import PairBatcher, read_pair_examples
from jaxfid.dual_encoder.model import (
    QUERY_TOWER, T5_KEYS, DualEncoder, DualEncoderConfig, passage_text)
from jaxfid.checkpoints import model_dir as checkpointing
from jaxfid.training import optim
from jaxfid.training.metrics_log import MetricsLog

_ENCODER_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads",
                   "num_layers", "feed_forward_proj",
                   "relative_attention_num_buckets",
                   "relative_attention_max_distance", "layer_norm_epsilon")


def contrastive_loss(encoder: DualEncoder, params: dict, batch: dict,
                     dropout_rng=None, temperature: float = 1.0):
  """In-batch-negative cross-entropy; returns (loss, metrics)."""
  rq = rp = None
  if dropout_rng is not None:
    rq, rp = jax.random.split(dropout_rng)
  q = encoder.embed(params, batch["query_tokens"], tower="query",
                    dropout_rng=rq)                           # [B, D]
  p = encoder.embed(params, batch["passage_tokens"], tower="passage",
                    dropout_rng=rp)                           # [B*(1+H), D]
  scores = (q @ p.T) / temperature                            # [B, B*(1+H)]
  scores = jnp.where(batch["passage_mask"][None, :], scores, -1e9)
  per = p.shape[0] // q.shape[0]
  targets = jnp.arange(q.shape[0]) * per
  logp = jax.nn.log_softmax(scores, axis=-1)
  loss = -jnp.mean(jnp.take_along_axis(logp, targets[:, None], axis=1))
  positive = jnp.take_along_axis(scores, targets[:, None], axis=1)
  rank = 1 + jnp.sum(scores > positive, axis=1)
  return loss, {"loss": loss,
                "accuracy": jnp.mean((rank == 1).astype(jnp.float32)),
                "mean_rank": jnp.mean(rank.astype(jnp.float32))}


def make_step(encoder: DualEncoder, optimizer, *, seed: int,
              temperature: float):
  """``step(state, batch) -> (state, metrics)`` (pure; jit it)."""
  base = jax.random.key(seed)

  def step(state, batch):
    rng = jax.random.fold_in(base, state["step"])
    grad_fn = jax.value_and_grad(
        lambda p: contrastive_loss(encoder, p, batch, rng, temperature),
        has_aux=True)
    (loss, metrics), grads = grad_fn(state["params"])
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = optimizer.update(grads, state["opt_state"],
                                          state["params"])
    params = optax.apply_updates(state["params"], updates)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o),
                                         new, old)
    return ({"step": state["step"] + 1,
             "params": keep(params, state["params"]),
             "opt_state": keep(opt_state, state["opt_state"])},
            dict(metrics, grad_norm=grad_norm,
                 finite=finite.astype(jnp.float32)))

  return step


def _state_shardings(encoder: DualEncoder, optimizer, mesh) -> dict:
  params = encoder.param_shardings(mesh)
  specs = jax.tree.map(lambda s: s.spec, params)
  is_spec = lambda x: isinstance(x, PartitionSpec)
  opt_shapes = jax.eval_shape(optimizer.init, encoder.abstract_params())
  opt_specs = optax.tree_map_params(
      optimizer, lambda _, spec: spec, opt_shapes, specs,
      transform_non_params=lambda _: PartitionSpec(), is_leaf=is_spec)
  replicated = NamedSharding(mesh, PartitionSpec())
  return {"step": replicated, "params": params,
          "opt_state": jax.tree.map(lambda s: NamedSharding(mesh, s),
                                    opt_specs, is_leaf=is_spec)}


def initial_params(encoder: DualEncoder, init_checkpoint: str | None,
                   seed: int) -> dict:
  """Random parameters, or an encoder's (HF, GTR, jaxfid) checked to match."""
  if not init_checkpoint:
    return encoder.init_params(seed)
  from jaxfid.dual_encoder.checkpoint import load_dual_encoder
  loaded = load_dual_encoder(init_checkpoint)
  theirs = loaded.encoder.config
  diff = [f for f in _ENCODER_FIELDS
          if getattr(theirs, f) != getattr(encoder.config, f)]
  if diff:
    raise InputError(init_checkpoint, "INIT_CHECKPOINT's encoder differs "
                     f"from the run's in {', '.join(diff)}; list the matching "
                     "gin/models file")
  got, want = loaded.encoder.settings, encoder.settings
  if (got.projection_dim, got.projection_bias) != (want.projection_dim,
                                                   want.projection_bias):
    raise InputError(init_checkpoint, f"INIT_CHECKPOINT's projection "
                     f"({got.projection_dim}, bias {got.projection_bias}) "
                     f"differs from the run's ({want.projection_dim}, bias "
                     f"{want.projection_bias}); set PROJECTION_DIM")
  p = loaded.params
  params = encoder.from_encoder_params({k: p[k] for k in T5_KEYS},
                                       p.get("projection"))
  if not encoder.settings.shared and QUERY_TOWER in p:
    params[QUERY_TOWER] = p[QUERY_TOWER]
  return params


def evaluate(embed_fn, params, batcher_cfg: dict, examples, tokenizer,
             batch_size: int, parallel: int, put) -> dict:
  """eval_top1 / eval_top5: the positive's rank among every eval passage."""
  from jaxfid.core.tokenization import encode_padded
  fmt = batcher_cfg["passage_format"]
  pool: dict[tuple[str, str], int] = {}
  for ex in examples:
    for p in (ex.positive, *ex.hard_negatives):
      pool.setdefault(p, len(pool))
  texts = [passage_text(t, x, fmt) for (t, x) in pool]
  gold = np.asarray([pool[ex.positive] for ex in examples])

  def embed(strings, tower, length):
    out = []
    size = -(-batch_size // parallel) * parallel
    for a in range(0, len(strings), size):
      chunk = strings[a:a + size]
      tokens = encode_padded(tokenizer, chunk + [""] * (size - len(chunk)),
                             length)
      out.append(np.asarray(embed_fn(params, put(tokens), tower))[:len(chunk)])
    return np.concatenate(out)

  q = embed([ex.question for ex in examples], "query",
            batcher_cfg["query_maxlength"])
  p = embed(texts, "passage", batcher_cfg["passage_maxlength"])
  scores = q @ p.T
  positive = scores[np.arange(len(examples)), gold]
  rank = 1 + np.sum(scores > positive[:, None], axis=1)
  return {"eval_top1": float(np.mean(rank <= 1)),
          "eval_top5": float(np.mean(rank <= 5)),
          "eval_examples": len(examples)}


def train(*, model_dir: str, train_data: str, eval_data: str | None = None,
          model_config: T5Config = T5Config(),
          init_checkpoint: str | None = None, train_steps: int = 1000,
          batch_size: int = 32, hard_negatives: int = 1,
          query_maxlength: int = 64, passage_maxlength: int = 256,
          passage_format: str = "title_text", pooling: str = "mean",
          normalize: bool = False, projection_dim: int | None = None,
          shared: bool = True, temperature: float = 1.0,
          learning_rate: float = 1e-4, optimizer: str = "adamw",
          schedule: str = "linear", warmup_steps: int = 0,
          weight_decay: float = 0.0, clip_norm: float = 1.0,
          eval_every: int = 500, eval_max_examples: int | None = None,
          eval_batch_size: int = 64, checkpoint_every: int = 500,
          keep_checkpoints: int = 2, log_every: int = 10, seed: int = 0,
          mesh: str = "", on_nan: str = "stop",
          progress: bool = True) -> dict:
  """Trains a dual encoder into ``model_dir``; returns the last metrics."""
  from jaxfid.training import loop as loop_lib

  from jaxfid.dual_encoder.checkpoint import write_dual_encoder_config
  from jaxfid.core.tokenization import load_tokenizer
  if on_nan not in ("stop", "skip"):
    raise ValueError(f"on_nan must be 'stop' or 'skip', got {on_nan!r}")
  if temperature <= 0:
    raise InputError("TEMPERATURE", f"must be positive, got {temperature}")
  settings = DualEncoderConfig(
      pooling=pooling, normalize=normalize, projection_dim=projection_dim,
      shared=shared, query_maxlength=query_maxlength,
      passage_maxlength=passage_maxlength, passage_format=passage_format)
  encoder = DualEncoder(model_config, settings)
  examples = read_pair_examples(train_data)
  eval_examples = (read_pair_examples(eval_data, limit=eval_max_examples)
                   if eval_data else [])
  spiece_dir = init_checkpoint if init_checkpoint and os.path.isfile(
      os.path.join(init_checkpoint, "spiece.model")) else None
  tokenizer = load_tokenizer(spiece_dir)
  batcher = PairBatcher(examples, tokenizer, batch_size=batch_size,
                        hard_negatives=hard_negatives,
                        query_maxlength=query_maxlength,
                        passage_maxlength=passage_maxlength,
                        passage_format=passage_format, seed=seed)
  opt, lr_schedule = optim.make_optimizer(
      learning_rate, optimizer=optimizer, schedule=schedule,
      warmup_steps=warmup_steps, total_steps=train_steps,
      weight_decay=weight_decay, clip_norm=clip_norm)
  from jaxfid.fid.trainer import checked_mesh
  device_mesh = checked_mesh(mesh, batch_size)
  parallel = device_mesh.shape["data"] * device_mesh.shape["fsdp"]
  sh = _state_shardings(encoder, opt, device_mesh)
  batch_sharding = NamedSharding(
      device_mesh, shd.logical_to_mesh((shd.BATCH,), mesh=device_mesh))
  replicated = NamedSharding(device_mesh, PartitionSpec())

  os.makedirs(model_dir, exist_ok=True)
  write_dual_encoder_config(model_dir, encoder, train_data=train_data,
                            temperature=temperature,
                            hard_negatives=hard_negatives)
  if not os.path.exists(os.path.join(model_dir, "spiece.model")):
    shutil.copyfile(tokenizer.path, os.path.join(model_dir, "spiece.model"))
  ckpts = checkpointing.RunCheckpoints(model_dir, keep=keep_checkpoints)

  with jax.set_mesh(device_mesh):
    start = ckpts.latest_step()
    if start is not None:
      abstract = jax.eval_shape(lambda: {
          "step": jnp.zeros((), jnp.int32),
          "params": encoder.abstract_params(),
          "opt_state": opt.init(encoder.abstract_params())})
      abstract = jax.tree.map(
          lambda s, shard: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                sharding=shard), abstract, sh)
      state = ckpts.restore(abstract, start)
      print(f"resumed from step {start} in {model_dir}", file=sys.stderr)
    else:
      start = 0
      params = jax.device_put(initial_params(encoder, init_checkpoint, seed),
                              sh["params"])
      state = jax.jit(lambda p: {"step": jnp.zeros((), jnp.int32),
                                 "params": p, "opt_state": opt.init(p)},
                      out_shardings=sh)(params)
    step_fn = jax.jit(make_step(encoder, opt, seed=seed,
                                temperature=temperature),
                      in_shardings=(sh, batch_sharding),
                      out_shardings=(sh, replicated), donate_argnums=0)
    embed_fn = jax.jit(lambda p, t, tower: encoder.embed(p, t, tower=tower),
                       static_argnums=2, out_shardings=replicated)
    log = MetricsLog(model_dir, resume_step=start)
    eval_cfg = {"passage_format": passage_format,
                "query_maxlength": query_maxlength,
                "passage_maxlength": passage_maxlength}

    def run_eval(step: int) -> dict:
      result = evaluate(embed_fn, state["params"], eval_cfg, eval_examples,
                        tokenizer, eval_batch_size, parallel,
                        lambda t: jax.device_put(t, batch_sharding))
      log.write(step, result)
      if ckpts.maybe_save_best(step, state["params"], result["eval_top1"],
                               name="eval_top1"):
        result["best"] = True
      return result

    last: dict = {}
    t0 = time.time()
    loop = loop_lib.StepLoop(total=train_steps, start=start,
                             desc="train dual encoder", progress=progress,
                             on_nan=on_nan)
    step = start
    try:
      while step < train_steps:
        batch = jax.device_put(batcher.batch(step), batch_sharding)
        state, metrics = step_fn(state, batch)
        step += 1
        metrics = loop.finished_step(step, metrics)
        if step % log_every == 0 or step == train_steps:
          last = {k: float(metrics[k]) for k in ("loss", "accuracy",
                                                 "mean_rank", "grad_norm")}
          last["learning_rate"] = float(lr_schedule(step - 1))
          last["questions_per_sec"] = loop.rate(batch_size)
          log.write(step, last)
          loop.show(loss=f"{last['loss']:.4f}", acc=f"{last['accuracy']:.3f}")
        if eval_examples and (step % eval_every == 0 or step == train_steps):
          last.update(run_eval(step))
        if step % checkpoint_every == 0 or step == train_steps:
          ckpts.save(step, state)
    finally:
      loop.close()
      log.close()
      ckpts.close()
  last["step"] = step
  last["train_time_s"] = time.time() - t0
  return last


__all__ = ["train", "contrastive_loss", "make_step", "initial_params",
           "evaluate"]
