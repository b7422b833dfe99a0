"""Cloud TPU slices by name, their devices without a TPU, and chip figures.

A GPU name (``h100-8``) is handed to :mod:`jaxfid.aot.gpus`, ``cpu-<n>`` (this
host's CPU devices) to :mod:`jaxfid.aot.local`.

``jaxfid bench compile --topology NAME`` compiles for a TPU slice on any
host where ``libtpu`` is installed (``pip install -e '.[tpu]'``, a CPU
laptop too): :func:`devices` asks libtpu for the slice's devices
(``jax.experimental.topologies``), which a ``Mesh`` and ``jax.jit(...)
.lower(...).compile()`` accept as if they were attached.

Names (:func:`parse`):

* Cloud TPU accelerator types, as ``gcloud`` spells them: ``v4-32`` and
  ``v5p-64`` count TensorCores (two per chip: 16 and 32 chips), ``v5e-16``
  (alias ``v5litepod-16``) and ``v6e-8`` count chips;
* a literal libtpu shape, ``v5e:4x4`` or ``v4:2x2x4`` (chips per axis);
* ``slices`` > 1: that many such slices (multi-slice, over DCN).

The per-chip figures (:data:`CHIPS`) are the public ones of the Cloud TPU
documentation's system-architecture pages (cloud.google.com/tpu/docs/v4,
/v5e, /v5p, /v6e): HBM capacity, peak bf16 FLOP/s, HBM bandwidth.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import re
import sys
import tempfile

from jax.experimental import topologies as jax_topologies

from jaxfid.aot import gpus, local
from jaxfid.core.errors import InputError

GIB = 2 ** 30
INSTALL_HINT = "pip install -e '.[tpu]' (works on a CPU host)"


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU generation's public per-chip figures (module docstring)."""
  generation: str           # 'v5e'
  libtpu_name: str          # the topology name's prefix: 'v5e'
  cores_per_chip: int       # TensorCores an accelerator-type name counts
  hbm_bytes: int
  peak_bf16_flops: float    # FLOP/s
  hbm_bytes_per_s: float
  max_host_bounds: tuple[int, int, int]  # chips a host holds (x, y, z)
  dims: int                 # axes of a slice's shape (2: v5e/v6e, 3: v4/v5p)


