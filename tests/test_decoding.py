"""Tests for jaxfid.t5.decoding: greedy, sampling and beam search vs references.

The toy model is a random Markov-like chain over a small vocabulary whose
logits depend on the current token and on a cache (a step counter, the
previous token, a running hash of the history, a [N, L] history buffer and a
shared transition table), so cache threading, expansion and beam reordering
all change the result when wrong. The references below are written
independently of the JAX code: per-example Python lists, logits recomputed
from the full prefix. Parity with HF ``generate`` is in test_decoding_hf.py.
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxfid.t5 import decoding

EOS = 1
HASH_MOD = 13


# ------------------------------------------------------------------------------
# Toy model: JAX step function with a cache, numpy prefix function.
# ------------------------------------------------------------------------------


class Toy:
  """Random tables; logits = f(cur token, previous token, hash, step)."""

  def __init__(self, seed, vocab, max_len, batch, use_cur_token=True,
               eos_push=0.0):
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.normal(size=s).astype(np.float32)
    self.vocab, self.max_len, self.batch = vocab, max_len, batch
    self.use_cur_token = use_cur_token
    self.trans = f32(vocab, vocab)
    self.prev = f32(vocab + 1, vocab)  # row `vocab`: no previous token
    self.hash = f32(HASH_MOD, vocab)
    self.hist = f32(HASH_MOD, vocab)
    self.pos = f32(max_len + 1, vocab)
    self.pos[:, EOS] += eos_push * np.arange(max_len + 1, dtype=np.float32)
    self.h0 = rng.integers(0, HASH_MOD, size=batch).astype(np.int32)
    self.ex_bias = np.zeros((batch, max_len + 1, vocab), np.float32)

  def init_cache(self):
    b, n = self.batch, self.max_len + 1
    return {
        "step": jnp.zeros((b,), jnp.int32),
        "prev": jnp.full((b,), self.vocab, jnp.int32),
        "h": jnp.asarray(self.h0),
        "ex": jnp.arange(b, dtype=jnp.int32),
        "hist": jnp.zeros((b, n), jnp.int32),
        "trans": jnp.asarray(self.trans),  # shared leaf (leading dim V)
        "calls": jnp.array(0, jnp.int32),  # shared scalar leaf
    }

  def tokens_to_logits(self, state):
    c = state.cache
    tok, step = state.cur_token, c["step"]
    hist_sum = jnp.sum(c["hist"], axis=1) % HASH_MOD
    if self.use_cur_token:
      base = c["trans"][tok]
    else:  # only what the cache remembers of earlier tokens
      base = c["trans"][c["prev"] % self.vocab]
    j = jnp.asarray
    logits = (base + j(self.prev)[c["prev"]] + j(self.hash)[c["h"]]
              + j(self.hist)[hist_sum] + j(self.pos)[step]
              + j(self.ex_bias)[c["ex"], step])
    rows = jnp.arange(tok.shape[0])
    new = dict(c)
    new["hist"] = c["hist"].at[rows, step].set(tok)
    new["h"] = (c["h"] * 7 + tok + 1) % HASH_MOD
    new["prev"] = tok
    new["step"] = step + 1
    new["calls"] = c["calls"] + 1
    return logits, new

  def prefix_logits(self, b, prefix):
    """Logits after ``prefix`` (start token first) for example ``b``."""
    tok, step = prefix[-1], len(prefix) - 1
    earlier = prefix[:-1]
    prev = earlier[-1] if earlier else self.vocab
    h = int(self.h0[b])
    for x in earlier:
      h = (h * 7 + x + 1) % HASH_MOD
    hist_sum = sum(earlier) % HASH_MOD
    base = self.trans[tok if self.use_cur_token else prev % self.vocab]
    return (base + self.prev[prev] + self.hash[h] + self.hist[hist_sum]
            + self.pos[step] + self.ex_bias[b, step])


def log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max()
  return x - m - np.log(np.exp(x - m).sum())


# ------------------------------------------------------------------------------
# Plain references.
# ------------------------------------------------------------------------------


def ref_greedy(toy, b, max_len):
  prefix, out = [0], []
  for _ in range(max_len):
    tok = int(np.argmax(toy.prefix_logits(b, prefix)))
    out.append(tok)
    prefix.append(tok)
    if tok == EOS:
      break
  return out


def _candidates(toy, b, running, n):
  """Top n (score, tokens) continuations; ties by (beam, token) order."""
  cands = []
  for score, toks in running:
    lp = log_softmax(toy.prefix_logits(b, [0] + toks))
    cands += [(score + lp[v], toks + [v]) for v in range(toy.vocab)]
  order = sorted(range(len(cands)), key=lambda i: -cands[i][0])
  return [cands[i] for i in order[:n]]


def ref_hf_beam(toy, b, k, max_len, alpha, early_stopping, freeze=True):
  """HF 5.x beam search for one example, written with lists.

  Returns (finished [(score, tokens)] best first, number of model calls).
  ``freeze=False`` keeps updating the finished set after HF would have frozen
  it (only used to show that a test scenario depends on the freezing).
  """
  running, finished, improvable = [(0.0, [])], [], True
  for t in range(max_len):
    length = t + 1
    cands = _candidates(toy, b, running, 2 * k)
    hit = [c[1][-1] == EOS or length == max_len for c in cands]
    full = len(finished) == k
    if not freeze or (improvable and not (early_stopping is True and full)):
      finished += [(s / length ** alpha, toks)
                   for (s, toks), h in zip(cands[:k], hit) if h]
      finished = sorted(finished, key=lambda f: -f[0])[:k]
    running = [c for c, h in zip(cands, hit) if not h][:k]
    if length == max_len:
      break
    best_len = max_len if early_stopping == "never" and alpha > 0 else length
    if len(finished) == k and (
        running[0][0] / best_len ** alpha <= finished[-1][0]):
      improvable = False
    if freeze and (not improvable
                   or (early_stopping is True and len(finished) == k)):
      break
  return finished, t + 1


def ref_t5x_beam(toy, k, max_len, alpha):
  """t5x beam search, written with lists; all examples in one loop.

  The loop is joint because t5x's stopping test is global and, for alpha < 0,
  an example that met it can still change while others go on.
  Returns ([result [(score, tokens)] best first per example], model calls).
  """
  bp = lambda n: ((5.0 + n) / 6.0) ** alpha
  running = [[(0.0, [])] for _ in range(toy.batch)]
  finished = [[] for _ in range(toy.batch)]
  for t in range(max_len):
    length = t + 1
    done = []
    for b in range(toy.batch):
      cands = _candidates(toy, b, running[b], 2 * k)
      finished[b] += [(s / bp(length), toks) for s, toks in cands
                      if toks[-1] == EOS]
      finished[b] = sorted(finished[b], key=lambda f: -f[0])[:k]
      running[b] = [c for c in cands if c[1][-1] != EOS][:k]
      # t5x bounds the live beams with the penalty at max_len + 1.
      done.append(len(finished[b]) == k and (
          finished[b][-1][0] > running[b][0][0] / bp(max_len + 1)))
    if all(done):
      break
  return [f if f else r for f, r in zip(finished, running)], t + 1


def pad(toks, n):
  return list(toks) + [0] * (n - len(toks))


def check_against(ref_lists, tokens, scores, max_len):
  tokens, scores = np.asarray(tokens), np.asarray(scores)
  for b, ref in enumerate(ref_lists):
    assert len(ref) == tokens.shape[1]
    for j, (s, toks) in enumerate(ref):
      assert list(tokens[b, j]) == pad(toks, max_len), (b, j)
      np.testing.assert_allclose(scores[b, j], s, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------
# Greedy.
# ------------------------------------------------------------------------------


def test_greedy_matches_reference():
  toy = Toy(0, vocab=11, max_len=9, batch=3, eos_push=0.4)
  tokens, lengths = decoding.greedy_decode(
      toy.tokens_to_logits, toy.init_cache(), batch_size=3, max_decode_len=9)
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  refs = [ref_greedy(toy, b, 9) for b in range(3)]
  assert any(r[-1] == EOS for r in refs)  # the test exercises EOS
  assert any(r[-1] != EOS for r in refs)  # ... and running to the end
  for b, ref in enumerate(refs):
    assert list(tokens[b]) == pad(ref, 9)
    assert lengths[b] == len(ref)


def _count_calls(fn, counter):
  def counted(state):
    jax.debug.callback(lambda: counter.append(1))
    return fn(state)
  return counted


def _forced(plan, vocab):
  """Emits plan[b][step] (the last entry past the end); logits depend only
  on the cache's step counter, never on cur_token."""
  plan = jnp.asarray(plan, jnp.int32)

  def fn(state):
    step = state.cache["step"]
    target = plan[jnp.arange(step.shape[0]) % plan.shape[0],
                  jnp.minimum(step, plan.shape[1] - 1)]
    logits = 10.0 * jax.nn.one_hot(target, vocab)
    return logits, {"step": step + 1}
  return fn


