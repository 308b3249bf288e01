# Two entry points for a fresh clone (see README.md):
#   make demo  - install everything, then run the npa lifecycle on the local default
#   make test  - install everything, then lint, type-check and run every test
# Both install what they need themselves: the venv with pinned Python deps, then the external
# tools through scripts/bootstrap-tools. The demo needs only the pulumi CLI (profile demo); the
# tests need everything (profile test). `scripts/bootstrap-tools --plan` says what either would
# install or build before a long first run.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TOOLS_CACHE ?= $(or $(NPA_TOOLS_CACHE),$(HOME)/.cache/npa-tools)
TOOLS_ENV := $(TOOLS_CACHE)/env.sh
PYTEST_ARGS ?=
# pytest-xdist workers for make test, each given whole test files (--dist loadfile): every
# cluster test is in tests/integration/test_cluster_skypilot.py, which one worker runs in order
# (its first launch creates the jobs controller the rest share) while the other files run
# beside it. Files go out in collection order (not largest first), and tests/tiers.py puts the
# cluster tier first in it, so it starts at once. PYTEST_WORKERS=0 runs one process, in order.
PYTEST_WORKERS ?= 2
# One pytest command for make test and make rehearse; tests/tiers.py prints each tier's time
# and pytest the 40 longest test phases (what to look at when a run grows).
TOOLS_ON_PATH = . "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH"
PYTEST_RUN = $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40

.PHONY: setup tools tools-demo prepare-test prepare-demo lint-tools lint check test test-all rehearse demo demo-cluster bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

tools:
	scripts/bootstrap-tools --profile test --skip cluster-images

tools-demo:
	scripts/bootstrap-tools --profile demo

# The venv and the tools do not depend on each other: on a fresh machine pip's downloads and the
# Go builds overlap instead of running one after the other. The one exception is the test
# cluster's images, built for the venv's SkyPilot: that step runs alone once both are done.
prepare-test:
	$(MAKE) --no-print-directory -j2 setup tools
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/bootstrap-tools --only cluster-images

prepare-demo:
	$(MAKE) --no-print-directory -j2 setup tools-demo

lint-tools:
	scripts/bootstrap-tools --only shellcheck

lint: setup lint-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m tests.import_graph
	$(BIN)/python -m tests.names
	$(BIN)/python -m tests.complexity
	shellcheck -x $(shell find scripts -type f | sort) .ci/run

# The loop to develop in: lint, types, the structure checks and the unit tier (in process, no
# external tool; every property a small sample), in about a minute on two cores.
check: lint
	NPA_TEST_FAST=1 $(BIN)/pytest -q -n 2 -m unit tests/unit $(PYTEST_ARGS)

test: prepare-test lint
	$(TOOLS_ON_PATH) $(PYTEST_RUN) $(PYTEST_ARGS)

# make test and the tests marked opt_in: too slow for CI's 90 minutes on two cores, each passed
# for real (docs/development.md lists them).
test-all: prepare-test lint
	$(TOOLS_ON_PATH) NPA_TEST_OPT_IN=1 $(PYTEST_RUN) $(PYTEST_ARGS)

# The integration and cluster tiers with every core kept busy (scripts/load-rehearsal): run it
# before submitting work that touches supervision, watching or the test harness.
rehearse: prepare-test
	$(TOOLS_ON_PATH) scripts/load-rehearsal -- $(PYTEST_RUN) -m "integration or cluster" $(PYTEST_ARGS)

demo: prepare-demo
	$(TOOLS_ON_PATH) scripts/demo

# Not one of the two commands: the lifecycle on the test harness's two-node Kubernetes
# cluster through SkyPilot managed jobs (root; the tools and images of the test profile).
demo-cluster: prepare-test
	$(TOOLS_ON_PATH) scripts/demo-cluster

bench: prepare-test
	$(TOOLS_ON_PATH) $(BIN)/python bench/cli_startup.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
