"""NVIDIA GPUs by name, their devices without a GPU, and card figures.

``jaxfid bench compile --topology h100-8`` compiles for GPUs on any host
where JAX's CUDA plugin is installed (``pip install -e '.[gpu-aot]'``: the
plugin with its CUDA libraries, a CPU laptop too): :func:`devices` asks the
plugin for the devices of a topology described by the card's target config
(a ``GpuTargetConfigProto`` shipped in ``jaxfid/aot/gpu_targets/``) through
``jax.experimental.topologies``; ``jax.jit(...).lower(...).compile()`` then
runs XLA's GPU compiler for them (no autotuning: that needs the card).

Names (:func:`parse`): ``<card>-<n>``, ``n`` GPUs (1 to 8) of one host
(``h100-8``, ``a100-1``); ``--slices N`` compiles for N such hosts, XLA's
topology ``"Nx1xn"`` (slices x hosts per slice x GPUs per host: each host
its own NVLink domain, hosts joined by the network, as TPU slices are by
DCN).

The per-card figures (:data:`CARDS`): memory is the target config's
``device_memory_size`` (what the card reports); peak dense bf16 FLOP/s and
HBM bandwidth are NVIDIA's datasheets' (the Tensor Core figures without
sparsity): A100 SXM 80GB (nvidia.com/en-us/data-center/a100, "BF16 Tensor
Core 312 TFLOPS", 2,039 GB/s), H100 SXM (nvidia.com/en-us/data-center/h100,
"BF16 Tensor Core 1,979 TFLOPS" with sparsity, 3.35 TB/s), H200 SXM
(nvidia.com/en-us/data-center/h200, 1,979 TFLOPS with sparsity, 4.8 TB/s),
B200 (HGX B200 datasheet, nvidia.com/en-us/data-center/hgx: "FP16/BF16
Tensor Core 36 PFLOPS" with sparsity over 8 GPUs, 64 TB/s over 8).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys

from jax.experimental import topologies as jax_topologies

from jaxfid.core.errors import InputError

TARGETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "gpu_targets")
INSTALL_HINT = "pip install -e '.[gpu-aot]' (works on a CPU host)"
PLUGIN_MODULES = ("jax_plugins.xla_cuda12", "jax_cuda12_plugin")
MAX_PER_HOST = 8


@dataclasses.dataclass(frozen=True)
class Card:
  """A GPU's public figures (module docstring) and its target config."""
  name: str                 # 'h100', the topology name's prefix
  device_kind: str          # what JAX's device_kind says of it
  memory_bytes: int         # the target config's device_memory_size
  peak_bf16_flops: float    # FLOP/s, dense
  hbm_bytes_per_s: float
  target_file: str          # in gpu_targets/

  @property
  def hbm_bytes(self) -> int:  # what the report calls a chip's memory
    return self.memory_bytes

  def target_config(self) -> str:
    with open(os.path.join(TARGETS_DIR, self.target_file),
              encoding="utf-8") as f:
      return f.read()


CARDS: dict[str, Card] = {
    "a100": Card("a100", "NVIDIA A100-SXM4-80GB", 85100068864, 312e12,
                 2039e9, "a100_sxm_80.txtpb"),
    "h100": Card("h100", "NVIDIA H100 80GB HBM3", 84942979072, 989.5e12,
                 3350e9, "h100_sxm.txtpb"),
    "h200": Card("h200", "NVIDIA H200 141GB HBM3e", 151397597184, 989.5e12,
                 4800e9, "h200.txtpb"),
    "b200": Card("b200", "NVIDIA B200", 191514411008, 2250e12, 8000e9,
                 "b200.txtpb"),
}
KNOWN_FORMS = (f"a GPU card and count <card>-<n>, n of 1 to {MAX_PER_HOST} "
               f"on one host ({', '.join(f'{c}-8' for c in CARDS)}; "
               "--slices N for N hosts)")


@dataclasses.dataclass(frozen=True)
class GpuTopology:
  """GPUs of one host (or ``num_slices`` hosts) to compile for."""
  name: str
  chip: Card
  per_host: int
  num_slices: int = 1

  @property
  def chips(self) -> int:
    return self.per_host * self.num_slices

  @property
  def compiler_options(self) -> dict | None:
    """Triton's GEMM fusions off, unless ``XLA_FLAGS`` names them: without
    the card XLA cannot autotune their tiles, and its default fails on some
    of FiD-base's matmuls ("INTERNAL: Couldn't find output tile sizes that
    satisfy hlo: ... dot(...)", jaxlib 0.10.2); the GEMMs compile to cuBLAS
    calls instead, which the card's autotuning may choose too."""
    if "xla_gpu_enable_triton_gemm" in os.environ.get("XLA_FLAGS", ""):
      return None
    return {"xla_gpu_enable_triton_gemm": False}

  @property
  def xla_topology(self) -> str:
    """XLA's ``slices x hosts per slice x devices per host``."""
    return f"{self.num_slices}x1x{self.per_host}"


def card_of(name: str) -> Card | None:
  """The card a topology name starts with (``h100-8``: H100), else None."""
  match = re.fullmatch(r"([a-z0-9]+)-\d+", name.strip().lower())
  return CARDS.get(match.group(1)) if match else None


def parse(name: str, slices: int = 1) -> GpuTopology:
  """The :class:`GpuTopology` of ``<card>-<n>``; InputError otherwise."""
  if slices < 1:
    raise InputError("--slices", f"must be at least 1, got {slices}")
  card = card_of(name)
  count = int(name.strip().rsplit("-", 1)[1]) if card else 0
  if card is None or not 1 <= count <= MAX_PER_HOST:
    raise InputError("--topology", f"unknown GPU topology {name!r}: expected "
                     f"{KNOWN_FORMS}")
  return GpuTopology(name, card, count, slices)


def plugin_available() -> bool:
  """Whether JAX's CUDA 12 plugin can be imported (a module set to None in
  ``sys.modules``, as a test hides it, counts as missing)."""
  for module in PLUGIN_MODULES:
    if module in sys.modules:
      if sys.modules[module] is not None:
        return True
      continue
    try:
      if importlib.util.find_spec(module) is not None:
        return True
    except ImportError:  # its parent package is missing
      continue
  return False


def devices(topology: GpuTopology) -> list:
  """The GPUs' devices (to compile for, not to run on); InputError with the
  install command when the CUDA plugin is missing."""
  if not plugin_available():
    raise InputError("--topology", f"compiling for a GPU needs JAX's CUDA "
                     f"plugin: {INSTALL_HINT}")
  try:
    desc = jax_topologies.get_topology_desc(
        platform="cuda", topology_name="",
        target_config=topology.chip.target_config(),
        topology=topology.xla_topology)
  except Exception as e:  # pylint: disable=broad-except
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise InputError("--topology", f"the CUDA plugin cannot describe "
                     f"{topology.xla_topology} {topology.chip.name} GPUs: "
                     f"{first}") from None
  found = list(desc.devices)
  if len(found) != topology.chips:
    raise InputError("--topology", f"the CUDA plugin gave {len(found)} "
                     f"devices for {topology.xla_topology}, expected "
                     f"{topology.chips}")
  return found
