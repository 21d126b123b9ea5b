"""The paper's tables from episode records (docs/method.md §7): Table 1, Tables 6–8, Table 2, the budget sweep.

    python -m contextrender.analysis.tables --runs results/runs/table1 --out results [--table table1|main|ablation|sweep|all]
                              [--recall results/recall_B2000.json]

Records (``experiments.records``) become a DataFrame with one row per episode;
each row is priced with Eq. 3 (``experiments.cost``) using ρ, the cache
fraction of the Full-history records of the same model × benchmark at the same
budget B. The cost-comparison set T of a (model, benchmark, B) group is the
tasks whose Full run at B exceeded B; mean cost is over T (successes and
failures alike) and normalised cost is mean_m / mean_Full (a ratio of means).
A group without Full records gets no ρ, T or cost, and says so.

Records are read through ``experiments.records.effective_records``: one per
key, the latest outcome. An infrastructure error (``retryable: true``) that a
rerun has not yet replaced is not a task failure: it is counted (``retry``)
but left out of performance, ρ, T and mean cost until it succeeds.

Each table is written as ``<out>/<stem>.md``, ``.csv`` and ``.tex``:
``table1`` (Table 1: relative change of ContextRender vs each method),
``table_main`` (Tables 6–8), ``table_ablation`` (Tables 2–3), ``table_sweep``
(budget sweep, Figure 5). The paper's values sit beside ours where the paper
reports the same (model, benchmark, method, B) cell.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from contextrender.billing import PROFILE_MODELS, Prices, PricesUnavailable, prices
from contextrender.experiments import catalogue
from contextrender.experiments.records.cost import (
    billed_cost,
    cache_fraction,
    cache_hit_share,
    comparison_set,
    mean_cost,
    normalised_cost,
    record_cost,
    record_tokens,
    relative_change,
)
from contextrender.experiments.records.schema import (
    STATUSES,
    effective_records,
    is_retryable,
    load_records,
    mixed_config_notes,
)

FULL = "full"
CR = "contextrender"
#: the method catalogue's order (conf/catalogue.yaml); methods not in it follow alphabetically
METHOD_ORDER = catalogue.method_order()
#: methods of this project, not of the paper: marked § in every table and "(ours)" in every figure
OURS = catalogue.ours()
ABLATION_METHODS = catalogue.group("ablation")
MAIN_TABLES = ("table6", "table7", "table8")
OFFLINE_MODELS = ("oracle", "oracle_reread")
#: benchmark-name prefix → primary metric (experiments.benchmarks.base.Benchmark.primary_metric)
PRIMARY_BY_PREFIX = (("bfcl", "task_acc"), ("appworld", "tgc"), ("moqa", "f1"), ("qa", "f1"))
KNOWN_METRICS = ("task_acc", "tgc", "f1")
METRIC_LABELS = {"task_acc": "task accuracy (%)", "tgc": "TGC (%)", "f1": "F1 ×100"}
AGE_BINS = ("le3", "4_10", "11_25", "gt25")
AGE_LABELS = {"le3": "≤3", "4_10": "4–10", "11_25": "11–25", "gt25": ">25"}
#: the paper's Table 2 recall-by-age setting, used as a labelled reference when no cell matches ours
PAPER_RECALL_REFERENCE = ("gpt-4.1", "appworld_test_normal", 6000)
GROUP = ["model", "benchmark", "budget"]
INT_COLUMNS = {"budget", "n", "ok", "error", "step_limit", "cost_limit", "retry", "T", "n_T_covered"}


# -- records → DataFrame ---------------------------------------------------------------

def primary_metric(benchmark: str, score_keys: Iterable[str] = (), recorded: Iterable[str] = ()) -> str:
    """The score key the tables report for ``benchmark``.

    ``recorded``: the ``metric`` field of the benchmark's records (schema ≥ 3),
    which wins; older records fall back to the benchmark name and score keys.
    """
    named = {m for m in recorded if m}
    if len(named) == 1:
        return next(iter(named))
    if len(named) > 1:
        raise ValueError(f"{benchmark}: records name several primary metrics {sorted(named)}")
    b = benchmark.lower()
    for prefix, metric in PRIMARY_BY_PREFIX:
        if b.startswith(prefix):
            return metric
    keys = set(score_keys)
    known = [m for m in KNOWN_METRICS if m in keys]
    if len(known) == 1:
        return known[0]
    if keys:
        return sorted(keys)[0]
    return "score"


def method_sort_key(method: str) -> tuple[int, str]:
    return catalogue.sort_key(method)


def is_offline(model: str) -> bool:
    return model in OFFLINE_MODELS


def dedupe(records: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], int]:
    """Keep the last record per (model, benchmark, method, budget, task); return it and the number dropped."""
    last: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for r in records:
        last[(r["model"], r["benchmark"], r["method"], int(r["budget"]), r["task"])] = r
    return list(last.values()), len(records) - len(last)


@dataclass
class GroupInfo:
    """Cost context of one (model, benchmark, budget): ρ and T from its Full records."""

    model: str
    benchmark: str
    budget: int
    n_full: int
    rho: float | None
    T: set[str] = field(default_factory=set)
    full_mean: float | None = None
    #: per billing profile: Full's mean billed cost over T (docs/method.md §14); None where it cannot be billed
    full_billed: dict[str, float | None] = field(default_factory=dict)

    @property
    def has_full(self) -> bool:
        return self.n_full > 0

    @property
    def note(self) -> str:
        if not self.has_full:
            return (f"no Full-history records for {self.model} × {self.benchmark} at B={self.budget}: "
                    "ρ, T and cost are undefined; costs not computed or normalised")
        if not self.T:
            return (f"{self.model} × {self.benchmark} at B={self.budget}: no Full run exceeded B "
                    "(T is empty); costs not compared")
        return ""


def group_info(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, int], GroupInfo]:
    """ρ, T and the Full mean cost for each (model, benchmark, budget) present in ``records``."""
    keys = sorted({(r["model"], r["benchmark"], int(r["budget"])) for r in records})
    out = {}
    for model, bench, budget in keys:
        # docs/method.md §7: ρ and T come from Full runs; an infrastructure error is no run of the task
        full = [r for r in records if r["model"] == model and r["benchmark"] == bench
                and int(r["budget"]) == budget and r["method"] == FULL and not is_retryable(r)]
        info = GroupInfo(model, bench, budget, len(full), None)
        if full:
            info.rho = cache_fraction(full)
            info.T = comparison_set(full)
            info.full_mean = mean_cost(full, info.T, info.rho)
            info.full_billed = {p: mean_billed(full, info.T, p) for p in BILLED}
        out[(model, bench, budget)] = info
    return out


# -- billed cost (docs/method.md §14) ------------------------------------------------------------

#: The billing profiles every table shows, each at its profile's default model's prices from litellm's cost map.
BILLED = tuple(PROFILE_MODELS)


def billing_prices(profile: str) -> Prices | None:
    """The prices a profile is billed at (its default model, from the cost map); None when unavailable."""
    try:
        return prices(PROFILE_MODELS[profile])
    except PricesUnavailable as exc:
        if profile not in _WARNED:
            _WARNED.add(profile)
            print(f"warning: {exc}; billed cost under {profile!r} left blank", file=sys.stderr)
        return None


_WARNED: set[str] = set()


def mean_billed(records: Iterable[Mapping[str, Any]], tasks: set[str], profile: str) -> float | None:
    """Mean US$ over the records whose task is in T, each request billed from its own cached prefix under
    ``profile``; None when T is empty or a record in it cannot be billed (written before schema 5)."""
    p = billing_prices(profile)
    costs = [billed_cost(r, profile, p) for r in records if r["task"] in tasks] if p is not None else []
    if not costs or any(c is None for c in costs):
        return None
    return float(sum(costs)) / len(costs)


def _billed_columns(recs: Sequence[Mapping[str, Any]], info: GroupInfo) -> dict[str, Any]:
    """``billed_usd_<p>`` (mean over T), ``billed_<p>`` (×Full's, a ratio of means) and ``hit_<p>`` (the cache-hit
    share of the agent's prompt tokens, %, over all the cell's records) per profile."""
    out: dict[str, Any] = {}
    for p in BILLED:
        mean = mean_billed(recs, info.T, p) if info.T else None
        share = cache_hit_share(recs, p)
        out[f"billed_usd_{p}"] = mean
        out[f"billed_{p}"] = normalised_cost(mean, info.full_billed.get(p))
        out[f"hit_{p}"] = None if share is None else 100.0 * share
    return out


def records_frame(records: Sequence[Mapping[str, Any]],
                  groups: Mapping[tuple[str, str, int], GroupInfo] | None = None) -> pd.DataFrame:
    """One row per record: identity, status, primary score, tokens, and cost with the group's ρ.

    A retryable infrastructure error keeps its row (``retryable``) with no
    score (NaN), no cost and ``in_T`` false, so no mean counts it.
    """
    groups = group_info(records) if groups is None else groups
    keys_by_bench: dict[str, set[str]] = {}
    named_by_bench: dict[str, set[str]] = {}
    for r in records:
        keys_by_bench.setdefault(r["benchmark"], set()).update((r.get("score") or {}).keys())
        named_by_bench.setdefault(r["benchmark"], set()).add(r.get("metric") or "")
    metrics = {b: primary_metric(b, keys_by_bench[b], named_by_bench[b]) for b in keys_by_bench}
    rows = []
    for r in records:
        g = groups[(r["model"], r["benchmark"], int(r["budget"]))]
        metric = metrics[r["benchmark"]]
        p, o, e, c = record_tokens(r)
        score = (r.get("score") or {}).get(metric)
        retry = is_retryable(r)
        rows.append({
            "model": r["model"], "benchmark": r["benchmark"], "budget": int(r["budget"]), "method": r["method"],
            "task": r["task"], "status": r["status"], "metric": metric,
            # a task failure without a score scores 0; an infrastructure error has no score at all
            "score": math.nan if retry else float(score) if score is not None else 0.0,
            "retryable": retry,
            "input_tokens": p, "output_tokens": o, "embedding_tokens": e, "cached_tokens": c,
            "exceeded_budget": bool(r.get("exceeded_budget", False)),
            "rho": g.rho, "cost_usd": record_cost(r, g.rho) if g.rho is not None and not retry else math.nan,
            "in_T": r["task"] in g.T and not retry, "synthetic": bool(r.get("synthetic", False)),
            "offline": is_offline(r["model"]),
            "weights": json.dumps(r["weights"], sort_keys=True) if r.get("weights") else "",
            "key": r.get("key", ""), "record": r,
        })
    cols = ["model", "benchmark", "budget", "method", "task", "status", "metric", "score", "retryable", "input_tokens",
            "output_tokens", "embedding_tokens", "cached_tokens", "exceeded_budget", "rho", "cost_usd", "in_T",
            "synthetic", "offline", "weights", "key", "record"]
    return pd.DataFrame(rows, columns=cols)


# -- per-method summary ----------------------------------------------------------------

def _paper_cells() -> dict[tuple[str, str, str, int, str], float]:
    """(model, benchmark, method, budget, metric) → value over the paper's Tables 6–8."""
    try:
        from contextrender.experiments.paper import paper_results
        df = paper_results()
    except (ImportError, FileNotFoundError) as exc:  # the paper CSV is optional for our own numbers
        print(f"warning: paper results unavailable ({exc}); paper columns left blank", file=sys.stderr)
        return {}
    df = df[df["table"].isin(MAIN_TABLES) & df["budget"].notna()]
    return {(r.model, r.benchmark, r.method, int(r.budget), r.metric): float(r.value) for r in df.itertuples()}