def test_greedy_pads_after_eos_and_stops_early():
  plan = [[4, 5, EOS, 6, 6, 6], [7, EOS, 6, 6, 6, 6]]
  calls = []
  fn = _count_calls(_forced(plan, 9), calls)
  tokens, lengths = decoding.greedy_decode(
      fn, {"step": jnp.zeros((2,), jnp.int32)}, batch_size=2,
      max_decode_len=6)
  jax.effects_barrier()
  assert np.asarray(tokens).tolist() == [[4, 5, EOS, 0, 0, 0],
                                         [7, EOS, 0, 0, 0, 0]]
  assert np.asarray(lengths).tolist() == [3, 2]
  assert len(calls) == 3  # stopped as soon as both ended


def test_cache_is_threaded():
  # Logits depend only on the cache's step counter: without threading every
  # step would emit the same token.
  plan = [[2, 3, 4, 5, EOS]]
  cache = {"step": jnp.zeros((1,), jnp.int32)}
  tokens, _ = decoding.greedy_decode(_forced(plan, 8), cache, batch_size=1,
                                     max_decode_len=5)
  assert np.asarray(tokens).tolist() == plan
  for style in ("t5x", "hf"):
    tokens, _ = decoding.beam_search(
        _forced(plan, 8), cache, batch_size=1, num_beams=2, max_decode_len=5,
        length_penalty_style=style)
    assert np.asarray(tokens)[0, 0].tolist() == plan[0]


