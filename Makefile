# Monarch developer commands. `make` (or `make help`) lists them.
#
# Everything Python lives in $(VENV); nothing is installed globally. CI runs `.ci/run`,
# which runs `make test`.

PYTHON ?= python3
VENV ?= .venv
CARGO ?= cargo

VENV_PYTHON := $(VENV)/bin/python
MATURIN := $(VENV)/bin/maturin

# Python packages of the venv, in three groups, each installed once (its stamp file's name
# carries a hash of its list, so changing a list installs that group again): what building
# the extension needs, what the demos add (torch), and what the tests, linters and docs
# tools add. `make demo` installs the first two only; `make install` and `make test` all.
BUILD_REQUIREMENTS := maturin>=1.9.4,<2 cloudpickle
DEMO_REQUIREMENTS := torch numpy
DEV_REQUIREMENTS := pytest pytest-timeout pytest-xdist ruff mypy matplotlib nbclient ipykernel nbformat \
	pexpect kubernetes kubernetes-validate jsonschema selenium prometheus-client
req_stamp = $(VENV)/.requirements-$(1)-$(shell printf '%s' '$(2)' | sha256sum | cut -c1-16)
BUILD_STAMP := $(call req_stamp,build,$(BUILD_REQUIREMENTS))
DEMO_STAMP := $(call req_stamp,demo,$(DEMO_REQUIREMENTS))
DEV_STAMP := $(call req_stamp,dev,$(DEV_REQUIREMENTS))
# Everything: what `install`, the tests and the linters use.
REQ_STAMP := $(BUILD_STAMP) $(DEMO_STAMP) $(DEV_STAMP)

# Plain cargo commands configure PyO3 the way maturin does: the venv's interpreter, and
# PYO3_BUILD_EXTENSION_MODULE so the monarch_extension cdylib never links libpython (which
# a machine without python3-dev lacks). maturin also passes a config file of its own, so
# alternating `make build-dev` with clippy/test still rebuilds the pyo3 crates (~15 s);
# `make test` builds the extension in release and tests in debug, so it does not.
export PYO3_PYTHON := $(abspath $(VENV_PYTHON))
export PYO3_BUILD_EXTENSION_MODULE := 1

MATURIN_DEVELOP := VIRTUAL_ENV=$(abspath $(VENV)) $(MATURIN) develop
# `examples/` is not tracked until it has files; only lint the directories that exist.
PY_LINT_PATHS := $(wildcard python tests examples benches tools)

.DEFAULT_GOAL := help

.PHONY: help install build-dev build-prod format lint lint-rust lint-python stubtest \
	typecheck test test-deps test-rust loom test-python slurm-deps browser-deps demo demo-build bench bench-scale bench-peers bench-multihost bench-rdma bench-tensors bench-ddp bench-recovery bench-workspace docs all \
	clean distclean

help: ## Show this list of targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' \
		$(MAKEFILE_LIST)

$(VENV_PYTHON):
	$(PYTHON) -m venv $(VENV)

# Packages are installed with uv (itself installed by the venv's pip, once): it links the
# files of a package it has unpacked before from its cache instead of unpacking the wheel
# again. Measured on 2 cores, torch and NumPy into a new venv: pip 57 s (52 s of CPU),
# uv 1.9 s from its cache and 16 s with an empty cache (downloads included); pip stays in
# the venv for maturin and for users. A wheel directory named by PIP_FIND_LINKS is
# searched too, as pip would.
# The commands here let Python cache the bytecode it compiles (.pyc files): an
# environment with PYTHONDONTWRITEBYTECODE=1 (common on CI machines) would have every
# process compile torch's modules again from source. Measured on 2 cores: `import torch`
# 4.3 s -> 2.1 s, building a DistributedDataParallel (which imports torch._dynamo)
# 5.8 s -> 1.5 s, per process. Only the modules a program imports are compiled, once
# (compiling all of the venv's packages ahead would take 32 s of CPU).
unexport PYTHONDONTWRITEBYTECODE
# One install at a time changes the venv (a lock file): `install` and `demo` run them
# beside the extension's build, and two installing a shared dependency at once would
# break it. They run at a lower priority (nice): the extension's build beside them is
# what everything else waits for.
UV := $(VENV)/bin/uv
PIP_LOCK := flock $(VENV)/.pip.lock nice -n 10
define pip_install
	$(PIP_LOCK) $(UV) pip install --quiet --python $(VENV_PYTHON) \
		$(if $(PIP_FIND_LINKS),--find-links '$(PIP_FIND_LINKS)') $(foreach r,$(2),'$(r)')
	rm -f $(VENV)/.requirements-$(1)-*
	touch $@
