"""Speed of FiD training steps and greedy decoding (``jaxfid bench``).

Synthetic batches of exactly the configured shapes (full passages, answers
of ``answer_maxlength`` tokens), timed after a warm-up step: examples/s, step
time, model TFLOP/s (analytic, without remat), MFU against a measured or
given peak, peak device memory and the device.
"""
from __future__ import annotations

import dataclasses
import platform
import resource
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxfid.t5 import decoding
from jaxfid.t5 import passages as fid
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.training.step import make_train_step


@dataclasses.dataclass(frozen=True)
class Shape:
  batch_size: int
  n_context: int
  text_maxlength: int
  answer_maxlength: int


def forward_flops(cfg: T5Config, shape: Shape, decoded_tokens: int | None = None) -> float:
  """Matmul FLOPs of one forward pass over a batch (2 per multiply-add)."""
  b, p, l = shape.batch_size, shape.n_context, shape.text_maxlength
  t = shape.answer_maxlength if decoded_tokens is None else decoded_tokens
  d, f, inner = cfg.d_model, cfg.d_ff, cfg.inner_dim
  kv_inner = cfg.d_kv if cfg.multi_query_cross_attention else inner
  mlp = (3 if cfg.is_gated else 2) * d * f
  attn_proj = 4 * d * inner
  enc_tokens = b * p * l
  enc = cfg.num_layers * (enc_tokens * 2 * (attn_proj + mlp)
                          + b * p * 2 * 2 * l * l * inner)
  dec_tokens = b * t
  n_cross = sum(cfg.has_cross_attention(i) for i in range(cfg.num_decoder_layers))
  dec = cfg.num_decoder_layers * dec_tokens * 2 * (attn_proj + mlp)
  dec += cfg.num_decoder_layers * b * 2 * 2 * t * t * inner
  dec += n_cross * (dec_tokens * 2 * 2 * d * inner          # cross q, o
                    + enc_tokens * 2 * 2 * d * kv_inner     # cross k, v
                    + b * 2 * 2 * t * p * l * inner)        # scores, context
  head = dec_tokens * 2 * d * cfg.vocab_size
  return float(enc + dec + head)


def measure_peak_tflops(dtype: str) -> float:
  """TFLOP/s of a large square matmul in ``dtype`` on the default device."""
  n = 8192 if jax.default_backend() != "cpu" else 1024
  a = jnp.ones((n, n), jnp.dtype(dtype))
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  reps = 20 if jax.default_backend() != "cpu" else 3
  t0 = time.perf_counter()
  for _ in range(reps):
    out = f(a)
  out.block_until_ready()
  return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def peak_memory_gb() -> tuple[float, str]:
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return stats["peak_bytes_in_use"] / 1e9, "device"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, "host_rss"


