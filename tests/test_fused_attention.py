"""The fused attention kernel (jaxfid.t5.fused_attention, Pallas' interpreter
on CPU) computes what the reference attention does: context and gradients
(q, k, v and the relative bias table) with T5's bias, padding and the same
dropout mask; a whole T5 with ATTENTION='pallas' equals 'reference'; the
kernel compiles for a TPU slice inside a sharded step (marked ``tpu``)."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid import cli
from jaxfid.core import sharding as ax
from jaxfid.aot import topologies
from jaxfid.t5 import attention_ops, fused_attention
from jaxfid.t5.config import T5Config
from jaxfid.t5.layers import relative_position_buckets
from jaxfid.t5.model import EncoderDecoderModel
from attention_checks import assert_bfloat16_close, assert_float32_close

B, L, H, E, BUCKETS = 4, 12, 4, 8, 8
BUCKET_IDS = relative_position_buckets(L, L, bidirectional=True,
                                       num_buckets=BUCKETS, max_distance=16)


def _inputs(dtype=jnp.float32, lengths=(12, 7, 0, 3)):
  """q, k, v [B, L, H, E]; the bias table [H, N]; the key mask [B,1,1,L]
  (passage 2 is all padding) and the output's cotangent."""
  ks = jax.random.split(jax.random.key(0), 5)
  q, k, v = (jax.random.normal(ks[i], (B, L, H, E)).astype(dtype)
             for i in range(3))
  table = jax.random.normal(ks[3], (H, BUCKETS))
  mask = (np.arange(L)[None, :] < np.asarray(lengths)[:, None])
  cot = jax.random.normal(ks[4], (B, L, H, E)).astype(dtype)
  return q, k, v, table, jnp.asarray(mask[:, None, None, :]), cot


def _loss(implementation, rate, rng, mask, cot):
  def loss(q, k, v, table):
    bias = jnp.take(table, jnp.asarray(BUCKET_IDS), axis=1)[None]  # [1, H, L, L]
    ctx, _ = attention_ops.attend(q, k, v, bias=bias, mask=mask, rate=rate,
                                  rng=rng, implementation=implementation)
    return jnp.sum(ctx.astype(jnp.float32) * cot.astype(jnp.float32)), ctx
  return loss


def _both(rate, rng, dtype=jnp.float32, **kw):
  """(reference, pallas): each (context, grads of q, k, v, bias table)."""
  q, k, v, table, mask, cot = _inputs(dtype, **kw)
  out = []
  for impl in ("reference", "pallas"):
    grads, ctx = jax.jit(jax.grad(_loss(impl, rate, rng, mask, cot),
                                  argnums=(0, 1, 2, 3), has_aux=True))(
                                      q, k, v, table)
    out.append((ctx, *grads))
  return out


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_kernel_equals_reference_float32(rate):
  """Forward and every gradient to 1e-5; with dropout the kernel drops
  the same elements (a different mask would move the context by O(1))."""
  ref, fused = _both(rate, jax.random.key(7))
  assert_float32_close(ref, fused)
  assert float(jnp.abs(ref[4]).max()) > 1e-2  # the bias gradient is not zero


def test_kernel_equals_reference_bfloat16():
  ref, fused = _both(0.2, jax.random.key(1), jnp.bfloat16)
  assert_bfloat16_close(ref, fused)


def test_dropout_differs_from_no_dropout():
  """The dropout path is live in the kernel: another key, another result."""
  q, k, v, table, mask, _ = _inputs()
  bias = jnp.take(table, jnp.asarray(BUCKET_IDS), axis=1)[None]
  run = lambda rng: fused_attention.attention(  # noqa: E731
      q, k, v, bias=bias, mask=mask, rate=0.3, rng=rng, interpret=True)
  assert float(jnp.abs(run(jax.random.key(1)) - run(jax.random.key(2))).max()) > 0.1
  assert float(jnp.abs(run(None) - run(jax.random.key(1))).max()) > 0.1


def test_sharded_kernel_equals_reference():
  """Under a mesh splitting the batch and the heads (shard_map), each
  shard's dropout counts its global passages and heads, and the bias
  gradient is summed over the batch shards."""
  mesh = ax.parse_mesh("data=2,model=2", jax.devices()[:4])
  with jax.set_mesh(mesh):
    ref, fused = _both(0.3, jax.random.key(5))
  assert_float32_close(ref, fused)


