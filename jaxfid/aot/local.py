"""``--topology cpu-<n>``: n of this host's CPU devices.

What ``jaxfid bench compile --save-executable`` compiles for to run here
(a test, or a CPU run that should start without compiling): the devices
are this process's own (``--xla_force_host_platform_device_count`` gives
more than one). The report's memory is the host's; a CPU has no public
peak, so the roofline is None.
"""
from __future__ import annotations

import dataclasses
import os
import re

import jax

from jaxfid.core.errors import InputError

FORM = "cpu-<n> (n of this host's CPU devices)"


@dataclasses.dataclass(frozen=True)
class HostCpu:
  """The figures the report reads: the host's memory, no peaks."""
  name: str = "cpu"
  hbm_bytes: int = 0
  peak_bf16_flops: float | None = None
  hbm_bytes_per_s: float | None = None


@dataclasses.dataclass(frozen=True)
class CpuTopology:
  name: str
  chip: HostCpu
  count: int
  num_slices: int = 1

  @property
  def chips(self) -> int:
    return self.count


def _host_memory() -> int:
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return 0


def parse(name: str, slices: int = 1) -> CpuTopology | None:
  """``cpu-<n>``'s topology; None for another name."""
  match = re.fullmatch(r"cpu-(\d+)", name.strip().lower())
  if not match:
    return None
  if slices != 1:
    raise InputError("--slices", f"{name} is this host's CPU: one slice")
  return CpuTopology(name, HostCpu(hbm_bytes=_host_memory()),
                     int(match.group(1)))


def devices(topology: CpuTopology) -> list:
  """The first ``count`` CPU devices of this process."""
  found = jax.devices("cpu")
  if not 1 <= topology.count <= len(found):
    raise InputError("--topology", f"{topology.name}: this host has "
                     f"{len(found)} CPU device(s)")
  return found[:topology.count]