def _paper_table2() -> pd.DataFrame:
    try:
        from contextrender.experiments.paper import paper_results
        df = paper_results()
    except (ImportError, FileNotFoundError):
        return pd.DataFrame(columns=["table", "model", "benchmark", "method", "budget", "metric", "value"])
    return df[df["table"] == "table2"]


def _has_rereads(summary: pd.DataFrame) -> bool:
    return "rereads_per_task" in summary and bool(summary["rereads_per_task"].notna().any())


REREAD_NOTE = ("oracle_reread: the offline oracle's reread mode — before a call that needs a value the render hid, "
               "it re-issues the earlier read-only call whose result held it (its own invocation, charged like any "
               "other, within the benchmark's step limit) and fails only when no read-only call brings the value "
               "back; 'oracle' is the strict mode (a hidden value makes a wrong call). re-reads/task: the calls it "
               "re-issued, per task (0 in strict mode).")


def _rereads(records: Sequence[Mapping[str, Any]]) -> float:
    """Mean calls per task the offline oracle re-issued to read a hidden value again (its ``reread`` mode);
    NaN when the records do not say (another model, or records written before the mode existed)."""
    counts = [r["extra"]["oracle_rereads"] for r in records if "oracle_rereads" in (r.get("extra") or {})]
    return float(sum(counts)) / len(counts) if counts else math.nan


