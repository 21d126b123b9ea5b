"""The paper's reported numbers (arXiv:2609.37743, Tables 2 and 4–8) as a DataFrame.

``experiments/data/paper_results.csv`` has one row per reported value:
``table, model, benchmark, method, budget, metric, value``; ``budget`` is
empty for tables that do not depend on B (the reuse-event counts of Tables 4–5).
Method names are the project's ``conf/method`` names, so a run's results can be
put beside the paper's by name.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pandas as pd

PAPER_CSV = Path(__file__).resolve().parent / "data" / "paper_results.csv"

#: Metric names of Later-Used Result Recall in Table 2 (docs/method.md §7), by age bin.
RECALL_METRIC = "later_used_recall"
RECALL_AGE_METRICS = {b: f"later_used_recall_age_{b}" for b in ("le3", "4_10", "11_25", "gt25")}


@functools.lru_cache(maxsize=1)
def _load() -> pd.DataFrame:
    df = pd.read_csv(PAPER_CSV, dtype={"table": str, "model": str, "benchmark": str, "method": str, "metric": str})
    df["budget"] = pd.to_numeric(df["budget"], errors="raise").astype("Int64")
    df["value"] = pd.to_numeric(df["value"], errors="raise").astype(float)
    return df


def paper_results() -> pd.DataFrame:
    """All reported values (a copy; safe to modify)."""
    return _load().copy()


def paper_value(table: str, model: str, benchmark: str, method: str, metric: str,
                budget: int | None = None) -> float | None:
    """One reported value, or None if the paper does not report it.

    ``budget=None`` matches a row of any budget (including none) and raises if
    that is ambiguous; a number matches only rows of exactly that budget.
    """
    df = _load()
    rows = df[(df["table"] == table) & (df["model"] == model) & (df["benchmark"] == benchmark)
              & (df["method"] == method) & (df["metric"] == metric)]
    if budget is not None:
        rows = rows[rows["budget"].eq(int(budget)).fillna(False)]
    if rows.empty:
        return None
    if len(rows) > 1:
        raise ValueError(f"{len(rows)} paper values match {table}/{model}/{benchmark}/{method}/{metric}; "
                         "pass budget=")
    value = float(rows["value"].iloc[0])
    return None if math.isnan(value) else value


__all__ = ["PAPER_CSV", "RECALL_AGE_METRICS", "RECALL_METRIC", "paper_results", "paper_value"]
