"""The environment of a test's subprocess that trains for minutes.

The suite sets XLA:CPU's backend to -O0 and 8 simulated devices
(conftest.py): its programs are tiny and compiling them is most of its
time. A subprocess that runs thousands of training steps (the demo, the
FiD-KD world) is the other way round: -O0 makes its steps two to three times
as slow, and 8 devices on 2 cores split each step eight ways. It gets
XLA's defaults instead, as a user's run would.
"""
from __future__ import annotations

import os

_SUITE_FLAGS = ("--xla_backend_optimization_level",
                "--xla_force_host_platform_device_count")


def default_xla_env(**extra: str) -> dict:
  """``os.environ`` without the suite's XLA flags, on the CPU, plus
  ``extra``."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith(_SUITE_FLAGS)]
  return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu",
              **extra)
