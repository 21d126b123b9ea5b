"""The fitted-profile study's report: its prose is generated from the data it reports, and its oracle stage
runs the harness in this process."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path
from typing import Any

import pytest

from contextrender.experiments.evaluation.recall import AGE_BINS
from contextrender.experiments.studies import plus_fitted_evaluate as ev
from contextrender.experiments.studies import plus_fitted_fit as fit
from contextrender.experiments.studies import plus_fitted_oracle as orc_mod
from contextrender.experiments.studies import plus_fitted_report as rep
from contextrender.experiments.studies.plus_fitted_data import CEILING, CEILINGS, PLUS

PROSE_CEILING = next(k for k, v in CEILINGS.items() if v)


def _m(recall: float, by_age: dict[str, float | None] | None = None, **extra: Any) -> dict[str, Any]:
    ages = dict.fromkeys(AGE_BINS) | (by_age or {"le3": recall})
    return {"recall": recall, "recall_by_age": ages, "over_budget_renders": 0, **extra}


def _replay(traces: int, events: int, methods: dict[str, Any]) -> dict[str, Any]:
    return {"traces": traces, "events": events, "events_by_age": {**dict.fromkeys(AGE_BINS, 0), "le3": events},
            "methods": methods}


def _data() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A small study result with distinct numbers: ``alpha`` fitted on (train half), ``omega`` never."""
    alpha = {PLUS: _m(90.0), rep.SESSION_ROW: _m(89.0), rep.TRIM_ROW: _m(90.0), "contextrender": _m(80.0),
             CEILING: _m(95.0, reference=True), PROSE_CEILING: _m(95.0, reference=True)}
    omega = {PLUS: _m(60.0), rep.SESSION_ROW: _m(60.0, {"le3": 61.0}), rep.TRIM_ROW: _m(60.0),
             "contextrender": _m(50.0), CEILING: _m(70.0, reference=True), PROSE_CEILING: _m(70.0, reference=True)}
    evald = {"alpha": {"2000": _replay(12, 200, alpha)}, "omega": {"2000": _replay(7, 40, omega)}}
    other = {"alpha": {"1000": _replay(12, 200, {PLUS: _m(30.0), "contextrender": _m(20.0),
                                                 CEILING: _m(40.0, reference=True),
                                                 PROSE_CEILING: _m(41.0, reference=True)})}}
    fitted = {"params": {"prior_weight": 4.0}, "train_objective": 71.25, "fit_budgets": [2000],
              "fit_sets": ["alpha"], "train_tasks": {"alpha": 11}, "prior_default": 0.0415,
              "tool_prior": {"lookup": 0.61, "noisy": 0.0, "listing": 0.0005, "search": 0.07, "act": 0.2},
              "session_history": [{"session_prior": w, "train_recall": {"mean": m}}
                                  for w, m in ((0.0, 70.5), (1.0, 71.25), (2.0, 69.0))],
              "prior_min_age": 1, "budget": 2000, "task_score_bench": "benchA", "task_score_train_tasks": 9,
              "train_task_score": {"contextrender": 80.0, "plus, prior_min_age 0": 79.0,
                                   "plus, prior_min_age 1": 82.0},
              "train_recall": {"plus, prior_min_age 0": {"mean": 60.0}, "plus, prior_min_age 1": {"mean": 55.5}}}
    cell = {"tasks": 8, "metric": "pass"}
    orc = {"benchA": {"contextrender": {"2000": {**cell, "mean": 50.0, "test_mean": 40.0}},
                      PLUS: {"2000": {**cell, "mean": 62.5, "test_mean": 45.0}},
                      "plus −tabular": {"2000": {**cell, "mean": 50.0, "test_mean": 40.0}},
                      rep.ORACLE_SESSION_ROW: {"2000": {**cell, "mean": 62.5, "test_mean": 45.0}}}}
    return evald, fitted, orc, other


def _notes(md: str) -> str:
    return md.split("## Notes", 1)[1]


def test_the_notes_state_what_the_data_holds():
    evald, fitted, orc, other = _data()
    notes = _notes(rep.report(evald, fitted, orc, other))
    # (95 − 90) % of 200 events; omega's 10 points of 40 events
    assert "(held-out B=2000, events): alpha 10 of 200, omega 4 of 40." in notes
    assert "Never fitted on, reported whole (B=2000): omega (7 traces): contextrender 50.0, plus 60.0, " \
           "ceiling 70.0 (50 % of the gap)." in notes
    assert "1.0 has the best train mean, 71.25, 0.75 points above the next, 70.50 at 0.0" in notes
    assert "recall totals change on: alpha 90.0 → 89.0; only the split by age changes on: omega" in notes
    assert "oracle scores change on: none" in notes
    assert "prior_min_age 1, chosen by the select stage" in notes and "below that floor: 0 (79.0)" in notes
    assert "benchA train-task score (9 tasks) is not below contextrender's 80.0" in notes
    assert "plus −tabular: benchA -12.5" in notes and "plus vs contextrender: benchA 45.0 vs 40.0" in notes
    assert "Never reused on train: noisy; lowest above them: listing 0.0005, search 0.07, act 0.2." in notes
    assert "without it (the `plus −prose-first trim` rows, B=2000) recall changes on: none" in notes
    assert "differs from the first ceiling, at every budget reported, on: alpha B=1000 40.0 → 41.0." in notes
    assert "mean F1" not in rep.report(evald, fitted, orc, other)  # only the benchmark's own metric is named
    assert "benchA: pass^1 % (8 tasks)" in rep.report(evald, fitted, orc, other)


