"""T5X checkpoints <-> jaxfid parameters.

A T5X ``checkpoint_<step>/`` holds a msgpack ``checkpoint`` of
``{'version': 3, 'optimizer': {'target': params, 'state': ...}}``, its
arrays inline or as TensorStore zarr specs; only ``target`` is read. Also
read: orbax-written T5X checkpoints and orbax aggregate files with
``PLACEHOLDER://`` leaves. 3-D attention kernels are reshaped to 2-D;
scanned layers are refused. The configuration comes from the shapes and,
when present, ``config.gin``. :func:`write_t5x` writes the same layouts and a
``config.gin``.
"""
from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from flax import serialization

from jaxfid.checkpoints import names
from jaxfid.checkpoints.configs import config_from_params, t5x_activations
from jaxfid.checkpoints.hf import check_params
from jaxfid.core.errors import InputError
from jaxfid.runtime.files import atomic_directory, check_destination, write_atomic

CHECKPOINT_FILE = "checkpoint"
_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
_PLACEHOLDER = "PLACEHOLDER://"
# Target chunk size of T5X's TensorStore arrays (64 MiB).
_CHUNK_BYTES = 64 * 1024 * 1024


# --------------------------------------------------------------------------
# locating a checkpoint


def _is_orbax_pytree(directory: Path) -> bool:
  return ((directory / "_METADATA").is_file()
          or (directory / "manifest.ocdbt").is_file())


def step_dirs(model_dir) -> list[tuple[int, Path]]:
  """``(step, path)`` of the finished ``checkpoint_<step>`` dirs, ascending."""
  out = []
  model_dir = Path(model_dir)
  if model_dir.is_dir():
    for child in model_dir.iterdir():
      m = _STEP_DIR.match(child.name)
      if m and child.is_dir():
        out.append((int(m.group(1)), child))
  return sorted(out)


def locate(path) -> tuple[Path, str]:
  """The checkpoint directory to read and its kind ('msgpack' or 'orbax').

  ``path`` as :func:`read_t5x` takes it.
  """
  path = Path(path)
  if not path.exists():
    raise InputError(path, "does not exist")
  if path.is_file():
    if path.name != CHECKPOINT_FILE:
      raise InputError(path, "not a T5X checkpoint (expected a "
                       "checkpoint_<step> directory or its 'checkpoint' file)")
    path = path.parent
  if _is_orbax_pytree(path):
    return path, "orbax"
  if (path / CHECKPOINT_FILE).is_file():
    return path, "msgpack"
  steps = step_dirs(path)
  if steps:
    return locate(steps[-1][1])
  items = sorted(d for d in path.iterdir() if d.is_dir() and
                 _is_orbax_pytree(d))
  for preferred in ("state", "default", "params", "target"):
    if path / preferred in items:
      return path / preferred, "orbax"
  if len(items) == 1:
    return items[0], "orbax"
  if items:
    raise InputError(path, "several orbax items ("
                     + ", ".join(d.name for d in items)
                     + "); pass the one holding the parameters")
  raise InputError(path, "not a T5X checkpoint: no 'checkpoint' file, orbax "
                   "metadata or checkpoint_<step> directories")


# --------------------------------------------------------------------------
# reading


def _is_ts_spec(leaf: Any) -> bool:
  return isinstance(leaf, Mapping) and "driver" in leaf and "kvstore" in leaf


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping) and not _is_ts_spec(value):
      out.update(_flatten(value, name + "/"))
    else:
      out[name] = value
  return out


def find_params(tree: Any) -> Mapping | None:
  """The subtree holding ``token_embedder`` (breadth first, 'target' first)."""
  queue = [tree]
  while queue:
    node = queue.pop(0)
    if not isinstance(node, Mapping) or _is_ts_spec(node):
      continue
    if "token_embedder" in node:
      return node
    keys = sorted(node, key=lambda k: (k not in ("target", "params"), str(k)))
    queue.extend(node[k] for k in keys)
  return None


