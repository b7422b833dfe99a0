"""The PyTorch FiD reference for ``fid_vs_pytorch.py``: HF T5 with FiD reshaping.

Fusion-in-Decoder as facebookresearch/FiD implements it (``src/model.py``:
``EncoderWrapper`` reshapes ``[B, P*L]`` to ``[B*P, L]`` for the encoder and
the output back to ``[B, P*L, D]``), written here on an unmodified
``transformers.T5ForConditionalGeneration``: :class:`FiDReference` runs the
encoder on ``[B*P, L]``, reshapes the hidden states to ``[B, P*L, D]`` and
hands them to the model as ``encoder_outputs=`` (training) or to
``generate(encoder_outputs=...)`` (decoding). The weights are random, of the
same sizes as the jaxfid model (nothing is downloaded).

Timed like ``jaxfid.fid.bench``: the same synthetic batches (every passage full
length, every answer ``answer_maxlength`` tokens), warm-up steps first, then
``steps`` timed ones; greedy decoding produces exactly ``answer_maxlength``
tokens (``min_new_tokens = max_new_tokens``: the EOS logit is masked, as
jaxfid's bench decodes with no EOS). The train step is forward, backward and
a ``torch.optim.Adam`` update, under ``torch.autocast`` in bfloat16 when asked
(parameters and optimizer state stay float32, like jaxfid's).
"""
from __future__ import annotations

import contextlib
import gc
import resource
import time
from typing import Any

import numpy as np
import torch
import transformers
from transformers.modeling_outputs import BaseModelOutput

from jaxfid.checkpoints.configs import hf_json_from_config
from jaxfid.t5.config import T5Config

ATTN_IMPLEMENTATION = "sdpa"  # T5 in transformers 5.x declares _supports_sdpa


class FiDReference(torch.nn.Module):
  """FiD over a HF T5: passages encoded alone, decoder attends to all of them."""

  def __init__(self, t5: transformers.T5ForConditionalGeneration):
    super().__init__()
    self.t5 = t5

  def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """[B, P, L] tokens -> hidden [B, P*L, D] and mask [B, P*L]."""
    b, p, l = input_ids.shape
    out = self.t5.encoder(input_ids=input_ids.reshape(b * p, l),
                          attention_mask=attention_mask.reshape(b * p, l))
    hidden = out.last_hidden_state.reshape(b, p * l, -1)
    return hidden, attention_mask.reshape(b, p * l)

  def forward(self, input_ids, attention_mask, labels) -> torch.Tensor:
    """Mean token cross-entropy of ``labels`` [B, T] (HF shifts them right)."""
    hidden, mask = self.encode(input_ids, attention_mask)
    return self.t5(encoder_outputs=(hidden,), attention_mask=mask,
                   labels=labels).loss

  @torch.inference_mode()
  def generate(self, input_ids, attention_mask, num_tokens: int) -> torch.Tensor:
    """Greedy decoding of exactly ``num_tokens`` tokens -> [B, 1 + num_tokens]."""
    hidden, mask = self.encode(input_ids, attention_mask)
    return self.t5.generate(
        encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
        attention_mask=mask, max_new_tokens=num_tokens,
        min_new_tokens=num_tokens, do_sample=False, num_beams=1,
        use_cache=True)


def hf_config(cfg: T5Config) -> transformers.T5Config:
  """The HF configuration of the same architecture as a jaxfid ``T5Config``."""
  return transformers.T5Config(**hf_json_from_config(cfg),
                               attn_implementation=ATTN_IMPLEMENTATION)


def device() -> torch.device:
  return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(dtype: str):
  """bfloat16 autocast on the current device, or nothing for float32."""
  if dtype == "float32":
    return contextlib.nullcontext()
  return torch.autocast(device().type, dtype=torch.bfloat16)


def _sync():
  if torch.cuda.is_available():
    torch.cuda.synchronize()


class MemoryProbe:
  """Peak memory of one measurement.

  On GPU: ``torch.cuda.max_memory_allocated`` after resetting the peak (exact
  for this measurement). On CPU: how much the process's maximum resident set
  size grew during it (``ru_maxrss``; 0 when the peak stayed below memory the
  process had already touched), a lower bound.
  """

  def __enter__(self):
    gc.collect()
    if torch.cuda.is_available():
      torch.cuda.empty_cache()
      torch.cuda.reset_peak_memory_stats()
    self._rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return self

  def __exit__(self, *exc):
    if torch.cuda.is_available():
      self.gb = torch.cuda.max_memory_allocated() / 1e9
      self.source = "cuda max_memory_allocated"
    else:
      rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      self.gb = (rss - self._rss0) / 1e6
      self.source = "growth of process max RSS"


