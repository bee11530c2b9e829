# sglang-detspec developer targets. `make demo` runs the main job, `make test` the CPU suite.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.detspec-installed
# The demo needs no SGLang: a light venv with torch, transformers and rich runs it.
DEMO_VENV := .venv-demo
DEMO_BIN := $(DEMO_VENV)/bin
DEMO_STAMP := $(DEMO_VENV)/.detspec-installed
# The versions SGLang 0.5.23 pins, so the demo runs on the stack the test suite runs on
# (test_light_install.py checks them against SGLang's metadata).
DEMO_DEPS := torch==2.14.1 transformers==5.19.0 rich requests
# Another package index for torch alone, e.g. PyTorch's CPU wheel index (a CPU-only torch,
# about 0.2 GB instead of about 3 GB of CUDA wheels). Empty: the default index.
TORCH_INDEX ?=
PIP_PROGRESS := --progress-bar on
# The full install's size on disk, GiB: `make setup` refuses to start an install with less free.
SETUP_FREE_GB ?= 11
ifneq ($(word 2,$(VENV)),)
$(error VENV must be a path without spaces, got '$(VENV)')
endif

.PHONY: help setup demo-setup test demo demo-light

# A bare `make` explains the targets instead of starting the full install.
.DEFAULT_GOAL := help
help:
	@echo "sglang-detspec targets (venvs from $(PYTHON); PYTHON=python3.x picks another):"
	@echo "  make demo        the main job: detspec audit on embedded tiny models"
	@echo "  make test        the CPU test suite (installs SGLang 0.5.23, about $(SETUP_FREE_GB) GiB)"
	@echo "  make setup       only the full install (.venv: package, SGLang, tests)"
	@echo "  make demo-light  the demo from the light venv even when .venv exists"
	@echo "  make test-gpu    the Triton kernel suite (CUDA GPU)"
	@echo "  make test-e2e    the suites that launch real SGLang servers (CUDA GPU)"
	@echo "  make bench       the kernel benchmark (CUDA GPU)"
	@echo "  make bench-serving  the end-to-end serving benchmark (two H200 GPUs; results in OUT)"
	@echo "  make bench-serving-report RESULTS=<folder>  tables and plots of a serving run"
	@echo "  make bench-serving-report RESULTS=\"<f1> <f2>\" REPORT_OUT=<folder>  one report of several commands"
	@echo "  make docs-hooks  regenerate docs/plugin.md's hook table from the plugin's hook table"

# The interpreter the venvs are built from: a clear error instead of make's "Error 127".
PYTHON_CHECK = command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found: install Python 3.11, or \
	pass another interpreter, e.g. make $(MAKECMDGOALS) PYTHON=python3" >&2; exit 2; }

setup: $(STAMP)

# Idempotent: the first run installs SGLang; later runs reuse the venv and only reinstall
# when pyproject.toml changes.
$(STAMP): pyproject.toml
	@[ -e "$(STAMP)" ] || bash scripts/setup_space_check.sh "$(VENV)" "$(SETUP_FREE_GB)"
	@echo "== make setup: installing sglang-detspec into $(VENV) with sglang==0.5.23, torch 2.14.1 (CUDA"
	@echo "   build) and about 220 other packages: about $(SETUP_FREE_GB) GiB on disk, several minutes the first"
	@echo "   time; pip's progress follows. Later runs reuse $(VENV)."
	@test -x $(BIN)/python || { $(PYTHON_CHECK); }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_PROGRESS) --upgrade pip
	$(BIN)/python -m pip install $(PIP_PROGRESS) -e '.[test,bench]'
	touch $(STAMP)

demo-setup: $(DEMO_STAMP)

# With TORCH_INDEX set, the index must answer before pip runs: pip would otherwise retry it for
# minutes and then blame a missing dependency.
# Any Python runs the check: the demo venv's once it exists, else $(PYTHON) (the tests set it).
# Only a connection failure stops make: an index that answers with an HTTP error (a login) is pip's business.
INDEX_CHECK_PYTHON ?= $(if $(wildcard $(DEMO_BIN)/python),$(DEMO_BIN)/python,$(PYTHON))
TORCH_INDEX_CHECK = $(INDEX_CHECK_PYTHON) -c "import sys, urllib.error as e, urllib.request as r; exec('try: r.urlopen(sys.argv[1], timeout=15)\nexcept e.HTTPError: pass')" \
	'$(patsubst %/,%,$(TORCH_INDEX))/torch/' >/dev/null 2>&1 || { echo "make demo: TORCH_INDEX=$(TORCH_INDEX) cannot be reached from this machine;" >&2; \
	echo "   run make demo without TORCH_INDEX (torch from the default index: about 3 GB of CUDA wheels)" >&2; exit 2; }