endef

$(UV): | $(VENV_PYTHON)
	$(VENV_PYTHON) -m pip install --quiet --disable-pip-version-check 'uv>=0.5,<1'

$(BUILD_STAMP): | $(UV)
	$(call pip_install,build,$(BUILD_REQUIREMENTS))

$(DEMO_STAMP): | $(UV)
	$(call pip_install,demo,$(DEMO_REQUIREMENTS))

$(DEV_STAMP): | $(UV)
	$(call pip_install,dev,$(DEV_REQUIREMENTS))

# The extension's release build runs beside the installs (a sub-make with two jobs), which
# then cost little (see above). maturin then installs
# only the monarch package itself (its one dependency, cloudpickle, is in the build group,
# installed before), so it touches nothing the pip beside it writes.
# (Two jobs of its own, unless it runs under a parallel make already, such as `make lint`.)
install: $(BUILD_STAMP) ## Create .venv, install every Python dependency (once), build the extension (release)
	$(MAKE) --no-print-directory $(if $(findstring jobserver,$(MAKEFLAGS)),,-j2) build-prod $(DEMO_STAMP) $(DEV_STAMP)

build-dev: $(BUILD_STAMP) ## Build the extension in debug mode into .venv (maturin develop)
	$(MATURIN_DEVELOP)

build-prod: $(BUILD_STAMP) ## Build the extension in release mode into .venv
	$(MATURIN_DEVELOP) --release

# Distributions for `pip install` (docs/install.md). The wheel holds the release extension
# (abi3: one wheel for every CPython >= 3.10), the package with its stubs, py.typed and
# manifests, and the console scripts; maturin reuses the release build of `make install`
# in target/ (seconds then) and tags the wheel manylinux for the oldest glibc its symbols
# allow. tools/dist_check.py checks what is inside and prints the size.
DIST_DIR ?= dist

.PHONY: wheel sdist

wheel: $(BUILD_STAMP) ## Build the release wheel (abi3, manylinux) into dist/ and print its size
	rm -f $(DIST_DIR)/monarch-*.whl
	$(MATURIN) build --release --interpreter $(VENV_PYTHON) --out $(DIST_DIR)
	$(VENV_PYTHON) tools/dist_check.py wheel $(DIST_DIR)/monarch-*.whl

sdist: $(BUILD_STAMP) ## Build the source distribution into dist/
	rm -f $(DIST_DIR)/monarch-*.tar.gz
	$(MATURIN) sdist --out $(DIST_DIR)
	$(VENV_PYTHON) tools/dist_check.py sdist $(DIST_DIR)/monarch-*.tar.gz

format: $(DEV_STAMP) ## Format Rust and Python sources in place
	$(CARGO) fmt --all
	$(VENV)/bin/ruff format $(PY_LINT_PATHS)

# The linters run side by side, each one's output printed together when it ends:
# clippy keeps both cores busy, mypy and stubtest one each. Measured in CI (2 cores, a
# clean clone): one after the other 262 s, side by side 183 s. On a new checkout
# stubtest's `install` runs beside them too, but no faster than before them (clippy and
# the release build take turns on target/, and both are CPU-bound).
LINT_JOBS ?= 3

lint: ## Run every linter
	$(MAKE) --no-print-directory -j$(LINT_JOBS) --output-sync=target \
		lint-rust lint-python typecheck stubtest

lint-rust: | $(VENV_PYTHON) ## cargo fmt --check and clippy with warnings denied
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

lint-python: $(DEV_STAMP) ## ruff check and ruff format --check
	$(VENV)/bin/ruff check $(PY_LINT_PATHS)
	$(VENV)/bin/ruff format --check $(PY_LINT_PATHS)

