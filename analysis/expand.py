"""The expand tool on task success (docs/method.md §16): the plus without and with the tool, beside Full.

    python -m contextrender.analysis.expand --runs results/runs/expand --out results/expand

``--runs``: run directories of ``+experiment=expand`` (records of ``full`` and ``contextrender_plus`` under
``model=oracle`` and ``model=oracle_expand``). Writes ``<out>/table_expand.{md,csv,tex}`` — per benchmark and B:
the plus's pass in strict mode and with the expand tool, its expansions per task, and its billed cost as a multiple
of Full's under both profiles in both modes — and ``<out>/fig_expand.{png,pdf}`` (pass and billed cost against B).

Full is never offered the tool (its markers carry no handles), so its expand-mode runs are its strict ones: each
mode's ratio divides by the Full of the same mode, which is the same Full.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from contextrender.analysis.plots import _save  # noqa: E402
from contextrender.analysis.tables import FULL, Table, billing_note, build_with_notes, write_table  # noqa: E402

STEM = "table_expand"
FIGURE = "fig_expand"
PLUS = "contextrender_plus"
MODES = {"oracle": "strict", "oracle_expand": "expand"}
PROFILES = ("anthropic", "openai")
EXPAND_NOTE = ("expand: the offline oracle's expand mode — offered the contextrender_expand tool, before a call "
               "that needs a value the render hid it calls the tool with the handle an omitted result's marker "
               "shows, narrowed to the rows or JSON member holding the values, then the whole result (each call its own "
               "invocation, charged like any other, within the benchmark's step limits); it fails only when no "
               "visible handle holds the value. strict: a hidden value makes a wrong call. expansions/task: the "
               "tool's calls per task.")


def expand_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (benchmark, B): Full's pass, the plus's pass and billed ×Full in both modes, its expansions."""
    rows: dict[tuple[str, int], dict[str, object]] = {}
    for s in summary.to_dict("records") if not summary.empty else []:
        mode = MODES.get(s["model"])
        if mode is None or s["method"] not in (PLUS, FULL):
            continue
        k = (s["benchmark"], int(s["budget"]))
        r = rows.setdefault(k, {"benchmark": k[0], "budget": k[1], "metric": s["metric"], "offline": True,
                                "synthetic": bool(s["synthetic"])})
        if s["method"] == FULL:
            r[f"full_pass_{mode}"] = s["perf"]
            continue
        r[f"n_{mode}"] = s["n"]
        r[f"pass_{mode}"] = s["perf"]
        for p in PROFILES:
            r[f"billed_{p}_{mode}"] = s.get(f"billed_{p}", math.nan)
            r[f"hit_{p}_{mode}"] = s.get(f"hit_{p}", math.nan)
        if mode == "expand":
            r["expansions_per_task"] = s.get("expansions_per_task", math.nan)
    cols = ["benchmark", "budget", "metric", "full_pass_strict", "n_strict", "pass_strict", "n_expand", "pass_expand",
            "expansions_per_task", *(f"{k}_{p}_{m}" for k in ("billed", "hit") for p in PROFILES
                                     for m in MODES.values()), "offline", "synthetic"]
    out = pd.DataFrame(list(rows.values()))
    for c in cols:
        if c not in out.columns:
            out[c] = math.nan
    return out[cols].sort_values(["benchmark", "budget"]).reset_index(drop=True) if len(out) else out[cols]


def expand_table(frame: pd.DataFrame) -> Table:
    cols = [("benchmark", "benchmark", "s"), ("budget", "B", "d"), ("full_pass_strict", "Full pass", ".1f"),
            ("pass_strict", "plus pass strict", ".1f"), ("pass_expand", "plus pass expand", ".1f"),
            ("expansions_per_task", "expansions/task", ".2f")]
    for p in PROFILES:
        cols += [(f"billed_{p}_strict", f"billed ×Full {p} strict", ".3f"),
                 (f"billed_{p}_expand", f"billed ×Full {p} expand", ".3f")]
    cols += [(f"hit_{p}_expand", f"cache hits % {p} expand", ".1f") for p in PROFILES]
    return Table(STEM, "The expand tool: contextrender_plus without (strict) and with it (expand), beside Full "
                       "[offline oracle]", frame, cols,
                 [EXPAND_NOTE, billing_note(),
                  "Full is never offered the tool (its markers carry no handles): its runs are the same in both modes, "
                  "and each ratio divides by that Full. Pass is task success (the benchmark's own check); billed "
                  "cost is the agent's requests as the profile bills each one from its own cached prefix."])


