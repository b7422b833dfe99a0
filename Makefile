# jaxfid: `make demo` runs the end-to-end demo, `make test` the test suite.
# Both create a virtual environment in .venv (once) and install the package
# into it; stamp files keep later runs from reinstalling unless setup.py
# changed.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PIP := $(VENV)/bin/python -m pip
# Reinstall when the packaging changes (or a new top-level package appears).
INSTALL_DEPS := setup.py $(wildcard tasks/__init__.py)

.PHONY: demo test clean-venv

demo: $(VENV)/.stamp-base
	$(VENV)/bin/jaxfid demo

test: $(VENV)/.stamp-test
	$(VENV)/bin/python -m pytest tests -q

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 found; run 'make PYTHON=/path/to/python3.11'" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "error: $(PYTHON) is older than Python 3.11; run 'make PYTHON=/path/to/python3.11'" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }

$(VENV)/.stamp-base: $(INSTALL_DEPS) | $(VENV)/bin/python
	$(PIP) install -e .
	touch $@

# The test extra is a superset of the base install, so it satisfies `demo`.
$(VENV)/.stamp-test: $(INSTALL_DEPS) | $(VENV)/bin/python
	$(PIP) install -e '.[test]'
	touch $(VENV)/.stamp-base $@

clean-venv:
	rm -rf $(VENV)