# The package with its own strictness, then the examples `make demo` runs and the Python
# code of the guides as users' code (see tests/typecheck/extract_doc_snippets.py for how a
# partial block is left out).
typecheck: $(REQ_STAMP) ## mypy: the monarch package, examples/ and the code of docs/*.md
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy examples
	$(VENV_PYTHON) tests/typecheck/extract_doc_snippets.py --mypy docs/*.md

stubtest: install ## Check the .pyi stubs against the built extension
	$(VENV_PYTHON) -m mypy.stubtest monarch._rust_bindings

test: install test-deps test-rust loom test-python ## Install everything and run the whole test suite

# What tests need beyond the venv: Slurm and munge for tests/slurm, installed when this runs
# as root; elsewhere the script says what is missing and those tests skip with the reason.
test-deps:
	-tests/slurm/install_slurm.sh
	-tests/browser/install_chromium.sh

browser-deps: ## Install Chromium and its driver for tests/browser (root)
	tests/browser/install_chromium.sh

# Hard ceilings on each half of the suite, far above its normal run time, so that a bug
# which slips past every per-test timeout still ends the run with an error, not a hang.
TEST_RUST_LIMIT ?= 1800
TEST_PYTHON_LIMIT ?= 1500

test-rust: | $(VENV_PYTHON) ## cargo test --workspace (unit, integration and doc tests)
	timeout -k 30 $(TEST_RUST_LIMIT) $(CARGO) test --workspace

# The loom models (tests named loom_*): hyperactor::sync built over the loom model checker
# (the crates' `loom` feature, so no dependency is rebuilt), exploring every interleaving,
# within loom's bounds, of ten models: the driven actor's work queue, Deferred, the
# supervision queue (failure desk), the sequencer of incoming casts, a call's reply
# collector and a relay's reply reducer.
TEST_LOOM_LIMIT ?= 900

loom: | $(VENV_PYTHON) ## Model-check the runtime's concurrent structures with loom
	timeout -k 30 $(TEST_LOOM_LIMIT) $(CARGO) test -p hyperactor -p hyperactor_mesh --features loom --lib loom_

# pytest runs in PYTEST_WORKERS processes (pytest-xdist; default: the cores, at most 4):
# most tests wait on processes they start rather than compute. Each file's tests, and each
# directory of tests that share simulated hosts or a browser, run in one worker
# (tests/conftest.py); PYTEST_WORKERS=1 runs everything in one process.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

test-python: $(REQ_STAMP) ## Run pytest (build the extension first: make install or build-dev)
	timeout -k 30 $(TEST_PYTHON_LIMIT) $(VENV_PYTHON) -m pytest \
		$(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadgroup)

# The real-Slurm tests (tests/slurm) need Debian's Slurm and munge packages; this installs
# them (root, apt-get) without starting any system daemon, and is a quick check once they
# are there. CI runs it before `make test`.
slurm-deps: ## Install Slurm and munge for tests/slurm (root; no daemon is started)
	tests/slurm/install_slurm.sh

# The Rust demos (package monarch_demos: the examples of hyperactor and hyperactor_mesh as
# programs) are built in one cargo invocation with the extension's library and with the
# environment maturin gives cargo: the same features, flags and PyO3 configuration, so
# cargo finds every crate maturin compiled for `build-prod` and compiles the demos only.
# tools/cargo_fresh.py prints cargo's messages and warns if anything else was compiled
# (a newer maturin that passes cargo something else, say).
CARGO_TARGET := $(or $(CARGO_TARGET_DIR),target)
PY_VERSION = $(shell $(VENV_PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
MATURIN_CARGO_ENV = PYO3_BUILD_EXTENSION_MODULE=1 \
	PYO3_CONFIG_FILE="$$(realpath $(CARGO_TARGET)/maturin/pyo3-config-*-$(PY_VERSION)-abi3.txt)" \
	PYO3_ENVIRONMENT_SIGNATURE=cpython-$(PY_VERSION)-64bit \
	PYO3_PYTHON=$(abspath $(VENV_PYTHON)) PYTHON_SYS_EXECUTABLE=$(abspath $(VENV_PYTHON))
DEMO_BINS := $(CARGO_TARGET)/release

# The crates only the demos use (the extension does not): the ones the demos' build may
# compile.
DEMO_ONLY_CRATES := monarch_demos anyhow
DEMO_BUILD = $(MATURIN_CARGO_ENV) $(CARGO) build --release -p monarch_extension -p monarch_demos \
	--lib --bins --message-format json-render-diagnostics | $(VENV_PYTHON) tools/cargo_fresh.py $(DEMO_ONLY_CRATES)

demo-build: build-prod ## Build the Rust demos with the extension's release build (compiles the demos only)
	$(DEMO_BUILD)

# torch is installed beside the extension's release build, as in `install`. Then the two
# quick Python demos run on an idle machine (ping_pong prints its latency); the others run
# two at a time beside the Rust demos' build (each keeps about one core busy, mostly
# starting interpreters), each demo's output printed whole when it ends; the Rust demos
# last.
DEMO_PY_PARALLEL := ddp_spmd elastic_training parameter_server distributed_tensors ddp_tensors web_crawler \
	reinforcement_learning
DEMO_PY_JOBS := $(addprefix demo-py-,$(DEMO_PY_PARALLEL))
.PHONY: demo-parallel $(DEMO_PY_JOBS)
demo: $(BUILD_STAMP) ## Install what the demos need (not the test tools), run them: Rust ping-pong and native mesh, Python tour, DDP, elastic DDP, RDMA, tensors, DDP on tensors, crawler, RL
	$(MAKE) --no-print-directory -j2 build-prod $(DEMO_STAMP)
	$(VENV_PYTHON) examples/ping_pong.py
	$(VENV_PYTHON) examples/getting_started.py
	$(MAKE) --no-print-directory -j2 --output-sync=target demo-parallel
	$(DEMO_BINS)/ping_pong
	$(DEMO_BINS)/mesh_demo

demo-parallel: demo-build-only $(DEMO_PY_JOBS)

$(DEMO_PY_JOBS): demo-py-%:
	$(VENV_PYTHON) examples/$*.py

.PHONY: demo-build-only
demo-build-only:
	$(DEMO_BUILD)

# `make bench` compares this project with upstream Monarch (PyPI `torchmonarch`) and Ray,
# each installed once into a venv of its own under $(BENCH_DIR) (ignored by git). The
# versions are pinned so runs stay comparable; changing a list reinstalls that venv.
# torchmonarch is installed with torch, as its users have it (its actor API does not
# import torch, so the numbers do not depend on it); `make bench BENCH_UPSTREAM_EXTRA=`
# leaves torch out, saving a download of several GB.
BENCH_DIR := .bench
BENCH_UPSTREAM_VENV := $(BENCH_DIR)/venv-upstream
BENCH_RAY_VENV := $(BENCH_DIR)/venv-ray
BENCH_UPSTREAM_EXTRA ?= torch
BENCH_UPSTREAM_REQ := torchmonarch==0.7.0 $(BENCH_UPSTREAM_EXTRA)
BENCH_RAY_REQ := ray==2.60.0
BENCH_UPSTREAM_STAMP := $(BENCH_UPSTREAM_VENV)/.installed-$(shell printf '%s' '$(BENCH_UPSTREAM_REQ)' | sha256sum | cut -c1-16)
BENCH_RAY_STAMP := $(BENCH_RAY_VENV)/.installed-$(shell printf '%s' '$(BENCH_RAY_REQ)' | sha256sum | cut -c1-16)
# Arguments for benches/compare.py, e.g. BENCH_ARGS="--reps 5" or "--impls ours,ray".
BENCH_ARGS ?=
# Arguments for the scale harness (hyperactor_mesh/benches/scale/), e.g.
# BENCH_SCALE_ARGS="--quick" or "--hosts 256 --real 16,64"; `--help` lists them.
BENCH_SCALE_ARGS ?=
# Arguments for benches/multihost_bench.py, e.g. BENCH_MULTIHOST_ARGS="--reps 3".
BENCH_MULTIHOST_ARGS ?=
# Arguments for benches/rdma_bench.py, e.g. BENCH_RDMA_ARGS="--no-1g" or "--no-cross".
BENCH_RDMA_ARGS ?=
# Arguments for benches/tensor_bench.py, e.g. BENCH_TENSORS_ARGS="--reps 5" or "--quick".
BENCH_TENSORS_ARGS ?=
# Arguments for benches/ddp_tensors_bench.py, e.g. BENCH_DDP_ARGS="--reps 9"; and those
# of its run across simulated hosts: the links' speed (a tc rate) and a batch whose
# backward pass takes about as long as the reductions over such links.
BENCH_DDP_ARGS ?=
BENCH_DDP_NETWORK ?= --network 1gbit --batch 1024
# Arguments for benches/recovery_bench.py, e.g. BENCH_RECOVERY_ARGS="--reps 5".
BENCH_RECOVERY_ARGS ?=
# Arguments for benches/workspace_bench.py, e.g. BENCH_WORKSPACE_ARGS="--reps 10".
BENCH_WORKSPACE_ARGS ?=

$(BENCH_UPSTREAM_STAMP):
	rm -rf $(BENCH_UPSTREAM_VENV)
	$(PYTHON) -m venv $(BENCH_UPSTREAM_VENV)
	$(BENCH_UPSTREAM_VENV)/bin/python -m pip install --quiet $(BENCH_UPSTREAM_REQ)
	touch $@

$(BENCH_RAY_STAMP):
	rm -rf $(BENCH_RAY_VENV)
	$(PYTHON) -m venv $(BENCH_RAY_VENV)
	$(BENCH_RAY_VENV)/bin/python -m pip install --quiet $(BENCH_RAY_REQ)
	touch $@

bench-peers: $(BENCH_UPSTREAM_STAMP) $(BENCH_RAY_STAMP) ## Install upstream Monarch and Ray into .bench (once)

# A peer that fails to install does not stop the run: its column says it is missing.
bench: install ## Release build; hyperactor messaging bench; ours vs upstream Monarch vs Ray
	$(CARGO) bench -p hyperactor --bench proc_messaging
	-$(MAKE) --no-print-directory -k bench-peers
	$(VENV_PYTHON) benches/compare.py $(BENCH_ARGS)
	-$(VENV_PYTHON) benches/multihost_bench.py $(BENCH_MULTIHOST_ARGS)
	-$(VENV_PYTHON) benches/rdma_bench.py $(BENCH_RDMA_ARGS)
	-$(VENV_PYTHON) benches/tensor_bench.py $(BENCH_TENSORS_ARGS)
	-$(VENV_PYTHON) benches/ddp_tensors_bench.py $(BENCH_DDP_ARGS)
	-$(VENV_PYTHON) benches/ddp_tensors_bench.py $(BENCH_DDP_NETWORK) $(BENCH_DDP_ARGS)
	-$(VENV_PYTHON) benches/recovery_bench.py $(BENCH_RECOVERY_ARGS)
	-$(VENV_PYTHON) benches/workspace_bench.py $(BENCH_WORKSPACE_ARGS)
	$(VENV_PYTHON) benches/log_bench.py
	-$(VENV_PYTHON) benches/monitoring_bench.py
	-$(VENV_PYTHON) benches/slurm_bench.py
	-$(MAKE) --no-print-directory bench-scale

# The scale harness: 1,024 simulated hosts x 8 procs through the production mesh code
# (host agents, spawn, cast tree, codec, reply reduction, supervision, stop), the hosts
# and their procs simulated by a few sim host processes, beside the same calls to 1 to
# 256 real procs (one OS process each). Rust only, no venv; release build. Prints its
# tables and writes .bench/results/scale.json (docs/benchmarks.md, "Scale: 1,024
# simulated hosts"). About 2 minutes on the 2-core VM, plus its release build.
bench-scale: ## Scale harness: 1,024 simulated hosts x 8 procs beside 1-256 real procs (Rust)
	$(CARGO) bench -p hyperactor_mesh --bench scale -- $(BENCH_SCALE_ARGS)

bench-multihost: install ## Multi-host bench, ours vs upstream, over network-namespace hosts (root)
	-$(MAKE) --no-print-directory -k bench-peers
	$(VENV_PYTHON) benches/multihost_bench.py $(BENCH_MULTIHOST_ARGS)

# The part between hosts needs root (network namespaces); without it, it is skipped and
# says why.
bench-rdma: install ## monarch.rdma bench, ours vs upstream: same host, and between namespace hosts
	-$(MAKE) --no-print-directory -k bench-peers
	$(VENV_PYTHON) benches/rdma_bench.py $(BENCH_RDMA_ARGS)

bench-tensors: install ## Distributed tensors bench: ours vs upstream, and the gloo all_reduce floor
	-$(MAKE) --no-print-directory -k bench-peers
	$(VENV_PYTHON) benches/tensor_bench.py $(BENCH_TENSORS_ARGS)

# The second run puts one proc on each of 4 network-namespace hosts with links of
# limited speed (BENCH_DDP_NETWORK; root: without it, it is skipped and says why).
bench-ddp: install ## Data-parallel tensors bench: reductions on a comms stream vs the main stream
	$(VENV_PYTHON) benches/ddp_tensors_bench.py $(BENCH_DDP_ARGS)
	$(VENV_PYTHON) benches/ddp_tensors_bench.py $(BENCH_DDP_NETWORK) $(BENCH_DDP_ARGS)

# Four network-namespace hosts (root: without it, it is skipped and says why); host 1 is
# SIGKILLed mid-run, ElasticTrainer with a warm spare against torchrun --max-restarts
# with a checkpoint every step.
bench-recovery: install ## Recovery from a lost host: monarch.recovery vs torchrun --max-restarts
	$(VENV_PYTHON) benches/recovery_bench.py $(BENCH_RECOVERY_ARGS)

# Three network-namespace hosts, each WORKSPACE_DIR a private tmpfs (root: without it,
# three workers of this host instead, and no bytes on the wire).
bench-workspace: install ## sync_workspace: 1,000 files to 3 hosts, then 10 changed (time, bytes)
	$(VENV_PYTHON) benches/workspace_bench.py $(BENCH_WORKSPACE_ARGS)

# The documentation site (mkdocs.yml, tools/docs/): the guides of docs/, the Python API
# from the docstrings and stubs (mkdocstrings, by static analysis: nothing is imported),
# the examples and the Rust API (cargo doc), into site/. Warnings, broken links and
# anchors included, fail the build. Its packages have a stamp of their own, so that the
# main requirements (and so every other target) are unaffected. `make docs DOCS_RUST=0`
# leaves out the Rust API (cargo doc: about 35 s from a tree that clippy has checked).
DOCS_REQUIREMENTS := mkdocs>=1.6,<2 mkdocstrings[python]>=0.29 pymdown-extensions pygments
DOCS_STAMP := $(VENV)/.docs-requirements-$(shell printf '%s' '$(DOCS_REQUIREMENTS)' | sha256sum | cut -c1-16)
DOCS_RUST ?= 1
CARGO_DOC_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target)/doc)
DOCS_RUST_ENV := MONARCH_DOCS_RUST=$(if $(filter 1,$(DOCS_RUST)),$(CARGO_DOC_DIR))

$(DOCS_STAMP): | $(VENV_PYTHON)
	$(VENV_PYTHON) -m pip install --quiet $(foreach r,$(DOCS_REQUIREMENTS),'$(r)')
	rm -f $(VENV)/.docs-requirements-*
	touch $@

docs: $(DOCS_STAMP) ## Build the documentation site into site/ (DOCS_RUST=0: without the Rust API)
	$(if $(filter 1,$(DOCS_RUST)),RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps)
	$(DOCS_RUST_ENV) $(VENV)/bin/mkdocs build --strict --site-dir site

.PHONY: docs-serve
docs-serve: $(DOCS_STAMP) ## Serve the documentation site on localhost:8000, rebuilt on each change
	$(if $(filter 1,$(DOCS_RUST)),$(CARGO) doc --workspace --no-deps)
	$(DOCS_RUST_ENV) $(VENV)/bin/mkdocs serve --strict

all: lint test ## Lint and test everything

clean: ## Remove build outputs and caches (keeps .venv)
	$(CARGO) clean
	rm -rf dist site .pytest_cache .ruff_cache .mypy_cache
	find python -name '*.so' -delete
	find python tests -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean ## Also remove .venv
	rm -rf $(VENV)
