"""Task success first: every method, both oracle modes, every benchmark and budget — one table, a verdict, a figure.

    python -m contextrender.analysis.task_success --runs results/runs/task_success \\
        --replays results/task_success/replay_*.json --out results

``--runs``: run directories of ``+experiment=task_success`` (records of every catalogue method under
``model=oracle`` and ``model=oracle_reread``); ``--replays``: replay outputs of each benchmark's Full
traces at each budget with the same methods (call readiness and recall). Writes
``<out>/table_task_success.{md,csv,tex}`` — per benchmark, B and method: pass (strict, reread),
re-reads per task, normalised cost (both modes), call and trace readiness, recall — and
``<out>/table_task_success_verdict.{md,csv,tex}`` — per benchmark, B and mode: contextrender_plus
against the best other budgeted method and against Prune — and ``<out>/fig_task_success.{png,pdf}``.

Full history is the unbudgeted reference (it ignores B): it is shown, never counted as a competitor.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from contextrender.analysis.plots import _save, label, style  # noqa: E402
from contextrender.analysis.tables import (  # noqa: E402
    FULL,
    METRIC_LABELS,
    READINESS_NOTE,
    RECALL_CAVEAT,
    REREAD_NOTE,
    Table,
    _cost_notes,
    billing_note,
    build_with_notes,
    load_recall,
    method_sort_key,
    replay_benchmark,
    setting_notes,
    write_table,
)

STEM = "table_task_success"
VERDICT = "table_task_success_verdict"
FIGURE = "fig_task_success"
PLUS = "contextrender_plus"
PRUNE = "prune"
MODES = {"oracle": "strict", "oracle_reread": "reread"}
#: the billing profiles this table shows (docs/method.md §14)
BILLED_SHOWN = ("anthropic", "openai")
#: how far above Prune's normalised cost the plus may be and still count as "as cheap"
COST_SLACK = 0.05


def _ok(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x)) and not pd.isna(x)


def success_frame(summary: pd.DataFrame, replays: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per (benchmark, B, method): both modes' pass, cost and re-reads, and the replay's readiness and recall."""
    rows: dict[tuple[str, int, str], dict[str, Any]] = {}
    for s in summary.to_dict("records") if not summary.empty else []:
        mode = MODES.get(s["model"])
        if mode is None:
            continue
        k = (s["benchmark"], int(s["budget"]), s["method"])
        r = rows.setdefault(k, {"benchmark": k[0], "budget": k[1], "method": k[2], "metric": s["metric"],
                                "offline": True, "synthetic": bool(s["synthetic"])})
        r[f"n_{mode}"] = s["n"]
        r[f"pass_{mode}"] = s["perf"]
        r[f"cost_{mode}"] = s["normalised_cost"]
        for prof in BILLED_SHOWN:
            r[f"billed_{prof}_{mode}"] = s.get(f"billed_{prof}", math.nan)
            r[f"hit_{prof}_{mode}"] = s.get(f"hit_{prof}", math.nan)
        if mode == "reread":
            r["rereads_per_task"] = s.get("rereads_per_task", math.nan)
    for rep in replays:
        bench, budget = replay_benchmark(rep), int(rep["budget"])
        for method, m in (rep.get("methods") or {}).items():
            k = (bench or "(replay)", budget, method)
            if k not in rows:
                continue  # a replayed method without runs at this cell: the table is about runs
            rows[k].update({"call_readiness": m.get("call_readiness"), "trace_readiness": m.get("trace_readiness"),
                            "recall": m.get("recall")})
    cols = ["benchmark", "budget", "method", "metric", "n_strict", "pass_strict", "n_reread", "pass_reread",
            "rereads_per_task", "cost_strict", "cost_reread",
            *(f"{k}_{prof}_{mode}" for k in ("billed", "hit") for prof in BILLED_SHOWN for mode in MODES.values()),
            "call_readiness", "trace_readiness", "recall", "offline", "synthetic"]
    out = pd.DataFrame(list(rows.values()))
    for c in cols:
        if c not in out.columns:
            out[c] = math.nan
    out = out[cols]
    if out.empty:
        return out
    out["_m"] = out["method"].map(method_sort_key)
    return out.sort_values(["benchmark", "budget", "_m"]).drop(columns="_m").reset_index(drop=True)