def fig_expand(frame: pd.DataFrame, out: str | Path, stem: str = FIGURE) -> list[Path]:
    """Per benchmark: pass vs B (strict, expand, Full) and billed ×Full vs B (both profiles, both modes)."""
    benches = list(dict.fromkeys(frame["benchmark"]))
    fig, axes = plt.subplots(2, len(benches), figsize=(4.2 * len(benches), 6.4), squeeze=False)
    for j, b in enumerate(benches):
        g = frame[frame["benchmark"] == b].sort_values("budget")
        ax = axes[0][j]
        ax.plot(g["budget"], g["full_pass_strict"], color="0.5", ls=":", marker="o", label="Full")
        ax.plot(g["budget"], g["pass_strict"], color="C0", ls="--", marker="s", label="plus, strict")
        ax.plot(g["budget"], g["pass_expand"], color="C3", ls="-", marker="D", label="plus + expand")
        ax.set_title(b, fontsize=9)
        ax.set_xscale("log")
        ax.set_xticks(list(g["budget"]), [str(int(x)) for x in g["budget"]])
        ax.minorticks_off()  # a log axis labels 3×10³ between the budgets otherwise
        ax.set_ylabel("pass %") if j == 0 else None
        ax.set_ylim(0, 102)
        ax = axes[1][j]
        ax.axhline(1.0, color="0.5", ls=":", lw=1)
        for p, c in zip(PROFILES, ("C1", "C2"), strict=True):
            ax.plot(g["budget"], g[f"billed_{p}_strict"], color=c, ls="--", marker="s", label=f"{p}, strict")
            ax.plot(g["budget"], g[f"billed_{p}_expand"], color=c, ls="-", marker="D", label=f"{p}, expand")
        ax.set_xscale("log")
        ax.set_xticks(list(g["budget"]), [str(int(x)) for x in g["budget"]])
        ax.minorticks_off()
        ax.set_xlabel("budget B (tokens)")
        ax.set_ylabel("plus billed cost ×Full") if j == 0 else None
    for row in axes:
        h, lab = row[0].get_legend_handles_labels()
        row[-1].legend(h, lab, fontsize=7, loc="lower right")
    fig.suptitle("contextrender_plus with the expand tool: task success and billed cost vs B  [offline oracle]",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return _save(fig, Path(out), stem)


def make_expand(runs: Sequence[str | Path], out: str | Path) -> tuple[list[Path], pd.DataFrame]:
    df, summary, _, _, notes = build_with_notes(runs)
    if df.empty:
        raise SystemExit(f"no records under {', '.join(map(str, runs))} (expected <run_dir>/records/*.jsonl)")
    frame = expand_frame(summary)
    t = expand_table(frame)
    t.notes += notes + ["Source: " + ", ".join(str(r) for r in runs) + f" ({len(df)} records)."]
    return write_table(t, out) + fig_expand(frame, out), frame


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m contextrender.analysis.expand", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run directories holding records/*.jsonl")
    ap.add_argument("--out", default="results/expand", help="output directory (default: results/expand)")
    args = ap.parse_args(argv)
    paths, _ = make_expand(args.runs, args.out)
    for p in paths:
        print(p)
        if p.suffix == ".md":
            sys.stdout.write(p.read_text(encoding="utf-8") + "\n")


__all__ = ["expand_frame", "expand_table", "fig_expand", "make_expand"]

if __name__ == "__main__":
    main()
