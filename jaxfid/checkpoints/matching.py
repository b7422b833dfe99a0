"""Whether a checkpoint loaded to initialise a run holds the run's model.

A run that starts from ``INIT_CHECKPOINT`` loads its parameters into the
run's own architecture: a checkpoint of another shape (layers, widths,
vocabulary, activation) is refused before any work, with one line naming
every field that differs.
"""
from __future__ import annotations

from jaxfid.core.errors import InputError


def check_init_config(path: str, run_config, other_config, *, fields=None,
                      hint: str = "list the matching gin/models file") -> None:
  """INIT_CHECKPOINT's model must be the run's: one line naming what differs.

  ``fields``: only these T5Config fields count (e.g. a dual encoder's
  encoder fields); run-only fields (dropout, dtype, remat) never do.
  """
  diff = run_config.architecture_differences(other_config)
  if fields is not None:
    diff = [n for n in diff if n in fields]
  if diff:
    values = ", ".join(f"{n} (checkpoint {getattr(other_config, n)}, run "
                       f"{getattr(run_config, n)})" for n in diff)
    raise InputError(path, f"INIT_CHECKPOINT's model differs from the run's "
                     f"in {values}; {hint}")
