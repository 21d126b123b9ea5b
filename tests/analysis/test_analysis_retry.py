"""Infrastructure errors in analysis: not scored, not in ρ or T, superseded by a rerun.

Built on the hand-worked group of test_analysis_tables (ρ = 0.5, T = {a, b},
Full 66.7, CR 100, Prune 33.3) plus retryable error rows that would change
every one of those numbers if they were counted.
"""

from __future__ import annotations

import pytest
from test_analysis_tables import BENCH, MODEL, M, main_records, rec, row, write_runs

from contextrender.analysis import tables


def retry(method: str, task: str, inp: int, cached: int = 0, **kw) -> dict:
    r = rec(method, task, inp, cached, status="error", score=0.0, **kw)
    r.update(retryable=True, score={}, error="OSError: [Errno 28] No space left on device", schema_version=2)
    return r


def records() -> list[dict]:
    recs = main_records()
    by_key = {(r["method"], r["task"]): r for r in recs}
    return [
        retry("prune", "c", 9 * M),  # superseded: the outcome below comes later in the file
        *recs,
        # a Full episode lost to a full disk: counted, its huge cached usage would move ρ, its task T
        retry("full", "d", 10 * M, 10 * M, exceeded=True),
        retry("contextrender", "a", 7 * M),  # after CR a's outcome: the outcome still wins
        retry("contextrender", "e", M),  # CR e never succeeded yet: pending, not a 0
    ] + [by_key[("prune", "c")]]  # the rerun's outcome for prune c, written again after its error


def test_retryable_errors_are_out_of_scores_rho_and_T(tmp_path):
    runs = write_runs(tmp_path / "runs", records())
    df, summary, groups, dropped = tables.build([runs])
    info = groups[(MODEL, BENCH, 6000)]
    assert info.T == {"a", "b"} and info.rho == pytest.approx(0.5)  # counting Full d: T ∪ {d}, ρ = 14/18
    full, cr, prune = row(summary, "full"), row(summary, "contextrender"), row(summary, "prune")
    assert (full["n"], full["retry"], full["perf"]) == (3, 1, pytest.approx(200 / 3))
    assert full["mean_cost_usd"] == pytest.approx(3.75)
    assert (cr["n"], cr["retry"], cr["perf"]) == (3, 1, pytest.approx(100.0))  # not 75 with e as a 0
    assert cr["mean_cost_usd"] == pytest.approx(1.875)  # CR a's 7M-token failed attempt is not its cost
    assert (prune["n"], prune["retry"], prune["error"]) == (3, 0, 0)  # the superseded error is gone
    assert dropped == 0  # superseding is not deduplication: nothing is reported as dropped
    pending = df[df["retryable"]]
    assert sorted(pending["task"]) == ["d", "e"] and pending["score"].isna().all() and not pending["in_T"].any()


def test_group_info_ignores_retryable_errors_even_without_effective_records():
    groups = tables.group_info(main_records() + [retry("full", "d", 10 * M, 10 * M, exceeded=True)])
    assert groups[(MODEL, BENCH, 6000)].T == {"a", "b"}
    assert groups[(MODEL, BENCH, 6000)].rho == pytest.approx(0.5)


def test_main_table_counts_and_explains_pending_errors(tmp_path):
    runs = write_runs(tmp_path / "runs", records())
    tables.make_tables([runs], tmp_path / "out", "main")
    md = (tmp_path / "out" / "table_main.md").read_text(encoding="utf-8")
    assert "infra errors to retry" in md and "infrastructure error" in md
    assert f"{MODEL} × {BENCH} B=6000 contextrender: 1" in md and f"{MODEL} × {BENCH} B=6000 full: 1" in md
    csv = (tmp_path / "out" / "table_main.csv").read_text(encoding="utf-8")
    assert ",retry," in csv.splitlines()[0]


def test_main_table_has_no_retry_column_when_nothing_is_pending(tmp_path):
    runs = write_runs(tmp_path / "runs", [r for r in records() if not r.get("retryable")])
    tables.make_tables([runs], tmp_path / "out", "main")
    md = (tmp_path / "out" / "table_main.md").read_text(encoding="utf-8")
    assert "infra errors to retry" not in md and "infrastructure error" not in md
    assert ",retry," not in (tmp_path / "out" / "table_main.csv").read_text(encoding="utf-8").splitlines()[0]
