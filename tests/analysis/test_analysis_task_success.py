"""The task-success verdict (analysis/task_success.py): per cell, the plus against every other budgeted method."""

from __future__ import annotations

import math

import pandas as pd

from contextrender.analysis import task_success as ts


def _frame(rows: list[tuple[str, int, str, float, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"benchmark": b, "budget": B, "method": m, "pass_strict": ps, "pass_reread": pr,
                          "cost_strict": cs, "cost_reread": cr, "rereads_per_task": 0.0, "synthetic": False}
                         for b, B, m, ps, pr, cs, cr in rows])


def test_the_verdict_compares_only_cells_where_others_ran_and_says_which_lack_them() -> None:
    nan = math.nan
    frame = _frame([
        ("tau2_retail", 2000, "full", 100.0, 100.0, 1.0, 1.0),
        ("tau2_retail", 2000, "prune", 82.5, 96.5, 0.94, 1.02),
        ("tau2_retail", 2000, "contextrender", 71.9, 95.6, 0.95, 1.05),
        ("tau2_retail", 2000, ts.PLUS, 93.0, 95.0, 0.95, 0.97),  # reread: below prune's 96.5
        ("tau2_airline", 4000, "full", 100.0, 100.0, 1.0, 1.0),
        ("tau2_airline", 4000, ts.PLUS, 100.0, 100.0, 0.99, 0.99),  # nobody else ran here
        ("bfcl", 2000, "prune", 81.0, nan, 0.43, nan),
        ("bfcl", 2000, ts.PLUS, 100.0, nan, 0.58, nan),  # strict only; costlier than prune + 0.05
    ])
    v = ts.verdict_frame(frame)
    cell = {(r.benchmark, r.mode): r for r in v.itertuples()}
    assert cell[("tau2_retail", "strict")].plus_at_least_every_other
    assert not cell[("tau2_retail", "reread")].plus_at_least_every_other
    assert cell[("tau2_retail", "reread")].best_other == "prune"
    assert cell[("tau2_airline", "strict")].methods_compared == 0
    assert not cell[("bfcl", "strict")].plus_cost_within
    notes = ts.verdict_table(v).notes
    # 3 cells with others (retail ×2, bfcl strict; bfcl reread has no pass for anyone): 2 wins; cost 1 of 3
    assert notes[0].startswith("contextrender_plus passes at least as many tasks as every other budgeted method "
                               "in 2 of the 3 cells")
    assert "within 0.05 of Prune's or lower in 2 of the 3 where Prune ran" in notes[0]
    assert "No other method has records yet in: " in notes[0] and "tau2_airline B=4000 strict" in notes[0]
    assert any(n.startswith("tau2_retail B=2000 reread: prune passes 96.5") for n in notes)
