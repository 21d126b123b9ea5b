"""The expand table and figure (analysis/expand.py): the plus in strict and expand mode beside Full, per cell."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from contextrender.analysis import expand as ex
from contextrender.analysis.tables import write_table


def _summary(rows: list[tuple[str, str, str, int, float, float]]) -> pd.DataFrame:
    """(model, method, benchmark, B, pass, billed anthropic ×Full) rows, in the summary's columns."""
    return pd.DataFrame([{"model": model, "method": method, "benchmark": b, "budget": B, "metric": "pass",
                          "synthetic": False, "n": 10, "perf": perf, "billed_anthropic": billed,
                          "billed_openai": billed - 0.1, "hit_anthropic": 80.0, "hit_openai": 79.0,
                          "expansions_per_task": 1.5 if model == "oracle_expand" else 0.0}
                         for model, method, b, B, perf, billed in rows])


def test_each_cell_holds_both_modes_of_the_plus_and_full_and_nothing_else() -> None:
    frame = ex.expand_frame(_summary([
        ("oracle", "full", "tau2_retail", 1000, 100.0, 1.0),
        ("oracle", ex.PLUS, "tau2_retail", 1000, 51.8, 0.93),
        ("oracle_expand", ex.PLUS, "tau2_retail", 1000, 98.2, 1.12),
        ("oracle", "prune", "tau2_retail", 1000, 40.0, 0.9),  # another method: not in this table
        ("oracle_reread", ex.PLUS, "tau2_retail", 1000, 74.6, 0.95),  # another mode: not in this table
        ("oracle", ex.PLUS, "bfcl", 2000, 100.0, 0.45),  # strict only: the expand columns stay empty
    ]))
    assert list(frame["benchmark"]) == ["bfcl", "tau2_retail"]
    retail = frame[frame["benchmark"] == "tau2_retail"].iloc[0]
    assert (retail["full_pass_strict"], retail["pass_strict"], retail["pass_expand"]) == (100.0, 51.8, 98.2)
    assert retail["billed_anthropic_expand"] == 1.12 and math.isclose(retail["billed_openai_strict"], 0.83)
    assert retail["expansions_per_task"] == 1.5
    bfcl = frame[frame["benchmark"] == "bfcl"].iloc[0]
    assert bfcl["pass_strict"] == 100.0 and math.isnan(bfcl["pass_expand"]) and math.isnan(bfcl["full_pass_strict"])


def test_the_table_and_figure_are_written(tmp_path: Path) -> None:
    frame = ex.expand_frame(_summary([
        ("oracle", "full", "tau2_retail", B, 100.0, 1.0) for B in (1000, 2000)] + [
        (model, ex.PLUS, "tau2_retail", B, 90.0, 1.1) for model in ex.MODES for B in (1000, 2000)]))
    t = ex.expand_table(frame)
    paths = ex.fig_expand(frame, tmp_path)
    assert {p.suffix for p in paths} == {".png", ".pdf"} and all(p.stat().st_size > 0 for p in paths)
    written = write_table(t, tmp_path)
    text = next(p for p in written if p.suffix == ".md").read_text(encoding="utf-8")
    assert "| tau2_retail | 1000 | 100.0 | 90.0 | 90.0 | 1.50 | 1.100 | 1.100 | 1.000 | 1.000 | 80.0 | 79.0 |" in text
