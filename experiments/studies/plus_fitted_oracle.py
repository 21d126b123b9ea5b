"""The fitted-profile study's oracle stage: the offline oracle's task score for contextrender, the profile
and its ablations, every job run by the harness's runner in this process (:mod:`.plus_fitted`)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contextrender.experiments.records.schema import effective_records
from contextrender.experiments.studies.plus_fitted_data import OUT, PLUS, ROOT, is_train, run_harness_jobs

log = logging.getLogger(__name__)

PLUS_SOURCE = ROOT / "contextrender" / "plus.py"
ORACLE_METHODS = ("contextrender", PLUS)
ORACLE_BUDGETS = (2000,)
#: benchmark -> (extra overrides, score key): all 200 BFCL long-context tasks (task accuracy), every
#: τ²-retail and τ²-airline task (pass^1), the 200 moqa8_offline tasks the trace set holds (mean F1).
ORACLE_BENCHES = {"bfcl_multi_turn": ((), "task_acc"),
                  "tau2_retail": ((), "pass"),
                  "tau2_airline": ((), "pass"),
                  "moqa8_offline": (("benchmark.n_tasks=200",), "f1")}
#: Oracle benchmark -> the trace set whose split its task ids follow (is_train of "set:task id"): the
#: oracle's mean is also reported over the TRAIN and the TEST (held-out) task ids.
ORACLE_SPLIT = {"bfcl_multi_turn": "bfcl", "tau2_retail": "tau2_retail", "moqa8_offline": "moqa"}
#: Benchmarks that run only some rows (moqa8_offline: what the call prior, which acts there, changes).
ORACLE_BENCH_ROWS = {"moqa8_offline": ("contextrender", PLUS, "plus −call prior")}
#: Oracle ablations of contextrender_plus: the prior (what changes which results are shown) and the
#: context-only switches (tabular forms, stubs, compacted omitted results: they never change recall).
ORACLE_ABLATIONS = {"plus −prior": (PLUS, ("method.prior_weight=0", "method.session_prior=0")),
                    "plus −session prior": (PLUS, ("method.session_prior=0",)),
                    "plus −call prior": (PLUS, ("method.use_call_prior=false",)),
                    "plus −tabular": (PLUS, ("method.tabular=false",)),
                    "plus −tabular −stubs −compact omitted": (PLUS, (
                        "method.tabular=false", "method.compact_omitted=false", "method.stubs=false"))}


def code_key(method: str) -> str:
    """A digest of a method's config and of every policy source file it could run.

    The runner resumes by task key, so oracle records live in a directory named by this
    digest: records of an earlier configuration or earlier code are never reused.
    """
    h = hashlib.sha256((ROOT / "conf" / "method" / f"{method}.yaml").read_bytes())
    for pkg in ("contextrender", "baselines"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == PLUS_SOURCE and method != PLUS:
                continue  # only the plus runs it
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:10]


def oracle_run_dirs(rows: Mapping[str, tuple[str, Sequence[str]]],
                    jobs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Path]:
    """(benchmark, row label) -> the run directory of its records: the row's method and a digest of its
    code (:func:`code_key`) and overrides, so a changed row never resumes from another's records."""
    tags = {label: code_key(m) + (("-" + hashlib.sha256("\n".join(over).encode()).hexdigest()[:6]) if over else "")
            for label, (m, over) in rows.items()}
    return {(bench, label): OUT / "runs" / f"oracle_{bench}" / f"{rows[label][0]}-{tags[label]}"
            for bench, label in jobs}


def oracle_cell(run_dir: Path, bench: str, method: str, budget: int) -> dict[str, Any]:
    """One row's score at one budget, from its records: tasks, metric, mean (%), and on the benchmarks of
    :data:`ORACLE_SPLIT` the tasks and mean of the TRAIN and the TEST task ids."""
    key = ORACLE_BENCHES[bench][1]
    recs = []
    for p in (run_dir / "records").glob(f"*__{method}__B{budget}.jsonl"):
        recs += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    # one record per task, the retry rule's (a rerun after an infrastructure error replaces it); failures 0
    score = {str(r["task"]): float((r.get("score") or {}).get(key, 0.0) or 0.0) for r in effective_records(recs)}
    cell: dict[str, Any] = {"tasks": len(score), "metric": key,
                            "mean": 100 * float(np.mean(list(score.values()))) if score else None}
    if bench in ORACLE_SPLIT:
        for part, want in (("train", True), ("test", False)):
            vals = [v for t, v in score.items() if is_train(f"{ORACLE_SPLIT[bench]}:{t}") == want]
            cell[f"{part}_tasks"] = len(vals)
            cell[f"{part}_mean"] = 100 * float(np.mean(vals)) if vals else None
    return cell


def oracle(methods: Sequence[str] = ORACLE_METHODS, budgets: Sequence[int] = ORACLE_BUDGETS,
           ablations: Mapping[str, tuple[str, Sequence[str]]] = ORACLE_ABLATIONS,
           workers: int = 1, benches: Sequence[str] | None = None) -> dict[str, Any]:
    """Oracle task score of every method (and ablation) at every budget on the offline benchmarks: one
    harness job per benchmark, row and budget, run in this process (``workers`` > 1: that many worker
    processes, :func:`~.plus_fitted_data.run_harness_jobs`). On the benchmarks of :data:`ORACLE_SPLIT` the
    means over their TRAIN and TEST task ids are reported too."""
    benches = list(ORACLE_BENCHES) if benches is None else list(benches)
    rows = {m: (m, ()) for m in methods} | dict(ablations)
    jobs = [(bench, label) for bench in benches for label in rows
            if bench not in ORACLE_BENCH_ROWS or label in ORACLE_BENCH_ROWS[bench]]
    run_dir = oracle_run_dirs(rows, jobs)
    overrides = [[f"method={rows[label][0]}", f"benchmark={bench}", f"budget={b}", "experiment_name=plus_oracle",
                  f"run_dir={run_dir[(bench, label)]}", *ORACLE_BENCHES[bench][0], *rows[label][1]]
                 for bench, label in jobs for b in budgets]
    run_harness_jobs(overrides, workers)
    log.info("oracle: %d jobs done", len(overrides))
    out: dict[str, Any] = {}
    for bench, label in jobs:
        for b in budgets:
            cell = oracle_cell(run_dir[(bench, label)], bench, rows[label][0], b)
            out.setdefault(bench, {}).setdefault(label, {})[str(b)] = cell
    return out
