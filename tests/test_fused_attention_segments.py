"""The fused attention with segment ids (ReAtt's bi-encoder: question and
document attend within themselves) computes what the reference does with
the dense block mask: context and gradients (q, k, v, the bias table) with
padding and dropout; a whole tiny ReAtt with ATTENTION='pallas' equals
'reference'; the kernel with segments compiles for a TPU slice (``tpu``)."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid import cli
from jaxfid.aot import topologies
from jaxfid.core import sharding as ax
from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reatt.retrieval_attention import block_mask, block_segments
from jaxfid.t5 import attention_ops, fused_attention, fused_attention_fit
from jaxfid.t5.layers import relative_position_buckets
from attention_checks import assert_bfloat16_close, assert_float32_close
from reatt_world import make_world, tiny_model

B, L, H, E, BUCKETS = 4, 12, 4, 8, 8
BUCKET_IDS = relative_position_buckets(L, L, bidirectional=True,
                                       num_buckets=BUCKETS, max_distance=16)
# real tokens and question lengths per row: a question and a document; a
# padded one; an empty row (all padding); a row that is all question
LENGTHS, QUESTIONS = (12, 7, 0, 3), (4, 2, 0, 5)


def _inputs(dtype=jnp.float32):
  """q, k, v [B, L, H, E]; the bias table [H, N]; valid [B, L] and question
  lengths [B]; the output's cotangent."""
  ks = jax.random.split(jax.random.key(0), 5)
  q, k, v = (jax.random.normal(ks[i], (B, L, H, E)).astype(dtype)
             for i in range(3))
  table = jax.random.normal(ks[3], (H, BUCKETS))
  valid = jnp.asarray(np.arange(L)[None, :] < np.asarray(LENGTHS)[:, None])
  cot = jax.random.normal(ks[4], (B, L, H, E)).astype(dtype)
  return q, k, v, table, valid, jnp.asarray(QUESTIONS, jnp.int32), cot


def _both(rate, rng, dtype=jnp.float32):
  """(reference with the block mask, pallas with the segments): each
  (context, grads of q, k, v, bias table)."""
  q, k, v, table, valid, qlen, cot = _inputs(dtype)
  masks = {"reference": block_mask(valid, qlen),
           "pallas": block_segments(valid, qlen)}
  out = []
  for impl, mask in masks.items():
    def loss(q, k, v, table, mask=mask, impl=impl):
      bias = jnp.take(table, jnp.asarray(BUCKET_IDS), axis=1)[None]  # [1, H, L, L]
      ctx, _ = attention_ops.attend(q, k, v, bias=bias, mask=mask, rate=rate,
                                    rng=rng, implementation=impl)
      return jnp.sum(ctx.astype(jnp.float32) * cot.astype(jnp.float32)), ctx
    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
    grads, ctx = step(q, k, v, table)
    assert str(jax.make_jaxpr(step)(q, k, v, table)).count("pallas_call") == (
        2 if impl == "pallas" else 0)
    out.append((ctx, *grads))
  return out


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_segments_equal_the_block_mask_float32(rate):
  """Forward and every gradient to 1e-5, padding and an empty row
  included; with dropout the kernel drops the same elements."""
  ref, fused = _both(rate, jax.random.key(7))
  assert_float32_close(ref, fused)
  assert float(jnp.abs(ref[4]).max()) > 1e-2  # the bias gradient is not zero


def test_segments_equal_the_block_mask_bfloat16():
  ref, fused = _both(0.2, jax.random.key(1), jnp.bfloat16)
  assert_bfloat16_close(ref, fused)