def test_sampling_limits_equal_greedy():
  toy = Toy(0, vocab=11, max_len=9, batch=3, eos_push=0.4)
  kwargs = dict(batch_size=3, max_decode_len=9)
  greedy = decoding.greedy_decode(toy.tokens_to_logits, toy.init_cache(),
                                  **kwargs)
  rng = jax.random.PRNGKey(0)
  for temperature, topk in [(0.0, 0), (1.5, 1)]:
    got = decoding.temperature_sample(
        toy.tokens_to_logits, toy.init_cache(), rng, temperature=temperature,
        topk=topk, **kwargs)
    for g, e in zip(got, greedy):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(e))


def test_sampling_distribution_and_topk():
  logits = jnp.array([1.0, -0.5, 0.3, 2.0, 0.0])
  n = 4000

  def fn(state):
    return jnp.broadcast_to(logits, (n, 5)), state.cache
  cache = {"dummy": jnp.zeros((n,))}
  sample = jax.jit(functools.partial(
      decoding.temperature_sample, fn, batch_size=n, max_decode_len=1,
      temperature=2.0))
  rng = jax.random.PRNGKey(1)
  tokens, lengths = sample(cache, rng)
  freq = np.bincount(np.asarray(tokens)[:, 0], minlength=5) / n
  want = np.asarray(jax.nn.softmax(logits / 2.0))
  np.testing.assert_allclose(freq, want, atol=0.03)
  assert (np.asarray(lengths) == 1).all()
  again, _ = sample(cache, rng)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(tokens))
  other, _ = sample(cache, jax.random.PRNGKey(2))
  assert not np.array_equal(np.asarray(other), np.asarray(tokens))
  top2, _ = decoding.temperature_sample(
      fn, cache, rng, batch_size=n, max_decode_len=1, temperature=2.0, topk=2)
  assert set(np.unique(np.asarray(top2))) == {0, 3}


