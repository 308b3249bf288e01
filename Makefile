# Two entry points for a fresh clone (see README.md):
#   make demo  - install everything, then run the npa lifecycle on the local default
#   make test  - install everything, then lint, type-check and run every test
# Both install what they need themselves: the venv with pinned Python deps, then the external
# tools (pulumi CLI and plugin, etcd, kube-apiserver, registry) through scripts/bootstrap-tools.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TOOLS_CACHE ?= $(or $(NPA_TOOLS_CACHE),$(HOME)/.cache/npa-tools)
TOOLS_ENV := $(TOOLS_CACHE)/env.sh
PYTEST_ARGS ?=

.PHONY: setup tools lint test demo bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

tools: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/bootstrap-tools

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: tools lint
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest $(PYTEST_ARGS)

demo: tools
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo

bench: tools
	. "$(TOOLS_ENV)" && PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/cli_startup.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
