"""What the ahead-of-time tests of every method share (tests/test_aot_*.py).

A method's Task hooks for ``jaxfid bench compile`` (jaxfid/training/task.py:
``prepare_shapes``, ``abstract_batch``, ``decode_program``) are trusted when

* ``abstract_batch`` equals what a real ``prepare`` + ``batch`` gives
  (:func:`assert_same_shapes`, every leaf's shape and dtype), and
* every phase's step and the prediction program lower (fast tier) and
  compile (slow tier) with the loop's shardings after ``prepare_shapes``
  alone (:func:`lower_phases`, :func:`lower_decode`), from a gin
  configuration whose files do not exist.
"""
from __future__ import annotations

import gin
import jax

from jaxfid.commands import gin_flags
from jaxfid.training import state as state_lib

MISSING = "/nonexistent/jaxfid-aot"   # no file is read under it


def configured(gin_file: str, bindings: list[str]):
  """(task, settings, optimizer) as ``jaxfid train`` builds them from gin."""
  gin_flags.parse_gin([gin_file], bindings)
  try:
    build = lambda name: gin.query_parameter(name).scoped_configurable_fn()
    return (build("%METHOD"), build("loop.train.settings"),
            build("loop.train.optimizer"))
  finally:
    gin.clear_config()


def assert_same_shapes(abstract, host_batch) -> None:
  """``abstract`` (ShapeDtypeStructs) is exactly the device view of a host
  batch: the same tree, and per leaf the same shape and dtype."""
  real = jax.eval_shape(lambda b: b, host_batch)
  assert jax.tree.structure(abstract) == jax.tree.structure(real)
  for (path, a), r in zip(jax.tree_util.tree_leaves_with_path(abstract),
                          jax.tree.leaves(real)):
    assert isinstance(a, jax.ShapeDtypeStruct), path
    assert (a.shape, a.dtype) == (r.shape, r.dtype), (
        jax.tree_util.keystr(path), a, r)


def loop_placement(p):
  """The loop's mesh and placement of ``p.model`` (loop.train's step 1;
  ``p`` what the task's ``prepare`` or ``prepare_shapes`` returned)."""
  s = p.settings
  mesh = state_lib.checked_mesh(s.mesh, s.batch_size, s.accumulation_steps)
  return mesh, state_lib.placement(mesh, p.model.param_axes())


def lower_phases(task, p, optimizer) -> list:
  """Each phase's step lowered as the loop jits it (its shardings, the state
  donated), from abstract shapes only; ``.compile()`` them for the
  executables (XLA:CPU compiling is what takes seconds)."""
  mesh, place = loop_placement(p)
  phases = task.phases(p, optimizer)
  abstract_params = p.model.abstract_params()
  out = []
  for i, phase in enumerate(phases):
    state = jax.eval_shape(phase.make_state, abstract_params, 0)
    shardings = place.state(state, abstract_params)
    batch = task.abstract_batch(p, i)
    with jax.set_mesh(mesh):
      out.append(jax.jit(phase.step, in_shardings=(shardings, place.batch),
                         out_shardings=(shardings, place.replicated),
                         donate_argnums=0).lower(state, batch))
  return out


def lower_decode(task, p, batch_size: int):
  """``decode_program``'s fn lowered with the parameters placed as the loop
  places them and the batch sharded over the data axes."""
  mesh, place = loop_placement(p)
  fn, batch = task.decode_program(p, batch_size)
  with jax.set_mesh(mesh):
    return jax.jit(fn, in_shardings=(place.params, place.batch),
                   out_shardings=place.replicated).lower(
                       p.model.abstract_params(), batch)
