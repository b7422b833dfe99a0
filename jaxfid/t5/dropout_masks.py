"""Dropout masks: a counter-based hash of each element's linear index.

One definition serves the reference attention and the layers
(``jaxfid.t5.layers`` re-exports these) and the fused attention kernel
(``jaxfid.t5.fused_attention``), which computes the same hash inside the
kernel from the constants here, so both drop exactly the same elements.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
# The hash: z = fmix32(fmix32(index * GOLDEN + seed0) ^ seed1), kept where
# z >= round(rate * 2**32) (unsigned); fmix32 is MurmurHash3's finaliser.
GOLDEN = 0x9E3779B9
FMIX_1 = 0x85EBCA6B
FMIX_2 = 0xC2B2AE35


def _fmix32(z: Array) -> Array:
  """MurmurHash3's 32-bit finaliser: a bijection that mixes every input bit."""
  z = (z ^ (z >> 16)) * jnp.uint32(FMIX_1)
  z = (z ^ (z >> 13)) * jnp.uint32(FMIX_2)
  return z ^ (z >> 16)


def seeds(rng: Array) -> Array:
  """The two uint32 words of the hash, drawn from ``rng``."""
  return jax.random.bits(rng, (2,), jnp.uint32)


def threshold(rate: float) -> int:
  """The unsigned 32-bit threshold below which an element is dropped."""
  return min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)


def dropout_keep(shape: tuple[int, ...], rate: float, rng: Array) -> Array:
  """bool ``shape``: True where an element is kept (probability ``1 - rate``).

  The mask is a counter-based hash of each element's linear index under two
  32-bit words drawn from ``rng`` (two rounds of MurmurHash3's finaliser),
  compared with ``rate * 2**32``. It is deterministic in ``rng`` like
  ``jax.random.bernoulli``, but a few integer operations per element instead
  of threefry's twenty rounds: on CPU, threefry masks cost about as much as
  the T5 MLP's matmuls they drop out of. Dropout needs independence, not
  cryptographic strength.
  """
  seed = seeds(rng)
  index = jnp.zeros(shape, jnp.uint32)
  for d, size in enumerate(shape):  # row-major linear index, mod 2**32
    index = index * jnp.uint32(size) + jax.lax.broadcasted_iota(
        jnp.uint32, shape, d)
  z = _fmix32(index * jnp.uint32(GOLDEN) + seed[0])
  z = _fmix32(z ^ seed[1])
  return z >= jnp.uint32(threshold(rate))


def dropout(x: Array, rate: float, rng: Array | None) -> Array:
  """Inverted dropout; ``rng=None`` means deterministic (no dropout)."""
  if rng is None or rate == 0.0:
    return x
  keep = dropout_keep(x.shape, rate, rng)
  return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)