def verdict_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (benchmark, B, mode): the plus's pass and cost, the best other budgeted method, Prune."""
    rows = []
    for (bench, budget), g in frame.groupby(["benchmark", "budget"], sort=True):
        plus = g[g["method"] == PLUS]
        if plus.empty:
            continue
        plus = plus.iloc[0]
        others = g[(g["method"] != PLUS) & (g["method"] != FULL)]
        prune = g[g["method"] == PRUNE]
        for mode in MODES.values():
            col = f"pass_{mode}"
            ranked = others[others[col].notna()].sort_values(col, ascending=False, kind="stable")
            best = ranked.iloc[0] if len(ranked) else None
            p_cost = prune.iloc[0][f"cost_{mode}"] if len(prune) else math.nan
            rows.append({
                "benchmark": bench, "budget": int(budget), "mode": mode, "plus_pass": plus[col],
                "best_other": best["method"] if best is not None else "",
                "best_other_pass": best[col] if best is not None else math.nan,
                "methods_compared": int(ranked.shape[0]),
                "plus_at_least_every_other": bool(best is None or plus[col] >= best[col] - 1e-9),
                "prune_pass": prune.iloc[0][col] if len(prune) else math.nan,
                "plus_cost": plus[f"cost_{mode}"], "prune_cost": p_cost,
                "plus_cost_within": bool(_ok(plus[f"cost_{mode}"]) and _ok(p_cost)
                                         and plus[f"cost_{mode}"] <= p_cost + COST_SLACK),
                "plus_rereads_per_task": plus["rereads_per_task"] if mode == "reread" else math.nan,
                **_billed_verdict(plus, others, mode),
                "offline": True, "synthetic": bool(plus["synthetic"]),
            })
    return pd.DataFrame(rows)


def _billed_verdict(plus: Mapping[str, Any], others: pd.DataFrame, mode: str) -> dict[str, Any]:
    """Per profile: the plus's billed ×Full, the cheapest other budgeted method's, and whether the plus is billed
    at most both (docs/method.md §14)."""
    out: dict[str, Any] = {}
    for prof in BILLED_SHOWN:
        col = f"billed_{prof}_{mode}"
        mine = plus.get(col, math.nan)
        theirs = others[col].dropna() if col in others else pd.Series(dtype=float)
        cheapest = float(theirs.min()) if len(theirs) else math.nan
        out[f"plus_billed_{prof}"] = mine
        out[f"cheapest_other_billed_{prof}"] = cheapest
        out[f"plus_billed_cheapest_{prof}"] = bool(_ok(mine) and mine <= 1.0 + 1e-9
                                                   and (not _ok(cheapest) or mine <= cheapest + 1e-9))
    return out


def success_table(frame: pd.DataFrame, stem: str = STEM) -> Table:
    cols = [("benchmark", "benchmark", "s"), ("budget", "B", "d"), ("method", "method", "s"),
            ("pass_strict", "pass strict", ".1f"), ("pass_reread", "pass reread", ".1f"),
            ("rereads_per_task", "re-reads/task", ".2f"), ("cost_strict", "norm. cost strict", ".3f"),
            ("cost_reread", "norm. cost reread", ".3f")]
    billed = not frame.empty and bool(frame[[f"billed_{p}_strict" for p in BILLED_SHOWN]].notna().any().any())
    if billed:
        cols += [(f"billed_{p}_{mode}", f"billed ×Full {p} {mode}", ".3f") for p in BILLED_SHOWN
                 for mode in ("strict", "reread")]
        cols += [(f"hit_{p}_strict", f"cache hits % {p}", ".0f") for p in BILLED_SHOWN]
    cols += [("call_readiness", "call ready", ".1f"), ("trace_readiness", "trace ready", ".1f"),
             ("recall", "recall", ".1f")]
    notes = setting_notes(frame.assign(model="oracle")) + [REREAD_NOTE]
    if not frame.empty:
        pairs = sorted({(b, m) for b, m in zip(frame["benchmark"], frame["metric"], strict=True)
                        if isinstance(m, str) and m})
        notes.append("pass = mean primary metric ×100 over all tasks (failures score 0): " + ", ".join(
            f"{b}: {METRIC_LABELS.get(m, m)}" for b, m in pairs) + ".")
    notes += _cost_notes() + ([billing_note()] if billed else []) + [
        READINESS_NOTE + " From one replay of each benchmark's Full-history traces per B, every method on the "
        "same recorded calls.",
        "recall: Later-Used Result Recall (docs/method.md §7) from the same replays. " + RECALL_CAVEAT,
        "full ignores B (the unbudgeted reference); every other method renders within B."]
    title = "Task success first: pass under both oracle modes, re-reads, cost, readiness and recall per method" \
        " [offline oracle: not comparable to paper numbers]"
    return Table(stem, title, frame, cols, [n for n in notes if n])


