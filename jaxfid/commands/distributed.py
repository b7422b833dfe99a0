"""Multi-process start-up for the commands that run on every host.

``--distributed`` (implied by ``JAX_COORDINATOR_ADDRESS``) calls
``jax.distributed.initialize`` before any device use, with
``--coordinator-address``, ``--num-processes`` and ``--process-id`` (else
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``) when
given, otherwise letting JAX detect the cluster. CPU processes use gloo.
"""
from __future__ import annotations

import argparse
import os

import jax

from jaxfid.core.errors import InputError
from jaxfid.runtime import peer_watch
from jaxfid.runtime.compilation_cache import apply_runtime_defaults

ENV = {"coordinator_address": "JAX_COORDINATOR_ADDRESS",
       "num_processes": "JAX_NUM_PROCESSES",
       "process_id": "JAX_PROCESS_ID"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group("multi-host")
  group.add_argument("--distributed", action="store_true",
                     help="initialise JAX's multi-process runtime first "
                          "(implied when JAX_COORDINATOR_ADDRESS is set)")
  group.add_argument("--coordinator-address", default=None,
                     help="HOST:PORT of process 0 (else "
                          "$JAX_COORDINATOR_ADDRESS; else auto-detected)")
  group.add_argument("--num-processes", type=int, default=None,
                     help="number of processes (else $JAX_NUM_PROCESSES)")
  group.add_argument("--process-id", type=int, default=None,
                     help="this process's index (else $JAX_PROCESS_ID)")


def settings(args: argparse.Namespace) -> dict | None:
  """The ``jax.distributed.initialize`` arguments, or None (one process)."""
  values = {}
  for name, env in ENV.items():
    value = getattr(args, name, None)
    if value is None and os.environ.get(env):
      value = os.environ[env]
    if value is not None and name != "coordinator_address":
      try:
        value = int(value)
      except ValueError:
        raise InputError(env, f"must be an integer, got {value!r}") from None
    if value is not None:
      values[name] = value
  if not (getattr(args, "distributed", False) or values):
    return None
  if values and len(values) != len(ENV):
    missing = [f"--{n.replace('_', '-')} (or ${ENV[n]})" for n in ENV
               if n not in values]
    raise InputError("--distributed", "a coordinator, the number of processes "
                     "and this process's id go together; missing "
                     + ", ".join(missing))
  if values:
    if values["num_processes"] < 1:
      raise InputError("--num-processes", "must be at least 1")
    if not 0 <= values["process_id"] < values["num_processes"]:
      raise InputError("--process-id", f"{values['process_id']} is not in "
                       f"[0, {values['num_processes']})")
  return values


def initialize(args: argparse.Namespace) -> None:
  """``jax.distributed.initialize`` as the flags/variables say (or nothing)."""
  values = settings(args)
  if values is None:
    return
  # CPU devices talk over gloo; GPU/TPU collectives are unaffected.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**values)
  # a process killed (or its host lost): the others stop at once, one line
  peer_watch.start(getattr(args, "command", "run"))
  # A multi-process run: the persistent compilation cache the CLI turned on
  # for one process goes off (see jaxfid.runtime.compilation_cache).
  apply_runtime_defaults()
