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

# DistDGL's own environment (DGL wheels need torch <= 2.2): the `distdgl` baseline runs
# its trainers and servers with this python (baselines/distdgl/). From PyPI, torch 2.1.2
# is the CUDA build (about 2.6 GB with its nvidia-* wheels; it also runs on CPU).
DGL_VENV  ?= .venv-dgl
DGL_SPEC  ?= torch==2.1.2 dgl==2.1.0 torchdata==0.7.1 "numpy<2" pandas pyyaml pydantic
DGL_STAMP := $(DGL_VENV)/.installed-$(shell echo '$(DGL_SPEC)' | cksum | cut -d' ' -f1)

# The GPU tier: exactly the tests marked `gpu` (parity suite on CUDA/ROCm, training on
# one GPU and on grids sharing it, Algorithm 2 on the GPU, prefetch streams, compile),
# with the python and torch of the machine (a GPU node often has no package registry:
# nothing is installed). Without a GPU every one of them is reported as skipped.
# GPU_TESTS: every test file holding a `gpu` test, and no other (their imports are all a
# GPU node needs); tests/harness/test_architecture.py keeps the list complete.
GPU_PYTHON ?= python3
GPU_TESTS  ?= tests/unit/test_sampling_kernel.py tests/unit/test_perf.py tests/unit/test_timing.py \
              tests/parallel/test_collectives.py tests/parallel/test_tail.py tests/parallel/test_model.py \
              tests/parallel/test_engine.py tests/parallel/test_device.py tests/parallel/test_compiled_step.py \
              tests/parallel/test_step_graph.py \
              tests/baselines/test_cagnet.py tests/baselines/test_device.py tests/integration/test_gpu_surface.py

# The documentation site (mkdocs.yml, docs/): `make docs` builds it, in the environment `make
# test` builds (its dev extra holds the docs extra), into $(DOCS_OUT) with --strict (a
# warning, e.g. a link that does not resolve, fails).
DOCS_OUT   ?= build/docs

.PHONY: demo test test-vgpu test-readme test-slurm test-cluster test-gpu test-torch-floor gpu-report bench-gpu env bench clean-env dgl-env docs

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	@rm -f $(VENV)/.installed-*
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(TORCH_SPEC),$(PY) -m pip install --quiet "$(TORCH_SPEC)")
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet $(PYG_WHEELS) torch-sparse torch-scatter torch-geometric
	$(PY) -m pip install --quiet $(PYG_WHEELS) -e ".[dev,baselines]"
	@touch $@

$(DGL_STAMP):
	@test -x $(DGL_VENV)/bin/python || $(PYTHON) -m venv $(DGL_VENV)
	@rm -f $(DGL_VENV)/.installed-*
	$(DGL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DGL_VENV)/bin/python -m pip install --quiet $(DGL_SPEC)
	@touch $@

dgl-env: $(DGL_STAMP)

docs: $(STAMP)
	$(PY) -m mkdocs build --strict --clean --site-dir $(DOCS_OUT)

env: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/scalegnn demo

test: $(STAMP) $(DGL_STAMP)
	$(PY) -m pytest -q

# The virtual-device tier (CI; not part of `make test`): every system's whole run and the
# engine in every configuration with --device cuda on a virtual GPU (tests/vgpu/virtual.py:
# the CPU computes, torch.cuda is stubbed, an operator mixing devices, a host kernel given
# device memory or a host read inside a prefetched step fails the test). A few minutes.
test-vgpu: $(STAMP)
	$(PY) -m pytest -q -m vgpu -p no:cacheprovider tests/vgpu

# The README's long commands (not part of `make test`: about 8 minutes on 2 cores): the
# Facebook run, csbm on 8 ranks, the edge list on 4; the short ones run in `make test`.
test-readme: $(STAMP)
	$(PY) -m pytest -q -m readme -p no:cacheprovider tests/harness/test_readme_commands.py