# The package without its dependencies (SGLang) plus what the in-process demo imports.
$(DEMO_STAMP): pyproject.toml Makefile
	@test -x $(DEMO_BIN)/python || { $(PYTHON_CHECK); }
	@$(if $(TORCH_INDEX),$(TORCH_INDEX_CHECK))
	@echo "== make demo: installing the light demo venv $(DEMO_VENV): $(DEMO_DEPS) and"
	@echo "   sglang-detspec without SGLang: torch from $(if $(TORCH_INDEX),$(TORCH_INDEX),the default index) (about"
	@echo "   3 GB of CUDA wheels from the default index, about 0.2 GB from a CPU wheel index), about 2-4 minutes"
	@echo "   the first time; pip's progress follows. Later runs reuse $(DEMO_VENV)."
	test -x $(DEMO_BIN)/python || $(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_BIN)/python -m pip install $(PIP_PROGRESS) --upgrade pip
	$(DEMO_BIN)/python -m pip install $(PIP_PROGRESS) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) \
		$(filter torch==%,$(DEMO_DEPS))
	$(DEMO_BIN)/python -m pip install $(PIP_PROGRESS) $(filter-out torch==%,$(DEMO_DEPS))
	$(DEMO_BIN)/python -m pip install $(PIP_PROGRESS) --no-deps -e .
	touch $(DEMO_STAMP)

test: setup
	$(BIN)/python -m pytest test/registered/unit -q

# From the full venv when `make setup` / `make test` built it, else from the light one.
demo: $(if $(wildcard $(STAMP)),setup,demo-setup)
	$(if $(wildcard $(STAMP)),$(BIN),$(DEMO_BIN))/detspec audit --require-control-variation

# Always from the light venv: what a fresh machine runs.
demo-light: demo-setup
	$(DEMO_BIN)/detspec audit --require-control-variation

.PHONY: test-gpu bench

# test-gpu and test-e2e on a machine without a CUDA GPU (or torch, or Triton): nothing runs,
# the closing lines say so and why, and the exit status is 5, pytest's "no tests ran"
# (test/registered/conftest.py); a run whose tests all skipped ends the same way.

# GPU kernel suite (needs CUDA + Triton); uses the venv's python when there is one.
test-gpu:
	DETSPEC_PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) bash scripts/gpu_kernel_suite.sh

# Draft sampler / verifier benchmark on a CUDA GPU: writes docs/benchmarks/draft_sampling.{md,json,png}.
bench:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) benchmark/bench_draft_sampling.py

.PHONY: test-e2e

# End-to-end suites against real SGLang servers (test/registered/e2e): needs a CUDA GPU and
# SGLang's `sglang` command. Results: $DETSPEC_E2E_OUT. Without a GPU (nvidia-smi lists none and
# there is no /dev/nvidia*) it stops before the 11 GB install, with pytest's "no tests ran" status like test-gpu.
test-e2e:
	@{ nvidia-smi -L 2>/dev/null | grep -q '^GPU'; } || ls /dev/nvidia[0-9]* >/dev/null 2>&1 || { \
		echo "make test-e2e: nothing ran, nothing installed: no CUDA GPU here (nvidia-smi lists none, no" \
			"/dev/nvidia*), and the end-to-end suites launch real SGLang servers (the CPU suite: make test)" >&2; \
		exit 5; }
	$(MAKE) setup
	$(BIN)/python -m pytest test/registered/e2e -v

.PHONY: bench-serving bench-serving-report docs-hooks

# docs/plugin.md's hook table, written from sglang_plugin.hook_table() (a unit test fails when they differ).
docs-hooks: $(STAMP)
	PYTHONPATH=python $(BIN)/python scripts/gen_hook_doc.py

# End-to-end serving benchmark at 8B scale on a two-GPU H200 machine after the wheel install
# (docs/benchmarks/serving/README.md): results in $(OUT).
bench-serving:
	OUT=$${OUT:-/tmp/detspec-serving} bash benchmark/serving/run_h200.sh

# Tables and plots from a results folder: make bench-serving-report RESULTS=docs/benchmarks/serving/<run>
# Several folders (one per command) make one report in REPORT_OUT: RESULTS="<f1> <f2>" REPORT_OUT=<folder>.
# Needs only Python (matplotlib for the plots, else they are skipped with a note): no set-up.
bench-serving-report:
	@[ -n "$(RESULTS)" ] || { echo "make bench-serving-report: set RESULTS to a results folder, e.g." \
		"make bench-serving-report RESULTS=docs/benchmarks/serving/2026-12-01-h200-x2" >&2; exit 2; }
	$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) benchmark/serving/serving_report.py $(RESULTS) \
		$(if $(REPORT_OUT),--out $(REPORT_OUT))
