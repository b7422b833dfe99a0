"""`jaxfid <command>`: a thin dispatcher.

Each command lives in its own module, which exposes ``add_parser(subparsers)``
(registering its arguments and ``set_defaults(func=run)``) and a ``run(args)``
that calls library code, and describes itself as a
:class:`~jaxfid.commands.registry.Command` (``COMMAND``). This module
registers the shared commands (:data:`SHARED_COMMANDS`); each method's
plug-in module registers the method's own (:mod:`jaxfid.methods` imports
them all). The parser lists the registered commands in their
:attr:`~jaxfid.commands.registry.Command.order` (see
:mod:`jaxfid.commands.registry`). The CLI holds no logic a test cannot call
directly. Which JAX platforms start is settled before this module runs, by
importing ``jaxfid`` (:mod:`jaxfid.core.platforms`: a host without a TPU is
not probed for one, even where libtpu is installed).
Bad input raises :class:`jaxfid.core.errors.InputError`; it is printed as one
line and the process exits with status 2, with no traceback. A storage fault
(:class:`jaxfid.core.errors.StorageError`, or any error caused by a full
disk or quota, wherever it is raised) is printed as one line naming the path
and the cause, exit status 1. When another process of a multi-host run
fails (:class:`jaxfid.core.errors.PeerError`), one line says which, with
that process's exit status.
"""
from __future__ import annotations

import argparse
import logging
import sys

import jaxfid.methods  # noqa: F401 (registers every method's plug-ins)
from jaxfid.commands import (bench, convert, corpus, eval_retrieval, evaluate,
                             index, registry, retrieve, train)
from jaxfid.commands.gin_flags import split_gin_bindings
from jaxfid.core import background_errors, peer_watch
from jaxfid.core.errors import InputError, PeerError
from jaxfid.core.host_memory import tune_cpu_malloc
from jaxfid.core.runtime import apply_runtime_defaults
from jaxfid.core.storage import storage_fault

# The commands every method shares (each method's plugin registers its own).
SHARED_COMMANDS = (convert.COMMAND, train.COMMAND, evaluate.COMMAND,
                   index.COMMAND, retrieve.COMMAND, corpus.COMMAND,
                   eval_retrieval.COMMAND, bench.COMMAND)
for _command in SHARED_COMMANDS:
  registry.register_command(_command)
# The commands whose time goes into XLA programs (train and decode steps):
# on a CPU they get jaxfid.core.host_memory's malloc settings.
MODEL_COMMANDS = registry.model_commands()


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="jaxfid",
      description="Retrieval-augmented T5 (FiD, ReAtt, ReFusion) in JAX.")
  sub = parser.add_subparsers(dest="command", required=True)
  for command in registry.commands():
    command.add_parser(sub)
  return parser


def main(argv=None) -> int:
  # orbax and absl log every checkpoint operation; a command says what
  # matters itself (errors stay visible).
  logging.getLogger("absl").setLevel(logging.ERROR)
  # a failed checkpoint read or write leaves orbax/tensorstore background
  # work that reports its end with tracebacks; the command says the error
  background_errors.install()
  parser = build_parser()
  args, unknown = parser.parse_known_args(argv)
  if getattr(args, "accepts_gin_bindings", False):
    args.gin_bindings, unknown = split_gin_bindings(unknown)
  for prefix in getattr(args, "gin_binding_prefixes", ()):
    bindings, unknown = split_gin_bindings(unknown, prefix)
    setattr(args, f"{prefix}_bindings", bindings)
  if unknown:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  apply_runtime_defaults()  # the persistent compilation cache (single process)
  if args.command in MODEL_COMMANDS:
    tune_cpu_malloc()  # no mmap/munmap of each step's buffers (CPU only)
  try:
    result = args.func(args)
  except InputError as e:
    print(f"jaxfid {args.command}: error: {e.message}", file=sys.stderr)
    return 2
  except PeerError as e:  # another process of a multi-host run failed
    print(f"jaxfid {args.command}: error: {e.message}", file=sys.stderr)
    return e.code
  except FloatingPointError as e:  # training.loop.NonFiniteLoss (ON_NAN='stop')
    print(f"jaxfid {args.command}: error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(f"jaxfid {args.command}: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # pylint: disable=broad-except
    fault = storage_fault(e)
    if fault is None:
      lost = peer_watch.lost_peer(e)  # a killed process of a multi-host run
      if lost is None:
        raise
      peer_watch.stop(args.command, lost)  # one line, then SIGABRT
    print(f"jaxfid {args.command}: error: {fault.message}", file=sys.stderr)
    return 1
  return int(result or 0)


if __name__ == "__main__":
  sys.exit(main())