# Cloud TPU documentation, system architecture of each generation
# (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e):
#   v4:  32 GiB HBM2,  275 TFLOP/s bf16, 1,200 GB/s
#   v5e: 16 GiB HBM2,  197 TFLOP/s bf16,   819 GB/s
#   v5p: 95 GiB HBM2e, 459 TFLOP/s bf16, 2,765 GB/s
#   v6e: 32 GiB HBM,   918 TFLOP/s bf16, 1,638 GB/s
# The pages write the capacities as "GB"; they are GiB (the v5e compiler's
# own limit is 15.75 GiB, what it leaves of 16 GiB).
CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", "v4", 2, 32 * GIB, 275e12, 1200e9, (2, 2, 1), 3),
    "v5e": Chip("v5e", "v5e", 1, 16 * GIB, 197e12, 819e9, (2, 2, 1), 2),
    "v5p": Chip("v5p", "v5p", 2, 95 * GIB, 459e12, 2765e9, (2, 2, 1), 3),
    "v6e": Chip("v6e", "v6e", 1, 32 * GIB, 918e12, 1638e9, (2, 2, 1), 2),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A slice (or several) to compile for."""
  name: str                      # as the user gave it
  chip: Chip
  shape: tuple[int, ...]         # chips per axis of one slice
  num_slices: int = 1

  @property
  def chips(self) -> int:
    return math.prod(self.shape) * self.num_slices

  @property
  def chip_config(self) -> str:
    """libtpu's chip configuration: v4 and v5p chips compile as one device
    of two TensorCores ('megacore', what they run as), others 'default'."""
    return "megacore" if self.chip.cores_per_chip == 2 else "default"

  @property
  def libtpu_name(self) -> str:
    return f"{self.chip.libtpu_name}:{'x'.join(map(str, self.shape))}"

  @property
  def host_bounds(self) -> tuple[int, int, int]:
    """Chips per host along each axis (at most the slice's own extent)."""
    shape = (*self.shape, 1, 1)[:3]
    return tuple(min(b, s) for b, s in zip(self.chip.max_host_bounds, shape))


KNOWN_FORMS = ("accelerator types v4-N and v5p-N (N TensorCores, two per "
               "chip), v5e-N (or v5litepod-N) and v6e-N (N chips), or a "
               "shape such as v5e:4x4 or v4:2x2x4; or " + gpus.KNOWN_FORMS
               + "; or " + local.FORM)


def _grid(chips: int, dims: int) -> tuple[int, ...] | None:
  """The usual slice shape of ``chips`` chips: powers of two, as square as
  possible, axes of 1 last (v5e-16 is 4x4, v5e-32 4x8, v4-8's 4 chips
  2x2x1, v4-32's 16 chips 2x2x4), as Cloud TPU lays slices out."""
  if chips < 1 or chips & (chips - 1):
    return None
  shape = [1] * dims
  for i in range(int(math.log2(chips))):
    shape[i % dims] *= 2
  shape.sort()
  return tuple([s for s in shape if s > 1] + [s for s in shape if s == 1])


def parse(name: str, slices: int = 1) -> Topology | gpus.GpuTopology:
  """The :class:`Topology` of a name (module docstring), or a
  :class:`~jaxfid.aot.gpus.GpuTopology` where it names a GPU card
  (``h100-8``); InputError if the name is none of the known forms."""
  if gpus.card_of(name) is not None:
    return gpus.parse(name, slices)
  cpu = local.parse(name, slices)
  if cpu is not None:
    return cpu
  if slices < 1:
    raise InputError("--slices", f"must be at least 1, got {slices}")
  text = name.strip().lower()
  literal = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+){1,2})", text)
  typed = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
  match = literal or typed
  generation = ALIASES.get(match.group(1), match.group(1)) if match else None
  chip = CHIPS.get(generation)
  shape = None
  if chip is not None and literal:
    shape = tuple(int(s) for s in literal.group(2).split("x"))
    if len(shape) != chip.dims or min(shape) < 1:
      shape = None
  elif chip is not None:
    count = int(typed.group(2))
    if count % chip.cores_per_chip == 0:
      shape = _grid(count // chip.cores_per_chip, chip.dims)
  if shape is None:
    raise InputError("--topology", f"unknown TPU topology {name!r}: expected "
                     f"{KNOWN_FORMS}")
  return Topology(name, chip, shape, slices)


@contextlib.contextmanager
def _quiet_libtpu():
  """libtpu on a host without a TPU: no accelerator-type and worker-hostname
  warnings (the variables it would otherwise look up), no shared lockfile
  (several compiling processes at once), and whatever its C++ side still
  prints to stderr dropped (a failure is one line: :func:`devices`)."""
  quiet = {"TPU_ACCELERATOR_TYPE": "v5litepod-1",
           "TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "1",
           "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  saved = {k: os.environ.get(k) for k in quiet}
  os.environ.update({k: v for k, v in quiet.items() if saved[k] is None})
  with tempfile.TemporaryFile() as held:
    stderr = os.dup(2)
    os.dup2(held.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(stderr, 2)
      os.close(stderr)
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)


def libtpu_available() -> bool:
  """Whether libtpu can be imported (``sys.modules['libtpu'] = None``, as a
  test hides it, counts as missing)."""
  if "libtpu" in sys.modules:
    return sys.modules["libtpu"] is not None
  return importlib.util.find_spec("libtpu") is not None


def devices(topology: Topology | gpus.GpuTopology) -> list:
  """The slice's devices (``TpuDevice``s to compile for, not to run on), or
  a GPU topology's (:func:`jaxfid.aot.gpus.devices`).

  Raises InputError with the install command when libtpu is missing.
  """
  if isinstance(topology, gpus.GpuTopology):
    return gpus.devices(topology)
  if isinstance(topology, local.CpuTopology):
    return local.devices(topology)
  if not libtpu_available():
    raise InputError("--topology", f"compiling for a TPU needs libtpu: "
                     f"{INSTALL_HINT}")
  with _quiet_libtpu():
    try:
      desc = jax_topologies.get_topology_desc(
          platform="tpu", topology_name=topology.libtpu_name,
          chip_config_name=topology.chip_config,
          chips_per_host_bounds=topology.host_bounds,
          num_slices=topology.num_slices)
    except Exception as e:  # pylint: disable=broad-except
      raise InputError("--topology", f"libtpu cannot describe "
                       f"{topology.libtpu_name} x {topology.num_slices} "
                       f"slice(s): {str(e).splitlines()[0]}") from None
  found = list(desc.devices)
  if len(found) != topology.chips:
    raise InputError("--topology", f"libtpu gave {len(found)} devices for "
                     f"{topology.libtpu_name}, expected {topology.chips}")
  return found
