"""Which JAX platforms a process starts: a CPU host with libtpu or JAX's CUDA
plugin stays a CPU host.

Installed on a host without the device, libtpu (the ``tpu`` extra) prints
initialisation errors and loses time in every process, and a CUDA plugin
(``gpu-aot``) fails ``cuInit`` with a traceback. :func:`exclude_absent_tpu`,
run when ``jaxfid`` is imported, sets ``JAX_PLATFORMS`` (environment and
``jax.config``) to the remaining platforms (``cpu`` or ``cuda,cpu``) when the
user chose none (``JAX_PLATFORMS`` absent, ``jax_platforms`` unset), libtpu
or a CUDA plugin is installed, nothing suggests a TPU (:func:`tpu_hints`: a
Google PCI device other than storage or network, ``/dev/accel*``,
``/dev/vfio/<n>``, :data:`TPU_ENV_HINTS`) and every other plugin is a CUDA
one (kept where :func:`gpu_hints` finds an NVIDIA GPU). Compiling for a
target (``get_topology_desc``) is unaffected. No JAX import, no network.
"""
from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import importlib.util
import os
import sys

ENV_VAR = "JAX_PLATFORMS"
LIBTPU = "libtpu"
GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI base classes of the Google devices a CPU VM on Compute Engine has:
# mass storage (NVMe persistent disk, local SSD) and network (gVNIC).
NOT_TPU_PCI_CLASSES = ("0x01", "0x02")
# Set on TPU VMs and GKE TPU nodes (or by a user who wants the TPU backend
# tried whatever this module finds).
TPU_ENV_HINTS = ("JAX_FORCE_TPU_INIT", "TPU_ACCELERATOR_TYPE",
                 "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "TPU_TOPOLOGY",
                 "TPU_VISIBLE_CHIPS")
# What libtpu reads when it initialises (once, at its first load) and
# cannot determine without a TPU: a valid accelerator type (any; it does not
# restrict the topologies compiled for) and this host as the only worker.
COMPILER_ONLY_ENV = {"TPU_ACCELERATOR_TYPE": "v5litepod-4",
                     "TPU_WORKER_HOSTNAMES": "localhost"}
# The platform a CUDA plugin serves (its entry-point or module name says it).
CUDA = "cuda"
NVIDIA_PCI_VENDOR = "0x10de"
GPU_PCI_CLASS = "0x03"  # display controllers: VGA (0x0300), 3D (0x0302)


def libtpu_installed(environ=None) -> bool:
  """Whether JAX would find libtpu (as jax/_src/cloud_tpu_init.py looks)."""
  environ = os.environ if environ is None else environ
  path = environ.get("TPU_LIBRARY_PATH")
  if path and os.path.isfile(path):
    return True
  return importlib.util.find_spec(LIBTPU) is not None


def accelerator_plugins(environ=None) -> list[str]:
  """JAX's PJRT plugins installed (entry points, the ``jax_plugins``
  namespace, ``PJRT_NAMES_AND_LIBRARY_PATHS``), libtpu not included."""
  environ = os.environ if environ is None else environ
  names = [e.name for e in importlib.metadata.entry_points(group="jax_plugins")]
  spec = importlib.util.find_spec("jax_plugins")
  for path in (spec.submodule_search_locations or ()) if spec else ():
    names += [f"jax_plugins.{name}" for name in sorted(os.listdir(path))
              if not name.startswith(("_", "."))]
  for entry in environ.get("PJRT_NAMES_AND_LIBRARY_PATHS", "").split(","):
    if entry.strip():
      names.append(entry.strip())
  return names


def _pci_devices(root: str, vendor: str) -> list[tuple[str, str | None]]:
  """(name, PCI class or None) of ``vendor``'s PCI devices; a device that
  vanished or cannot be read counts, with class None (unknown)."""
  found = []
  for vendor_path in sorted(glob.glob(
      os.path.join(root, "sys/bus/pci/devices/*/vendor"))):
    device = os.path.dirname(vendor_path)
    try:
      with open(vendor_path, encoding="ascii") as f:
        if f.read().strip().lower() != vendor:
          continue
      with open(os.path.join(device, "class"), encoding="ascii") as f:
        pci_class = f.read().strip().lower()
    except OSError:
      pci_class = None
    found.append((os.path.basename(device), pci_class))
  return found


def _pci_tpu_candidates(root: str) -> list[str]:
  return [f"Google PCI device {name}"
          for name, pci_class in _pci_devices(root, GOOGLE_PCI_VENDOR)
          if pci_class is None or not pci_class.startswith(NOT_TPU_PCI_CLASSES)]


