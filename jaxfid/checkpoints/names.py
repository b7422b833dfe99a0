"""The one rename table between jaxfid's parameter names and HF T5's.

jaxfid names are T5X's (``encoder/layers_0/attention/query/kernel``; T5X
stores them under ``target/``); HF's are
``encoder.block.0.layer.0.SelfAttention.q.weight`` with kernels and the
relative position table transposed. The table is written once in
:data:`ENCODER_LAYER`, :data:`DECODER_LAYER` and :data:`GLOBALS`; the rest
derives from it. :func:`fid_wrapper_to_hf` undoes the original FiD encoder
wrapper's names (``encoder.encoder.block.{i}[.module]...``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from jaxfid.checkpoints.configs import as_fields, is_gated


@dataclasses.dataclass(frozen=True)
class Rename:
  """One parameter: jaxfid path, HF name, whether HF stores it [out, in]."""
  path: str
  hf: str
  transpose: bool

  def to_hf(self, array):
    return array.T if self.transpose else array

  def from_hf(self, array):
    return array.T if self.transpose else array


_ATTENTION = (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
_MLP = ("wi", "wi_0", "wi_1", "wo")


def _attention(jax_name: str, hf_layer: str) -> list[tuple[str, str, bool]]:
  return [(f"{jax_name}/{jax}/kernel", f"{hf_layer}.{hf}.weight", True)
          for jax, hf in _ATTENTION]


def _mlp(hf_layer: str) -> list[tuple[str, str, bool]]:
  return [(f"mlp/{name}/kernel", f"{hf_layer}.DenseReluDense.{name}.weight",
           True) for name in _MLP]


# (jaxfid suffix under {stack}/layers_{i}/, HF suffix under {stack}.block.{i}.,
#  transpose). MLP rows cover both the gated (wi_0, wi_1) and plain (wi) forms.
ENCODER_LAYER: tuple[tuple[str, str, bool], ...] = tuple(
    [("pre_attention_layer_norm/scale", "layer.0.layer_norm.weight", False)]
    + _attention("attention", "layer.0.SelfAttention")
    + [("pre_mlp_layer_norm/scale", "layer.1.layer_norm.weight", False)]
    + _mlp("layer.1"))

DECODER_LAYER: tuple[tuple[str, str, bool], ...] = tuple(
    [("pre_self_attention_layer_norm/scale", "layer.0.layer_norm.weight",
      False)]
    + _attention("self_attention", "layer.0.SelfAttention")
    + [("pre_cross_attention_layer_norm/scale", "layer.1.layer_norm.weight",
        False)]
    + _attention("encoder_decoder_attention", "layer.1.EncDecAttention")
    + [("pre_mlp_layer_norm/scale", "layer.2.layer_norm.weight", False)]
    + _mlp("layer.2"))

_RELPOS = "layer.0.SelfAttention.relative_attention_bias.weight"
GLOBALS: tuple[tuple[str, str, bool], ...] = (
    ("token_embedder/embedding", "shared.weight", False),
    ("encoder/relpos_bias/rel_embedding", f"encoder.block.0.{_RELPOS}", True),
    ("encoder/encoder_norm/scale", "encoder.final_layer_norm.weight", False),
    ("decoder/relpos_bias/rel_embedding", f"decoder.block.0.{_RELPOS}", True),
    ("decoder/decoder_norm/scale", "decoder.final_layer_norm.weight", False),
    ("decoder/logits_dense/kernel", "lm_head.weight", True),
)

# HF tensors that carry no jaxfid parameter: copies of shared.weight, and the
# cross-attention position table transformers < 4 created (and used) in the
# first decoder block; transformers >= 4 and jaxfid drop it.
HF_EMBEDDING_COPIES = ("encoder.embed_tokens.weight",
                       "decoder.embed_tokens.weight")
HF_IGNORED = (
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)

_STACK_TABLES = {"encoder": ENCODER_LAYER, "decoder": DECODER_LAYER}
_PATH_RE = re.compile(r"^(encoder|decoder)/layers_(\d+)/(.+)$")
_HF_RE = re.compile(r"^(encoder|decoder)\.block\.(\d+)\.(.+)$")
_FID_RE = re.compile(r"^encoder\.encoder\.(block\.\d+\.)(module\.)?(.+)$")


def _mlp_wanted(jax_suffix: str, gated: bool) -> bool:
  if not jax_suffix.startswith("mlp/wi"):
    return True
  return jax_suffix.startswith("mlp/wi_") == gated


def renames(config: Any) -> list[Rename]:
  """Every parameter of a config, in a fixed order (embedding first)."""
  f = as_fields(config)
  gated = is_gated(f["feed_forward_proj"])
  out = [Rename(*GLOBALS[0]), Rename(*GLOBALS[1])]
  for stack, count in (("encoder", f["num_layers"]),
                       ("decoder", f["num_decoder_layers"])):
    if stack == "decoder":
      out.append(Rename(*GLOBALS[3]))
    for i in range(count):
      for jax, hf, transpose in _STACK_TABLES[stack]:
        if _mlp_wanted(jax, gated):
          out.append(Rename(f"{stack}/layers_{i}/{jax}",
                            f"{stack}.block.{i}.{hf}", transpose))
    out.append(Rename(*(GLOBALS[2] if stack == "encoder" else GLOBALS[4])))
  if not f["tie_word_embeddings"]:
    out.append(Rename(*GLOBALS[5]))
  return out


def param_shapes(config: Any) -> dict[str, tuple[int, ...]]:
  """jaxfid path -> shape, for every parameter of a config."""
  f = as_fields(config)
  d, inner, d_ff = f["d_model"], f["num_heads"] * f["d_kv"], f["d_ff"]
  relpos = (f["num_heads"], f["relative_attention_num_buckets"])
  shapes = {}
  for rename in renames(f):
    path = rename.path
    if path == "token_embedder/embedding":
      shape = (f["vocab_size"], d)
    elif path == "decoder/logits_dense/kernel":
      shape = (d, f["vocab_size"])
    elif path.endswith("rel_embedding"):
      shape = relpos
    elif path.endswith("/scale"):
      shape = (d,)
    elif path.endswith("/out/kernel"):
      shape = (inner, d)
    elif path.endswith(("/query/kernel", "/key/kernel", "/value/kernel")):
      shape = (d, inner)
    elif path.endswith("/wo/kernel"):
      shape = (d_ff, d)
    else:  # mlp/wi, wi_0, wi_1
      shape = (d, d_ff)
    shapes[path] = shape
  return shapes


def count_parameters(fields: Any) -> int:
  """Number of parameters of a config (jaxfid layout)."""
  total = 0
  for shape in param_shapes(fields).values():
    size = 1
    for dim in shape:
      size *= dim
    total += size
  return total


def describe(config: Any) -> str:
  """One line: sizes, activation and tying, e.g. for the convert summary."""
  f = as_fields(config)
  tie = "tied" if f["tie_word_embeddings"] else "untied"
  return (f"{f['num_layers']}+{f['num_decoder_layers']} layers, d_model "
          f"{f['d_model']}, {f['num_heads']}x{f['d_kv']} heads, d_ff "
          f"{f['d_ff']}, {f['feed_forward_proj']}, {tie} embeddings, vocab "
          f"{f['vocab_size']}, {count_parameters(f):,} parameters")


def hf_shape(rename: Rename, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The shape HF stores a parameter of jaxfid shape ``shape`` in."""
  return tuple(reversed(shape)) if rename.transpose else tuple(shape)


