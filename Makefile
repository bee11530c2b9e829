# sglang-detspec developer targets. `make demo` runs the main job, `make test` the CPU suite.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.detspec-installed

.PHONY: setup test demo

setup: $(STAMP)

# Idempotent: the first run installs SGLang (about 11 GB); later runs reuse the venv
# and only reinstall when pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest test/registered/unit -q

demo: setup
	$(BIN)/detspec audit

.PHONY: test-gpu bench

# GPU kernel suite (needs CUDA + Triton); uses the venv's python when there is one.
test-gpu:
	DETSPEC_PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) bash scripts/gpu_kernel_suite.sh

# Draft sampler / verifier benchmark on a CUDA GPU: writes docs/benchmarks/draft_sampling.{md,json,png}.
bench:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) benchmark/bench_draft_sampling.py

.PHONY: test-e2e

# End-to-end suites against real SGLang servers (test/registered/e2e): needs a CUDA GPU and
# SGLang's `sglang` command; skipped, with the reason, elsewhere. Results: $DETSPEC_E2E_OUT.
test-e2e: setup
	$(BIN)/python -m pytest test/registered/e2e -v
