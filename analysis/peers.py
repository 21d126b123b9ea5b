"""The peer head-to-head: one table and one figure from the peers runs and their replays.

    python -m contextrender.analysis.peers --runs results/runs/peers --recall R1.json [R2.json ...] --out results

``--runs``: run directories of ``+experiment=peers`` (every peer plus full, prune and
contextrender, one record per task); ``--recall``: one replay output per benchmark
(``python -m contextrender.experiments.evaluation.replay`` over that benchmark's Full traces
with the same methods, ``benchmark_name=`` set so the file names its benchmark). Writes
``<out>/table_peers.{md,csv,tex}`` and ``<out>/fig_peers.{png,pdf}``.

Per (model, benchmark, B) and method: the task score and normalised cost of the runs
(:mod:`~contextrender.analysis.tables`: same ρ, T and ratio-of-means cost as Table 1),
Later-Used Result Recall overall and by age from the replay, and the failure-mode measures
(:mod:`~contextrender.experiments.evaluation.measures`) — from the replay, where every method
faces the same recorded calls, and from the runs, where the calls are the ones the agent made
under the method: identifier survival, redundant re-reads (a call repeating an earlier one
whose result the render hid), prompt-cache prefix retention. Ours (ContextRender) is marked;
the peers carry their projects' names from the catalogue (``conf/catalogue.yaml``).
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
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.markers import MarkerStyle  # noqa: E402

from contextrender.analysis.plots import _save, label, style  # noqa: E402
from contextrender.analysis.tables import (  # noqa: E402
    AGE_BINS,
    AGE_LABELS,
    CEILING,
    CEILING_NOTE,
    CR,
    METRIC_LABELS,
    Table,
    billing_note,
    build_with_notes,
    is_offline,
    load_recall,
    method_sort_key,
    recall_entries,
    replay_benchmark,
    setting_notes,
    write_table,
)
from contextrender.experiments import catalogue  # noqa: E402
from contextrender.experiments.evaluation.measures import MeasureStats  # noqa: E402
from contextrender.experiments.records.schema import is_retryable  # noqa: E402

#: the billing profiles the peers table shows (docs/method.md §14)
BILLED_SHOWN = ("anthropic", "openai")

STEM = "table_peers"
FIGURE = "fig_peers"
GROUP = ["model", "benchmark", "budget"]
#: the measures' summary keys taken into the table, from the replay (``replay_*``) and the runs (``run_*``)
MEASURE_KEYS = ("identifier_survival", "identifier_uses", "rereads", "rereads_per_episode", "rereads_per_100_calls",
                "repeat_calls", "tool_calls", "prefix_retention", "prefix_retention_tokens")


def kind(method: str) -> str:
    """ours (ContextRender), peer (another framework's strategy), baseline (the paper's others) or reference
    (the hindsight ceiling, not a policy)."""
    if method == CR:
        return "ours"
    if method == CEILING:
        return "reference"
    m = catalogue.info(method)
    return "peer" if m is not None and m.kind == "peer" else "baseline"


def display_label(method: str) -> str:
    """The catalogue label (the peer's project name); ContextRender marked as ours."""
    if method == CEILING:
        return "hindsight ceiling (not a policy)"
    return f"{label(method)} (ours)" if method == CR else label(method)


# -- inputs ------------------------------------------------------------------------------------


def match_replays(replays: Sequence[Mapping[str, Any]],
                  groups: Sequence[tuple[str, str, int]]) -> dict[tuple[str, str, int], Mapping[str, Any]]:
    """Each replay output to the run group(s) of its benchmark and budget (a nameless one: the only group at B)."""
    out: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    for r in replays:
        budget, bench = int(r["budget"]), replay_benchmark(r)
        targets = [g for g in groups if g[2] == budget and (bench is None or g[1] == bench)]
        if bench is None and len(targets) > 1:
            raise SystemExit(f"a replay output at B={budget} names no benchmark and {len(targets)} run groups have "
                             "that budget; replay with benchmark_name=<benchmark>")
        if not targets:
            targets = [("(replay)", bench or "(replay)", budget)]
        for g in targets:
            if g in out:
                raise SystemExit(f"two replay outputs for {g[1]} at B={g[2]}")
            out[g] = r
    return out


def run_measures(df: pd.DataFrame) -> dict[tuple[str, str, int, str], tuple[MeasureStats, int]]:
    """Per (model, benchmark, B, method): the records' measures pooled, and how many records carried them.

    Records older than schema 4 carry none: they are left out (unknown, never zero).
    """
    out: dict[tuple[str, str, int, str], tuple[MeasureStats, int]] = {}
    if df.empty:
        return out
    for key, g in df.groupby(["model", "benchmark", "budget", "method"], sort=False):
        stats, n = MeasureStats(), 0
        for rec in g["record"]:
            m = rec.get("measures")
            if m is None or is_retryable(rec):
                continue
            stats, n = stats + MeasureStats.from_dict(m), n + 1
        out[(str(key[0]), str(key[1]), int(key[2]), str(key[3]))] = (stats, n)
    return out


def _nan(x: Any) -> Any:
    return math.nan if x is None else x


def peers_frame(summary: pd.DataFrame, df: pd.DataFrame, replays: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per (model, benchmark, B, method): run score and cost, replay recall, both sources' measures."""
    groups = sorted({(str(r.model), str(r.benchmark), int(r.budget)) for r in summary.itertuples()}) \
        if not summary.empty else []
    by_group = match_replays(list(replays), groups)
    measured = run_measures(df)
    rows: dict[tuple[str, str, int, str], dict[str, Any]] = {}

    def row(model: str, bench: str, budget: int, method: str) -> dict[str, Any]:
        k = (model, bench, budget, method)
        if k not in rows:
            rows[k] = {"model": model, "benchmark": bench, "budget": budget, "method": method,
                       "label": display_label(method), "kind": kind(method), "offline": is_offline(model),
                       "synthetic": False}
        return rows[k]

    for s in summary.to_dict("records") if not summary.empty else []:
        r = row(s["model"], s["benchmark"], int(s["budget"]), s["method"])
        r.update({"n": s["n"], "metric": s["metric"], "perf": s["perf"], "normalised_cost": s["normalised_cost"],
                  "mean_cost_usd": s["mean_cost_usd"], "rho": s["rho"], "T": s["T"],
                  "rereads_per_task": s.get("rereads_per_task", math.nan),
                  **{f"{k}_{p}": _nan(s.get(f"{k}_{p}")) for k in ("billed", "hit") for p in BILLED_SHOWN},
                  "synthetic": bool(s["synthetic"]), "note": s["note"]})
        stats, n_meas = measured.get((s["model"], s["benchmark"], int(s["budget"]), s["method"]), (MeasureStats(), 0))
        ms = stats.summary() if n_meas else {}
        r["run_measured"] = n_meas
        for key in MEASURE_KEYS:
            r[f"run_{key}"] = _nan(ms.get(key))
        for b in AGE_BINS:
            r[f"run_identifier_survival_{b}"] = _nan((ms.get("identifier_survival_by_age") or {}).get(b))
    for (model, bench, budget), rep in by_group.items():
        for method, s in recall_entries(rep):
            r = row(model, bench, budget, method)
            by_age = s.get("recall_by_age") or {}
            r["call_readiness"] = _nan(s.get("call_readiness"))
            r["trace_readiness"] = _nan(s.get("trace_readiness"))
            r["recall"] = _nan(s.get("recall"))
            for b in AGE_BINS:
                r[f"recall_{b}"] = _nan(by_age.get(b))
            ms = s.get("measures") or {}
            for key in MEASURE_KEYS:
                r[f"replay_{key}"] = _nan(ms.get(key))
            for b in AGE_BINS:
                r[f"replay_identifier_survival_{b}"] = _nan((ms.get("identifier_survival_by_age") or {}).get(b))
            bill = ((rep.get("billing") or {}).get("methods") or {}).get(method) or {}
            for p in BILLED_SHOWN:
                r[f"replay_billed_{p}"] = _nan((bill.get(p) or {}).get("vs_full"))
                share = (bill.get(p) or {}).get("cache_hit_share")
                r[f"replay_hit_{p}"] = _nan(None if share is None else 100.0 * share)
            r["replay_traces"] = rep.get("traces")
            r["replay_events"] = rep.get("events")
            for b in AGE_BINS:
                r[f"replay_events_{b}"] = (rep.get("events_by_age") or {}).get(b)
    cols = ["model", "benchmark", "budget", "method", "label", "kind", "n", "metric", "perf", "normalised_cost",
            "mean_cost_usd", "rho", "T", "rereads_per_task",
            *(f"{k}_{p}" for k in ("billed", "hit", "replay_billed", "replay_hit") for p in BILLED_SHOWN), "call_readiness", "trace_readiness", "recall",
            *[f"recall_{b}" for b in AGE_BINS],
            *[f"replay_{k}" for k in MEASURE_KEYS[:1]], *[f"replay_identifier_survival_{b}" for b in AGE_BINS],
            *[f"replay_{k}" for k in MEASURE_KEYS[1:]], "replay_traces", "replay_events",
            *[f"replay_events_{b}" for b in AGE_BINS],
            *[f"run_{k}" for k in MEASURE_KEYS[:1]], *[f"run_identifier_survival_{b}" for b in AGE_BINS],
            *[f"run_{k}" for k in MEASURE_KEYS[1:]], "run_measured", "offline", "synthetic", "note"]
    out = pd.DataFrame(list(rows.values()))
    for c in cols:
        if c not in out.columns:
            out[c] = math.nan if c not in ("note", "metric") else ""
    out = out[cols]
    if out.empty:
        return out
    out["_m"] = out["method"].map(method_sort_key)
    return out.sort_values(["model", "benchmark", "budget", "_m"]).drop(columns="_m").reset_index(drop=True)


# -- the table ---------------------------------------------------------------------------------


def peers_table(frame: pd.DataFrame, replays: Sequence[Mapping[str, Any]] = (), stem: str = STEM) -> Table:
    cols = [("model", "model", "s"), ("benchmark", "benchmark", "s"), ("budget", "B", "d"),
            ("label", "method", "s"), ("n", "n", "d"), ("perf", "score", ".1f"),
            ("normalised_cost", "norm. cost (Eq. 3)", ".3f")]
    billed = [k for k in ("billed", "replay_billed") if not frame.empty
              and frame[[f"{k}_{p}" for p in BILLED_SHOWN]].notna().any().any()]
    for k in billed:
        where = "run" if k == "billed" else "replay"
        cols += [(f"{k}_{p}", f"billed ×Full {p} ({where})", ".3f") for p in BILLED_SHOWN]
        cols += [(f"{k.replace('billed', 'hit')}_{p}", f"cache hits % {p} ({where})", ".0f") for p in BILLED_SHOWN]
    if not frame.empty and frame["rereads_per_task"].notna().any():
        cols.append(("rereads_per_task", "re-reads/task", ".2f"))
    cols += [("call_readiness", "call ready", ".1f"), ("trace_readiness", "trace ready", ".1f"),
             ("recall", "recall", ".1f")]
    cols += [(f"recall_{b}", f"age {AGE_LABELS[b]}", ".1f") for b in AGE_BINS]
    cols += [("replay_identifier_survival", "id survival", ".1f"),
             ("replay_rereads_per_episode", "re-reads /ep", ".2f"),
             ("replay_rereads_per_100_calls", "re-reads /100 calls", ".1f"),
             ("run_rereads_per_100_calls", "run re-reads /100 calls", ".1f"),
             ("run_prefix_retention", "prefix ret. (run)", ".1f"),
             ("replay_prefix_retention", "prefix ret. (replay)", ".1f")]
    notes = setting_notes(frame) + ([billing_note() + " (replay): the same bill for the replay's renders of the "
                                     "recorded traces, Full replayed beside them."] if billed else [])
    notes.append("Ours: ContextRender (the method this harness implements, docs/method.md §4–5), marked (ours). Peers are "
                 "labelled with their upstream project (conf/catalogue.yaml kind: peer; baselines/peers/); full and "
                 "prune are the paper's baselines. Every method runs under the same B, budget scope, token counter, "
                 "pairing rule and budget check.")
    if not frame.empty:
        pairs = sorted({(b, m) for b, m in zip(frame["benchmark"], frame["metric"], strict=True)
                        if isinstance(m, str) and m})
        if pairs:
            notes.append("score = mean primary metric ×100 over all tasks (failures score 0): " + ", ".join(
                f"{b}: {METRIC_LABELS.get(m, m)}" for b, m in pairs) + ".")
    notes.append("norm. cost: Eq. 3 with ρ = cache fraction of the Full records of the same model × benchmark × B, "
                 "mean over T (tasks whose Full run exceeded B), divided by Full's (a ratio of means).")
    for rep in replays:
        ev = rep.get("events_by_age") or {}
        first: Mapping[str, Any] = next(iter((rep.get("methods") or {}).values()), {})
        ms = first.get("measures") or {}
        uses = ms.get("identifier_uses_by_age") or {}
        notes.append(f"{replay_benchmark(rep) or '(replay)'} at B={rep['budget']}: recall and the replay measures "
                     f"from replaying {rep.get('traces')} recorded Full-history traces with every method; "
                     f"{rep.get('events')} recall events ("
                     + ", ".join(f"{AGE_LABELS[b]}: {ev.get(b, 0)}" for b in AGE_BINS) + "), "
                     f"{ms.get('identifier_uses', '?')} identifier uses ("
                     + ", ".join(f"{AGE_LABELS[b]}: {uses.get(b, 0)}" for b in AGE_BINS) + "), "
                     f"{ms.get('repeat_calls', '?')} repeated calls of {ms.get('tool_calls', '?')}.")
    if any(rep.get("ceiling") for rep in replays):
        notes.append(CEILING_NOTE)
    notes += [
        "call ready / trace ready (docs/method.md, \"Call readiness\"; from the replay): a recorded tool call needs "
        "each argument value (≥ 4 characters) that only earlier tool results held, and is ready when every such "
        "value occurs as a whole token (numbers by value) anywhere in the render before it; trace ready: traces "
        "whose every such call was. The oracle fails a task on exactly this rule, so these follow the score.",
        "recall (docs/method.md §7): share of (turn j, result r) reuse events whose result was rendered in full before j, "
        "by age j − k (≤3, 4–10, 11–25, >25 turns). It counts only tokens of ≥ 6 characters with an uppercase "
        "letter or an underscore — never digit-only ids — and only results shown in full, so it can disagree with "
        "the score: read it after the score and readiness.",
        "id survival: share of identifier uses (turn j uses, as a whole token under TFA's rules, a qualifying value "
        "first seen in an earlier tool result) whose value appears anywhere in the render before j — in full, in a "
        "summary, a placeholder or an assistant message; a value only a summary kept counts here and not for "
        "recall. From the replay (the same recorded uses for every method); by age in the CSV.",
        "re-reads: tool calls repeating an earlier call's name and normalised JSON arguments when none of the "
        "earlier calls' results was rendered in full before the call — per episode and per 100 tool calls. "
        "Replay: the recorded agent's re-reads that the method's render would have left without their earlier "
        "result; run: the calls the (oracle) agent made under the method.",
        "prefix ret.: per invocation, the share of the rendered messages' tokens (session counter, message by "
        "message) in the leading messages unchanged since the previous render of the episode — what a prefix "
        "cache can reuse, which drives ρ; mean over invocations. Runs: the method's own episodes; replay: the "
        "Full traces re-rendered by the method.",
        "Pairing validity (every rendered tool call has its result and every result its call) was asserted for "
        "every render of the runs and the replays; a violation stops the run.",
        "CSV only: identifier survival by age and from the runs, counts of uses, repeats and calls, token-weighted "
        "prefix retention. In oracle runs a value the render hid is replaced by a wrong one (the oracle cannot know "
        "it), so the use disappears and run survival is high by construction; the loss shows in the score.",
    ]
    notes += list(dict.fromkeys(n for n in frame.get("note", pd.Series(dtype=str)) if isinstance(n, str) and n))
    tag = " [offline oracle: not comparable to paper numbers]" if not frame.empty and frame["offline"].any() else ""
    title = "Peer context strategies head to head: score, cost, recall and the failure modes users report" + tag
    return Table(stem, title, frame, cols, [n for n in notes if n])


# -- the figure --------------------------------------------------------------------------------


def _ok(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x)) and not pd.isna(x)


def fig_peers(frame: pd.DataFrame, out: str | Path, stem: str = FIGURE) -> list[Path]:
    """Per (model, benchmark, B): task score vs normalised cost (top) and recall by age (bottom)."""
    groups = list(frame.groupby(GROUP, sort=True))
    methods = sorted(frame["method"].unique(), key=method_sort_key)
    n = max(1, len(groups))
    fig, axes = plt.subplots(2, n, figsize=(5.4 * n, 9.0), squeeze=False)
    for col, ((model, bench, budget), g) in enumerate(groups):
        g = g.sort_values("method", key=lambda s: s.map(method_sort_key))
        top, bottom = axes[0][col], axes[1][col]
        flags = " (offline oracle)" if bool(g["offline"].any()) else ""
        top.set_title(f"{model} · {bench} · B={int(budget):,}{flags}", fontsize=10)
        metric = next((m for m in g["metric"] if isinstance(m, str) and m), "score")
        top.set_ylabel(f"task score: {METRIC_LABELS.get(metric, metric)}")
        top.set_xlabel("normalised cost (mean over T, Full = 1)")
        top.grid(True, alpha=0.3)
        top.axvline(1.0, color="gray", linestyle="--", linewidth=0.8, zorder=0)
        for _, r in g.iterrows():
            if not (_ok(r["normalised_cost"]) and _ok(r["perf"])):
                continue
            c, mk = style(r["method"], methods)
            ours = r["method"] == CR
            edge = {"edgecolors": "black" if ours else c} if MarkerStyle(mk).is_filled() else {}
            top.scatter(r["normalised_cost"], r["perf"], s=260 if ours else 70, marker=mk, color=c,
                        linewidths=0.8 if MarkerStyle(mk).is_filled() else 1.6, zorder=4 if ours else 3, **edge)
            if ours:
                top.annotate("ContextRender (ours)", (r["normalised_cost"], r["perf"]), xytext=(8, 6),
                             textcoords="offset points", fontsize=8, color=c, fontweight="bold")
        top.margins(x=0.15, y=0.15)
        x = list(range(len(AGE_BINS)))
        bottom.set_title("Later-Used Result Recall by age (replay of Full traces)", fontsize=9)
        bottom.set_xticks(x)
        events = [next((e for e in g[f"replay_events_{b}"] if _ok(e)), None) for b in AGE_BINS]
        bottom.set_xticklabels([AGE_LABELS[b] + ("" if e is None else f"\n({int(e)} events)")
                                for b, e in zip(AGE_BINS, events, strict=True)])
        bottom.set_xlabel("age of the reused result (turns)")
        bottom.set_ylabel("recall (%)")
        bottom.grid(True, alpha=0.3)
        for i, (_, r) in enumerate(g.iterrows()):
            ys = [r[f"recall_{b}"] for b in AGE_BINS]
            dx = 0.012 * (i - (len(g) - 1) / 2)  # a small offset per method: coinciding lines stay visible
            pts = [(xi + dx, y) for xi, y in zip(x, ys, strict=True) if _ok(y)]
            if not pts:
                continue
            if r["method"] == CEILING:
                bottom.plot([p[0] for p in pts], [p[1] for p in pts], color="0.35", linestyle=":", linewidth=1.8,
                            zorder=2)
                continue
            c, mk = style(r["method"], methods)
            ours = r["method"] == CR
            bottom.plot([p[0] for p in pts], [p[1] for p in pts], color=c, marker=mk, markersize=11 if ours else 5,
                        linewidth=2.4 if ours else 1.0, markeredgecolor="black" if ours else c,
                        zorder=4 if ours else 3, linestyle="--" if r["method"] == "full" else "-")
        bottom.set_ylim(-5, 105)
        bottom.set_xlim(-0.4, len(AGE_BINS) - 0.6)
    if not groups:
        axes[0][0].text(0.5, 0.5, "no rows", ha="center", va="center", transform=axes[0][0].transAxes)
    handles = []
    for m in methods:
        if m == CEILING:
            handles.append(Line2D([], [], color="0.35", linestyle=":", linewidth=1.8, label=display_label(m)))
            continue
        c, mk = style(m, methods)
        ours = m == CR
        handles.append(Line2D([], [], color=c, marker=mk, linestyle="none", markersize=12 if ours else 7,
                              markeredgecolor="black" if ours else c, label=display_label(m)))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 5),
               frameon=False, fontsize=9)
    tag = "  [offline oracle: not comparable to paper numbers]" if not frame.empty and frame["offline"].any() else ""
    fig.suptitle("Peer context strategies vs ContextRender: score vs cost, recall by age" + tag, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, Path(out), stem)


