"""What a decoder hands the model at each step: the ``tokens_to_logits`` contract.

  tokens_to_logits(DecodingState(cur_index, cur_token, cache))
      -> (logits float32 [N, vocab], new_cache)

(see :mod:`jaxfid.t5.decoding` for ``N`` and the cache).
"""
from __future__ import annotations

from typing import Any, Callable

import flax
import jax

PAD_ID = 0


@flax.struct.dataclass
class DecodingState:
  """What ``tokens_to_logits`` sees at one decoding step.

  Attributes:
    cur_index: int32 scalar, the position being decoded (0 on the first step).
    cur_token: int32 [N], the token at ``cur_index`` (the start id at step 0).
    cache: the caller's pytree, as returned by the previous call.
  """
  cur_index: jax.Array
  cur_token: jax.Array
  cache: Any


TokensToLogits = Callable[[DecodingState], tuple[jax.Array, Any]]


def check_max_decode_len(max_decode_len: int) -> None:
  """ValueError unless at least one token may be generated."""
  if max_decode_len < 1:
    raise ValueError(f"max_decode_len must be >= 1, got {max_decode_len}")
