# ContextRender harness. `make help` lists the targets.
SHELL := /bin/bash
PY    ?= .venv/bin/python
STAMP := .venv/.installed-$(shell cat requirements.lock requirements-nodeps.txt pyproject.toml | sha1sum | cut -c1-10)
MODEL ?= oracle
BENCHMARK ?= bfcl_multi_turn
BUDGET ?=
ARGS ?=

.PHONY: help setup demo test check bench reproduce-table1 ablation sweep tables plots clean

help: ## list targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv with the pinned, offline-installable dependency set

$(STAMP): requirements.lock requirements-nodeps.txt pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	rm -f .venv/.installed-*; touch $@

demo: setup ## record a short transcript and show what ContextRender renders under a budget, and why
	$(PY) -m experiments.demo $(ARGS)

test: setup ## run the test suite (offline; `live` tests skip without API keys)
	$(PY) -m pytest -q $(ARGS)

check: setup ## lint and type-check
	$(PY) -m ruff check contextrender baselines experiments analysis tests
	$(PY) -m mypy contextrender

bench: setup ## per-invocation overhead at 100/1k/10k results → results/bench/overhead.json
	$(PY) -m experiments.bench $(ARGS)

clean: ## remove caches and raw run directories (keeps committed results)
	rm -rf .pytest_cache .hypothesis outputs multirun results/runs