# ------------------------------------------------------------------------------
# Beam search against the references.
# ------------------------------------------------------------------------------

# (alpha, early_stopping, use_cur_token); use_cur_token=False makes the
# logits depend on earlier tokens only through the cache.
HF_CASES = [(0.6, False, True), (0.6, True, True), (2.0, "never", True),
            (0.0, "never", True), (-0.5, False, True), (0.6, False, False),
            (2.0, True, False), (1.0, "never", False)]


def beam_vs_reference(toy, k, n, alpha, style, early_stopping=False):
  """Runs beam_search on the toy; checks results and call count vs the ref."""
  calls = []
  tokens, scores = decoding.beam_search(
      _count_calls(toy.tokens_to_logits, calls), toy.init_cache(),
      batch_size=toy.batch, num_beams=k, max_decode_len=n, alpha=alpha,
      length_penalty_style=style, early_stopping=early_stopping)
  jax.effects_barrier()
  if style == "hf":
    refs = [ref_hf_beam(toy, b, k, n, alpha, early_stopping)
            for b in range(toy.batch)]
    # The loop runs until the last example is frozen.
    results, steps = [r for r, _ in refs], max(steps for _, steps in refs)
  else:
    results, steps = ref_t5x_beam(toy, k, n, alpha)
  check_against(results, tokens, scores, n)
  assert len(calls) == steps
  return results


@pytest.mark.parametrize("alpha,early_stopping,use_cur_token", HF_CASES)
def test_beam_hf_matches_reference(alpha, early_stopping, use_cur_token):
  toy = Toy(1, vocab=11, max_len=6, batch=2, use_cur_token=use_cur_token,
            eos_push=0.5)
  beam_vs_reference(toy, 3, 6, alpha, "hf", early_stopping)


@pytest.mark.parametrize("early_stopping,seed", [(True, 11), (False, 10)])
def test_beam_hf_frozen_example_stays_frozen(early_stopping, seed):
  # Example 0 fills its finished slots early; EOS is impossible for example 1
  # until late, so the loop goes on. With alpha=2 later, longer hypotheses of
  # example 0 would score better, but HF no longer admits them (its slots are
  # full with early_stopping=True / its heuristic said "no improvement").
  k, n, alpha = 2, 7, 2.0
  toy = Toy(seed, vocab=11, max_len=n, batch=2, eos_push=0.0)
  toy.ex_bias[0, :2, EOS] += 3.0
  toy.ex_bias[1, :5, EOS] -= 30.0
  refs = beam_vs_reference(toy, k, n, alpha, "hf", early_stopping)
  unfrozen, _ = ref_hf_beam(toy, 0, k, n, alpha, early_stopping, freeze=False)
  assert [t for _, t in unfrozen] != [t for _, t in refs[0]]


@pytest.mark.parametrize("alpha,use_cur_token",
                         [(0.0, True), (2.0, True), (-0.5, True), (0.6, False)])
def test_beam_t5x_matches_reference(alpha, use_cur_token):
  toy = Toy(2, vocab=11, max_len=6, batch=2, use_cur_token=use_cur_token,
            eos_push=0.5)
  beam_vs_reference(toy, 3, 6, alpha, "t5x")


def test_beam_t5x_without_finished_returns_live_beams():
  toy = Toy(3, vocab=11, max_len=4, batch=2, eos_push=-30.0)  # no EOS ever
  refs = beam_vs_reference(toy, 2, 4, 0.6, "t5x")
  assert all(EOS not in toks for ref in refs for _, toks in ref)


