"""Whether a checkpoint loaded to initialise a run holds the run's model: one
of another shape is refused before any work, naming each differing field.
"""
from __future__ import annotations

from jaxfid.core.errors import InputError


def check_init_config(path: str, run_config, other_config, *, fields=None,
                      hint: str = "list the matching gin/models file") -> None:
  """INIT_CHECKPOINT's model must be the run's: one line naming what
  differs among ``fields`` (default all; run-only fields never count)."""
  diff = run_config.architecture_differences(other_config)
  if fields is not None:
    diff = [n for n in diff if n in fields]
  if diff:
    values = ", ".join(f"{n} (checkpoint {getattr(other_config, n)}, run "
                       f"{getattr(run_config, n)})" for n in diff)
    raise InputError(path, f"INIT_CHECKPOINT's model differs from the run's "
                     f"in {values}; {hint}")