def test_segments_mask_what_the_key_mask_alone_keeps():
  """The segments are live: the kernel with them differs from the kernel
  with the key mask alone (the question would see the document)."""
  q, k, v, table, valid, qlen, _ = _inputs()
  bias = jnp.take(table, jnp.asarray(BUCKET_IDS), axis=1)[None]
  seg = block_segments(valid, qlen)
  run = lambda segments: fused_attention.attention(  # noqa: E731
      q, k, v, bias=bias, mask=valid[:, None, None, :], rate=0.0, rng=None,
      interpret=True, segments=segments)
  assert float(jnp.abs(run((seg.query, seg.key)) - run(None)).max()) > 0.1
  np.testing.assert_array_equal(np.asarray(seg.dense()),
                                np.asarray(block_mask(valid, qlen)))


def test_sharded_segments_equal_the_block_mask():
  """Under a mesh splitting the batch and the heads, the segment ids are
  split with the batch."""
  mesh = ax.parse_mesh("data=2,model=2", jax.devices()[:4])
  with jax.set_mesh(mesh):
    ref, fused = _both(0.3, jax.random.key(5))
  assert_float32_close(ref, fused)


def test_dispatch_with_segments():
  """The kernel takes segment ids of the query and key lengths; others go
  to the reference path, which builds the dense mask."""
  ok = fused_attention.supported
  assert ok((2, 8, 4, 8), (2, 8, 4, 8), None, (2, 1, 1, 8), [(2, 8), (2, 8)])
  assert not ok((2, 8, 4, 8), (2, 8, 4, 8), None, None, [(2, 8), (2, 9)])
  q, k, v, _, valid, qlen, _ = _inputs()
  seg = block_segments(valid, qlen)
  _, logits = attention_ops.attend(q, k, v, bias=None, mask=seg, rate=0.0,
                                   rng=None, implementation="pallas",
                                   return_logits=True)
  masked = ~np.asarray(block_mask(valid, qlen))[:, 0]  # [B, L, L]
  assert np.all(np.asarray(logits)[:, 0][masked] == attention_ops.NEG_INF)


@pytest.mark.tpu
def test_segments_kernel_compiles_for_tpu_in_a_sharded_step():
  """'auto' on a v5e mesh takes the segments into the Mosaic kernels,
  forward and backward, batch and heads split."""
  if not topologies.libtpu_available():
    pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
  devices = topologies.devices(topologies.parse("v5e:2x2"))
  mesh = ax.parse_mesh("data=2,model=2", devices)
  q, k, v, table, valid, qlen, cot = _inputs(jnp.bfloat16)
  seg = block_segments(valid, qlen)

  def loss(q, k, v, table):
    bias = jnp.take(table, jnp.asarray(BUCKET_IDS), axis=1)[None]
    ctx, _ = attention_ops.attend(q, k, v, bias=bias, mask=seg, rate=0.1,
                                  rng=jax.random.key(0), implementation="auto")
    return jnp.sum(ctx.astype(jnp.float32) * cot.astype(jnp.float32)), ctx

  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
  with jax.set_mesh(mesh):
    args = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v, table)]
    hlo = step.trace(*args).lower().compile().as_text()
  assert hlo.count("tpu_custom_call") >= 2  # the forward and backward kernels


@pytest.mark.slow  # a tiny ReAtt through Pallas' interpreter: 15-25 s
def test_reatt_with_pallas_equals_reference():
  """A tiny ReAtt (1 bi-encoder layer of 2, padding, dropout, the KL
  term): the same loss and gradients with ATTENTION='pallas' (the
  bi-encoder's block mask as segments, the cross-encoder's key mask) as
  with 'reference'."""
  tok = Tokenizer()
  _, examples = make_world(num_keys=8, n_context=3)
  examples = examples[:2]
  tokens, pmask = fid_inputs.encode_examples(tok, examples, 3, 16)
  pmask[1, 2] = False  # an empty row
  qlen = np.array([len(tok.encode(f"question: {e.question}"))
                   for e in examples], np.int32)
  targets = np.stack([fid_inputs.encode_target(tok, e.answers[0], 4)
                      for e in examples])
  batch = {"encoder_input_tokens": tokens, "passage_mask": pmask,
           "question_length": qlen, "decoder_target_tokens": targets}
  out, kernels = {}, {}
  for impl in ("reference", "pallas"):
    model = tiny_model(bi_encoder_layers=1, num_layers=2, dropout_rate=0.2,
                       attention=impl)
    params = model.init_params(0)
    step = jax.value_and_grad(lambda p: model.loss(  # noqa: B023
        p, batch, jax.random.key(3), kl_weight=1.0)[0])
    out[impl] = jax.jit(step)(params)
    kernels[impl] = str(jax.make_jaxpr(step)(params)).count("pallas_call")
  # forward and backward in each of the 2 encoder layers (the decoder's
  # 4 queries are a decoding shape: reference)
  assert kernels == {"reference": 0, "pallas": 2 * 2}
  np.testing.assert_allclose(out["pallas"][0], out["reference"][0], rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5,
                                                      rtol=1e-5),
               out["pallas"][1], out["reference"][1])


