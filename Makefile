# ContextRender harness. `make help` lists the targets.
SHELL := /bin/bash
PY    ?= .venv/bin/python
STAMP := .venv/.installed-$(shell cat requirements.lock requirements-nodeps.txt pyproject.toml | sha1sum | cut -c1-10)
MODEL ?= oracle
# Offline, the main job runs τ²-bench retail (where context management matters: reuse many turns
# later) and BFCL v4 multi-turn long-context; a paper setting names its own, e.g. BENCHMARK=appworld_test_normal.
OFFLINE_BENCHMARKS ?= tau2_retail,bfcl_multi_turn
BENCHMARK ?= $(if $(filter oracle,$(MODEL)),$(OFFLINE_BENCHMARKS),appworld_test_normal)
# The offline oracle runs in both its modes: strict (a hidden value makes a wrong call) and reread
# (the agent first reads it again, paying a call); a paper setting (an LLM) is one model.
COMMA := ,
MODELS = $(if $(filter oracle,$(MODEL)),oracle$(COMMA)oracle_reread,$(MODEL))
BUDGET ?=
ARGS ?=
# An index holding torch's CPU build, when pip's own indexes have only the CUDA one (plain PyPI on
# Linux): make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: help setup demo test check bench reproduce-table1 ablation sweep tables plots clean appworld-setup appworld-data appworld-offline plus plus-fitted task-success

help: ## list targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv with the pinned, offline-installable dependency set

$(STAMP): requirements.lock requirements-nodeps.txt pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(if $(TORCH_INDEX),$(PY) -m pip install -q --index-url $(TORCH_INDEX) "$$(grep -E '^torch==' requirements.lock)")
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	rm -f .venv/.installed-*; touch $@

demo: setup ## record a short transcript and show what ContextRender renders under a budget, and why
	$(PY) -m contextrender.experiments.studies.demo $(ARGS)

test: setup ## run the test suite (offline; `live` tests skip without API keys)
	$(PY) -m pytest -q $(ARGS)

check: setup ## lint, type-check, and the one-way import rule (scripts/check_layers.py)
	$(PY) -m ruff check contextrender baselines experiments analysis tests scripts
	$(PY) -m mypy contextrender baselines experiments analysis
	$(PY) scripts/check_layers.py --graph docs/import_graph.svg

# The replay-speed part (cold/warm replay of 200 traces × 10 methods) is the longest, a few minutes
# on 2 cores: `make bench ARGS=--skip-replay` leaves it out (also --skip-overhead, --skip-embed, --skip-embedder,
# --skip-view).
bench: setup ## overhead, embedding throughput, replay speed, the default embedder vs sentence-transformers, session view → results/bench/{overhead,replay_speed,embedder,view}.json
	$(PY) -m contextrender.experiments.studies.bench $(ARGS)

# Offline default: the context-bounded oracle on τ²-retail and BFCL v4 multi-turn long-context, B=2000.
# Paper setting: make reproduce-table1 MODEL=gpt41 BENCHMARK=appworld_test_normal BUDGET=6000
OFFLINE_BUDGET ?= 2000
RUN_BUDGET = $(if $(BUDGET),$(BUDGET),$(if $(filter oracle,$(MODEL)),$(OFFLINE_BUDGET),6000))
RUNS ?= results/runs
# Method lists come from the catalogue (conf/catalogue.yaml). Offline runs add this project's own
# methods (contextrender_plus: ours, not the paper's — marked § / "(ours)"); paper-setting runs
# (MODEL other than oracle) run the paper's methods only. Override to choose, e.g.
# TABLE1_METHODS=full,contextrender. Expanded when a recipe runs, i.e. after `setup`.
CATALOGUE = $(PY) -m contextrender.experiments.catalogue
PAPER_ONLY = $(if $(filter oracle,$(MODEL)),,--paper)
TABLE1_METHODS ?= $(shell $(CATALOGUE) table1 $(PAPER_ONLY))
SWEEP_METHODS ?= $(shell $(CATALOGUE) sweep $(PAPER_ONLY))
ABLATION_METHODS ?= $(shell $(CATALOGUE) ablation)
RECALL_METHODS ?= $(shell $(CATALOGUE) recall)

reproduce-table1: setup ## run every Table 1 method, then write results/table1.{md,csv,tex} and Figure 4
	$(PY) -m contextrender.experiments.run -m +experiment=table1 model=$(MODELS) benchmark=$(BENCHMARK) budget=$(RUN_BUDGET) method=$(TABLE1_METHODS) $(ARGS)
	$(PY) -m contextrender.analysis.tables --runs $(RUNS)/table1 --out results --table table1
	$(PY) -m contextrender.analysis.tables --runs $(RUNS)/table1 --out results --table main
	$(PY) -m contextrender.analysis.plots --runs $(RUNS)/table1 --out results --figure fig4

