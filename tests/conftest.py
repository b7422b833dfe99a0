"""Test set-up: 8 simulated CPU devices, float32 matmuls, quiet TensorFlow,
glibc malloc as it is."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The CLI's CPU malloc settings (jaxfid/core/host_memory.py) trade compile
# speed and memory for step speed; the suite is mostly compilation, and this
# process and the commands it starts run without them.
# tests/test_host_memory.py and test_bench_scripts.py run them explicitly.
os.environ.setdefault("JAXFID_CPU_MALLOC", "0")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