def test_the_notes_follow_the_data():
    """Change the data and the sentences change with it: nothing in them is kept by hand."""
    evald, fitted, orc, other = _data()
    before = _notes(rep.report(evald, fitted, orc, other))
    evald2, fitted2, orc2 = copy.deepcopy(evald), copy.deepcopy(fitted), copy.deepcopy(orc)
    evald2["alpha"]["2000"]["methods"][CEILING]["recall"] = 97.5
    fitted2["session_history"][2]["train_recall"]["mean"] = 75.0
    orc2["benchA"]["plus −tabular"]["2000"]["mean"] = 60.0
    after = _notes(rep.report(evald2, fitted2, orc2, other))
    assert before != after
    assert "alpha 15 of 200" in after and "alpha 10 of 200" not in after
    assert "2.0 has the best train mean, 75.00, 3.75 points above the next, 71.25 at 1.0" in after
    assert "plus −tabular: benchA -2.5" in after
    # the acceptance verdict reads the same rows: alpha's share of the gap moved from 67 % to 57 %
    assert "alpha 67 %" in before and "alpha 57 %" in after


def test_the_report_keeps_no_numbers_of_its_own():
    """No string of the report's code holds a number: every figure is formatted from data or from a
    named parameter of the computation (the target, the bootstrap's draws), never typed into prose."""
    path = Path(rep.__file__)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            skip.update(id(n) for n in ast.walk(node.format_spec))  # {x:.1f}: a format, not a number
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))  # docstrings
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_plot"):
            skip.update(id(n) for n in ast.walk(node))  # the figure's colours and sizes are not prose
    # names that carry digits: the evaluation's and the oracle's row names and score keys (data keys), an
    # encoding; in prose, docs/method.md §7, pass^1 and F1
    names = {*ev.eval_specs(), *orc_mod.ORACLE_ABLATIONS, *(f"plus, prior_min_age {a}" for a in fit.AGE_CHOICES),
             *rep.METRIC_NAMES, "utf-8"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in names:
                continue
            text = re.sub(r"\{[^{}]*\}", "", node.value)  # "{:.0f} %" templates
            text = text.replace("§7", "").replace("pass^1", "").replace("F1", "")
            if re.search(r"[0-9]", text):
                found.append((node.lineno, node.value))
    assert not found, found


def test_the_report_stage_writes_the_three_outputs(tmp_path):
    import json

    evald, fitted, orc, other = _data()
    for name, d in (("plus_recall.json", evald), ("oracle.json", orc), ("plus_budgets.json", other)):
        (tmp_path / name).write_text(json.dumps(d))
    md = rep.write_outputs(tmp_path, fitted)
    assert (tmp_path / "plus.md").read_text(encoding="utf-8") == md
    written = json.loads((tmp_path / "plus.json").read_text())
    assert written["recall_test"] == evald and written["oracle"] == orc and written["recall_test_other_budgets"] == other
    assert (tmp_path / "plus.png").stat().st_size > 10_000


@pytest.mark.slow
def test_the_oracle_stage_runs_the_harness_in_this_process(tmp_path, monkeypatch):
    """oracle() composes each job's config with Hydra and calls the runner here: no subprocess, the records
    land in the row's run directory under OUT, and the scores are read back from them."""
    import subprocess

    started = subprocess.Popen.__init__

    def no_entry_point(self: Any, args: Any, *a: Any, **k: Any) -> None:
        if "contextrender.experiments.run" in " ".join(map(str, args if isinstance(args, list | tuple) else [args])):
            raise AssertionError("the oracle stage must not start the harness's entry point")
        started(self, args, *a, **k)  # the runner's own `git rev-parse` for the records' git_sha

    monkeypatch.setattr(subprocess.Popen, "__init__", no_entry_point)
    monkeypatch.setattr(orc_mod, "OUT", tmp_path)
    monkeypatch.setattr(orc_mod, "ORACLE_BENCHES", {"tau2_retail": (("benchmark.limit=2",), "pass")})
    out = orc_mod.oracle(methods=("contextrender",), ablations={}, benches=("tau2_retail",))
    cell = out["tau2_retail"]["contextrender"]["2000"]
    assert cell["tasks"] == 2 and cell["metric"] == "pass" and cell["train_tasks"] + cell["test_tasks"] == 2
    runs = list((tmp_path / "runs" / "oracle_tau2_retail").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("contextrender-")
    assert list((runs[0] / "records").glob("*__contextrender__B2000.jsonl"))