def _to_torch(batch: dict) -> dict:
  dev = device()
  tokens = torch.as_tensor(np.asarray(batch["encoder_input_tokens"]),
                           dtype=torch.long, device=dev)
  out = {"input_ids": tokens, "attention_mask": (tokens != 0).long()}
  if "decoder_target_tokens" in batch:
    out["labels"] = torch.as_tensor(np.asarray(batch["decoder_target_tokens"]),
                                    dtype=torch.long, device=dev)
  return out


def build(cfg: T5Config, seed: int = 0) -> FiDReference:
  torch.manual_seed(seed)
  return FiDReference(transformers.T5ForConditionalGeneration(
      hf_config(cfg))).to(device())


def prepare_train(cfg: T5Config, batch: dict, *, dtype: str,
                  compile: bool = False, learning_rate: float = 1e-4,
                  seed: int = 0):
  """A closure running one train step (forward, backward, Adam) and syncing.

  With ``compile`` the model is ``torch.compile``d (default mode); the
  compile happens in the first calls. The closure returns the loss.
  """
  model = build(cfg, seed)
  model.train()
  opt = torch.optim.Adam(model.parameters(), lr=learning_rate)
  inputs = _to_torch(batch)
  fn = torch.compile(model) if compile else model

  def step():
    with autocast(dtype):
      loss = fn(**inputs)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    _sync()
    return loss.detach()
  return step


def prepare_decode(cfg: T5Config, batch: dict, *, dtype: str, num_tokens: int,
                   seed: int = 0):
  """A closure decoding exactly ``num_tokens`` tokens greedily (encoder included)."""
  model = build(cfg, seed)
  model.eval()
  inputs = _to_torch(batch)

  def generate():
    with autocast(dtype):
      out = model.generate(inputs["input_ids"], inputs["attention_mask"],
                           num_tokens)
    _sync()
    if out.shape[1] != num_tokens + 1:
      raise RuntimeError(f"generate returned {out.shape[1] - 1} tokens, "
                         f"expected {num_tokens}")
    return out
  return generate


def bench_train(cfg: T5Config, batch: dict, *, steps: int, dtype: str,
                compile: bool = False, learning_rate: float = 1e-4,
                seed: int = 0) -> dict[str, Any]:
  """Time forward + backward + Adam on ``batch`` (jaxfid's synthetic batch).

  The compile (with ``compile``) happens in the two warm-up steps, reported
  as ``setup_s``. Returns step_time_s, setup_s (model construction + warm-up
  steps), loss, peak_memory_gb and its source.
  """
  with MemoryProbe() as mem:
    t_start = time.perf_counter()
    step = prepare_train(cfg, batch, dtype=dtype, compile=compile,
                         learning_rate=learning_rate, seed=seed)
    for _ in range(2 if compile else 1):
      loss = step()
    setup = time.perf_counter() - t_start
    t0 = time.perf_counter()
    for _ in range(steps):
      loss = step()
    dt = (time.perf_counter() - t0) / steps
  return {"step_time_s": dt, "setup_s": setup, "loss": float(loss),
          "peak_memory_gb": mem.gb, "peak_memory_source": mem.source}


def bench_decode(cfg: T5Config, batch: dict, *, steps: int, dtype: str,
                 num_tokens: int, seed: int = 0) -> dict[str, Any]:
  """Time greedy decoding of exactly ``num_tokens`` tokens (encoder included)."""
  with MemoryProbe() as mem:
    t_start = time.perf_counter()
    generate = prepare_decode(cfg, batch, dtype=dtype, num_tokens=num_tokens,
                              seed=seed)
    generate()
    setup = time.perf_counter() - t_start
    t0 = time.perf_counter()
    for _ in range(steps):
      generate()
    dt = (time.perf_counter() - t0) / steps
  return {"step_time_s": dt, "setup_s": setup,
          "peak_memory_gb": mem.gb, "peak_memory_source": mem.source}


def release() -> None:
  """Return torch's cached GPU memory to the device (before JAX runs)."""
  gc.collect()
  if torch.cuda.is_available():
    torch.cuda.empty_cache()


def measure_peak_tflops(dtype: str) -> float:
  """TFLOP/s of a large square matmul in ``dtype`` with torch."""
  dev = device()
  n = 8192 if dev.type == "cuda" else 1024
  tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
  a = torch.ones((n, n), dtype=tdtype, device=dev)
  (a @ a)
  _sync()
  reps = 20 if dev.type == "cuda" else 3
  t0 = time.perf_counter()
  for _ in range(reps):
    out = a @ a
  _sync()
  del out
  return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def describe() -> dict[str, Any]:
  """torch/transformers versions, device, attention implementation."""
  info = {"torch": torch.__version__, "transformers": transformers.__version__,
          "torch_device": str(device()), "torch_threads": torch.get_num_threads(),
          "attn_implementation": ATTN_IMPLEMENTATION}
  if torch.cuda.is_available():
    info["gpu"] = torch.cuda.get_device_name(0)
  return info