def _open_zarr(spec: dict, where: Path, name: str) -> np.ndarray:
  if not (where / ".zarray").is_file():
    raise InputError(where, f"missing TensorStore array for parameter {name}")
  try:
    return np.asarray(ts.open(spec, open=True).result().read().result())
  except Exception as e:  # pylint: disable=broad-except
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise InputError(where, f"cannot read parameter {name}: "
                     f"{message}") from None


def _read_ts_spec(ckpt_dir: Path, spec: Mapping, name: str) -> np.ndarray:
  """Reads one TensorStore-backed array (T5X's relative spec)."""
  spec = copy.deepcopy(dict(spec))
  kvstore = spec.get("kvstore")
  kvstore = dict(kvstore) if isinstance(kvstore, Mapping) else {}
  rel = kvstore.get("path") or spec.pop("path", None)
  if not isinstance(rel, str) or not rel:
    raise InputError(ckpt_dir / CHECKPOINT_FILE,
                     f"parameter {name}: TensorStore spec without a path")
  where = Path(rel) if os.path.isabs(rel) else ckpt_dir / rel
  # gcs/gfile checkpoints copied to local disk read from the file driver.
  spec["kvstore"] = {"driver": "file", "path": str(where)}
  metadata = dict(spec.get("metadata") or {})
  metadata.pop("chunks", None)
  metadata.pop("compressor", None)
  spec["metadata"] = metadata
  return _open_zarr(spec, where, name)


def _read_msgpack(ckpt_dir: Path) -> tuple[dict[str, np.ndarray], Path]:
  file = ckpt_dir / CHECKPOINT_FILE
  raw = file.read_bytes()
  if raw.startswith(b"model_checkpoint_path"):
    raise InputError(file, "a TensorFlow checkpoint index, not a T5X "
                     "checkpoint (convert Mesh TF checkpoints with t5x first)")
  try:
    contents = serialization.msgpack_restore(raw)
  except Exception as e:  # pylint: disable=broad-except
    raise InputError(file, f"not a T5X msgpack checkpoint "
                     f"({type(e).__name__})") from None
  if not isinstance(contents, Mapping):
    raise InputError(file, "not a T5X msgpack checkpoint (no state dict)")
  optimizer = contents.get("optimizer", contents)
  target = optimizer.get("target") if isinstance(optimizer, Mapping) else None
  params = find_params(target if target is not None else contents)
  if params is None:
    raise InputError(file, "no model parameters ('optimizer/target' with "
                     "token_embedder) in the checkpoint")
  flat = {}
  for name, leaf in _flatten(params).items():
    if _is_ts_spec(leaf):
      flat[name] = _read_ts_spec(ckpt_dir, leaf, name)
    elif isinstance(leaf, str) and leaf.startswith(_PLACEHOLDER):
      where = ckpt_dir / leaf[len(_PLACEHOLDER):]
      spec = {"driver": "zarr", "kvstore": {"driver": "file",
                                            "path": str(where)}}
      flat[name] = _open_zarr(spec, where, name)
    elif isinstance(leaf, (np.ndarray, np.generic, int, float)):
      flat[name] = np.asarray(leaf)
    else:
      raise InputError(file, f"parameter {name}: unexpected entry of type "
                       f"{type(leaf).__name__}")
  return flat, file


def _numpy_restore_args(checkpointer, path: str):
  """Orbax restore args reading every array as host numpy (needs no mesh)."""
  metadata = checkpointer.metadata(path)
  item = getattr(metadata, "item_metadata", metadata)
  tree = getattr(item, "tree", item)

  def one(leaf):
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
      return ocp.RestoreArgs(restore_type=np.ndarray)
    return ocp.RestoreArgs()

  return jax.tree_util.tree_map(one, tree)


