"""Test set-up: 8 simulated CPU devices, XLA:CPU's backend at -O0, float32
matmuls, quiet TensorFlow, glibc malloc as it is, and one persistent
compilation cache for the run.

The cache: one temporary directory for the whole pytest run (made by the
first process, removed at its end), exported as ``$JAXFID_COMPILATION_CACHE``
so that the in-process tests, the ``jaxfid`` commands they start as
subprocesses and pytest-xdist's workers all load a program any of them
compiled (the CLI turns the cache on from that variable, runtime/compilation_cache.py;
tests/multihost.py turns it off for multi-process runs). A variable the user
set is left alone (``JAXFID_COMPILATION_CACHE=0`` runs the suite without).

The ``slow`` marker (pytest.ini) puts a test in the long tier: ``make test``
runs ``-m "not slow"``, ``make test-all`` both tiers.
"""
import os
import shutil
import sys
import tempfile

# The suite's time is mostly XLA:CPU compiling tiny programs: LLVM's -O0
# (--xla_backend_optimization_level=0) compiles them about a quarter faster,
# with the same HLO and the same results (the parity tests hold at their
# tolerances); the commands the tests start inherit it.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_backend_optimization_level=0")
# JAX_PLATFORMS=cpu also keeps the tpu extra's libtpu out of every backend
# here and in the commands the tests start (jaxfid/runtime/platforms.py would
# choose the same on this host); the tests marked `tpu` load it as a
# compiler through jax.experimental.topologies, which this does not stop.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The CLI's CPU malloc settings (jaxfid/runtime/host_memory.py) trade compile
# speed and memory for step speed; the suite is mostly compilation, and this
# process and the commands it starts run without them.
# tests/test_host_memory.py and test_bench_scripts.py run them explicitly.
os.environ.setdefault("JAXFID_CPU_MALLOC", "0")

CACHE_VAR = "JAXFID_COMPILATION_CACHE"
_made_cache: str | None = None  # the directory this process made, if any
if CACHE_VAR not in os.environ:
  # Set before pytest-xdist starts its workers, which inherit it.
  _made_cache = tempfile.mkdtemp(prefix="jaxfid-test-xla-")
  os.environ[CACHE_VAR] = _made_cache

# The synthetic worlds the benchmarks and some tests share
# (benchmarks/distill_world.py, benchmarks/refusion_world.py) are imported
# by name.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks"))

import jax  # noqa: E402

from jaxfid.runtime import compilation_cache as runtime  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# The in-process tests use the cache from their first compilation on.
runtime.apply_runtime_defaults()


def pytest_unconfigure(config):
  del config
  if _made_cache:
    shutil.rmtree(_made_cache, ignore_errors=True)


# The files that take longest (measured: `make test`'s durations), first.
# pytest-xdist's --dist loadfile hands each worker whole files in collection
# order; starting the long ones first keeps a long file from being the last
# one left, running alone while the other worker idles.
LONGEST_FIRST = (
    "test_quiet_recoveries.py", "test_faults_training.py",
    "test_train_cli.py", "test_retrieval_dense_train.py",
    "test_seqio_cli.py", "test_sharding.py", "test_refusion_train.py",
    "test_scan_layers.py", "test_fid_model.py", "test_activation_sharding.py",
    "test_reatt_iterate.py", "test_host_memory.py", "test_reatt_model.py",
    "test_reatt_grad_cache.py", "test_gin_configs.py", "test_bench_cli.py",
)


# The same for the slow tier (`-m slow`; measured: `make test-all`'s
# durations).
LONGEST_FIRST_SLOW = (
    "test_distill_synthetic.py", "test_multihost.py", "test_demo.py",
    "test_refusion_train.py", "test_multihost_atlas.py",
    "test_bench_compile.py", "test_reatt_learning.py",
    "test_distill_iterate.py", "test_refusion_learning.py",
    "test_atlas_train.py", "test_multihost_index.py", "test_bench_scripts.py",
)


def pytest_collection_modifyitems(config, items):
  order = (LONGEST_FIRST_SLOW if config.option.markexpr.strip() == "slow"
           else LONGEST_FIRST)
  rank = {name: i for i, name in enumerate(order)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