ablation: setup ## Table 2/3: weight ablations (task score) + later-used recall by replaying Full traces
	$(PY) -m contextrender.experiments.run -m +experiment=ablation model=$(MODELS) benchmark=$(BENCHMARK) budget=$(RUN_BUDGET) method=$(ABLATION_METHODS) $(ARGS)
	@# One replay per benchmark's Full traces (the strict oracle's: Full never re-reads, so both modes' are the same):
	@# recall is reported per benchmark, never pooled.
	set -e; recalls=""; for t in $(RUNS)/ablation/traces/*__full__B$(RUN_BUDGET).jsonl; do \
		case $$(basename $$t) in oracle_reread__*) continue;; esac; \
		b=$$(basename $$t .jsonl); b=$${b#*__}; b=$${b%%__full__B*}; \
		$(PY) -m contextrender.experiments.evaluation.replay traces=$$t budget=$(RUN_BUDGET) \
			'methods=[$(RECALL_METHODS)]' benchmark_name=$$b output=results/recall_$${b}_B$(RUN_BUDGET).json; \
		recalls="$$recalls results/recall_$${b}_B$(RUN_BUDGET).json"; done; \
	$(PY) -m contextrender.analysis.tables --runs $(RUNS)/ablation --out results --table ablation --recall $$recalls

SWEEP_BUDGETS ?= 1000,2000,4000
sweep: setup ## Figure 5: performance vs budget (SWEEP_BUDGETS=1000,2000,4000 offline)
	$(PY) -m contextrender.experiments.run -m +experiment=budget_sweep_offline model=$(MODELS) benchmark=$(BENCHMARK) budget=$(SWEEP_BUDGETS) method=$(SWEEP_METHODS) $(ARGS)
	$(PY) -m contextrender.analysis.tables --runs $(RUNS)/budget_sweep_offline --out results --table sweep
	$(PY) -m contextrender.analysis.plots --runs $(RUNS)/budget_sweep_offline --out results --figure fig5

# From the records (and the replays' recall files) already under $(RUNS) and results/: each table
# whose runs are there. The peers table comes with its figure (one command writes both).
tables: setup ## rebuild each table whose runs exist under results/runs (table1, main, ablation, sweep, peers)
	set -e; if [ -d $(RUNS)/table1/records ]; then \
		$(PY) -m contextrender.analysis.tables --runs $(RUNS)/table1 --out results --table table1; \
		$(PY) -m contextrender.analysis.tables --runs $(RUNS)/table1 --out results --table main; fi
	set -e; if [ -d $(RUNS)/ablation/records ]; then \
		recalls=$$(ls results/recall_*_B$(RUN_BUDGET).json 2>/dev/null || true); \
		$(PY) -m contextrender.analysis.tables --runs $(RUNS)/ablation --out results --table ablation \
			$${recalls:+--recall $$recalls}; fi
	set -e; if [ -d $(RUNS)/budget_sweep_offline/records ]; then \
		$(PY) -m contextrender.analysis.tables --runs $(RUNS)/budget_sweep_offline --out results --table sweep; fi
	set -e; if [ -d $(RUNS)/peers/records ]; then \
		recalls=$$(ls results/peers_recall_*_B$(PEERS_BUDGET).json 2>/dev/null || true); \
		$(PY) -m contextrender.analysis.peers --runs $(RUNS)/peers --out results $${recalls:+--recall $$recalls}; fi

plots: setup ## rebuild each figure whose runs exist under results/runs (fig4, fig5)
	set -e; if [ -d $(RUNS)/table1/records ]; then \
		$(PY) -m contextrender.analysis.plots --runs $(RUNS)/table1 --out results --figure fig4; fi
	set -e; if [ -d $(RUNS)/budget_sweep_offline/records ]; then \
		$(PY) -m contextrender.analysis.plots --runs $(RUNS)/budget_sweep_offline --out results --figure fig5; fi

plus: setup ## contextrender_plus (ours): each switch off in turn, oracle both modes + readiness → results/plus
	$(PY) -m contextrender.experiments.studies.plus $(ARGS)

plus-fitted: setup ## the OPTIONAL fitted profile contextrender_plus_fitted: fit on train traces, held-out recall → results/plus_fitted
	$(PY) -m contextrender.experiments.studies.plus_fitted $(ARGS)

# The peer strategies (catalogue group peers: every kind-peer method plus full, prune and
# contextrender) head to head under one budget, offline (oracle), then recall and the failure-mode
# measures by replaying each benchmark's Full traces with the same methods; one table, one figure.
.PHONY: peers
PEERS_METHODS ?= $(shell $(CATALOGUE) peers)
PEERS_BENCHMARKS ?= bfcl_multi_turn,tau2_retail
PEERS_BUDGET ?= 2000
peers: setup ## peers vs full/prune/contextrender (oracle, BFCL + τ²-retail, B=2000) → results/table_peers, fig_peers
	$(PY) -m contextrender.experiments.run -m +experiment=peers model=oracle,oracle_reread benchmark=$(PEERS_BENCHMARKS) \
		budget=$(PEERS_BUDGET) method=$(PEERS_METHODS) $(ARGS)
	@# One replay per benchmark's Full traces: recall and the measures are per benchmark, never pooled.
	set -e; recalls=""; for t in $(RUNS)/peers/traces/*__full__B$(PEERS_BUDGET).jsonl; do \
		case $$(basename $$t) in oracle_reread__*) continue;; esac; \
		b=$$(basename $$t .jsonl); b=$${b#*__}; b=$${b%%__full__B*}; \
		$(PY) -m contextrender.experiments.evaluation.replay traces=$$t budget=$(PEERS_BUDGET) \
			'methods=[$(PEERS_METHODS)]' benchmark_name=$$b output=results/peers_recall_$${b}_B$(PEERS_BUDGET).json; \
		recalls="$$recalls results/peers_recall_$${b}_B$(PEERS_BUDGET).json"; done; \
	$(PY) -m contextrender.analysis.peers --runs $(RUNS)/peers --out results --recall $$recalls

# Task success first: every catalogue method under both oracle modes on τ²-retail, τ²-airline and BFCL at
# B = 1000, 2000, 4000 (378 jobs, a few hours on 2 cores; rerun to resume), then one replay of each
# benchmark's Full traces per B with the same methods (call readiness, recall), one table, a verdict, a figure.
TS_METHODS ?= $(shell $(CATALOGUE) task_success)
TS_BUDGETS ?= 1000 2000 4000
task-success: setup ## every method × both oracle modes × 3 benchmarks × 3 budgets → results/table_task_success{,_verdict}, fig_task_success
	$(PY) -m contextrender.experiments.run -m +experiment=task_success $(ARGS)
	set -e; mkdir -p results/task_success; replays=""; \
	for t in $(RUNS)/task_success/traces/oracle__*__full__B2000.jsonl; do \
		b=$$(basename $$t .jsonl); b=$${b#*__}; b=$${b%%__full__B*}; \
		for B in $(TS_BUDGETS); do \
			$(PY) -m contextrender.experiments.evaluation.replay traces=$$t budget=$$B ceiling=false \
				'methods=[$(TS_METHODS)]' benchmark_name=$$b output=results/task_success/replay_$${b}_B$$B.json \
				> results/task_success/.replay.md; \
			sed '/^\[20[0-9][0-9]-[0-9][0-9]-[0-9][0-9] /d' results/task_success/.replay.md \
				> results/task_success/replay_$${b}_B$$B.md; rm -f results/task_success/.replay.md; \
			replays="$$replays results/task_success/replay_$${b}_B$$B.json"; done; done; \
	$(PY) -m contextrender.analysis.task_success --runs $(RUNS)/task_success --replays $$replays --out results

# Billed cost against B (the task-success grid's records) and against session length (its recorded
# τ²-retail Full traces chained into longer sessions, replayed at B = 2000): one table, one figure.
.PHONY: billing
billing: setup ## billed cost (anthropic, openai) vs B and vs session length → results/table_billing.md, fig_billing, billing/
	$(PY) -m contextrender.experiments.studies.billing --runs $(RUNS)/task_success --out results $(ARGS)

# The expand tool on task success (docs/method.md §16): Full and contextrender_plus, strict and expand oracle,
# 3 benchmarks × B = 1000, 2000, 4000 (36 jobs, about 30 minutes on 2 cores; rerun to resume).
.PHONY: expand
expand: setup ## contextrender_plus with the expand tool vs without, beside Full → results/expand/table_expand, fig_expand
	$(PY) -m contextrender.experiments.run -m +experiment=expand $(ARGS)
	$(PY) -m contextrender.analysis.expand --runs $(RUNS)/expand --out results/expand
	@# Replay of Full's recorded runs with the tool offered (docs/method.md §16): values one expansion away, the bill;
	@# then without it (the renders a library caller's own render gives), each request billed with the trace's tools.
	set -e; for b in tau2_retail tau2_airline bfcl_multi_turn_long_context; do \
		$(PY) -m contextrender.cli replay $(RUNS)/expand/traces/oracle__$${b}__full__B2000.jsonl --budget 2000 \
			--methods full,prune,contextrender,contextrender_plus --expand --no-ceiling \
			--output results/expand/replay_$${b}_B2000.json > results/expand/replay_$${b}_B2000.md; \
		$(PY) -m contextrender.cli replay $(RUNS)/expand/traces/oracle__$${b}__full__B2000.jsonl --budget 2000 \
			--methods full,prune,contextrender,contextrender_plus --no-ceiling \
			--output results/expand/replay_$${b}_B2000_no_tool.json > results/expand/replay_$${b}_B2000_no_tool.md; done

appworld-setup: ## create .venv-appworld (appworld==0.1.3.post1 in its own venv; PyPI needed once)
	bash scripts/setup_appworld.sh

appworld-data: appworld-setup ## download AppWorld's released data into .appworld/data (needs internet)
	APPWORLD_CACHE=$(CURDIR)/.appworld/cache .venv-appworld/bin/appworld download data --root .appworld

appworld-offline: setup appworld-setup ## synthetic AppWorld tasks (dinner bill) with the oracle at B=2000
	$(PY) -m contextrender.experiments.run -m benchmark=appworld_offline model=oracle method=full,prune,contextrender,cr_recency_relevance budget=2000 embedding=hashing $(ARGS)

clean: ## remove caches and raw run directories (keeps committed results)
	rm -rf .pytest_cache .hypothesis outputs multirun results/runs