def tpu_hints(environ=None, root: str = "/") -> list[str]:
  """What suggests a TPU on this host (empty: nothing does; module doc);
  ``root``: the file system's root (a test's stand-in)."""
  environ = os.environ if environ is None else environ
  hints = [f"${name}" for name in TPU_ENV_HINTS if name in environ]
  hints += _pci_tpu_candidates(root)
  hints += sorted(glob.glob(os.path.join(root, "dev/accel[0-9]*")))
  hints += sorted(glob.glob(os.path.join(root, "dev/vfio/[0-9]*")))
  return hints


def _jax_state() -> tuple[bool, str | None]:
  """(backend started, ``jax.config.jax_platforms``) if JAX is imported."""
  config = sys.modules.get("jax._src.config")
  bridge = sys.modules.get("jax._src.xla_bridge")
  started = getattr(bridge, "backends_are_initialized", None)
  state = getattr(config, "jax_platforms", None)
  return bool(started and started()), getattr(state, "value", None)


def gpu_hints(root: str = "/") -> list[str]:
  """What suggests an NVIDIA GPU on this host (empty: nothing does): a PCI
  display or 3D controller of NVIDIA's (vendor ``0x10de``, class ``0x03``),
  a ``/dev/nvidia<N>`` device, or ``/proc/driver/nvidia/gpus/*``."""
  hints = [f"NVIDIA PCI device {name}"
           for name, pci_class in _pci_devices(root, NVIDIA_PCI_VENDOR)
           if pci_class is None or pci_class.startswith(GPU_PCI_CLASS)]
  hints += sorted(glob.glob(os.path.join(root, "dev/nvidia[0-9]*")))
  hints += sorted(glob.glob(os.path.join(root, "proc/driver/nvidia/gpus/*")))
  return hints


def decide(environ=None, root: str = "/") -> dict:
  """The platforms to set (module doc), without setting them:
  ``{'jax_platforms': str or None (JAX's own choice), 'reason': str}``."""
  environ = os.environ if environ is None else environ

  def keep(reason: str) -> dict:
    return {"jax_platforms": None, "reason": reason}

  if ENV_VAR in environ:
    return keep(f"{ENV_VAR}={environ[ENV_VAR]!r} set by the user")
  started, configured = _jax_state()
  if configured is not None:
    return keep(f"jax_platforms={configured!r} set by the user")
  if started:
    return keep("JAX's backend has already started")
  tpu = libtpu_installed(environ)
  plugins = accelerator_plugins(environ)
  cuda = any(CUDA in p.lower() for p in plugins)
  if not tpu and not cuda:
    return keep("no libtpu installed")
  hints = tpu_hints(environ, root) if tpu else []
  if hints:
    return keep(f"this host may have a TPU ({', '.join(hints)})")
  others = [p for p in plugins if CUDA not in p.lower()]
  if others:
    return keep(f"plugin {others[0]} installed: its platform is unknown")
  gpu = cuda and bool(gpu_hints(root))
  absent = (["libtpu installed on a host without a TPU"] if tpu else []) + (
      ["a CUDA plugin installed on a host without an NVIDIA GPU"]
      if cuda and not gpu else [])
  if not absent:
    return keep("a CUDA plugin installed and an NVIDIA GPU present")
  return {"jax_platforms": f"{CUDA},cpu" if gpu else "cpu",
          "reason": "; ".join(absent)}


def exclude_absent_tpu(environ=None, root: str = "/") -> dict:
  """Sets ``JAX_PLATFORMS`` in ``environ`` (and ``jax.config`` when JAX is
  imported) to what :func:`decide` chooses, if anything; returns that."""
  environ = os.environ if environ is None else environ
  decision = decide(environ, root)
  platforms = decision["jax_platforms"]
  if platforms is not None:
    environ[ENV_VAR] = platforms
    if "jax._src.config" in sys.modules:
      sys.modules["jax._src.config"].config.update("jax_platforms", platforms)
  return decision


@contextlib.contextmanager
def libtpu_as_compiler(environ=None, root: str = "/"):
  """Load libtpu inside this block (``get_topology_desc``) as a compiler on
  a host without a TPU, without its initialisation errors: the unset
  variables of :data:`COMPILER_ONLY_ENV` are set for the block (libtpu reads
  them at its first load). On a TPU host nothing is changed."""
  environ = os.environ if environ is None else environ
  added = []
  if not tpu_hints(environ, root):
    for name, value in COMPILER_ONLY_ENV.items():
      if name not in environ:
        environ[name] = value
        added.append(name)
  try:
    yield
  finally:
    for name in added:
      environ.pop(name, None)
