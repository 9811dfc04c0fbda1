# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Both create (or reuse) the virtual environment in $(VENV) and install what they
# need; the stamp file makes a second run install nothing.
#
# Cluster users who must keep their site torch build:
#   make demo VENV_FLAGS=--system-site-packages TORCH_SPEC=
# (an empty TORCH_SPEC installs no torch; the venv sees the site one).

PYTHON     ?= python3
VENV       ?= .venv
VENV_FLAGS ?=
TORCH_SPEC ?= torch==2.13.0
SHARED     ?= ../shared
# torch-sparse / torch-scatter (PyG samplers) are not on PyPI as wheels: this
# workplace ships them in ../shared/wheels; elsewhere PyG's wheel index serves them.
PYG_WHEELS ?= $(if $(wildcard $(SHARED)/wheels/*.whl),--find-links $(SHARED)/wheels,--find-links https://data.pyg.org/whl/torch-2.13.0+cpu.html)

PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: demo test env bench clean-env

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	@rm -f $(VENV)/.installed-*
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(TORCH_SPEC),$(PY) -m pip install --quiet "$(TORCH_SPEC)")
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet $(PYG_WHEELS) torch-sparse torch-scatter torch-geometric
	@touch $@

env: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/scalegnn demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m pytest benchmarks -q --benchmark-only

clean-env:
	rm -rf $(VENV)