def _expansions(records: Sequence[Mapping[str, Any]]) -> float:
    """Mean expand calls per task the offline oracle made (its ``expand`` mode, docs/method.md §16); NaN when the
    records do not say."""
    counts = [r["extra"]["oracle_expansions"] for r in records if "oracle_expansions" in (r.get("extra") or {})]
    return float(sum(counts)) / len(counts) if counts else math.nan


def summarise(df: pd.DataFrame, groups: Mapping[tuple[str, str, int], GroupInfo]) -> pd.DataFrame:
    """One row per (model, benchmark, budget, method) with our and the paper's numbers."""
    paper = _paper_cells()
    rows = []
    for (model, bench, budget, method), g in df.groupby(["model", "benchmark", "budget", "method"], sort=False):
        info = groups[(model, bench, int(budget))]
        metric = g["metric"].iloc[0]
        retry = g["retryable"].astype(bool)
        done = g[~retry]  # outcomes only: a pending infrastructure error is no result yet
        recs = list(done["record"])
        m_cost = mean_cost(recs, info.T, info.rho) if info.rho is not None else None
        status = done["status"].value_counts()
        row = {
            "model": model, "benchmark": bench, "budget": int(budget), "method": method, "metric": metric,
            "n": len(done), "perf": 100.0 * done["score"].mean() if len(done) else math.nan,
            "mean_cost_usd": m_cost, "normalised_cost": normalised_cost(m_cost, info.full_mean),
            **{s: int(status.get(s, 0)) for s in STATUSES}, "retry": int(retry.sum()),
            "rho": info.rho, "T": len(info.T) if info.has_full else None,
            "n_T_covered": int(done["in_T"].sum()) if info.has_full else None,
            "exceed_share_pct": 100.0 * len(info.T) / info.n_full if info.has_full else None,
            "paper_perf": paper.get((model, bench, method, int(budget), metric)),
            "paper_mean_cost_usd": paper.get((model, bench, method, int(budget), "mean_cost_usd")),
            "paper_normalised_cost": paper.get((model, bench, method, int(budget), "normalized_cost")),
            "offline": is_offline(model), "synthetic": bool(g["synthetic"].any()),
            "rereads_per_task": _rereads(recs),
            "expansions_per_task": _expansions(recs),
            **_billed_columns(recs, info),
            "note": info.note,
        }
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["_m"] = out["method"].map(method_sort_key)
    out = out.sort_values(["model", "benchmark", "budget", "_m"]).drop(columns="_m").reset_index(drop=True)
    return out


# -- tables ----------------------------------------------------------------------------

@dataclass
class Table:
    """A table: raw numbers (CSV), display columns and formats (md, tex), a title and notes."""

    stem: str
    title: str
    data: pd.DataFrame
    columns: list[tuple[str, str, str]]  # (data column, header, format: "s", "d", ".1f", "+pct", "usd", ...)
    notes: list[str] = field(default_factory=list)

    def display(self) -> list[list[str]]:
        """Formatted cells; the model of an offline-oracle row gets †, of a synthetic-data row ‡."""
        out = []
        for _, row in self.data.iterrows():
            cells = []
            for c, _, f in self.columns:
                cell = fmt(row[c], f)
                if c == "model":
                    cell += ("†" if _flag(row.get("offline")) else "") + ("‡" if _flag(row.get("synthetic")) else "")
                if c == "method" and row[c] in OURS:
                    cell += "§"
                cells.append(cell)
            out.append(cells)
        return out


def _flag(x: Any) -> bool:
    return not _missing(x) and bool(x)


def _missing(x: Any) -> bool:
    if x is None:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def fmt(x: Any, f: str) -> str:
    if f == "s":
        return "" if _missing(x) else str(x)
    if _missing(x):
        return "–"
    if f == "d":
        return str(int(x))
    if f == "+pct":
        return f"{x:+.1f}%"
    if f == "usd":
        return f"{x:.4f}" if x == 0 or abs(x) >= 0.001 else f"{x:.2e}"
    return format(x, f)