def verdict_table(verdict: pd.DataFrame, stem: str = VERDICT) -> Table:
    cols = [("benchmark", "benchmark", "s"), ("budget", "B", "d"), ("mode", "oracle mode", "s"),
            ("plus_pass", "contextrender_plus pass", ".1f"), ("best_other", "best other method", "s"),
            ("best_other_pass", "its pass", ".1f"), ("prune_pass", "prune pass", ".1f"),
            ("plus_cost", "plus norm. cost", ".3f"), ("prune_cost", "prune norm. cost", ".3f"),
            ("plus_rereads_per_task", "plus re-reads/task", ".2f")]
    billed = not verdict.empty and "plus_billed_anthropic" in verdict and verdict["plus_billed_anthropic"].notna().any()
    if billed:
        cols += [c for p in BILLED_SHOWN for c in (
            (f"plus_billed_{p}", f"plus billed ×Full {p}", ".3f"),
            (f"cheapest_other_billed_{p}", f"cheapest other {p}", ".3f"),
            (f"plus_billed_cheapest_{p}", f"plus ≤ Full and others {p}", "s"))]
    run = verdict[verdict["methods_compared"] > 0] if not verdict.empty else verdict
    met = int(run["plus_at_least_every_other"].sum()) if not run.empty else 0
    priced = run[run["prune_cost"].notna()] if not run.empty else run
    cheap = int(priced["plus_cost_within"].sum()) if not priced.empty else 0
    n = len(run)
    compared = sorted(set(verdict["methods_compared"])) if not verdict.empty else []
    alone = [f"{r['benchmark']} B={r['budget']} {r['mode']}" for _, r in verdict.iterrows()
             if r["methods_compared"] == 0]
    notes = [f"contextrender_plus passes at least as many tasks as every other budgeted method in {met} of the {n} "
             f"cells (benchmark × B × mode) where others ran; its normalised cost is within {COST_SLACK} of Prune's "
             f"or lower in {cheap} of the {len(priced)} where Prune ran."
             + (f" No other method has records yet in: {'; '.join(alone)}." if alone else ""),
             "best other method: the highest pass among the paper's budgeted methods, the weight ablations and the "
             f"peer strategies ({', '.join(map(str, compared))} methods per cell); full history, which ignores B, "
             "is not a competitor.",
             "§ contextrender_plus is ours, not the paper's method (docs/method.md, \"Beyond the paper\").",
             REREAD_NOTE]
    if billed:
        for p in BILLED_SHOWN:
            ok = int(run[f"plus_billed_cheapest_{p}"].sum()) if not run.empty else 0
            notes.append(f"Billed under {p}: the plus costs no more than Full and every other budgeted method in {ok} "
                         f"of the {n} cells.")
        notes.append(billing_note())
    misses = verdict[~verdict["plus_at_least_every_other"]] if not verdict.empty else verdict
    for _, r in misses.iterrows():
        notes.append(f"{r['benchmark']} B={r['budget']} {r['mode']}: {r['best_other']} passes "
                     f"{r['best_other_pass']:.1f} against the plus's {r['plus_pass']:.1f}.")
    title = "Verdict: contextrender_plus against every other budgeted method, per benchmark, budget and oracle mode" \
        " [offline oracle]"
    return Table(stem, title, verdict, cols, [x for x in notes if x])


