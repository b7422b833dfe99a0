"""cuDNN flash attention for T5 (jaxfid.t5.cudnn_attention): which
attention it takes, per platform, dtype, dropout and mask; that a T5's
programs compiled for an H100 without one hold cuDNN's fused attention
where it applies (marked ``gpu``; JAX's CUDA plugin compiles them on this
host). Its numbers need a GPU: benchmarks/gpu_step.py compares them there."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.aot import gpus, programs, topologies
from jaxfid.core import sharding as ax
from jaxfid.t5 import attention_ops, cudnn_attention
from jaxfid.t5.config import T5Config
from jaxfid.t5.model import EncoderDecoderModel

FMHA = "__cudnn$fmha"
BF16 = jnp.bfloat16


def _ok(q=(2, 16, 4, 64), k=None, dtype=BF16, bias=(1, 4, 16, 16),
        mask=(2, 1, 1, 16), causal=False, dropout=False):
  return cudnn_attention.supported(q, q if k is None else k, dtype, bias,
                                   mask, causal=causal, dropout=dropout)


def test_what_cudnn_takes():
  """T5's encoder self-attention (bias and key mask), the decoder's causal
  self-attention, multi-query keys; not float32, attention dropout, a bias
  per example, odd lengths with a bias, a key mask without the bias (the
  decoder's cross-attention over concatenated passages), a query mask, a
  decoding position, a head wider than 128."""
  assert _ok()
  assert _ok(mask=(1, 1, 1, 16)) and _ok(bias=None, mask=None)
  assert _ok(mask=(1, 1, 16, 16), causal=True)
  assert _ok(k=(2, 16, 1, 64), bias=None, mask=None)
  assert _ok(dtype=jnp.float16)
  assert not _ok(dtype=jnp.float32)
  assert not _ok(dropout=True)
  assert not _ok(bias=(2, 4, 16, 16))
  assert not _ok(q=(2, 15, 4, 64), bias=(1, 4, 15, 16))
  assert not _ok(bias=None)
  assert not _ok(mask=(2, 1, 16, 16))
  assert not _ok(q=(2, 1, 4, 64), k=(2, 16, 4, 64), bias=(1, 4, 1, 16))
  assert not _ok(q=(2, 16, 4, 256))
  assert not _ok(q=(2, 16, 4, 64), k=(2, 8, 4, 64), bias=None, mask=None,
                 causal=True)


def test_off_gpu_every_implementation_is_the_reference_or_pallas():
  """On this CPU host 'cudnn' and 'auto' are the reference: the same
  context and logits as the reference, bit for bit."""
  assert attention_ops.resolve("cudnn") == "reference"
  assert attention_ops.resolve("auto") == "reference"
  ks = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(x, (2, 16, 4, 64)).astype(BF16) for x in ks)
  bias = jnp.zeros((1, 4, 16, 16))
  mask = jnp.arange(16)[None, None, None, :] < jnp.array([16, 9])[:, None,
                                                                  None, None]
  outs = [attention_ops.attend(q, k, v, bias=bias, mask=mask, rate=0.0,
                               rng=None, implementation=i,
                               return_logits=True)
          for i in ("reference", "cudnn", "auto")]
  for ctx, logits in outs[1:]:
    np.testing.assert_array_equal(np.asarray(ctx, np.float32),
                                  np.asarray(outs[0][0], np.float32))
    np.testing.assert_array_equal(logits, outs[0][1])


def _xla_and_reference(mask, causal=False, kv_heads=4):
  """(this module's call through JAX's 'xla' attention, the reference):
  each (context, grads of q, k, v, bias), bfloat16 inputs."""
  ks = jax.random.split(jax.random.key(1), 5)
  q = jax.random.normal(ks[0], (3, 16, 4, 64)).astype(BF16)
  k, v = (jax.random.normal(x, (3, 16, kv_heads, 64)).astype(BF16)
          for x in ks[1:3])
  bias = jax.random.normal(ks[3], (1, 4, 16, 16))
  cot = jax.random.normal(ks[4], (3, 16, 4, 64))
  out = []
  for run in ("xla", "reference"):
    def loss(q, k, v, bias, run=run):
      if run == "xla":
        ctx = cudnn_attention.attention(q, k, v, bias=bias, mask=mask,
                                        causal=causal, implementation="xla")
      else:
        ctx, _ = attention_ops.reference(q, k, v, bias=bias, mask=mask,
                                         rate=0.0, rng=None)
      return jnp.sum(ctx.astype(jnp.float32) * cot), ctx
    grads, ctx = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
        q, k, v, bias)
    out.append([np.asarray(x, np.float32) for x in (ctx, *grads)])
  return out, v


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_the_call_computes_t5_attention(kv_heads):
  """What cudnn_attention hands cuDNN (no scaling, the bias in bfloat16,
  the key mask as lengths, multi-query keys), run through JAX's 'xla'
  attention on this host, is the reference's attention to bfloat16
  tolerance, context and gradients (the bias's, summed over the batch,
  too); a row with no real token attends to its first key."""
  lengths = jnp.array([16, 9, 0])
  mask = (jnp.arange(16)[None, :] < lengths[:, None])[:, None, None, :]
  (xla, ref), v = _xla_and_reference(mask, kv_heads=kv_heads)
  for name, a, b in zip(("ctx", "dq", "dk", "dv", "dbias"), xla, ref):
    if name != "dbias":
      a, b = a[:2], b[:2]  # the empty row differs by design
    np.testing.assert_allclose(a, b, atol=0.05, rtol=0.05, err_msg=name)
  first = np.asarray(v[2, 0], np.float32)  # [K, E]
  np.testing.assert_allclose(xla[0][2], np.broadcast_to(
      first, (16, 4, 64)), atol=1e-2)


def test_causal_and_a_mask_with_a_hole():
  """``causal=True`` is the decoder's causal mask; a key mask that is not a
  prefix makes that row's context NaN (the others are untouched)."""
  causal = jnp.tril(jnp.ones((16, 16), bool))[None, None]
  (xla, ref), _ = _xla_and_reference(causal, causal=True)
  for name, a, b in zip(("ctx", "dq", "dk", "dv", "dbias"), xla, ref):
    np.testing.assert_allclose(a, b, atol=0.05, rtol=0.05, err_msg=name)
  hole = jnp.ones((3, 1, 1, 16), bool).at[1, 0, 0, 3].set(False)
  (xla, ref), _ = _xla_and_reference(hole)
  assert np.isnan(xla[0][1]).all()
  np.testing.assert_allclose(xla[0][[0, 2]], ref[0][[0, 2]], atol=0.05,
                             rtol=0.05)


def _h100_mesh():
  if not gpus.plugin_available():
    pytest.skip("JAX's CUDA plugin is not installed (pip install -e "
                "'.[gpu-aot]')")
  devices = topologies.devices(topologies.parse("h100-1"))
  return ax.parse_mesh("data=1", devices)


@pytest.mark.gpu
def test_auto_is_cudnn_for_a_gpu_and_compiles_without_one():
  """Under an H100 mesh 'auto' is 'cudnn'; T5's biased, key-masked
  attention and its gradients (q, k, v and the bias) compile to cuDNN's
  forward and backward fused attention; with attention dropout, or float32,
  they stay einsums."""
  mesh = _h100_mesh()
  mask = (jnp.arange(16)[None, None, None, :]
          < jnp.array([16, 9])[:, None, None, None])  # [B, 1, 1, S]

  def step(dtype, rate):
    def loss(q, k, v, bias):
      ctx, _ = attention_ops.attend(
          q, k, v, bias=bias, mask=mask, rate=rate,
          rng=jax.random.key(0) if rate else None, implementation="auto")
      return jnp.sum(ctx.astype(jnp.float32) ** 2)
    args = [jax.ShapeDtypeStruct((2, 16, 4, 64), dtype)] * 3 + [
        jax.ShapeDtypeStruct((1, 4, 16, 16), jnp.float32)]
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(
        *args).lower().compile().as_text()

  with jax.set_mesh(mesh):
    assert attention_ops.resolve("auto") == "cudnn"
    hlo = step(BF16, 0.0)
    assert f'"{FMHA}ScaleBiasSoftmax"' in hlo
    assert f'"{FMHA}ScaleBiasSoftmaxBackward"' in hlo
    assert FMHA not in step(BF16, 0.1)
    assert FMHA not in step(jnp.float32, 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_the_program_flops_count_cudnn_as_the_einsums(causal):
  """``bench compile``'s program FLOPs (XLA:GPU has no cost analysis without
  a card) count cuDNN's forward and backward as the reference's einsums and
  their transposes: the same total for the gradient of either."""
  mesh = _h100_mesh()
  mask = None if causal else jnp.ones((2, 1, 1, 32), bool)

  def grads(implementation):
    def loss(q, k, v, bias):
      ctx, _ = attention_ops.attend(q, k, v, bias=bias, mask=mask, rate=0.0,
                                    rng=None, implementation=implementation,
                                    causal=causal)
      return jnp.sum(ctx.astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2, 3))

  args = [jax.ShapeDtypeStruct((2, 16, 4, 64), BF16)] + [
      jax.ShapeDtypeStruct((2, 32 - 16 * causal, 4, 64), BF16)] * 2 + [
          jax.ShapeDtypeStruct((1, 4, 16, 32 - 16 * causal), jnp.float32)]
  with jax.set_mesh(mesh):
    counted = {i: programs.program_flops(grads(i), *args)
               for i in ("reference", "cudnn")}
    assert FMHA in jax.jit(grads("cudnn")).trace(*args).lower().as_text()
  assert counted["cudnn"] == counted["reference"] == 12 * 2 * 4 * 16 * (
      32 - 16 * causal) * 64


CONFIG = T5Config(vocab_size=64, d_model=64, d_kv=16, d_ff=96, num_heads=4,
                  num_layers=2, num_decoder_layers=2, dropout_rate=0.0,
                  dtype="bfloat16", feed_forward_proj="gated-gelu",
                  tie_word_embeddings=False, remat="full")


@pytest.mark.gpu
@pytest.mark.slow  # a whole T5 step compiled for an H100: 30-40 s each here
@pytest.mark.parametrize("attention, passages, calls", [
    ("cudnn", "flatten", 4), ("reference", "flatten", 0),
    ("cudnn", "vmap", 0)])
def test_a_t5_train_step_uses_cudnn_for_its_self_attention(
    attention, passages, calls):
  """A FiD-shaped T5's loss gradient for an H100: each encoder layer's
  self-attention (relative bias, padded passages) and each decoder layer's
  causal self-attention is cuDNN's forward and backward; the
  decoder's cross-attention (passages concatenated) stays einsums, and so
  does everything under vmapped passages (jax's batching of cuDNN's
  attention fails there)."""
  mesh = _h100_mesh()
  model = EncoderDecoderModel(CONFIG.replace(attention=attention,
                                             passage_encoding=passages))
  params = jax.eval_shape(lambda: model.init_params(0))
  batch = {"encoder_input_tokens": jax.ShapeDtypeStruct((2, 3, 16), jnp.int32),
           "decoder_target_tokens": jax.ShapeDtypeStruct((2, 8), jnp.int32)}
  step = jax.jit(jax.grad(lambda p, b: model.loss(p, b, None)[0]))
  with jax.set_mesh(mesh):
    hlo = step.trace(params, batch).lower().compile().as_text()
  found = {t: hlo.count(f'custom_call_target="{FMHA}{t}"')
           for t in ("ScaleBiasSoftmax", "ScaleBiasSoftmaxBackward")}
  # the forward twice (REMAT='full' recomputes it for the backward)
  assert found == {"ScaleBiasSoftmax": 2 * calls,
                   "ScaleBiasSoftmaxBackward": calls}
  assert hlo.count(FMHA) == hlo.count(f"{FMHA}ScaleBias")