def _escape_md(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(t: Table) -> str:
    lines = [f"## {t.title}", ""]
    if t.data.empty:
        lines.append("_No rows._")
    else:
        aligns = ["---" if f == "s" else "---:" for _, _, f in t.columns]
        lines.append("| " + " | ".join(_escape_md(h) for _, h, _ in t.columns) + " |")
        lines.append("|" + "|".join(aligns) + "|")
        for cells in t.display():
            lines.append("| " + " | ".join(_escape_md(c) for c in cells) + " |")
    if t.notes:
        lines.append("")
        lines.extend(f"- {n}" for n in t.notes)
    return "\n".join(lines) + "\n"


_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                "≤": r"$\leq$", "×": r"$\times$", "–": "--", "—": "---", "−": "$-$", "ρ": r"$\rho$",
                "Δ": r"$\Delta$", "→": r"$\to$", "·": r"$\cdot$", "≥": r"$\geq$", "|": r"\textbar{}",
                "†": r"\dag{}", "‡": r"\ddag{}", ">": r"$>$", "<": r"$<$", "§": r"\S{}"}


def tex_escape(s: str) -> str:
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in s)


def to_latex(t: Table) -> str:
    """A booktabs ``table`` environment (needs \\usepackage{booktabs}); built by hand, no jinja2."""
    spec = "".join("l" if f == "s" else "r" for _, _, f in t.columns)
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\caption{{{tex_escape(t.title)}}}", rf"\label{{tab:{t.stem.replace('_', '-')}}}",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(tex_escape(h) for _, h, _ in t.columns) + r" \\", r"\midrule"]
    for cells in t.display():
        lines.append(" & ".join(tex_escape(c) for c in cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if t.notes:
        lines.append(r"\par\smallskip\footnotesize")
        lines.append(r" \\ ".join(tex_escape(n) for n in t.notes))
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def write_table(t: Table, out: str | Path) -> list[Path]:
    """Write ``<out>/<stem>.{md,csv,tex}``; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{t.stem}.{ext}" for ext in ("md", "csv", "tex")]
    paths[0].write_text(to_markdown(t), encoding="utf-8")
    data = t.data.drop(columns=[c for c in ("record",) if c in t.data.columns])
    if "retry" in data.columns and not pd.to_numeric(data["retry"]).fillna(0).any():
        data = data.drop(columns=["retry"])  # like the markdown: a column only while errors are pending
    for c in INT_COLUMNS & set(data.columns):  # an outer merge turns counts into floats
        data[c] = pd.to_numeric(data[c]).round().astype("Int64")
    data.to_csv(paths[1], index=False)
    paths[2].write_text(to_latex(t), encoding="utf-8")
    return paths


def setting_notes(df: pd.DataFrame) -> list[str]:
    """Labels for offline-oracle and synthetic-data records (not comparable to the paper)."""
    notes: list[str] = []
    if df.empty:
        return notes
    off = df[df["offline"]]
    if not off.empty:
        benches = ", ".join(sorted(off["benchmark"].unique()))
        models = " and ".join(f"'{m}'" for m in sorted(off["model"].unique()))
        notes.append(f"† OFFLINE: model {models} (a context-bounded script follower, not an LLM) on {benches} — "
                     "not comparable to the paper's numbers.")
        if "oracle_reread" in set(off["model"]):
            notes.append(REREAD_NOTE)
    syn = df[df["synthetic"]]
    if not syn.empty:
        benches = ", ".join(sorted(syn["benchmark"].unique()))
        notes.append(f"‡ SYNTHETIC: task data of {benches} generated by this project — "
                     "not comparable to the paper's numbers.")
    ours = sorted(set(df["method"]) & set(OURS))
    if ours:
        notes.append(f"§ OURS, NOT THE PAPER'S METHOD: {', '.join(ours)} (an experimental extension of "
                     "ContextRender; docs/method.md §13; what its switches do: results/README.md).")
    return notes


def _title_tag(df: pd.DataFrame) -> str:
    tags = []
    if not df.empty and df["offline"].any():
        tags.append("offline oracle")
    if not df.empty and df["synthetic"].any():
        tags.append("synthetic data")
    return f" [{', '.join(tags)}: not comparable to paper numbers]" if tags else ""


def _group_notes(summary: pd.DataFrame) -> list[str]:
    if summary.empty:
        return []
    return list(dict.fromkeys(n for n in summary["note"] if n))


def _retry_notes(summary: pd.DataFrame) -> list[str]:
    if summary.empty or "retry" not in summary or not summary["retry"].fillna(0).astype(int).any():
        return []
    pending = summary[summary["retry"].fillna(0).astype(int) > 0]
    cells = "; ".join(f"{r['model']} × {r['benchmark']} B={r['budget']} {r['method']}: {int(r['retry'])}"
                      for _, r in pending.iterrows())
    return [f"Episodes that ended in an infrastructure error (disk, graph I/O, model errors after retries) "
            f"are not task failures: they are left out of n, performance, ρ, T and cost until a rerun of the "
            f"job succeeds — {cells}."]


def _cost_notes() -> list[str]:
    return ["Cost: Eq. 3 with ρ = cache fraction of the Full-history records of the same model × benchmark × B; "
            "mean over T (tasks whose Full run exceeded B), successes and failures alike; "
            "normalised cost = mean_m / mean_Full (ratio of means)."]


def _has_billed(summary: pd.DataFrame) -> bool:
    return not summary.empty and any(c in summary and summary[c].notna().any() for c in
                                     (f"billed_{p}" for p in BILLED))


def billed_columns(summary: pd.DataFrame, hits: bool = True) -> list[tuple[str, str, str]]:
    """The display columns of billed cost (×Full per profile) and, with ``hits``, each profile's cache-hit share;
    none for records that cannot be billed (written before schema 5)."""
    if not _has_billed(summary):
        return []
    cols = [(f"billed_{p}", f"billed ×Full {p}", ".3f") for p in BILLED]
    if hits:
        cols += [(f"hit_{p}", f"cache hits % {p}", ".0f") for p in BILLED if p != "none"]
    return cols


def billing_note() -> str:
    """Said next to every billed figure: what it is and why it differs from Eq. 3."""
    models = ", ".join(f"{p}: {m}" for p, m in PROFILE_MODELS.items() if p != "none")
    return ("Billed ×Full (docs/method.md §14): each request billed as the provider would, from its own cached prefix "
            "— anthropic reads a cached prefix at 0.1× and writes it at 1.25× at breakpoints, openai caches "
            "automatically from 1,024 tokens in 128-token steps, none caches nothing — at the prices litellm's model "
            f"cost map gives ({models}); mean over T as a ratio of Full's. Cache hits: cached reads / prompt tokens of "
            "the agent's requests. This is the figure to believe for money: Eq. 3 (the paper's model, the norm. cost "
            "column) credits every method with Full's cache share ρ, so a method that re-renders the prefix at each "
            "call looks cheaper there than it is billed.")


def _metric_note(summary: pd.DataFrame) -> str:
    if summary.empty:
        return ""
    pairs = sorted({(b, m) for b, m in zip(summary["benchmark"], summary["metric"], strict=True)})
    return "Performance = mean primary metric ×100 over all tasks (failures score 0): " + ", ".join(
        f"{b}: {METRIC_LABELS.get(m, m)}" for b, m in pairs) + "."


def main_table(summary: pd.DataFrame, stem: str = "table_main") -> Table:
    cols = [("model", "model", "s"), ("benchmark", "benchmark", "s"), ("budget", "B", "d"),
            ("method", "method", "s"), ("n", "n", "d"), ("perf", "perf", ".1f"), ("paper_perf", "paper perf", ".1f"),
            ("mean_cost_usd", "mean cost $ (T)", "usd"), ("paper_mean_cost_usd", "paper mean cost $", "usd"),
            ("normalised_cost", "norm. cost (Eq. 3)", ".3f"), ("paper_normalised_cost", "paper norm. cost", ".3f"),
            ("ok", "ok", "d"), ("error", "error", "d"), ("step_limit", "step limit", "d"),
            ("cost_limit", "cost limit", "d"), ("T", "|T|", "d"), ("exceed_share_pct", "% tasks > B", ".1f"),
            ("rho", "ρ", ".3f")]
    if "retry" in summary and summary["retry"].fillna(0).astype(int).any():  # only while some are pending
        cols.append(("retry", "infra errors to retry", "d"))
    if _has_rereads(summary):
        cols.insert(11, ("rereads_per_task", "re-reads/task", ".2f"))
    billed = billed_columns(summary)
    at = [c[0] for c in cols].index("ok")
    cols[at:at] = billed
    notes = setting_notes(summary) + _group_notes(summary) + [_metric_note(summary)] + _cost_notes() + (
        [billing_note()] if billed else []) + [
        "Paper columns: the paper's Tables 6–8 where it reports the same (model, benchmark, method, B); "
        "blank (–) otherwise."]
    cov = summary[summary["T"].notna() & (summary["n_T_covered"] < summary["T"])] if not summary.empty else summary
    for _, r in cov.iterrows():
        notes.append(f"{r['model']} × {r['benchmark']} B={r['budget']}: {r['method']} has records for only "
                     f"{int(r['n_T_covered'])} of the {int(r['T'])} tasks in T.")
    notes += _retry_notes(summary)
    title = "Tables 6–8 analogue: performance, mean cost over T and normalised cost per method" + _title_tag(summary)
    return Table(stem, title, summary, cols, [n for n in notes if n])


def table1(summary: pd.DataFrame, stem: str = "table1") -> Table:
    """Relative change (CR − m)/m of ContextRender vs each other method, ours and the paper's."""
    rows = []
    for (model, bench, budget), g in summary.groupby(GROUP, sort=False):
        cr = g[g["method"] == CR]
        if cr.empty:
            continue
        cr = cr.iloc[0]
        for _, m in g[g["method"] != CR].iterrows():
            def pct(a: Any, b: Any) -> float | None:
                v = relative_change(None if _missing(a) else float(a), None if _missing(b) else float(b))
                return None if v is None else 100.0 * v
            rows.append({
                "model": model, "benchmark": bench, "budget": budget, "method": m["method"], "metric": m["metric"],
                "perf_cr": cr["perf"], "perf_m": m["perf"],
                "rel_perf_pct": pct(cr["perf"], m["perf"]),
                "paper_rel_perf_pct": pct(cr["paper_perf"], m["paper_perf"]),
                "cost_cr_usd": cr["mean_cost_usd"], "cost_m_usd": m["mean_cost_usd"],
                "rel_cost_pct": pct(cr["mean_cost_usd"], m["mean_cost_usd"]),
                "paper_rel_cost_pct": pct(cr["paper_mean_cost_usd"], m["paper_mean_cost_usd"]),
                **{f"rel_billed_{p}_pct": pct(cr.get(f"billed_usd_{p}"), m.get(f"billed_usd_{p}")) for p in BILLED},
                "offline": m["offline"], "synthetic": bool(cr["synthetic"] or m["synthetic"]), "note": m["note"],
            })
    data = pd.DataFrame(rows, columns=["model", "benchmark", "budget", "method", "metric", "perf_cr", "perf_m",
                                       "rel_perf_pct", "paper_rel_perf_pct", "cost_cr_usd", "cost_m_usd",
                                       "rel_cost_pct", "paper_rel_cost_pct",
                                       *(f"rel_billed_{p}_pct" for p in BILLED), "offline", "synthetic", "note"])
    cols = [("model", "model", "s"), ("benchmark", "benchmark", "s"), ("budget", "B", "d"),
            ("method", "vs method", "s"), ("perf_cr", "CR perf", ".1f"), ("perf_m", "method perf", ".1f"),
            ("rel_perf_pct", "Δ perf", "+pct"), ("paper_rel_perf_pct", "paper Δ perf", "+pct"),
            ("rel_cost_pct", "Δ mean cost (Eq. 3)", "+pct"), ("paper_rel_cost_pct", "paper Δ mean cost", "+pct")]
    billed = _has_billed(summary)
    if billed:
        cols += [(f"rel_billed_{p}_pct", f"Δ billed {p}", "+pct") for p in BILLED if p != "none"]
    notes = setting_notes(summary)
    missing_cr = [f"{k[0]} × {k[1]} B={k[2]}" for k, g in summary.groupby(GROUP, sort=False)
                  if not (g["method"] == CR).any()] if not summary.empty else []
    if missing_cr:
        notes.append("no ContextRender records (no Table 1 rows) for: " + "; ".join(missing_cr) + ".")
    notes += _group_notes(summary)
    notes += ["Δ = (CR − m)/m ×100%, for performance and for mean cost over T (negative Δ cost: CR is cheaper).",
              "Paper Δ derived from the paper's Tables 6–8 cells (performance, mean cost) of the same "
              "(model, benchmark, method, B); blank (–) where the paper has no such cell.",
              _metric_note(summary)] + _cost_notes() + (
        ["Δ billed: the same relative change of the mean billed cost over T. " + billing_note()] if billed else [])
    title = "Table 1 analogue: relative change of ContextRender vs each method" + _title_tag(summary)
    return Table(stem, title, data, cols, [n for n in notes if n])


#: Said next to every recall figure: what docs/method.md §7's recall cannot see.
RECALL_CAVEAT = ("Recall counts only tokens of ≥ 6 characters with an uppercase letter or an underscore — never "
                 "digit-only ids — and only results shown in full, so it can rank methods against their task score.")
#: Said next to every readiness figure.
READINESS_NOTE = ("call ready / trace ready (docs/method.md, \"Call readiness\"; same replay): a recorded tool call "
                  "needs each argument value (≥ 4 characters) that only earlier tool results held, and is ready "
                  "when every such value occurs as a whole token (numbers by value) anywhere in the render before it; "
                  "trace ready: the share of traces whose every such call was ready — the offline oracle's failure "
                  "rule applied to the recorded calls.")

#: The row of the hindsight ceiling in recall tables — not a policy (experiments/evaluation/ceiling.py).
CEILING = "hindsight ceiling"
CEILING_NOTE = ("hindsight ceiling: not a policy. At each turn it knows which results that turn reuses and shows "
                "the smallest of them first while they fit, under the same budget scope, verbatim trim and markers "
                "as the selectors; no selector with that scope covers more reuse events, so ceiling − method is "
                "what a better selector could still gain on these traces (experiments/evaluation/ceiling.py). "
                "A policy that drops or rewrites user and assistant messages to make room (the trimming and "
                "summarising peers, ACON) works in a wider scope and can pass it.")


def recall_entries(recall: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """A replay output's (method, summary) pairs, and the hindsight ceiling's last when the replay has it."""
    out = list(recall["methods"].items())
    if recall.get("ceiling"):
        out.append((CEILING, recall["ceiling"]))
    return out


def replay_benchmark(replay: Mapping[str, Any]) -> str | None:
    """The benchmark a replay output names: ``benchmark.name`` (replay of files), or a plain string."""
    b = replay.get("benchmark")
    if isinstance(b, Mapping):
        return b.get("name")
    return b if isinstance(b, str) else None


def load_recall(path: str | Path) -> dict[str, Any]:
    d = json.loads(Path(path).read_text(encoding="utf-8"))
    if "methods" not in d or "budget" not in d:
        raise ValueError(f"{path}: not a replay recall file (needs 'budget' and 'methods')")
    return d


def ablation_table(summary: pd.DataFrame, recall: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
                   stem: str = "table_ablation") -> Table:
    """Performance per ablation method; with ``recall`` (one replay output, or one per benchmark),
    Later-Used Result Recall overall and by age."""
    abl = summary[summary["method"].isin(ABLATION_METHODS)].copy() if not summary.empty else summary.copy()
    cols = [("model", "model", "s"), ("benchmark", "benchmark", "s"), ("budget", "B", "d"),
            ("method", "method", "s"), ("n", "n", "d"), ("perf", "perf", ".1f"), ("paper_perf", "paper perf", ".1f")]
    billed = billed_columns(abl)
    cols += billed
    notes = setting_notes(abl) + ([billing_note()] if billed else [])
    t2 = _paper_table2()

    if not abl.empty:  # Table 2's performance column (Tables 6–8 do not carry the cr_* ablations)
        abl["paper_perf"] = [p if not _missing(p) else _paper2(t2, r.model, r.benchmark, r.method, r.budget, r.metric)
                             for p, r in zip(abl["paper_perf"], abl.itertuples(), strict=True)]
    recalls = [] if recall is None else [recall] if isinstance(recall, Mapping) else list(recall)
    rec_rows: list[dict[str, Any]] = []
    for recall in recalls:  # one replay per benchmark's Full traces
        rec_rows += _ablation_recall_rows(recall, abl, t2, notes)
    if recalls:
        rec = pd.DataFrame(rec_rows)
        if abl.empty:
            abl = rec
        else:
            key = ["model", "benchmark", "budget", "method"]
            rec = rec.drop_duplicates(subset=key, keep="last")
            abl = abl.merge(rec, on=key, how="outer")
        cols += [("call_readiness", "call ready", ".1f"), ("trace_readiness", "trace ready", ".1f"),
                 ("recall", "recall", ".1f"), ("paper_recall", "paper recall", ".1f")]
        for b in AGE_BINS:
            cols += [(f"recall_{b}", f"age {AGE_LABELS[b]}", ".1f"), (f"paper_recall_{b}", "paper", ".1f")]
        cols.append(("paper_setting", "paper setting", "s"))
    if not abl.empty:
        abl["_m"] = abl["method"].map(method_sort_key)
        abl = abl.sort_values(["model", "benchmark", "budget", "_m"]).drop(columns="_m").reset_index(drop=True)
    if abl.empty or not abl["method"].isin([m for m in ABLATION_METHODS if m != FULL]).any():
        notes.append("no records of the ablation methods (cr_recency, cr_relevance, cr_recency_relevance).")
    notes += ["Ablations: ContextRender weights (W_rec, W_rel, W_reuse) — cr_recency (1,0,0), cr_relevance (0,1,0), "
              "cr_recency_relevance (1,1,0), contextrender (1,1,1); not renormalised.",
              "Paper perf: the paper's Table 2 (or Tables 6–8) where it reports the same (model, benchmark, "
              "method, B).", _metric_note(summary)]
    title = "Table 2 analogue: ContextRender ablations" + (" and Later-Used Result Recall" if recall else "") \
        + _title_tag(summary)
    if not abl.empty:  # recall-only rows (methods without records) come from the merge without flags
        abl["offline"] = abl["model"].map(is_offline)
        abl["synthetic"] = abl["synthetic"].fillna(False).astype(bool) if "synthetic" in abl else False
    return Table(stem, title, abl, cols, [n for n in notes if n])


def _paper2(t2: pd.DataFrame, model: str, bench: str, method: str, budget: int, metric: str) -> float | None:
    """The paper's Table 2 value for (model, benchmark, method, B, metric), if it reports one."""
    rows = t2[(t2["model"] == model) & (t2["benchmark"] == bench) & (t2["method"] == method)
              & (t2["metric"] == metric) & t2["budget"].eq(int(budget)).fillna(False)]
    return float(rows["value"].iloc[0]) if len(rows) else None


def _ablation_recall_rows(recall: Mapping[str, Any], abl: pd.DataFrame, t2: pd.DataFrame,
                          notes: list[str]) -> list[dict[str, Any]]:
    """One replay output's rows (readiness, recall, the paper's recall) for the ablation groups at its
    budget; its notes appended to ``notes``."""
    budget = int(recall["budget"])
    rmodel, rbench = recall.get("model"), replay_benchmark(recall)
    targets = sorted({(m, b) for m, b, bb in zip(abl["model"], abl["benchmark"], abl["budget"], strict=True)
                      if bb == budget and (rmodel is None or m == rmodel) and (rbench is None or b == rbench)})
    if not targets:
        targets = [(rmodel or "(replay)", rbench or "(replay)")]
        notes.append(f"no ablation records at the recall budget B={budget}; recall rows stand alone.")
    elif len(targets) > 1:
        notes.append(f"the recall file names no model/benchmark; its numbers are shown for every group at "
                     f"B={budget}: " + "; ".join(f"{m} × {b}" for m, b in targets) + ".")
    rrows = []
    for model, bench in targets:
        has_own = ((t2["model"] == model) & (t2["benchmark"] == bench) & t2["budget"].eq(budget).fillna(False)
                   & (t2["metric"] == "later_used_recall")).any()
        ref_setting = (model, bench, budget) if has_own else PAPER_RECALL_REFERENCE
        ref_model, ref_bench, ref_budget = ref_setting
        for method, s in recall_entries(recall):
            by_age = s.get("recall_by_age") or {}
            row = {"model": model, "benchmark": bench, "budget": budget, "method": method,
                   "call_readiness": s.get("call_readiness"), "trace_readiness": s.get("trace_readiness"),
                   "recall": s.get("recall"), **{f"recall_{b}": by_age.get(b) for b in AGE_BINS},
                   "paper_recall": _paper2(t2, ref_model, ref_bench, method, ref_budget, "later_used_recall"),
                   **{f"paper_recall_{b}": _paper2(t2, ref_model, ref_bench, method, ref_budget,
                                                   f"later_used_recall_age_{b}") for b in AGE_BINS},
                   "paper_setting": "{} / {} / B={}".format(*ref_setting)}
            rrows.append(row)
    ev = recall.get("events_by_age") or {}
    notes.append(f"Later-Used Result Recall (docs/method.md §7) from replaying recorded Full-history traces at B={budget}: "
                 f"{recall.get('events', '?')} events ("
                 + ", ".join(f"age {AGE_LABELS[b]}: {ev.get(b, '?')}" for b in AGE_BINS) + "). "
                 + RECALL_CAVEAT)
    notes.append(READINESS_NOTE)
    if recall.get("ceiling"):
        notes.append(CEILING_NOTE)
    notes.append("Paper recall columns: Table 2 of the setting named in 'paper setting' — the same "
                 "(model, benchmark, B) when the paper reports it, otherwise its reference setting "
                 f"({PAPER_RECALL_REFERENCE[0]}, {PAPER_RECALL_REFERENCE[1]}, B={PAPER_RECALL_REFERENCE[2]}), "
                 "shown for the methods' ordering only, not as comparable numbers.")
    return rrows


def sweep_table(summary: pd.DataFrame, stem: str = "table_sweep") -> Table:
    """Performance and normalised cost vs B, one row per (model, benchmark, method), one column pair per B."""
    budgets = sorted(summary["budget"].unique()) if not summary.empty else []
    rows = []
    if not summary.empty:
        for (model, bench, method), g in summary.groupby(["model", "benchmark", "method"], sort=False):
            row: dict[str, Any] = {"model": model, "benchmark": bench, "method": method}
            for b in budgets:
                r = g[g["budget"] == b]
                row[f"perf_B{b}"] = r["perf"].iloc[0] if len(r) else None
                row[f"normalised_cost_B{b}"] = r["normalised_cost"].iloc[0] if len(r) else None
                row[f"n_B{b}"] = int(r["n"].iloc[0]) if len(r) else None
                row[f"paper_perf_B{b}"] = r["paper_perf"].iloc[0] if len(r) else None
                row[f"rereads_B{b}"] = r["rereads_per_task"].iloc[0] if len(r) and "rereads_per_task" in r else None
                for p in BILLED:
                    row[f"billed_{p}_B{b}"] = r[f"billed_{p}"].iloc[0] if len(r) and f"billed_{p}" in r else None
            rows.append(row)
    data = pd.DataFrame(rows)
    if not data.empty:
        data["_m"] = data["method"].map(method_sort_key)
        data = data.sort_values(["model", "benchmark", "_m"]).drop(columns="_m").reset_index(drop=True)
        # paper columns only for budgets where the paper reports something
        for b in budgets:
            if data[f"paper_perf_B{b}"].isna().all():
                data = data.drop(columns=f"paper_perf_B{b}")
    cols = [("model", "model", "s"), ("benchmark", "benchmark", "s"), ("method", "method", "s")]
    for b in budgets:
        cols.append((f"perf_B{b}", f"perf B={b}", ".1f"))
        if f"paper_perf_B{b}" in data.columns:
            cols.append((f"paper_perf_B{b}", f"paper perf B={b}", ".1f"))
        cols.append((f"normalised_cost_B{b}", f"norm. cost B={b}", ".3f"))
        if _has_billed(summary):
            cols += [(f"billed_{p}_B{b}", f"billed ×Full {p} B={b}", ".3f") for p in BILLED if p != "none"]
        if _has_rereads(summary):
            cols.append((f"rereads_B{b}", f"re-reads/task B={b}", ".2f"))
    notes = setting_notes(summary) + _group_notes(summary) + [_metric_note(summary)] + _cost_notes() + [
        "Normalised cost at each B uses ρ and T of the Full records at that B."] + (
        [billing_note()] if _has_billed(summary) else [])
    title = "Budget sweep (Figure 5 analogue): performance and normalised cost vs B" + _title_tag(summary)
    return Table(stem, title, data, cols, [n for n in notes if n])


# -- entry point -----------------------------------------------------------------------

def load(runs: Sequence[str | Path]) -> tuple[list[Mapping[str, Any]], int]:
    """The effective records under ``runs`` (one per key, outcomes first), deduplicated per task."""
    return load_with_notes(runs)[:2]


def load_with_notes(runs: Sequence[str | Path]) -> tuple[list[Mapping[str, Any]], int, list[str]]:
    """:func:`load`, and a note for each job whose counted records mix configs (``mixed_config_notes``)."""
    recs: list[Mapping[str, Any]] = []
    for root in runs:
        recs.extend(load_records(root))
    effective = effective_records(recs)
    kept, dropped = dedupe(effective)
    return kept, dropped, mixed_config_notes(effective)


def build(runs: Sequence[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame, dict[tuple[str, str, int], GroupInfo],
                                                 int]:
    """(records frame, per-method summary, group info, duplicates dropped)."""
    df, summary, groups, dropped, _ = build_with_notes(runs)
    return df, summary, groups, dropped


def build_with_notes(runs: Sequence[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame,
                                                          dict[tuple[str, str, int], GroupInfo], int, list[str]]:
    """:func:`build`, and the notes every table of these records carries: duplicates dropped and
    jobs whose counted records mix configs."""
    recs, dropped, mixed = load_with_notes(runs)
    groups = group_info(recs)
    df = records_frame(recs, groups)
    notes = ([f"{dropped} duplicate records (same model, benchmark, method, B, task) dropped; kept the last."]
             if dropped else []) + mixed
    return df, summarise(df, groups), groups, dropped, notes


TABLES = ("table1", "main", "ablation", "sweep")


def make_tables(runs: Sequence[str | Path], out: str | Path, which: str = "all",
                recall: str | Path | Sequence[str | Path] | None = None) -> list[Path]:
    df, summary, _, _, extra = build_with_notes(runs)
    if df.empty:
        raise SystemExit(f"no records under {', '.join(map(str, runs))} (expected <run_dir>/records/*.jsonl)")
    source = "Source: " + ", ".join(str(r) for r in runs) + f" ({len(df)} records)."
    if which == "all":
        wanted = ["table1", "main"]
        if recall is not None or df["method"].isin([m for m in ABLATION_METHODS if m not in (FULL, CR)]).any():
            wanted.append("ablation")
        if (df.groupby(["model", "benchmark"])["budget"].nunique() > 1).any():
            wanted.append("sweep")
    else:
        wanted = [which]
    paths: list[Path] = []
    for name in wanted:
        if name == "table1":
            t = table1(summary)
        elif name == "main":
            t = main_table(summary)
        elif name == "ablation":
            files = [recall] if isinstance(recall, (str, Path)) else list(recall or [])
            t = ablation_table(summary, [load_recall(f) for f in files] if files else None)
        elif name == "sweep":
            t = sweep_table(summary)
        else:
            raise SystemExit(f"unknown table {name!r}; choose from {', '.join(TABLES)} or all")
        t.notes += extra + [source]
        paths += write_table(t, out)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m contextrender.analysis.tables", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run directories holding records/*.jsonl")
    ap.add_argument("--out", default="results", help="output directory (default: results)")
    ap.add_argument("--table", default="all", choices=[*TABLES, "all"])
    ap.add_argument("--recall", nargs="+", default=None,
                    help="replay recall JSON file(s) (contextrender replay / evaluation.replay output), one per "
                         "benchmark, for the ablation table")
    args = ap.parse_args(argv)
    for p in make_tables(args.runs, args.out, args.table, args.recall):
        print(p)
        if p.suffix == ".md":
            sys.stdout.write(p.read_text(encoding="utf-8") + "\n")


if __name__ == "__main__":
    main()