def fig_task_success(frame: pd.DataFrame, out: str | Path, stem: str = FIGURE,
                     highlight: Sequence[str] = (PLUS, "contextrender", PRUNE)) -> list[Path]:
    """Per benchmark: pass vs B, strict (solid) and reread (dashed); the highlighted methods in colour, the
    best and worst of the others as a grey band."""
    benches = sorted(frame["benchmark"].unique()) if not frame.empty else []
    fig, axes = plt.subplots(1, max(1, len(benches)), figsize=(5.2 * max(1, len(benches)), 4.4), squeeze=False)
    methods = sorted(frame["method"].unique(), key=method_sort_key) if not frame.empty else []
    for ax, bench in zip(axes[0], benches, strict=False):
        g = frame[frame["benchmark"] == bench]
        budgets = sorted(g["budget"].unique())
        others = g[~g["method"].isin([*highlight, FULL])]
        for mode, alpha in (("strict", 0.18), ("reread", 0.08)):
            lo = [others[others["budget"] == b][f"pass_{mode}"].min() for b in budgets]
            hi = [others[others["budget"] == b][f"pass_{mode}"].max() for b in budgets]
            ax.fill_between(budgets, lo, hi, color="0.5", alpha=alpha, linewidth=0,
                            label=f"other methods, {mode} (range)")
        for m in highlight:
            h = g[g["method"] == m].sort_values("budget")
            if h.empty:
                continue
            c, mk = style(m, methods)
            for mode, ls in (("strict", "-"), ("reread", "--")):
                ax.plot(h["budget"], h[f"pass_{mode}"], color=c, marker=mk, linestyle=ls,
                        linewidth=2.4 if m == PLUS else 1.4, label=f"{label(m)}, {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets)
        ax.set_xticklabels([f"{int(b):,}" for b in budgets])
        ax.set_xlabel("history budget B (tokens)")
        ax.set_ylabel("pass (%)")
        ax.set_ylim(-3, 103)
        ax.grid(True, alpha=0.3)
        ax.set_title(bench, fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, frameon=False, fontsize=8)
    fig.suptitle("Task success vs budget, strict (solid) and reread (dashed) oracle  [offline oracle]", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return _save(fig, Path(out), stem)


def make_task_success(runs: Sequence[str | Path], out: str | Path,
                      replays: Sequence[str | Path] = ()) -> tuple[list[Path], pd.DataFrame, pd.DataFrame]:
    df, summary, _, _, notes = build_with_notes(runs)
    if df.empty:
        raise SystemExit(f"no records under {', '.join(map(str, runs))} (expected <run_dir>/records/*.jsonl)")
    reps = [load_recall(p) for p in replays]
    frame = success_frame(summary, reps)
    verdict = verdict_frame(frame)
    source = "Source: " + ", ".join(str(r) for r in runs) + f" ({len(df)} records)" \
        + (("; replays: " + ", ".join(str(p) for p in replays)) if replays else "") + "."
    paths: list[Path] = []
    for t in (success_table(frame), verdict_table(verdict)):
        t.notes += notes + [source]
        paths += write_table(t, out)
    paths += fig_task_success(frame, out)
    return paths, frame, verdict


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m contextrender.analysis.task_success",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run directories holding records/*.jsonl")
    ap.add_argument("--replays", nargs="*", default=[], help="replay output JSON, one per benchmark and B")
    ap.add_argument("--out", default="results", help="output directory (default: results)")
    args = ap.parse_args(argv)
    paths, _, _ = make_task_success(args.runs, args.out, args.replays)
    for p in paths:
        print(p)
        if p.suffix == ".md":
            sys.stdout.write(p.read_text(encoding="utf-8") + "\n")


__all__ = ["fig_task_success", "make_task_success", "success_frame", "success_table", "verdict_frame",
           "verdict_table"]

if __name__ == "__main__":
    main()