def test_head_groups_equal_the_reference(monkeypatch):
  """Where a chip's VMEM does not hold all heads' bias and its gradient
  (v4: 16 MiB), the grid splits the heads into groups of 128 lanes: the
  same context and gradients, the same dropout mask (the hash counts each
  group's global heads)."""
  monkeypatch.setattr(fused_attention_fit, "_vmem_bytes", lambda: 300 << 10)
  b, l, h, e = 2, 16, 4, 64
  assert fused_attention.tiling(b, h, e, l, l, 4) == (2, 1)
  ks = jax.random.split(jax.random.key(2), 5)
  q, k, v, cot = (jax.random.normal(ks[i], (b, l, h, e)) for i in (0, 1, 2, 3))
  bias0 = jax.random.normal(ks[4], (1, h, l, l))
  valid = jnp.asarray(np.arange(l)[None, :] < np.asarray([16, 11])[:, None])
  qlen = jnp.asarray([5, 3], jnp.int32)
  out = []
  for impl, mask in (("reference", block_mask(valid, qlen)),
                     ("pallas", block_segments(valid, qlen))):
    def loss(q, k, v, bias, mask=mask, impl=impl):
      ctx, _ = attention_ops.attend(q, k, v, bias=bias, mask=mask, rate=0.3,
                                    rng=jax.random.key(4), implementation=impl)
      return jnp.sum(ctx * cot), ctx
    grads, ctx = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
        q, k, v, bias0)
    out.append((ctx, *grads))
  for name, a, c in zip(("ctx", "dq", "dk", "dv", "dbias"), *out):
    np.testing.assert_allclose(np.asarray(c), np.asarray(a), atol=1e-5,
                               rtol=1e-5, err_msg=name)


@pytest.mark.slow  # a ReAtt train step compiled twice for v4: ~80 s each
@pytest.mark.tpu
def test_reatt_step_compiles_with_the_kernel(capsys):
  """A tiny ReAtt train step with ATTENTION='pallas' compiles for v4:2x2x1
  through `jaxfid bench compile`: both encoder layers (the bi-encoder's by
  its segments) leave the einsum path, so the attention-score FLOPs that
  remain (the decoder's, the retrieval scores) are a small part of the
  reference's, and it moves fewer bytes."""
  if not topologies.libtpu_available():
    pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
  flags = ["--gin_file=gin/reatt/tiny.gin", "--gin.TARGET_MAXLENGTH=4",
           "--gin.config.T5Config.vocab_size=128", "--breakdown"]
  reports = {}
  for impl in ("reference", "pallas"):
    assert cli.main(["bench", "compile", "--in-process", "--topology",
                     "v4:2x2x1", *flags, f"--gin.ATTENTION='{impl}'"]) == 0
    reports[impl] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  scores = {impl: sum(g["flops"] for g in r["breakdown"]["groups"]
                      if g["group"] == "attention scores")
            for impl, r in reports.items()}
  assert reports["pallas"]["fits"]
  assert scores["pallas"] < 0.2 * scores["reference"], scores
  assert (reports["pallas"]["bytes_accessed_per_chip"]
          < reports["reference"]["bytes_accessed_per_chip"])
