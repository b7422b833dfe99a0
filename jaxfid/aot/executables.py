"""A compiled train step in a file: compile once, start a run in seconds.

``jaxfid bench compile ... --save-executable FILE`` compiles every phase's
train step for the target (a TPU slice, GPUs, or ``cpu-<n>``: this host's
CPU devices) and writes FILE: a zip of ``header.json`` and one serialized
executable per phase (``jax.experimental.serialize_executable``).
``jaxfid train --gin.COMPILED_STEP="'FILE'"`` then loads a phase's step from
it instead of compiling (:func:`load_step`, which :mod:`jaxfid.aot.plugin`
registers as the loop's ``COMPILED_STEP`` loader), after checking, in order:

* the versions: jax, jaxlib and the target platform's compiler (the CUDA
  plugin, libtpu) are those of this process;
* the target: the platform, device kind and number of devices, and the mesh
  (``MESH`` over them);
* the phase's signature: the input and output shapes, dtypes and shardings
  and the trees they form (the train state's parameters by name);
* the program: the SHA-256 of the step's StableHLO as this run lowers it,
  which any other setting the step depends on (learning rate, dropout,
  remat, ...) changes.

A mismatch, or a file that cannot be read, is one line on stderr naming
FILE and what differs, and the step compiles as usual. Loading runs
arbitrary code from FILE (pickle, as jax's deserializer does): load only
files you made.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
import time
import zipfile
from typing import Any, Callable

import jax
from jax.experimental import serialize_executable

from jaxfid.aot import programs
from jaxfid.training import loop
from jaxfid.training import state as state_lib

FORMAT = "jaxfid-compiled-step/1"
HEADER = "header.json"
# the compiler of each platform, beside jax and jaxlib
PLATFORM_PACKAGES = {"gpu": ("jax-cuda12-pjrt", "jax-cuda12-plugin"),
                     "cuda": ("jax-cuda12-pjrt", "jax-cuda12-plugin"),
                     "tpu": ("libtpu",), "cpu": ()}


def _version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def versions(platform: str) -> dict:
  """jax's, jaxlib's and the platform compiler's installed versions."""
  names = ("jax", "jaxlib", *PLATFORM_PACKAGES.get(platform, ()))
  return {name: _version(name) for name in names}


def target_of(devices: list, mesh) -> dict:
  """What an executable was compiled for: platform, device kind, count,
  mesh axis sizes."""
  return {"platform": devices[0].platform,
          "device_kind": devices[0].device_kind, "devices": len(devices),
          "mesh": {k: int(v) for k, v in mesh.shape.items()}}


def signature(lowered) -> dict:
  """A lowered step's inputs and outputs (trees; each leaf's type, with its
  sharding where the type carries it, and whether it is donated; outputs'
  shape, dtype and sharding) and its program's fingerprint (SHA-256 of its
  StableHLO text)."""
  args = jax.tree.leaves(lowered.args_info,
                         is_leaf=lambda x: hasattr(x, "shape"))
  outs = jax.tree.leaves(lowered.out_info,
                         is_leaf=lambda x: hasattr(x, "shape"))
  return {"in_tree": str(lowered.in_tree), "out_tree": str(lowered.out_tree),
          "inputs": [[str(getattr(a, "_aval", a)),
                      bool(getattr(a, "donated", False))] for a in args],
          "outputs": [[list(o.shape), str(o.dtype),
                       str(getattr(o.sharding, "spec", o.sharding))]
                      for o in outs],
          "program_sha256": hashlib.sha256(
              lowered.as_text().encode()).hexdigest()}


def compile_train_saving(task, p, optimizer, target: programs.Target,
                         path: str, model_flops: list[float] | None) -> dict:
  """:func:`~jaxfid.aot.programs.compile_train`'s report, with every phase's
  compiled step written to ``path`` (module docstring)."""
  settings = p.settings
  plan = loop.layout(task, p, optimizer, devices=target.devices)
  place, best, seconds, saved = plan.placement, None, 0.0, {}
  for i, phase in enumerate(plan.phases):
    state = state_lib.abstract_with(plan.abstract_states[i], plan.shardings[i])
    batch = programs._with_sharding(task.abstract_batch(p, i),  # pylint: disable=protected-access
                                    place.batch)
    t0 = time.perf_counter()
    with jax.set_mesh(plan.mesh):
      traced = loop.jit_step(phase, plan.shardings[i], place).trace(state,
                                                                     batch)
      lowered = traced.lower()
      compiled = lowered.compile(target.compiler_options)
    seconds += time.perf_counter() - t0
    saved[phase.name] = (signature(lowered), compiled)
    fields = programs.report(
        compiled, target=target, batch_size=settings.batch_size,
        model_flops=None if model_flops is None else model_flops[i],
        program_flops=programs.jaxpr_flops(traced.jaxpr))
    best = programs._larger({  # pylint: disable=protected-access
        **programs._header(target, plan.mesh, "train"),  # pylint: disable=protected-access
        "phase": phase.name, "batch_size": settings.batch_size, **fields},
                            best)
  best["compile_s"] = seconds
  _write(path, target_of(target.devices, plan.mesh), saved)
  best["executable"] = path
  return best


