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

.PHONY: setup tools tools-demo prepare-test prepare-demo lint-tools lint test demo bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

tools:
	scripts/bootstrap-tools --profile test

tools-demo:
	scripts/bootstrap-tools --profile demo

# The venv and the tools do not depend on each other: on a fresh machine pip's downloads and the
# Go builds overlap instead of running one after the other.
prepare-test:
	$(MAKE) --no-print-directory -j2 setup tools

prepare-demo:
	$(MAKE) --no-print-directory -j2 setup tools-demo

lint-tools:
	scripts/bootstrap-tools --only shellcheck

lint: setup lint-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m tests.import_graph
	shellcheck -x $(shell find scripts -type f | sort) .ci/run

test: prepare-test lint
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest $(PYTEST_ARGS)

demo: prepare-demo
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo

bench: prepare-test
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/cli_startup.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