@pytest.mark.parametrize("alpha", [0.0, 2.0])
def test_single_beam_hf_equals_greedy(alpha):
  toy = Toy(4, vocab=11, max_len=8, batch=3, eos_push=0.4)
  greedy, _ = decoding.greedy_decode(
      toy.tokens_to_logits, toy.init_cache(), batch_size=3, max_decode_len=8)
  tokens, _ = decoding.beam_search(
      toy.tokens_to_logits, toy.init_cache(), batch_size=3, num_beams=1,
      max_decode_len=8, alpha=alpha, length_penalty_style="hf",
      early_stopping=False)
  np.testing.assert_array_equal(np.asarray(tokens)[:, 0], np.asarray(greedy))


def _brute_force(toy, max_len, score_fn, include_unfinished):
  """All sequences ending in EOS (and, optionally, all of full length)."""
  out = []

  def walk(toks, logp):
    if toks and (toks[-1] == EOS or len(toks) == max_len):
      if toks[-1] == EOS or include_unfinished:
        out.append((score_fn(logp, len(toks)), toks))
      return
    lp = log_softmax(toy.prefix_logits(0, [0] + toks))
    for v in range(toy.vocab):
      walk(toks + [v], logp + lp[v])
  walk([], 0.0)
  return sorted(out, key=lambda f: -f[0])


@pytest.mark.parametrize("style", ["t5x", "hf"])
def test_wide_beam_equals_exhaustive_search(style):
  # With enough beams nothing is pruned, so the best finished sequences are
  # the best of all sequences.
  n, alpha = 3, 1.0
  toy = Toy(5, vocab=5, max_len=n, batch=1, eos_push=0.5)
  if style == "t5x":
    k = 40  # 2K >= 4**2 * 5 candidates at the last step
    score = lambda lp, m: lp / ((5.0 + m) / 6.0) ** alpha
  else:
    k = 80  # all last-step candidates are within the top K
    score = lambda lp, m: lp / m ** alpha
  brute = _brute_force(toy, n, score, include_unfinished=style == "hf")
  tokens, scores = decoding.beam_search(
      toy.tokens_to_logits, toy.init_cache(), batch_size=1, num_beams=k,
      max_decode_len=n, alpha=alpha, length_penalty_style=style,
      early_stopping="never")
  top = 20
  check_against([brute[:top]], np.asarray(tokens)[:, :top],
                np.asarray(scores)[:, :top], n)


@pytest.mark.parametrize("style,early_stopping",
                         [("t5x", False), ("hf", False), ("hf", True)])
def test_beam_stops_early_once_all_examples_finished(style, early_stopping):
  # EOS becomes overwhelmingly likely from step 2 on.
  toy = Toy(6, vocab=11, max_len=10, batch=2, eos_push=0.0)
  toy.pos[2:, EOS] += 40.0
  calls = []
  fn = _count_calls(toy.tokens_to_logits, calls)
  tokens, _ = decoding.beam_search(
      fn, toy.init_cache(), batch_size=2, num_beams=3, max_decode_len=10,
      alpha=0.6, length_penalty_style=style, early_stopping=early_stopping)
  jax.effects_barrier()
  tokens = np.asarray(tokens)
  assert len(calls) == 3
  eos_at = np.argmax(tokens == EOS, axis=-1)
  assert (tokens[:, :, :3] == EOS).any(-1).all()  # every beam ended by step 2
  for b, j in itertools.product(range(2), range(3)):
    assert (tokens[b, j, eos_at[b, j] + 1:] == 0).all()


# ------------------------------------------------------------------------------
# Cache plumbing, jit, arguments.
# ------------------------------------------------------------------------------