def _write(path: str, target: dict, saved: dict) -> None:
  header = {"format": FORMAT, "versions": versions(target["platform"]),
            "target": target,
            "phases": {name: sig for name, (sig, _) in saved.items()}}
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(HEADER, json.dumps(header, indent=1))
    for name, (_, compiled) in saved.items():
      data, _, _ = serialize_executable.serialize(compiled)
      z.writestr(f"{name}.bin", data)


class Mismatch(Exception):
  """Why a saved step cannot stand in for this run's (one line)."""


def _differs(what: str, saved, here) -> None:
  if saved != here:
    raise Mismatch(f"{what} differs (file: {saved}, this run: {here})")


def _check(header: dict, phase: str, lowered, mesh) -> None:
  if header.get("format") != FORMAT:
    raise Mismatch(f"not a {FORMAT} file")
  devices = list(mesh.devices.flat)
  here = target_of(devices, mesh)
  _differs("the versions", header["versions"], versions(here["platform"]))
  for key in ("platform", "device_kind", "devices", "mesh"):
    _differs(f"the target's {key}", header["target"][key], here[key])
  if phase not in header["phases"]:
    raise Mismatch(f"it holds no phase {phase!r} (it holds "
                   f"{', '.join(header['phases'])})")
  saved, mine = header["phases"][phase], signature(lowered)
  for key, what in (("in_tree", "the inputs' tree"),
                    ("out_tree", "the outputs' tree")):
    if saved[key] != mine[key]:
      raise Mismatch(f"{what} differs (the train state or batch is laid out "
                     "differently)")
  for key in ("inputs", "outputs"):
    for i, (a, b) in enumerate(zip(saved[key], mine[key])):
      _differs(f"{key[:-1]} {i}'s shape, dtype or sharding", a, b)
  if saved["program_sha256"] != mine["program_sha256"]:
    raise Mismatch("the program differs (a setting the step depends on: "
                   "learning rate, dropout, remat, shardings, ...)")


def load_step(path: str, jitted, args: tuple, phase: str) -> Callable:
  """The compiled step of ``phase`` from ``path`` if it matches what
  ``jitted`` lowers to at ``args`` (module docstring); else ``jitted``,
  after one line on stderr. Called inside the run's mesh."""
  try:
    with zipfile.ZipFile(path) as z:
      header = json.loads(z.read(HEADER))
      lowered = jitted.trace(*args).lower()
      mesh = _mesh(args)
      _check(header, phase, lowered, mesh)
      data = z.read(f"{phase}.bin")
    step = serialize_executable.deserialize_and_load(
        data, lowered.in_tree, lowered.out_tree,
        execution_devices=list(mesh.devices.flat))
  except Mismatch as e:
    return _fallback(path, str(e), jitted)
  except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
    first = (str(e).splitlines() or [""])[0]
    return _fallback(path, f"cannot be read ({type(e).__name__}: {first})",
                     jitted)
  print(f"jaxfid train: COMPILED_STEP {path}: phase {phase!r} loaded, not "
        "compiled", file=sys.stderr)
  return step


def _mesh(args: Any):
  """The mesh of the first leaf with a ``NamedSharding``."""
  for leaf in jax.tree.leaves(args):
    mesh = getattr(getattr(leaf, "sharding", None), "mesh", None)
    if mesh is not None and hasattr(mesh, "devices"):
      return mesh
  raise ValueError("no argument carries a mesh")


def _fallback(path: str, why: str, jitted):
  print(f"jaxfid train: COMPILED_STEP {path}: {why}; compiling the step",
        file=sys.stderr)
  return jitted