# The real-scheduler tier (not part of `make test`): a one-node SLURM cluster with munge
# started on this machine by tests/slurm/localslurm.sh (root; apt-get installs slurm-wlm
# and munge when missing), the sweep tests run against it, the daemons stopped by pid.
# SCALEGNN_SLURM_CONF=<slurm.conf> uses a cluster that already runs instead.
test-slurm: $(STAMP)
	$(PY) -m pytest -q -m slurm tests/harness/test_slurm.py

# The multi-node tier (not part of `make test`): a SLURM cluster of 3 nodes, each in its
# own network and UTS namespace (tests/cluster/localcluster.sh; root, Debian), its node
# count and host names printed first, the tests of tests/harness/test_cluster.py run
# against it, the daemons stopped by pid and the namespaces removed afterwards.
test-cluster: $(STAMP)
	bash tests/cluster/tier.sh $(PY) 3

test-gpu:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m pytest -m gpu -p no:cacheprovider $(GPU_TESTS)

# The oldest torch a cluster profile loads (pyproject's floor: Perlmutter's pytorch/2.6.0
# module), in an environment of its own: the core (engine parity with the serial model,
# the samplers, checkpoint and resume on the same and on another grid, the records and
# ScaleGNN's pinned records). Not part of `make test` or CI: from PyPI, torch 2.6.0 is the
# CUDA build (about 2.5 GB with its nvidia wheels; it runs on the CPU). No baseline:
# torch-sparse has no wheel for it here.
FLOOR_VENV  ?= .venv-torch-floor
FLOOR_SPEC  ?= torch==2.6.0
FLOOR_TESTS ?= tests/parallel/test_engine.py tests/unit/test_sampling.py tests/unit/test_checkpoint.py \
               tests/unit/test_records.py tests/integration/test_resume.py tests/integration/test_trained.py \
               tests/integration/test_record_pins.py
test-torch-floor:
	@test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet "$(FLOOR_SPEC)" numpy scipy pandas tqdm numba matplotlib \
	    pytest hypothesis torch-geometric
	PYTHONPATH=$(CURDIR) $(FLOOR_VENV)/bin/python -m pytest -q -p no:cacheprovider -k "not graphsage and not graphsaint" \
	    $(FLOOR_TESTS)

# The one command for a GPU machine: the GPU tests and the GPU benchmark, and one report of
# both (versions, device, every test's outcome, every number) in results/gpu/report.md (and
# .json), which docs/gpu.md publishes. Without a GPU every test is skipped and so is the benchmark.
GPU_REPORT ?= results/gpu/report.md
# GPU_BENCH_ARGS: the benchmark's arguments (by default every system at the settings
# `scalegnn tune` chose for it: results/bench/tuned/search, issue V); GPU_BENCH_FROM=results/bench/gpu
# reports that folder's earlier benchmark instead of running it (a re-run of the tests after a fix).
GPU_TUNED ?= results/bench/tuned/search
GPU_BENCH_ARGS ?= --tuned $(GPU_TUNED) --cuda-graphs
GPU_BENCH_FROM ?=
gpu-report:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m scalegnn.benchmarks.gpu_report --python $(GPU_PYTHON) \
	    --tests "$(GPU_TESTS)" --out $(GPU_REPORT) --bench-out results/bench/gpu --bench-args "$(GPU_BENCH_ARGS)" \
	    --bench-from "$(GPU_BENCH_FROM)"

# ScaleGNN on one GPU against PyG on the same GPU (benchmarks/gpu.py), the machine's python.
bench-gpu:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m scalegnn.benchmarks.gpu --out results/bench/gpu --tuned $(GPU_TUNED) --cuda-graphs

# The pytest-benchmark micro-benchmarks (tests/benchmarks/, marked `bench`): `make test`
# deselects them (pyproject.toml's addopts), this runs exactly them. The end-to-end
# comparisons are `scalegnn bench ...` (benchmarks/bench_command.py).
bench: $(STAMP)
	$(PY) -m pytest tests/benchmarks -q -m bench --benchmark-only

clean-env:
	rm -rf $(VENV)