def _read_orbax(ckpt_dir: Path) -> tuple[dict[str, np.ndarray], Path]:
  path = str(ckpt_dir.resolve())
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    restore_args = _numpy_restore_args(checkpointer, path)
    tree = checkpointer.restore(
        path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
  except Exception as e:  # pylint: disable=broad-except
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise InputError(ckpt_dir, f"orbax could not restore the checkpoint: "
                     f"{message}") from None
  params = find_params(tree)
  if params is None:
    raise InputError(ckpt_dir, "no model parameters (a subtree with "
                     "token_embedder) in the orbax checkpoint")
  return {n: np.asarray(v) for n, v in _flatten(params).items()}, ckpt_dir


def _gin_settings(ckpt_dir: Path) -> tuple[tuple[str, ...] | None,
                                           float | None]:
  """``mlp_activations`` and dropout rate from a ``config.gin`` nearby."""
  directories = [ckpt_dir, ckpt_dir.parent]
  if _STEP_DIR.match(ckpt_dir.parent.name):  # an orbax item directory
    directories.append(ckpt_dir.parent.parent)
  for directory in directories:
    gin = directory / "config.gin"
    if gin.is_file():
      text = gin.read_text(encoding="utf-8", errors="replace")
      activations = None
      m = re.search(r"^\s*[\w.]*mlp_activations\s*=\s*[\(\[]([^\)\]]*)"
                    r"[\)\]]", text, re.M | re.I)
      if m:
        activations = tuple(re.findall(r"['\"]([^'\"]+)['\"]", m.group(1)))
      dropout = None
      m = (re.search(r"^\s*[\w.]*T5Config\.dropout_rate\s*=\s*([0-9.eE+-]+)"
                     r"\s*$", text, re.M)
           or re.search(r"^\s*DROPOUT_RATE\s*=\s*([0-9.eE+-]+)\s*$", text,
                        re.M))
      if m:
        try:
          dropout = float(m.group(1))
        except ValueError:
          raise InputError(gin, f"bad dropout rate {m.group(1)!r}") from None
      return activations, dropout
  return None, None


def _is_3d_attention_kernel(name: str, got: tuple, want: tuple) -> bool:
  """[D, H, E] for a [D, H*E] query/key/value, [H, E, D] for [H*E, D] out."""
  if len(got) != 3 or "attention/" not in name or not name.endswith(
      "/kernel"):
    return False
  if name.endswith("/out/kernel"):
    return got[0] * got[1] == want[0] and got[2] == want[1]
  return got[0] == want[0] and got[1] * got[2] == want[1]


def _to_jaxfid_shapes(flat: dict, shapes: Mapping, file: Path) -> dict:
  """Validates names and shapes; reshapes 3-D attention kernels to 2-D."""
  for name in flat:
    if name not in shapes:
      raise InputError(file, f"unexpected parameter target/{name}")
  out = {}
  for name, shape in shapes.items():
    if name not in flat:
      raise InputError(file, f"missing parameter target/{name}")
    array = flat[name]
    if tuple(array.shape) != shape:
      if not _is_3d_attention_kernel(name, tuple(array.shape), shape):
        raise InputError(file, f"parameter target/{name} has shape "
                         f"{list(array.shape)}, expected {list(shape)}")
      array = array.reshape(shape)
    out[name] = np.ascontiguousarray(np.asarray(array, dtype=np.float32))
  return out


def read_t5x(path) -> tuple[dict, dict[str, np.ndarray]]:
  """``(fields, flat_params)`` of a T5X checkpoint (msgpack + TensorStore or
  orbax): a ``checkpoint_<step>`` directory or its ``checkpoint`` file, or
  a model directory (its latest step)."""
  ckpt_dir, kind = locate(path)
  flat, file = (_read_orbax(ckpt_dir) if kind == "orbax"
                else _read_msgpack(ckpt_dir))
  activations, dropout = _gin_settings(ckpt_dir)
  fields = config_from_params(flat, file, activations=activations,
                              dropout_rate=dropout)
  return fields, _to_jaxfid_shapes(flat, names.param_shapes(fields), file)


# --------------------------------------------------------------------------
# writing


def _chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
  """A chunk shape dividing ``shape`` with at most 64 MiB per chunk."""
  chunks = list(shape)
  limit = max(1, _CHUNK_BYTES // itemsize)
  while int(np.prod(chunks, dtype=np.int64)) > limit:
    axis = int(np.argmax(chunks))
    size = chunks[axis]
    chunks[axis] = next(d for d in range(size // 2, 0, -1)
                        if shape[axis] % d == 0 and d < size)
  return chunks


def _gin_text(fields: Mapping) -> str:
  acts = t5x_activations(fields["feed_forward_proj"])
  acts = ", ".join(repr(a) for a in acts) + ("," if len(acts) == 1 else "")
  lines = [
      "# Written by jaxfid.checkpoints.t5x.write_t5x; read back by read_t5x.",
      f"network.T5Config.vocab_size = {fields['vocab_size']}",
      f"network.T5Config.emb_dim = {fields['d_model']}",
      f"network.T5Config.num_heads = {fields['num_heads']}",
      f"network.T5Config.num_encoder_layers = {fields['num_layers']}",
      f"network.T5Config.num_decoder_layers = {fields['num_decoder_layers']}",
      f"network.T5Config.head_dim = {fields['d_kv']}",
      f"network.T5Config.mlp_dim = {fields['d_ff']}",
      f"network.T5Config.mlp_activations = ({acts})",
      f"network.T5Config.dropout_rate = {fields['dropout_rate']}",
      "network.T5Config.logits_via_embedding = "
      f"{bool(fields['tie_word_embeddings'])}",
  ]
  return "\n".join(lines) + "\n"


def write_t5x(model_dir, config: Any, flat: Mapping[str, Any], *,
              step: int = 0, overwrite: bool = False, use_orbax: bool = False,
              inline_max_elements: int = 0) -> Path:
  """Writes ``model_dir/checkpoint_<step>/`` in T5X's layout (``use_orbax``:
  an orbax PyTree; ``inline_max_elements``: msgpack arrays inline up to that
  size) and config.gin; returns the ``checkpoint_<step>`` directory."""
  fields = check_params(config, flat)
  model_dir = Path(model_dir)
  model_dir.mkdir(parents=True, exist_ok=True)
  final = model_dir / f"checkpoint_{int(step)}"
  check_destination(final, overwrite)
  params = {p: np.ascontiguousarray(np.asarray(a, dtype=np.float32))
            for p, a in flat.items()}
  state = {"step": np.asarray(step, dtype=np.int32)}
  if use_orbax:
    ocp.PyTreeCheckpointer().save(str(final.resolve()), {
        "target": names.unflatten(params), "state": state}, force=overwrite)
  else:
    with atomic_directory(final, overwrite) as tmp:
      leaves = {}
      for path, array in params.items():
        if array.size <= inline_max_elements:
          leaves[path] = array
          continue
        spec = {"driver": "zarr", "dtype": "float32",
                "kvstore": {"driver": "file", "path": names.t5x_name(path)},
                "metadata": {"compressor": {"id": "gzip"},
                             "shape": list(array.shape),
                             "chunks": _chunk_shape(array.shape, 4)}}
        absolute = copy.deepcopy(spec)
        absolute["kvstore"]["path"] = str(tmp / names.t5x_name(path))
        store = ts.open(absolute, create=True, open=True).result()
        store.write(array).result()
        leaves[path] = ts.Spec(spec).to_json()
      state["param_states"] = {}
      contents = {"version": 3, "optimizer": {"target": names.unflatten(leaves),
                                              "state": state}}
      (tmp / CHECKPOINT_FILE).write_bytes(
          serialization.msgpack_serialize(contents))
  write_atomic(model_dir / "config.gin", _gin_text(fields))
  return final