def test_dispatch():
  """'auto' is the reference off TPU; the kernel declines what it does not
  take (logits asked for, a query mask, multi-query keys, long keys, one
  decoding position)."""
  assert attention_ops.resolve("auto") == "reference"  # this CPU host
  assert attention_ops.resolve("pallas") == "pallas"
  ok = fused_attention.supported
  assert ok((2, 8, 4, 8), (2, 8, 4, 8), (1, 4, 8, 8), (2, 1, 1, 8))
  assert ok((2, 8, 4, 8), (2, 8, 4, 8), None, None)
  assert not ok((2, 8, 4, 8), (2, 8, 4, 8), None, (2, 1, 8, 8))  # causal
  assert not ok((2, 8, 4, 8), (2, 8, 1, 8), None, None)  # multi-query
  assert not ok((2, 8, 4, 8), (2, 2048, 4, 8), None, None)
  assert not ok((2, 1, 4, 8), (2, 8, 4, 8), (1, 4, 1, 8), (1, 1, 1, 8))  # decoding
  q, k, v, _, mask, _ = _inputs()
  _, logits = attention_ops.attend(q, k, v, bias=None, mask=mask, rate=0.0,
                                   rng=None, implementation="pallas",
                                   return_logits=True)
  assert logits.shape == (B, H, L, L)


CONFIG = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_heads=4,
                  num_layers=2, num_decoder_layers=2, dropout_rate=0.2,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                  remat="full")


@pytest.mark.slow  # a tiny T5 through Pallas' interpreter: ~50 s each
@pytest.mark.parametrize("passages", ["flatten", "vmap"])
def test_t5_with_pallas_equals_reference(passages):
  """A FiD-shaped T5 ([B, P, L] passages with padding, dropout on; the
  passages flattened into the batch or vmapped): the same loss and
  gradients with the encoder's self-attention fused."""
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 64, size=(2, 3, 9)).astype(np.int32)  # [B, P, L]
  enc[1, 1, 4:] = 0
  enc[0, 2, :] = 0
  targets = rng.integers(2, 64, size=(2, 8)).astype(np.int32)
  targets[1, 6:] = 0
  batch = {"encoder_input_tokens": jnp.asarray(enc),
           "decoder_target_tokens": jnp.asarray(targets)}
  params = EncoderDecoderModel(CONFIG).init_params(0)
  out, kernels = {}, {}
  for impl in ("reference", "pallas"):
    model = EncoderDecoderModel(CONFIG.replace(attention=impl,
                                               passage_encoding=passages))
    step = jax.value_and_grad(
        lambda p: model.loss(p, batch, jax.random.key(3))[0])  # noqa: B023
    out[impl] = jax.jit(step)(params)
    kernels[impl] = str(jax.make_jaxpr(step)(params)).count("pallas_call")
  # the kernel ran, forward and backward, in the encoder's self-attention
  # and the decoder's cross-attention (8 queries, 27 keys); the decoder's
  # causal self-attention stays on the reference path
  calls = CONFIG.num_layers + CONFIG.num_decoder_layers
  assert kernels == {"reference": 0, "pallas": 2 * calls}
  np.testing.assert_allclose(out["pallas"][0], out["reference"][0], rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
               out["pallas"][1], out["reference"][1])


@pytest.mark.tpu
def test_kernel_compiles_for_tpu_in_a_sharded_step():
  """'auto' on a v5e mesh is the kernel (a Mosaic custom call in the
  compiled program), forward and backward, batch and heads split."""
  if not topologies.libtpu_available():
    pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
  devices = topologies.devices(topologies.parse("v5e:2x2"))
  mesh = ax.parse_mesh("data=2,model=2", devices)
  q, k, v, table, mask, cot = _inputs(jnp.bfloat16)
  step = jax.jit(jax.grad(_loss("auto", 0.1, jax.random.key(0), mask, cot),
                          argnums=(0, 1, 2, 3), has_aux=True))
  with jax.set_mesh(mesh):
    args = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v, table)]
    hlo = step.trace(*args).lower().compile().as_text()
  assert hlo.count("tpu_custom_call") >= 2  # the forward and backward kernels


@pytest.mark.slow  # a FiD train step compiled for v5e: ~100 s
@pytest.mark.tpu
def test_fid_step_compiles_with_the_kernel(capsys):
  """A tiny FiD train step with ATTENTION='pallas' compiles for v5e:2x2
  through `jaxfid bench compile`, and moves fewer bytes than the reference."""
  if not topologies.libtpu_available():
    pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
  flags = ["--gin_file=gin/fid/tiny.gin", "--gin.BATCH_SIZE=8",
           "--gin.N_CONTEXT=4", "--gin.TEXT_MAXLENGTH=128",
           "--gin.ANSWER_MAXLENGTH=4", "--gin.config.T5Config.vocab_size=128"]
  reports = {}
  for impl in ("reference", "pallas"):
    assert cli.main(["bench", "compile", "--in-process", "--topology",
                     "v5e:2x2", *flags, f"--gin.ATTENTION='{impl}'"]) == 0
    reports[impl] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert reports["pallas"]["fits"]
  assert (reports["pallas"]["bytes_accessed_per_chip"]
          < reports["reference"]["bytes_accessed_per_chip"])
