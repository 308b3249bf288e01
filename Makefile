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

.PHONY: setup tools tools-demo lint-tools lint test demo demo-cluster bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

tools: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/bootstrap-tools --profile test

tools-demo: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/bootstrap-tools --profile demo

lint-tools:
	scripts/bootstrap-tools --only shellcheck

lint: setup lint-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	shellcheck -x scripts/* .ci/run

test: tools lint
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest $(PYTEST_ARGS)

demo: tools-demo
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo

# Not one of the two commands: the lifecycle on the test harness's single-node Kubernetes
# cluster through SkyPilot managed jobs (root; the tools and images of the test profile).
demo-cluster: tools
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo-cluster

bench: tools
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/cli_startup.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