# -- entry point -------------------------------------------------------------------------------


def make_peers(runs: Sequence[str | Path], out: str | Path,
               recall: Sequence[str | Path] = ()) -> tuple[list[Path], pd.DataFrame]:
    """Build and write the peers table and figure; returns the paths and the table's data."""
    df, summary, _, _, notes = build_with_notes(runs)
    if df.empty:
        raise SystemExit(f"no records under {', '.join(map(str, runs))} (expected <run_dir>/records/*.jsonl)")
    replays = [load_recall(p) for p in recall]
    frame = peers_frame(summary, df, replays)
    table = peers_table(frame, replays)
    table.notes.extend(notes)
    table.notes.append("Source: " + ", ".join(str(r) for r in runs) + f" ({len(df)} records)"
                       + (("; replays: " + ", ".join(str(p) for p in recall)) if recall else "") + ".")
    paths = write_table(table, out)
    paths += fig_peers(frame, out)
    return paths, frame


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m contextrender.analysis.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run directories holding records/*.jsonl")
    ap.add_argument("--recall", nargs="*", default=[], help="replay output JSON, one per benchmark")
    ap.add_argument("--out", default="results", help="output directory (default: results)")
    args = ap.parse_args(argv)
    paths, _ = make_peers(args.runs, args.out, args.recall)
    for p in paths:
        print(p)
        if p.suffix == ".md":
            sys.stdout.write(p.read_text(encoding="utf-8") + "\n")


__all__ = ["fig_peers", "make_peers", "match_replays", "peers_frame", "peers_table", "run_measures"]

if __name__ == "__main__":
    main()
