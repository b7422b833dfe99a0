"""`jaxfid <command>`: a thin dispatcher over the registered commands.

Each command module exposes ``add_parser(subparsers)`` and ``run(args)`` and
describes itself as a :class:`~jaxfid.commands.registry.Command`; this module
registers the shared ones (:data:`SHARED_COMMANDS`), the methods' plug-ins
their own. Errors are one line, no traceback: InputError exits 2, a storage
fault (StorageError, or a full disk or quota anywhere) 1 naming the path, a
failed peer of a multi-host run (PeerError) with that process's status.
"""
from __future__ import annotations

import argparse
import difflib
import logging
import sys

from jaxfid.commands import (bench, convert, corpus, eval_retrieval, evaluate,
                             index, registry, retrieve, train)
from jaxfid.commands.gin_flags import split_gin_bindings
from jaxfid.core.errors import InputError, PeerError
import jaxfid.methods  # noqa: F401 (registers every method's plug-ins)
from jaxfid.runtime import background_errors, peer_watch
from jaxfid.runtime.compilation_cache import apply_runtime_defaults
from jaxfid.runtime.host_memory import tune_cpu_malloc
from jaxfid.runtime.storage import storage_fault

# The commands every method shares (each method's plugin registers its own).
SHARED_COMMANDS = (convert.COMMAND, train.COMMAND, evaluate.COMMAND,
                   index.COMMAND, retrieve.COMMAND, corpus.COMMAND,
                   eval_retrieval.COMMAND, bench.COMMAND)
for _command in SHARED_COMMANDS:
  registry.register_command(_command)
# The commands whose time goes into XLA programs (train and decode steps):
# on a CPU they get jaxfid.runtime.host_memory's malloc settings.
MODEL_COMMANDS = registry.model_commands()


# The help of every command that takes gin bindings ends with this.
GIN_EPILOG = ("Every gin macro is also a flag, --gin.NAME=VALUE, checked "
              "before any work; a string value takes gin's quotes inside the "
              "shell's: --gin.MODEL_DIR=\"'runs/x'\". The macros, their "
              "defaults and checks: docs/configuration.md.")


def _subcommands(parser: argparse.ArgumentParser
                 ) -> dict[str, argparse.ArgumentParser]:
  """The parsers of ``parser``'s subcommands by name ({} for a command)."""
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      return dict(action.choices)
  return {}


def _parsers(parser: argparse.ArgumentParser):
  """``parser`` and every subcommand's parser under it."""
  yield parser
  for child in dict.fromkeys(_subcommands(parser).values()):  # aliases once
    yield from _parsers(child)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="jaxfid",
      description="Retrieval-augmented T5 in JAX: FiD (with FiDO and FiD-KD), "
      "Atlas, ReAtt, ReFusion, and the BM25 and dense retrieval they read "
      "from. `jaxfid demo` runs a small FiD experiment end to end on CPU.")
  sub = parser.add_subparsers(dest="command", required=True)
  for command in registry.commands():
    command.add_parser(sub)
  for each in _parsers(parser):
    if each.get_default("accepts_gin_bindings") and each.epilog is None:
      each.epilog = GIN_EPILOG
  return parser


def mistyped_option(parser: argparse.ArgumentParser,
                    argv: list[str]) -> str | None:
  """``jaxfid CMD: error: unrecognized argument --x (did you mean --y?)``
  for the first unknown option of ``argv`` with a close known one (a
  unique prefix is an option; gin bindings are not), else None."""
  names, words = ["jaxfid"], list(argv)
  while words and words[0] in _subcommands(parser):  # `jaxfid index bm25`
    names.append(words[0])
    parser = _subcommands(parser)[words.pop(0)]
  known = [o for action in parser._actions  # pylint: disable=protected-access
           for o in action.option_strings if o.startswith("--")]
  for word in words:
    if word == "--":
      break
    name = word.split("=", 1)[0]
    if not name.startswith("--") or "." in name or name in known:
      continue
    if parser.allow_abbrev and any(o.startswith(name) for o in known):
      continue
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if close:
      return (f"{' '.join(names)}: error: unrecognized argument {name} "
              f"(did you mean {close[0]}?)")
  return None


def main(argv=None) -> int:
  # orbax and absl log every checkpoint operation; a command says what
  # matters itself (errors stay visible).
  logging.getLogger("absl").setLevel(logging.ERROR)
  # a failed checkpoint read or write leaves orbax/tensorstore background
  # work that reports its end with tracebacks; the command says the error
  background_errors.install()
  parser = build_parser()
  typo = mistyped_option(parser, sys.argv[1:] if argv is None else argv)
  if typo is not None:
    print(typo, file=sys.stderr)
    return 2
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