def test_expand_and_gather_cache_rule():
  cache = {"a": jnp.arange(6).reshape(2, 3), "shared": jnp.arange(5),
           "idx": jnp.array(7)}
  flat = decoding.expand_cache(cache, batch_size=2, num_beams=3)
  assert flat["a"].shape == (6, 3)
  np.testing.assert_array_equal(flat["a"][:3], np.tile(np.arange(3), (3, 1)))
  assert flat["shared"].shape == (5,) and int(flat["idx"]) == 7
  flat["a"] = flat["a"] + jnp.arange(6)[:, None] * 100
  gathered = decoding.gather_flat_cache(flat, jnp.array([[2, 0, 0], [1, 1, 2]]))
  np.testing.assert_array_equal(gathered["a"][:, 0] // 100, [2, 0, 0, 4, 4, 5])
  np.testing.assert_array_equal(gathered["shared"], np.arange(5))


def test_expand_cache_fn_overrides_rule():
  # The toy's shared transition table has leading dim V; with V == batch_size
  # the default rule would wrongly expand it, so the caller expands explicitly.
  k, n, batch = 3, 5, 7
  toy = Toy(7, vocab=batch, max_len=n, batch=batch, eos_push=0.4)
  seen = []

  def expand(cache, num_beams):
    seen.append(num_beams)
    return {key: v if key in ("trans", "calls")
            else jnp.repeat(v, num_beams, axis=0) for key, v in cache.items()}
  kwargs = dict(batch_size=batch, num_beams=k, max_decode_len=n,
                length_penalty_style="hf")
  tokens, scores = decoding.beam_search(
      toy.tokens_to_logits, toy.init_cache(), expand_cache_fn=expand, **kwargs)
  assert seen == [k]
  refs = [ref_hf_beam(toy, b, k, n, 0.6, False)[0] for b in range(batch)]
  check_against(refs, tokens, scores, n)
  wrong, _ = decoding.beam_search(toy.tokens_to_logits, toy.init_cache(),
                                  **kwargs)
  assert not np.array_equal(np.asarray(wrong), np.asarray(tokens))


def test_jit_compiles_once():
  traces = []
  toy = Toy(8, vocab=11, max_len=5, batch=2, eos_push=0.4)

  def fn(state):
    traces.append(1)
    return toy.tokens_to_logits(state)

  beam = jax.jit(functools.partial(
      decoding.beam_search, fn, batch_size=2, num_beams=2, max_decode_len=5,
      length_penalty_style="hf"))
  greedy = jax.jit(functools.partial(
      decoding.greedy_decode, fn, batch_size=2, max_decode_len=5))
  cache = toy.init_cache()
  other = dict(cache, h=(cache["h"] + 3) % HASH_MOD)
  first = beam(cache)
  second = beam(other)
  greedy(cache)
  greedy(other)
  assert len(traces) == 2  # one trace per decoder, none on the second call
  assert beam._cache_size() == 1 and greedy._cache_size() == 1
  assert not np.array_equal(np.asarray(first[0]), np.asarray(second[0]))


def test_invalid_arguments():
  toy = Toy(9, vocab=11, max_len=3, batch=1)
  kwargs = dict(batch_size=1, num_beams=2, max_decode_len=3)
  with pytest.raises(ValueError, match="length_penalty_style"):
    decoding.beam_search(toy.tokens_to_logits, toy.init_cache(),
                         length_penalty_style="gnmt", **kwargs)
  with pytest.raises(ValueError, match="early_stopping"):
    decoding.beam_search(toy.tokens_to_logits, toy.init_cache(),
                         early_stopping="always", **kwargs)
  with pytest.raises(ValueError, match="num_beams"):
    decoding.beam_search(toy.tokens_to_logits, toy.init_cache(),
                         batch_size=1, num_beams=0, max_decode_len=3)
  with pytest.raises(ValueError, match="max_decode_len"):
    decoding.greedy_decode(toy.tokens_to_logits, toy.init_cache(),
                           batch_size=1, max_decode_len=0)
  with pytest.raises(ValueError, match="temperature"):
    decoding.temperature_sample(toy.tokens_to_logits, toy.init_cache(),
                                jax.random.PRNGKey(0), batch_size=1,
                                max_decode_len=3, temperature=-1.0)
