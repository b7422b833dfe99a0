"""What every gin-driven command reads, and what each value may be.

:data:`TABLE` has a check per parameter of the configurables that are
neither config dataclasses (their fields carry checks) nor annotated with a
jaxfid class (a gin reference); a method's evaluator adds rows from its
plug-in. :data:`COMMANDS` says what each registered command calls and reads.
:func:`check` validates a parsed run (:mod:`jaxfid.core.gin_checks`).
tests/test_gin_validation.py checks that every shipped binding has a check
that agrees with its annotation.
"""
from __future__ import annotations

from collections.abc import Mapping

from jaxfid.commands import registry, seqio_eval
from jaxfid.core.gin_checks import (REFERENCE, Check, Reads, Table, flag,
                                    integer, text, validate)
from jaxfid.core.gin_files import ParsedGin
from jaxfid.training import launch

SIZE = integer(1)
OPTIONAL_SIZE = integer(1, optional=True)
STEPS = integer(0)
PATH = text()
OPTIONAL_PATH = text(optional=True)

TABLE = Table()

# gin/training.gin
TABLE.add(launch.run, train_fn=Check(REFERENCE),
          use_hardware_rng=flag())                      # USE_HARDWARE_RNG
# gin/evaluation.gin (`jaxfid eval`)
TABLE.add(
    seqio_eval.evaluate,
    checkpoint_path=PATH,                               # CHECKPOINT_PATH
    output_dir=PATH,                                    # EVAL_OUTPUT_DIR
    mixture_or_task_name=text(),                        # MIXTURE_OR_TASK_NAME (required here)
    split=text(),                                       # EVAL_SPLIT
    batch_size=SIZE,                                    # EVAL_BATCH_SIZE
    max_examples=OPTIONAL_SIZE,                         # EVAL_MAX_EXAMPLES
    progress=flag())

# What the shared gin commands read; a method's commands register their own
# (jaxfid.commands.registry.Command.gin), and COMMANDS collects them all.
TRAIN_READS = Reads(roots=(launch.run,),
                    macros={"MIXTURE_OR_TASK_NAME": None})  # train.run: seqio tasks


def eval_reads() -> Reads:
  """``jaxfid eval``: :func:`seqio_eval.evaluate` and every registered
  method's evaluator (:data:`seqio_eval.METHODS`)."""
  evaluators = dict.fromkeys(cls for _, cls in seqio_eval.METHODS.items())
  return Reads(roots=(seqio_eval.evaluate, *evaluators))


class _RegisteredReads(Mapping[str, Reads]):
  """``{"train": Reads, "reatt iterate": Reads, ...}``: the gin reads of the
  registered commands (:func:`jaxfid.commands.registry.gin_reads`), looked
  up when asked (the methods register theirs after this module loads)."""

  def __getitem__(self, command: str) -> Reads:
    return registry.gin_reads()[command]

  def __iter__(self):
    return iter(registry.gin_reads())

  def __len__(self) -> int:
    return len(registry.gin_reads())


COMMANDS: Mapping[str, Reads] = _RegisteredReads()


def check(parsed: ParsedGin, command: str, reads: Reads) -> None:
  """Validates the parsed run for ``jaxfid <command>``, which reads
  ``reads``; raises a one-line InputError for the first problem."""
  validate(parsed, reads, TABLE, f"`jaxfid {command}`")