def synthetic_batch(cfg: T5Config, shape: Shape, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  b, p, l, t = (shape.batch_size, shape.n_context, shape.text_maxlength,
                shape.answer_maxlength)
  enc = rng.integers(3, min(cfg.vocab_size, 32000), size=(b, p, l)).astype(np.int32)
  enc[:, :, -1] = 1
  tgt = rng.integers(3, min(cfg.vocab_size, 32000), size=(b, t)).astype(np.int32)
  tgt[:, -1] = 1
  return {"encoder_input_tokens": enc, "decoder_target_tokens": tgt}


def abstract_batch(shape: Shape) -> dict:
  """``synthetic_batch``'s shapes and dtypes, without the data."""
  b, p, l, t = (shape.batch_size, shape.n_context, shape.text_maxlength,
                shape.answer_maxlength)
  return {"encoder_input_tokens": jax.ShapeDtypeStruct((b, p, l), jnp.int32),
          "decoder_target_tokens": jax.ShapeDtypeStruct((b, t), jnp.int32)}


def timed(step_fn: Callable[[], Any]) -> tuple[float, float]:
  """Run ``step_fn`` once; (wall seconds, CPU seconds of this process)."""
  cpu0, wall0 = time.process_time(), time.perf_counter()
  step_fn()
  return time.perf_counter() - wall0, time.process_time() - cpu0


def alternate(steps_by_name: dict, reps: int) -> dict:
  """Medians per name of prepared step closures timed in alternation: each
  called once (``first_s``: compile), then ``reps`` rounds call each once,
  the order reversed every other round. ``{name: {step_time_s, cpu_time_s,
  first_s, wall_s, cpu_s}}``."""
  out = {}
  for name, fn in steps_by_name.items():
    t0 = time.perf_counter()
    fn()
    out[name] = {"first_s": time.perf_counter() - t0, "wall_s": [],
                 "cpu_s": []}
  names = list(steps_by_name)
  for r in range(reps):
    for name in (names if r % 2 == 0 else names[::-1]):
      wall, cpu = timed(steps_by_name[name])
      out[name]["wall_s"].append(wall)
      out[name]["cpu_s"].append(cpu)
  for r in out.values():
    r["step_time_s"] = statistics.median(r["wall_s"])
    r["cpu_time_s"] = statistics.median(r["cpu_s"])
  return out


def train_program(cfg: T5Config, shape: Shape, *, learning_rate=1e-4,
                  seed: int = 0, abstract: bool = False):
  """``(step, state, batch)``: the jitted full train step (forward, backward,
  Adam update; the state argument donated), its initial state and the
  synthetic batch. ``abstract``: the state as shapes only (nothing
  allocated), for lowering models too large to run here."""
  model = EncoderDecoderModel(cfg)
  opt = optax.adam(learning_rate)
  init = lambda: model.init_params(seed)  # noqa: E731
  make_state = lambda p: {"step": jnp.zeros((), jnp.int32), "params": p,  # noqa: E731
                          "opt_state": opt.init(p)}
  if abstract:
    state = jax.eval_shape(lambda: make_state(init()))
  else:
    state = make_state(jax.jit(init)())
  loss_fn = lambda p, b, rng, norm: model.loss(p, b, rng, normalizer=norm)  # noqa: E731
  step = jax.jit(make_train_step(loss_fn, opt, seed=seed), donate_argnums=0)
  batch = jax.tree.map(jnp.asarray, synthetic_batch(cfg, shape, seed))
  return step, state, batch


def prepare_train(cfg: T5Config, shape: Shape, *, learning_rate=1e-4,
                  seed: int = 0) -> Callable[[], Any]:
  """A closure running one full train step (forward, backward, Adam) on the
  synthetic batch and waiting for it; the state is donated and carried."""
  step, state, batch = train_program(cfg, shape, learning_rate=learning_rate,
                                     seed=seed)
  box = {"state": state}

  def run_step():
    box["state"], metrics = step(box["state"], batch)
    return jax.block_until_ready(metrics)
  return run_step


def prepare_decode(cfg: T5Config, shape: Shape, *,
                   seed: int = 0) -> Callable[[], Any]:
  """A closure decoding ``answer_maxlength`` tokens greedily (no early EOS)
  in one jitted function, waiting for it; the first call compiles."""
  model = EncoderDecoderModel(cfg)
  params = jax.jit(lambda: model.init_params(seed))()
  tokens = jnp.asarray(synthetic_batch(cfg, shape, seed)["encoder_input_tokens"])
  jitted = jax.jit(greedy_generate(model, shape.answer_maxlength))
  return lambda: jax.block_until_ready(jitted(params, tokens))


def greedy_generate(model: EncoderDecoderModel, num_tokens: int
                    ) -> Callable[[Any, jax.Array], jax.Array]:
  """``generate(params, tokens [B, P, L]) -> int32 [B, num_tokens]``: passage
  encoding, the cross-attention K/V and the cached greedy loop, decoding
  exactly ``num_tokens`` tokens (no early EOS); to be jitted."""

  def generate(params, tokens):
    net = model.network(params)
    enc = fid.encode_passages(net, tokens)
    cache = net.init_cache(enc.hidden, enc.mask, num_tokens)
    out, _ = decoding.greedy_decode(
        lambda s: net.decode_step(s.cur_token, s.cache, s.cur_index), cache,
        batch_size=tokens.shape[0], max_decode_len=num_tokens, eos_id=-1)
    return out
  return generate


def _time(step_fn: Callable[[], Any], steps: int) -> float:
  step_fn()  # warm-up: compile
  t0 = time.perf_counter()
  for _ in range(steps):
    step_fn()
  return (time.perf_counter() - t0) / steps


def bench_train(cfg: T5Config, shape: Shape, *, steps: int, learning_rate=1e-4,
                seed: int = 0) -> dict:
  """Time the full train step (forward, backward, Adam update)."""
  dt = _time(prepare_train(cfg, shape, learning_rate=learning_rate, seed=seed),
             steps)
  return {"step_time_s": dt, "flops": 3 * forward_flops(cfg, shape)}


def bench_decode(cfg: T5Config, shape: Shape, *, steps: int, seed: int = 0) -> dict:
  """Time greedy decoding of exactly ``answer_maxlength`` tokens (no early EOS)."""
  dt = _time(prepare_decode(cfg, shape, seed=seed), steps)
  return {"step_time_s": dt, "flops": forward_flops(cfg, shape)}


def run(mode: str, cfg: T5Config, shape: Shape, *, steps: int,
        peak_tflops: float | None = None) -> dict:
  if mode == "train":
    r = bench_train(cfg, shape, steps=steps)
  elif mode == "decode":
    r = bench_decode(cfg, shape, steps=steps)
  else:
    raise ValueError(f"mode must be 'train' or 'decode', got {mode!r}")
  peak_source = "given"
  if peak_tflops is None:
    peak_tflops = measure_peak_tflops(cfg.dtype)
    peak_source = f"measured ({cfg.dtype} matmul)"
  mem, mem_source = peak_memory_gb()
  tflops = r["flops"] / r["step_time_s"] / 1e12
  device = jax.devices()[0]
  return {
      "mode": mode,
      "examples_per_sec": shape.batch_size / r["step_time_s"],
      "step_time_s": r["step_time_s"],
      "model_tflops_per_sec": tflops,
      "mfu": tflops / peak_tflops,
      "peak_tflops": peak_tflops,
      "peak_tflops_source": peak_source,
      "peak_memory_gb": mem,
      "peak_memory_source": mem_source,
      "device": f"{device.platform}:{getattr(device, 'device_kind', '')}",
      "device_count": jax.device_count(),
      "host": f"{platform.processor() or platform.machine()}",
      "steps": steps,
      "prng_impl": str(jax.random.key_impl(jax.random.key(0))),
      "model": {k: getattr(cfg, k) for k in (
          "d_model", "d_ff", "d_kv", "num_heads", "num_layers",
          "num_decoder_layers", "vocab_size", "feed_forward_proj", "dtype",
          "remat", "cross_attention_period", "multi_query_cross_attention")},
      "shape": dataclasses.asdict(shape),
  }