def to_hf(path: str) -> Rename:
  """The rename of one jaxfid path. Raises KeyError for unknown paths."""
  for row in GLOBALS:
    if row[0] == path:
      return Rename(*row)
  m = _PATH_RE.match(path)
  if m:
    stack, index, suffix = m.groups()
    for jax, hf, transpose in _STACK_TABLES[stack]:
      if jax == suffix:
        return Rename(path, f"{stack}.block.{index}.{hf}", transpose)
  raise KeyError(f"no HF name for jaxfid parameter {path!r}")


def from_hf(name: str) -> Rename | None:
  """The rename of one HF tensor name, or None if it is no jaxfid parameter."""
  for row in GLOBALS:
    if row[1] == name:
      return Rename(*row)
  m = _HF_RE.match(name)
  if m:
    stack, index, suffix = m.groups()
    for jax, hf, transpose in _STACK_TABLES[stack]:
      if hf == suffix:
        return Rename(f"{stack}/layers_{index}/{jax}", name, transpose)
  return None


def fid_wrapper_to_hf(name: str) -> str:
  """HF name of a tensor of the original FiD layout (others pass unchanged).

  ``encoder.encoder.block.3.module.layer.0...`` and ``encoder.encoder.block.3
  .layer.0...`` -> ``encoder.block.3.layer.0...``; ``encoder.encoder.X`` ->
  ``encoder.X``.
  """
  m = _FID_RE.match(name)
  if m:
    return "encoder." + m.group(1) + m.group(3)
  if name.startswith("encoder.encoder."):
    return name[len("encoder."):]
  return name


def hf_to_fid_wrapper(name: str, use_checkpoint: bool = False) -> str:
  """The original FiD name of a HF tensor (inverse of fid_wrapper_to_hf)."""
  if not name.startswith("encoder."):
    return name
  m = re.match(r"^encoder\.(block\.\d+\.)(.+)$", name)
  if m and use_checkpoint:
    return f"encoder.encoder.{m.group(1)}module.{m.group(2)}"
  return "encoder." + name


def t5x_name(path: str) -> str:
  """The TensorStore directory name T5X gives a jaxfid parameter."""
  return "target." + path.replace("/", ".")


def unflatten(flat: Mapping[str, Any]) -> dict:
  """{'a/b/c': x} -> {'a': {'b': {'c': x}}} (jaxfid parameter paths)."""
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
  """The inverse of :func:`unflatten`."""
  out = {}
  for key, value in tree.items():
    path = f"{prefix}/{key}" if prefix else str(key)
    if isinstance(value, Mapping):
      out.update(flatten(value, path))
    else:
      out[path] = value
  return out
