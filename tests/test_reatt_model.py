"""ReAtt model: avg-max relevance, the split encoder, the target, the KL loss, the head selector."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxfid.core.tokenization import Tokenizer
from jaxfid.reader import inputs as fid_inputs
from jaxfid.reader.examples import FidExample, Passage
from jaxfid.reatt import model as reatt
from jaxfid.t5.model import EncoderDecoderModel
from jaxfid.training.step import make_train_step
from reatt_world import make_world, tiny_model

TOK = Tokenizer()


def _batch(examples, n_context=3, length=16, seed=0):
  tokens, pmask = fid_inputs.encode_examples(TOK, examples, n_context, length)
  qlen = np.array([len(TOK.encode(f"question: {e.question}")) for e in examples],
                  np.int32)
  targets = np.stack([fid_inputs.encode_target(TOK, e.answers[0], 4)
                      for e in examples])
  return {"encoder_input_tokens": tokens, "passage_mask": pmask,
          "question_length": qlen, "decoder_target_tokens": targets}


@pytest.fixture(scope="module")
def world():
  _, examples = make_world(num_keys=8, n_context=3)
  return examples


def _numpy_avg_max(q, qm, k, km, bias=None):
  b, n, h = q.shape[0], k.shape[0], q.shape[2]
  bias = np.zeros((h, q.shape[1], k.shape[1])) if bias is None else bias
  out = np.zeros((b, h, n))
  for i in range(b):
    for d in range(n):
      for hh in range(h):
        if not km[d].any():
          continue
        vals = [max(float(q[i, a, hh] @ k[d, j, hh]) + float(bias[hh, a, j])
                    for j in np.flatnonzero(km[d]))
                for a in np.flatnonzero(qm[i])]
        out[i, hh, d] = np.mean(vals)
  return out


def _avg_max_inputs(rng, docs: int, doc_length: int, heads: int, width: int):
  """Random queries [2, 5, H, E] (one padded) and documents [N, S, H, E]
  (random padding, never the first token) with their masks."""
  q = rng.normal(size=(2, 5, heads, width)).astype(np.float32)
  k = rng.normal(size=(docs, doc_length, heads, width)).astype(np.float32)
  qm = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  km = rng.random((docs, doc_length)) < 0.6
  km[:, 0] = True
  return q, qm, k, km


def test_avg_max_matches_numpy_reference():
  q, qm, k, km = _avg_max_inputs(np.random.default_rng(0), 7, 6, 3, 4)
  km[3] = False  # a document without tokens scores 0
  want = _numpy_avg_max(q, qm, k, km)
  got = reatt.avg_max_relevance(q, qm, k, km)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  chunked = reatt.avg_max_relevance(q, qm, k, km, chunk=3)  # 7 = 3 + 3 + 1
  np.testing.assert_allclose(chunked, want, rtol=1e-5, atol=1e-5)
  # Padding query tokens do not count: changing them changes nothing.
  q2 = q.copy()
  q2[0, 3:] = 100.0
  np.testing.assert_allclose(reatt.avg_max_relevance(q2, qm, k, km), got)
  # The chunked version has the same gradient.
  f = lambda qq, c: jnp.sum(reatt.avg_max_relevance(qq, qm, k, km, chunk=c) ** 2)
  np.testing.assert_allclose(jax.grad(f)(q, 3), jax.grad(f)(q, 0), rtol=1e-5,
                             atol=1e-6)


def test_position_bias_joins_the_training_scores_only():
  """``position_bias``: the original's training scores are layer B+1's raw
  attention logits, relative position bias included (jzbjyb/FiD
  ``collect_for_retrieval``); its index's, and jaxfid's, have none."""
  rng = np.random.default_rng(1)
  q, qm, k, km = _avg_max_inputs(rng, 6, 7, 4, 8)
  bias = rng.normal(size=(4, 5, 7)).astype(np.float32)
  want = _numpy_avg_max(q, qm, k, km, bias)
  for chunk in (0, 4):
    np.testing.assert_allclose(
        reatt.avg_max_relevance(q, qm, k, km, chunk=chunk, bias=bias), want,
        rtol=1e-5, atol=1e-5)
  model = tiny_model(bi_encoder_layers=1)
  biased = reatt.ReAttModel(model.config,
                            model.reatt.replace(position_bias=True))
  params = biased.init_params(0)
  rel = np.asarray(biased.network(params).encoder.relpos_bias(5, 7)[0])
  assert np.abs(rel).max() > 0
  probs = np.asarray(biased.head_probabilities(params))
  for in_batch in (True, False):
    got, _ = biased.retrieval_scores(params, q, qm, k, km, 3, in_batch,
                                     position_bias=True)
    per_head = _numpy_avg_max(q, qm, k, km, rel)               # [B, H, N]
    if not in_batch:  # each question's own 3 rows
      per_head = np.stack([per_head[i, :, 3 * i:3 * i + 3] for i in range(2)])
    np.testing.assert_allclose(got, np.einsum("bhn,h->bn", per_head, probs),
                               rtol=1e-5, atol=1e-5)
  # the loss uses it; the relevance the index reproduces does not
  target = jax.nn.softmax(jnp.asarray(rng.normal(size=(2, 3))))
  loss = lambda m: float(m.retrieval_loss(params, q, qm, k, km, target,
                                          kl_weight=1.0)[0])
  assert loss(biased) != loss(model)
  plain, _ = model.retrieval_scores(params, q, qm, k, km, 3, True)
  unbiased, _ = biased.retrieval_scores(params, q, qm, k, km, 3, True)
  np.testing.assert_array_equal(unbiased, plain)


def test_question_lengths_from_tokens():
  examples = [FidExample(question="what is red?", ctxs=(Passage("t", "red"),)),
              FidExample(question="no passages"),
              FidExample(question="the title: trap", ctxs=(Passage("", "x"),))]
  tokens, _ = fid_inputs.encode_examples(TOK, examples, 1, 24)
  got = np.asarray(reatt.question_lengths_from_tokens(
      tokens[:, 0], TOK.encode("title:")))
  assert got[0] == len(TOK.encode("question: what is red?"))
  assert got[1] == np.sum(tokens[1, 0] != 0)  # all question (EOS included)
  assert got[2] == len(TOK.encode("question: the"))  # documented limitation


def test_block_mask_separates_question_and_document():
  valid = np.array([[1, 1, 1, 1, 1, 0]], bool)
  m = np.asarray(reatt.block_mask(valid, np.array([2])))[0, 0]
  assert m[:2, :2].all() and not m[:2, 2:].any()
  assert m[2:, 2:5].all() and not m[2:, :2].any() and not m[:, 5].any()


def test_without_bi_encoder_layers_it_is_fid(world):
  model = tiny_model(bi_encoder_layers=1, dropout_rate=0.1)
  # ReAttConfig asks for at least one bi-encoder layer (ReAtt trains one);
  # the model's split encoder at 0 layers is FiD's encoder.
  object.__setattr__(model.reatt, "bi_encoder_layers", 0)
  params = model.init_params(0)
  batch = _batch(world[:2])
  fid = EncoderDecoderModel(model.config)
  t5 = reatt.t5_part(params)
  dec = np.tile(np.arange(1, 5, dtype=np.int32), (2, 1))
  key = jax.random.key(1)
  want = jax.jit(lambda p, t, d, m, k: fid.logits(
      p, t, d, passage_mask=m, dropout_rng=k))(
          t5, batch["encoder_input_tokens"], dec, batch["passage_mask"], key)
  got = jax.jit(lambda p, t, d, m, k: model.logits(
      p, t, d, passage_mask=m, dropout_rng=k))(
          params, batch["encoder_input_tokens"], dec, batch["passage_mask"], key)
  np.testing.assert_array_equal(got, want)


def _retrieval_side(model, params, tokens, pmask, qlen):
  enc = model.encode(model.network(params), tokens, pmask, qlen,
                     with_retrieval=True)
  qm = np.asarray(enc.query_mask)
  return (np.asarray(enc.queries)[qm], np.asarray(enc.keys),
          np.asarray(enc.key_mask))


@pytest.mark.parametrize("bi_layers", [1, 2])
def test_bi_encoder_layers_isolate_question_and_documents(world, bi_layers):
  batch = _batch(world[:2])
  tokens, pmask, qlen = (batch["encoder_input_tokens"], batch["passage_mask"],
                         batch["question_length"])
  model = tiny_model(bi_encoder_layers=bi_layers)
  params = model.init_params(0)
  q0, k0, km = _retrieval_side(model, params, tokens, pmask, qlen)
  # Change question 0's documents (every row after its question block).
  doc_changed = tokens.copy()
  ql = qlen[0]
  real = doc_changed[0, :, ql:] != 0
  doc_changed[0, :, ql:] = np.where(real, 5 + doc_changed[0, :, ql:] % 100, 0)
  q1, k1, _ = _retrieval_side(model, params, doc_changed, pmask, qlen)
  np.testing.assert_array_equal(q1, q0)      # question states unchanged
  assert not np.allclose(k1[:3][km[:3]], k0[:3][km[:3]])
  np.testing.assert_array_equal(k1[3:], k0[3:])  # other questions' rows
  # Change question 0 only: its documents' keys are unchanged.
  q_changed = tokens.copy()
  q_changed[0, :, 2] = q_changed[0, :, 2] + 1
  q2, k2, _ = _retrieval_side(model, params, q_changed, pmask, qlen)
  assert not np.allclose(q2, q0)
  np.testing.assert_array_equal(k2[km], k0[km])
  # Control: the same layers without the block mask let the document in,
  net = model.network(params)

  def unmasked(tok):
    flat = tok.reshape(-1, tok.shape[-1])
    out = net.encoder(net.embed(flat), flat != 0, end=bi_layers, final_norm=False)
    return np.asarray(out.hidden)

  assert not np.allclose(unmasked(tokens)[0, :ql], unmasked(doc_changed)[0, :ql])
  # and the cross-encoder output of the question positions changes.
  h0 = model.encode(net, tokens, pmask, qlen).hidden
  h1 = model.encode(net, doc_changed, pmask, qlen).hidden
  assert not np.allclose(np.asarray(h0)[0, :ql], np.asarray(h1)[0, :ql])


def _leaves(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    path = f"{prefix}/{k}" if prefix else k
    out.update(_leaves(v, path) if isinstance(v, dict) else {path: np.asarray(v)})
  return out


def test_kl_gradient_reaches_the_bi_encoder_and_not_the_target(world):
  model = tiny_model(bi_encoder_layers=1)
  params = model.init_params(0)
  params[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS] = jnp.array([0.0, 0.001, 0, 0])
  batch = _batch(world[:4])
  grad_of = lambda name: jax.jit(jax.grad(
      lambda p: model.loss(p, batch)[1][name]))(params)
  grads = _leaves(grad_of("kl_loss"))
  nonzero = {k for k, g in grads.items() if np.any(g != 0)}
  assert {"encoder/layers_0/attention/query/kernel",
          "encoder/layers_0/mlp/wo/kernel", "token_embedder/embedding",
          "encoder/layers_1/attention/query/kernel",
          "encoder/layers_1/attention/key/kernel",
          "encoder/layers_1/pre_attention_layer_norm/scale",
          "reatt/head_weights"} <= nonzero
  for name in nonzero:  # nothing that only shapes the target
    assert not name.startswith("decoder/"), name
    assert not name.startswith("encoder/layers_2/"), name
    assert name not in ("encoder/encoder_norm/scale",
                        "encoder/layers_1/attention/value/kernel",
                        "encoder/layers_1/mlp/wo/kernel"), name
  # whereas the QA loss does train the decoder
  qa = _leaves(grad_of("qa_loss"))
  assert np.any(qa["decoder/layers_0/mlp/wo/kernel"] != 0)


def test_in_batch_documents_get_zero_target(world):
  t = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
  full = np.asarray(reatt.in_batch_targets(t))
  np.testing.assert_allclose(full, [[0.5, 0.3, 0.2, 0, 0, 0],
                                    [0, 0, 0, 0.1, 0.1, 0.8]])
  # The loss's KL is KL(target || softmax over all 2 * 3 documents).
  model = tiny_model(bi_encoder_layers=1)
  params = model.init_params(0)
  batch = _batch(world[:2])
  _, metrics = jax.jit(model.loss)(params, batch)

  @jax.jit
  def reference(params, batch):
    net = model.network(params)
    enc = model.encode(net, batch["encoder_input_tokens"],
                       batch["passage_mask"], batch["question_length"],
                       with_retrieval=True)
    _, dec = net.decode(enc.hidden, enc.mask, jnp.zeros((2, 1), jnp.int32),
                        output_attention_logits=True)
    target = reatt.target_distribution(dec.cross_attention_logits[-1],
                                       enc.mask, 3)
    per_head = reatt.avg_max_relevance(enc.queries, enc.query_mask, enc.keys,
                                       enc.key_mask)
    return target, jnp.einsum("bhn,h->bn", per_head,
                              model.head_probabilities(params))

  target, scores = map(np.asarray, reference(params, batch))
  np.testing.assert_allclose(target.sum(-1), 1.0, rtol=1e-5)
  logp = np.asarray(jax.nn.log_softmax(scores, -1))
  kl = [np.sum(target[i] * (np.log(target[i]) - logp[i, 3 * i:3 * i + 3]))
        for i in range(2)]
  np.testing.assert_allclose(metrics["kl_loss"], np.mean(kl), rtol=1e-4)
  # Without in-batch negatives, only the own documents are in the softmax.
  own = reatt.ReAttModel(model.config, model.reatt.replace(in_batch_negatives=False))
  _, m_own = jax.jit(own.loss)(params, batch)
  kl_own = [np.sum(target[i] * (np.log(target[i]) - np.asarray(
      jax.nn.log_softmax(scores[i, 3 * i:3 * i + 3])))) for i in range(2)]
  np.testing.assert_allclose(m_own["kl_loss"], np.mean(kl_own), rtol=1e-4)


def test_kl_weight_per_question_and_warmup(world):
  model = tiny_model(bi_encoder_layers=1)
  params = model.init_params(0)
  batch = _batch(world[:4])
  loss_fn = jax.jit(model.loss)
  loss0, m = loss_fn(params, {**batch, "kl_weight": np.zeros(4, np.float32)})
  np.testing.assert_allclose(loss0, m["qa_loss"])
  loss8, m8 = loss_fn(params, {**batch,
                               "kl_weight": np.full(4, 8.0 / 4, np.float32)})
  np.testing.assert_allclose(loss8, m8["qa_loss"] + 8.0 * m8["kl_loss"],
                             rtol=1e-5)


def test_accumulated_microbatches_add_up_without_in_batch_negatives(world):
  model = tiny_model(bi_encoder_layers=1)
  model = reatt.ReAttModel(model.config,
                           model.reatt.replace(in_batch_negatives=False))
  params = model.init_params(0)
  batch = {**_batch(world[:4]), "kl_weight": np.full(4, 2.0, np.float32)}
  opt = optax.sgd(0.0)
  fn = lambda p, b, r, n: model.loss(p, b, r, normalizer=n)
  state = {"step": jnp.zeros((), jnp.int32), "params": params,
           "opt_state": opt.init(params)}
  _, one = jax.jit(make_train_step(fn, opt, seed=0))(state, batch)
  _, two = jax.jit(make_train_step(fn, opt, seed=0, accumulation_steps=2))(
      state, batch)
  np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
  np.testing.assert_allclose(two["grad_norm"], one["grad_norm"], rtol=1e-4)


@pytest.mark.parametrize("tau,concentrated", [(0.001, True), (1.0, False)])
def test_head_selector_concentrates_on_one_head(tau, concentrated):
  rng = np.random.default_rng(0)
  b, h, n = 8, 4, 12
  per_head = rng.normal(size=(b, h, n)).astype(np.float32)
  target = np.asarray(jax.nn.softmax(3.0 * per_head[:, 2]))  # head 2 is right
  valid = np.ones((b, n), bool)

  def loss(w):
    probs = reatt.head_probabilities(w, tau)
    scores = jnp.einsum("bhn,h->bn", per_head, probs)
    return jnp.mean(reatt.kl_to_target(target, scores, valid))

  opt = optax.adam(1e-3)
  w = jnp.zeros(h)
  state = opt.init(w)
  for _ in range(100):
    updates, state = opt.update(jax.grad(loss)(w), state)
    w = optax.apply_updates(w, updates)
  probs = np.asarray(reatt.head_probabilities(w, tau))
  if concentrated:
    assert probs.argmax() == 2 and probs.max() > 0.99
  else:
    assert probs.max() < 0.5


def test_predict_relevance_and_parameters(world):
  model = tiny_model(bi_encoder_layers=2)
  params = model.init_params(0)
  batch = _batch(world[:2] + [dataclasses.replace(world[2], ctxs=world[2].ctxs[:2])])
  tokens, pmask = batch["encoder_input_tokens"], batch["passage_mask"]
  out = jax.jit(lambda p: model.predict(p, tokens, passage_mask=pmask,
                                        max_decode_len=3))(params)
  assert out.shape == (3, 3)
  relevance = jax.jit(lambda p, t, m, q: model.relevance(
      p, t, passage_mask=m, question_length=q))
  rel = np.asarray(relevance(params, tokens, pmask, None))
  assert np.isneginf(rel[2, 2]) and np.isfinite(rel[:2]).all()
  # Derived and exact question lengths agree on these rows.
  exact = relevance(params, tokens, pmask, batch["question_length"])
  np.testing.assert_allclose(exact, rel, rtol=1e-6)
  scores = np.asarray(jax.jit(lambda p: model.passage_scores(
      p, tokens, passage_mask=pmask))(params))
  np.testing.assert_allclose(scores[:2].sum(-1), 1.0, rtol=1e-5)
  axes = model.param_axes()
  assert axes["reatt"]["head_weights"] == (reatt.HEAD_AXIS,)
  assert model.abstract_params()["reatt"]["head_weights"].shape == (4,)
  with pytest.raises(ValueError, match="bi_encoder_layers"):
    reatt.ReAttModel(model.config, reatt.ReAttConfig(bi_encoder_layers=3))


def test_the_originals_kl_weight_times_gpus_is_the_global_mean():
  """jzbjyb/FiD ``DecoderWrapper.get_kl_loss`` multiplies the KL weight by
  the world size under in-batch negatives: every GPU computes the KL of all
  questions of the global batch (batchmean) from gathered queries and keys
  that carry gradients only for its own rows (``dist_utils.all_gather_tensors``
  puts the local tensor back), and DDP averages the GPUs' gradients. The
  product is the gradient of ``alpha * mean KL`` over the global batch,
  jaxfid's, for everything before the gather (the whole encoder). The head
  selector acts after it, so every GPU holds its whole gradient: the
  original's is G times jaxfid's there."""
  g, b, p, q_len, l, d = 4, 2, 3, 5, 6, 8
  model = tiny_model(bi_encoder_layers=1)
  h, e = model.config.num_heads, model.config.d_kv
  rng = np.random.default_rng(0)
  xq = jnp.asarray(rng.normal(size=(g * b, q_len, d)), jnp.float32)
  xk = jnp.asarray(rng.normal(size=(g * b * p, l, d)), jnp.float32)
  qmask = jnp.asarray(rng.random((g * b, q_len)) < 0.8).at[:, 0].set(True)
  kmask = jnp.asarray(rng.random((g * b * p, l)) < 0.8).at[:, 0].set(True)
  target = jax.nn.softmax(jnp.asarray(rng.normal(size=(g * b, p)) * 2.0))
  params = {"wq": jnp.asarray(rng.normal(size=(d, h, e)) * 0.3, jnp.float32),
            "wk": jnp.asarray(rng.normal(size=(d, h, e)) * 0.3, jnp.float32),
            reatt.PARAMS_KEY: {reatt.HEAD_WEIGHTS: jnp.asarray(
                rng.normal(size=(h,)) * 1e-3, jnp.float32)}}
  alpha = 8.0

  def kl_term(params, local=None, weight=alpha):
    queries = jnp.einsum("bqd,dhe->bqhe", xq, params["wq"])  # [G*b, Q, H, E]
    keys = jnp.einsum("nld,dhe->nlhe", xk, params["wk"])     # [G*b*P, L, H, E]
    if local is not None:  # another GPU's rows arrive without gradients
      own_q = (jnp.arange(g * b) // b == local)[:, None, None, None]
      own_k = (jnp.arange(g * b * p) // (b * p) == local)[:, None, None, None]
      queries = jnp.where(own_q, queries, jax.lax.stop_gradient(queries))
      keys = jnp.where(own_k, keys, jax.lax.stop_gradient(keys))
    return model.retrieval_loss(params, queries, qmask, keys, kmask, target,
                                kl_weight=weight)[0]

  def both(params):
    # jaxfid: alpha / global batch per question (ReAttBatcher's kl_weight)
    ours = jax.grad(lambda pr: model.retrieval_loss(
        pr, jnp.einsum("bqd,dhe->bqhe", xq, pr["wq"]), qmask,
        jnp.einsum("nld,dhe->nlhe", xk, pr["wk"]), kmask, target,
        kl_weights=jnp.full((g * b,), alpha / (g * b)))[0])(params)
    # the original: each GPU's gradient, then DDP's average over the GPUs,
    # with the KL weight times G and without
    ddp = [jax.tree.map(lambda x: x.mean(0), jax.vmap(
        jax.grad(kl_term), (None, 0, None))(params, jnp.arange(g), w))
           for w in (alpha * g, alpha)]
    return ours, *ddp

  ours, ddp, unscaled = jax.jit(both)(params)
  for name in ("wq", "wk"):
    assert np.abs(ours[name]).max() > 1e-3
    np.testing.assert_allclose(ddp[name], ours[name], rtol=1e-5, atol=1e-7)
  head = lambda t: t[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS]
  np.testing.assert_allclose(head(ddp), g * head(ours), rtol=1e-5, atol=1e-6)
  # Without the factor G the encoder would get 1/G of the gradient.
  np.testing.assert_allclose(unscaled["wq"], ours["wq"] / g, rtol=1e-5,
                             atol=1e-7)


def test_learned_score_scale_is_the_originals_combine_weight():
  """jzbjyb/FiD DecoderWrapper.forward: ``exp(combine_weight) * scores``
  before the KL's softmax, combine_weight a parameter starting at 0."""
  model = tiny_model(bi_encoder_layers=1)
  scaled = reatt.ReAttModel(model.config,
                            model.reatt.replace(score_scale=True))
  t5 = {"token_embedder": {"embedding": jnp.zeros((2, 2))}}
  grown = reatt.add_head_weights(t5, 4, score_scale=True)  # a T5's: both 0
  assert float(grown[reatt.PARAMS_KEY][reatt.SCORE_SCALE]) == 0.0
  assert not np.any(grown[reatt.PARAMS_KEY][reatt.HEAD_WEIGHTS])
  assert (set(scaled.abstract_params()[reatt.PARAMS_KEY])
          == set(scaled.param_axes()[reatt.PARAMS_KEY])
          == {reatt.HEAD_WEIGHTS, reatt.SCORE_SCALE})
  params = reatt.add_head_weights(grown, 4)  # unscaled: dropped, and added
  assert set(params[reatt.PARAMS_KEY]) == {reatt.HEAD_WEIGHTS}
  assert set(reatt.add_head_weights(params, 4, True)[reatt.PARAMS_KEY]) == {
      reatt.HEAD_WEIGHTS, reatt.SCORE_SCALE}
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(2, 3, 4, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(6, 5, 4, 8)), jnp.float32)
  qm, km = jnp.ones((2, 3), bool), jnp.ones((6, 5), bool)
  double = {**grown, reatt.PARAMS_KEY: {
      **grown[reatt.PARAMS_KEY], reatt.SCORE_SCALE: jnp.log(2.0)}}
  target = jax.nn.softmax(jnp.asarray(rng.normal(size=(2, 3))))

  @jax.jit
  def run(params, double, grown):
    plain, _ = model.retrieval_scores(params, q, qm, k, km, 3, True)
    twice, _ = scaled.retrieval_scores(double, q, qm, k, km, 3, True)
    return plain, twice, jax.grad(lambda p: scaled.retrieval_loss(
        p, q, qm, k, km, target, kl_weight=1.0)[0])(grown)

  plain, twice, grad = run(params, double, grown)
  np.testing.assert_allclose(twice, 2.0 * plain, rtol=1e-5)
  assert float(grad[reatt.PARAMS_KEY][reatt.SCORE_SCALE]) != 0.0
