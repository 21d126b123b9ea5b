"""The paper's figures from episode records: Figure 4 (performance vs normalised cost), Figure 5 (vs budget).

    python -m contextrender.analysis.plots --runs results/runs/table1 --out results [--figure fig4|fig5|all]

Figure 4: one panel per model × benchmark × B, one marker per method at
(normalised cost, performance); ContextRender is a large red star; the paper's
points (Tables 6–8, same model, benchmark, method and B) are hollow markers of
the same shape and colour. Figure 5: one panel per model × benchmark,
performance vs B, one line per method (paper points hollow where reported).
Numbers come from :mod:`contextrender.analysis.tables` (same ρ, T and ratio-of-means cost).
Written as ``<out>/fig4.{png,pdf}`` and ``<out>/fig5.{png,pdf}`` (PNG at 150 dpi).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from contextrender.analysis.tables import CR, FULL, METHOD_ORDER, METRIC_LABELS, OURS, build, method_sort_key  # noqa: E402
from contextrender.experiments import catalogue  # noqa: E402

DPI = 150
CR_COLOR = catalogue.catalogue()[CR].colour
_EXTRA_COLORS = ["#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d"]


def style(method: str, others: Sequence[str] = ()) -> tuple[str, str]:
    """(colour, marker) of a method; stable across panels and figures."""
    known = catalogue.info(method)
    if known is not None:
        return known.colour, known.marker
    extra = sorted(m for m in others if catalogue.info(m) is None)
    i = extra.index(method) if method in extra else 0
    return _EXTRA_COLORS[i % len(_EXTRA_COLORS)], "o"


def label(method: str) -> str:
    """Legend text from the catalogue: the paper's method by name, this project's own marked as ours."""
    known = catalogue.info(method)
    return known.label if known is not None else method


def _ok(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x)) and not pd.isna(x)


def _grid(n: int, ncols_max: int = 3, w: float = 4.6, h: float = 3.8) -> tuple[plt.Figure, list[plt.Axes]]:
    ncols = max(1, min(ncols_max, n))
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows + 0.6), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _setting_tag(df: pd.DataFrame) -> str:
    tags = []
    if df["offline"].any():
        tags.append("offline oracle")
    if df["synthetic"].any():
        tags.append("synthetic data")
    return f"  [{', '.join(tags)}: not comparable to paper numbers]" if tags else ""


def _panel_title(model: str, bench: str, budget: int | None, offline: bool, synthetic: bool) -> str:
    t = f"{model} · {bench}" + (f" · B={budget:,}" if budget is not None else "")
    flags = [s for s, on in (("offline oracle", offline), ("synthetic", synthetic)) if on]
    return t + (f"\n({', '.join(flags)})" if flags else "")


def _legend(fig: plt.Figure, methods: Sequence[str], paper: bool, ncol: int) -> None:
    handles = []
    for m in methods:
        c, mk = style(m, methods)
        big = m == CR
        handles.append(Line2D([], [], color=c, marker=mk, linestyle="none", markersize=13 if big else 8,
                              markeredgecolor="black" if big else c, label=label(m)))
    if paper:
        handles.append(Line2D([], [], color="black", marker="o", linestyle="none", markersize=8, label="measured here (filled)"))
        handles.append(Line2D([], [], color="black", marker="o", markerfacecolor="none", linestyle="none",
                              markersize=8, label="paper's number (hollow)"))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), ncol),
               frameon=False, fontsize=9)


def _save(fig: plt.Figure, out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    fig.savefig(paths[0], dpi=DPI, bbox_inches="tight")
    # No creation date in the PDF: the same records give byte-identical files.
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None})
    plt.close(fig)
    return paths


def fig4(summary: pd.DataFrame, out: str | Path, stem: str = "fig4") -> list[Path]:
    """Performance vs normalised cost, one panel per (model, benchmark, B)."""
    groups = list(summary.groupby(["model", "benchmark", "budget"], sort=True))
    methods = sorted(summary["method"].unique(), key=method_sort_key)
    fig, axes = _grid(len(groups))
    any_paper = any_billed = False
    for ax, ((model, bench, budget), g) in zip(axes, groups, strict=True):
        g = g.sort_values("method", key=lambda s: s.map(method_sort_key))
        ax.set_title(_panel_title(model, bench, int(budget), bool(g["offline"].any()), bool(g["synthetic"].any())),
                     fontsize=10)
        metric = g["metric"].iloc[0]
        ax.set_ylabel(f"performance: {METRIC_LABELS.get(metric, metric)}")
        ax.set_xlabel("normalised cost (mean over T, Full = 1)")
        ax.grid(True, alpha=0.3)
        has_cost = g["normalised_cost"].map(_ok).any()
        if not has_cost:
            note = g["note"].iloc[0] or "normalised cost undefined"
            ax.text(0.5, 0.5, "no normalised cost:\n" + _wrap(note, 40), ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="dimgray")
        ax.axvline(1.0, color="gray", linestyle="--", linewidth=0.8, zorder=0)
        for _, r in g.iterrows():
            c, mk = style(r["method"], methods)
            big = r["method"] == CR
            size = 260 if big else (120 if r["method"] in OURS else 70)
            if _ok(r["normalised_cost"]):
                # ours drawn larger and underneath, so a paper method at the same point stays visible
                z = 4 if big else (2.5 if r["method"] in OURS else 3)
                ax.scatter(r["normalised_cost"], r["perf"], s=size, marker=mk, color=c, zorder=z,
                           edgecolors="black" if big else c, linewidths=0.8)
                if big:
                    ax.annotate("ContextRender", (r["normalised_cost"], r["perf"]), xytext=(8, 6),
                                textcoords="offset points", fontsize=8, color=CR_COLOR, fontweight="bold")
                billed = r.get("billed_anthropic")
                if _ok(billed):  # docs/method.md §14: where the same point lands as the provider bills it
                    any_billed = True
                    ax.annotate("", xy=(billed, r["perf"]), xytext=(r["normalised_cost"], r["perf"]),
                                arrowprops={"arrowstyle": "->", "color": c, "lw": 1.0, "alpha": 0.8}, zorder=1)
                    ax.scatter(billed, r["perf"], s=size * 0.5, marker=mk, facecolors="white", edgecolors=c,
                               linewidths=1.0, zorder=z - 0.5)
            if _ok(r.get("paper_normalised_cost")) and _ok(r.get("paper_perf")):
                any_paper = True
                ax.scatter(r["paper_normalised_cost"], r["paper_perf"], s=size, marker=mk, facecolors="none",
                           edgecolors=c, linewidths=1.4, zorder=2)
        ax.margins(x=0.15, y=0.15)
    title = "Figure 4 analogue: performance vs normalised cost (Eq. 3)"
    if any_billed:
        title += "; arrows: to the cost billed under anthropic prices (each request's own cached prefix)"
    fig.suptitle(title + _setting_tag(summary), fontsize=12 if not any_billed else 10)
    _legend(fig, methods, any_paper, ncol=6)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, Path(out), stem)


def fig5(summary: pd.DataFrame, out: str | Path, stem: str = "fig5") -> list[Path]:
    """Performance vs budget B, one line per method, one panel per (model, benchmark)."""
    groups = list(summary.groupby(["model", "benchmark"], sort=True))
    methods = sorted(summary["method"].unique(), key=method_sort_key)
    fig, axes = _grid(len(groups), ncols_max=2, w=5.6, h=4.2)
    any_paper = False
    for ax, ((model, bench), g) in zip(axes, groups, strict=True):
        ax.set_title(_panel_title(model, bench, None, bool(g["offline"].any()), bool(g["synthetic"].any())),
                     fontsize=10)
        metric = g["metric"].iloc[0]
        budgets = sorted(int(b) for b in g["budget"].unique())
        for method, gm in sorted(g.groupby("method"), key=lambda kv: method_sort_key(kv[0])):
            gm = gm.sort_values("budget")
            c, mk = style(method, methods)
            big = method == CR
            ax.plot(gm["budget"], gm["perf"], color=c, marker=mk, markersize=13 if big else 6,
                    linewidth=2.6 if big else 1.3, zorder=4 if big else 3,
                    markeredgecolor="black" if big else c, linestyle="--" if method == FULL else "-")
            pp = gm[gm["paper_perf"].map(_ok)]
            if len(pp):
                any_paper = True
                ax.scatter(pp["budget"], pp["paper_perf"], s=160 if big else 60, marker=mk, facecolors="none",
                           edgecolors=c, linewidths=1.4, zorder=2)
        if len(budgets) > 1 and budgets[-1] / budgets[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(budgets)
        ax.set_xticklabels([f"{b / 1000:g}K" if b >= 1000 else str(b) for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("context budget B (tokens)")
        ax.set_ylabel(f"performance: {METRIC_LABELS.get(metric, metric)}")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.08, y=0.12)
    fig.suptitle("Figure 5 analogue: performance vs context budget" + _setting_tag(summary), fontsize=12)
    _legend(fig, methods, any_paper, ncol=6)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, Path(out), stem)


def _wrap(s: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(s, width))


FIGURES = ("fig4", "fig5")


def make_plots(runs: Sequence[str | Path], out: str | Path, which: str = "all") -> list[Path]:
    df, summary, _, _ = build(runs)
    if df.empty:
        raise SystemExit(f"no records under {', '.join(map(str, runs))} (expected <run_dir>/records/*.jsonl)")
    if which == "all":
        wanted = ["fig4"]
        if (summary.groupby(["model", "benchmark"])["budget"].nunique() > 1).any():
            wanted.append("fig5")
    else:
        wanted = [which]
    paths: list[Path] = []
    for name in wanted:
        paths += fig4(summary, out) if name == "fig4" else fig5(summary, out)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m contextrender.analysis.plots", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run directories holding records/*.jsonl")
    ap.add_argument("--out", default="results", help="output directory (default: results)")
    ap.add_argument("--figure", default="all", choices=[*FIGURES, "all"])
    args = ap.parse_args(argv)
    for p in make_plots(args.runs, args.out, args.figure):
        print(p)


__all__ = ["FIGURES", "fig4", "fig5", "make_plots", "style", "METHOD_ORDER"]

if __name__ == "__main__":
    main()
