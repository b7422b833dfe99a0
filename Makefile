# jaxfid: `make demo` runs the end-to-end demo, `make test` the test suite's
# fast tier (every module and every guarantee, minutes on 2 CPU cores),
# `make test-all` the fast tier and then the slow one (the tests marked
# `slow`: multi-host runs, the demo's signals, learning tests, minute-long CLI
# runs; what .ci/run runs). Both tiers run on two pytest-xdist workers, each
# test file on one of them, all sharing one compilation cache
# (tests/conftest.py).
# Both create a virtual environment in .venv (once, CPython 3.11) and install
# the package into it with the exact versions of requirements-lock.txt (pip
# constraints), the `tpu` extra included; stamp files keep later runs from
# reinstalling unless setup.py or the lock changed. The `tpu` extra's libtpu
# (the lock's: a ~210 MB download, ~680 MB installed, ~10 s to install) is
# the TPU compiler of the tests marked `tpu` (pytest.ini), which compile tiny
# programs for TPU topologies on this CPU host; they belong to the tiers as
# any test does (`slow` or not), and `make test-tpu` runs them alone
# (`pytest -m tpu`). The `gpu-aot` extra (jax's CUDA 12 plugin with its CUDA
# libraries, the lock's versions: a 3.2 GB download, 4.9 GB installed, 2 min
# 51 s to install on the 2-core CPU host) is the GPU compiler of the tests
# marked `gpu` (tests/test_bench_compile_gpu.py: a tiny FiD step compiled for
# an H100 without one). On a host without a TPU or an NVIDIA GPU, importing
# jaxfid keeps JAX off those platforms (jaxfid/runtime/platforms.py), so libtpu
# and the CUDA plugin cost the other tests nothing.
#
# `make test-latest` runs the suite on the other end of setup.py's ranges:
# a CPython 3.12 virtualenv (.venv-latest) with the newest releases of
# everything (jax, flax, optax, orbax, TensorFlow, ...), upgraded on every
# run (libtpu: the one the newest jax[tpu] pins), without PyTorch (its CPU
# wheel for 3.12 is not at hand; the PyTorch-reference tests skip).
# `make test-latest LATEST_PYTHON=python3.13` runs it on another Python (the
# virtualenv is remade for it). `make lock` rewrites the lock from a fresh
# CPython 3.11 virtualenv with the newest releases for 3.11.

# The interpreter of the lock (CPython 3.11), and the newest one tested; a
# pyenv installation is found without `pyenv global`.
PYENV_VERSIONS := $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions
find_python = $(firstword $(foreach p,python$(1) $(sort $(wildcard $(PYENV_VERSIONS)/$(1).*/bin/python$(1))),$(shell $(p) -c 'import sys; print(sys.executable) if sys.version_info[:2] == ($(subst .,$(comma),$(1))) else None' 2>/dev/null)))
comma := ,
ifndef PYTHON
PYTHON := $(call find_python,3.11)
endif
ifndef LATEST_PYTHON
LATEST_PYTHON := $(call find_python,3.12)
endif

LOCK := requirements-lock.txt
VENV := .venv
PIP := $(VENV)/bin/python -m pip
LATEST_VENV := .venv-latest
LOCK_VENV := .venv-lock
# Reinstall when the packaging changes (or a new top-level package appears).
INSTALL_DEPS := setup.py $(LOCK) $(wildcard tasks/__init__.py)

.PHONY: demo test test-all test-tpu test-latest lock clean-venv

demo: $(VENV)/.stamp-base
	$(VENV)/bin/jaxfid demo

# JAXFID_LOCK: tests/test_packaging.py checks the environment against it.
# --durations=15: the slowest tests, so that a slow run shows where its time
# went.
PYTEST := JAXFID_LOCK=$(LOCK) $(VENV)/bin/python -m pytest tests -q \
	-n 2 --dist loadfile --durations=15

test: $(VENV)/.stamp-test
	$(PYTEST) -m "not slow"

test-all: test
	$(PYTEST) -m slow

test-tpu: $(VENV)/.stamp-test
	$(PYTEST) -m tpu

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "error: no CPython 3.11 found (the lock is for 3.11); run 'make PYTHON=/path/to/python3.11'" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "error: $(PYTHON) is not Python 3.11, which $(LOCK) is for; run 'make PYTHON=/path/to/python3.11' (or 'make test-latest')" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }

# The serve extra too (uvicorn, Starlette and their dependencies: 6 small
# pure-Python packages, 3.5 s into an empty venv here), so that the
# `jaxfid serve` command the demo ends with runs in the demo's environment.
$(VENV)/.stamp-base: $(INSTALL_DEPS) | $(VENV)/bin/python
	$(PIP) install -c $(LOCK) -e '.[serve]'
	touch $@

# The test extras are a superset of the base install, so they satisfy `demo`.
$(VENV)/.stamp-test: $(INSTALL_DEPS) | $(VENV)/bin/python
	$(PIP) install -c $(LOCK) -e '.[test,torch,tpu,gpu-aot]'
	touch $(VENV)/.stamp-base $@

test-latest:
	@test -n "$(LATEST_PYTHON)" || { echo "error: no CPython 3.12 found; run 'make test-latest LATEST_PYTHON=/path/to/python3.12'" >&2; exit 1; }
	@v='import sys; print(sys.version_info[:2])'; test "$$($(LATEST_VENV)/bin/python -c "$$v" 2>/dev/null)" = "$$($(LATEST_PYTHON) -c "$$v")" || { rm -rf $(LATEST_VENV); echo "$(LATEST_PYTHON) -m venv $(LATEST_VENV)"; $(LATEST_PYTHON) -m venv $(LATEST_VENV); } || { rm -rf $(LATEST_VENV); exit 1; }
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install --upgrade --upgrade-strategy eager -e '.[test,tpu]'
	@$(LATEST_VENV)/bin/python -c 'import sys; from importlib.metadata import version; print("Python " + sys.version.split()[0], *(f"{n} {version(n)}" for n in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "tensorflow", "seqio", "transformers", "libtpu")), sep=", ")'
	$(LATEST_VENV)/bin/python -m pytest tests -q -rs

lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -e '.[test,torch,tpu,gpu-aot]'
	{ sed -n '/^#/p;/^#/!q' $(LOCK); $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | grep -v '^#'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)

clean-venv:
	rm -rf $(VENV) $(LATEST_VENV) $(LOCK_VENV)
