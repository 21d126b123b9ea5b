"""What each switch of contextrender_plus buys (ours, NOT the paper's method) — results/plus/plus.md.

    make plus   (= python -m contextrender.experiments.studies.plus)

The plus (conf/method/contextrender_plus.yaml; docs/method.md, "Beyond the paper") is run with every
switch on and with each switch off in turn, by the offline oracle in both modes (strict: a hidden value
makes a wrong call; reread: it is read again first, paying a call) on τ²-retail, τ²-airline and BFCL
v4 multi-turn long-context at B = 2000, and each variant's call readiness and recall come from one
replay of each benchmark's Full traces. The report says, per switch, what removing it does to the task
score, the re-reads, the cost and readiness, and whether the switch stays. Every number in the report
is computed from the records written here (results/runs/plus); the prose is generated from them.

Nothing here fits anything: the plus's constants are the paper's, and what it learns it learns from
its own graph file while it runs (one file per job: the earlier episodes of the same benchmark).
The runs go through the harness in-process (the same runner as ``make task-success``).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contextrender import offline
from contextrender.experiments.evaluation.replay import write_json

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "plus"
RUNS = ROOT / "results" / "runs" / "plus"
PLUS = "contextrender_plus"
#: variant name -> the overrides that make it (the full plus first)
VARIANTS: dict[str, dict[str, Any]] = {
    PLUS: {},
    "plus −id forms": {"id_forms": False},
    "plus +learned id value": {"learned_id_value": True},
    "plus −learned prior": {"learned_prior": 0.0},
    "plus −tabular": {"tabular": False},
    "plus −tabular cap": {"tabular_cap": False},
    "plus −compact omitted": {"compact_omitted": False},
    "plus +lexical (W_lex 1)": {"lexical": 1.0},
    "plus −packing": {"packing": False},
    "plus −prose-first trim": {"trim_prose_first": False},
}
#: the paper's method, for reference in every table
REFERENCE = "contextrender"
BENCHMARKS = {"tau2_retail": "tau2_retail", "tau2_airline": "tau2_airline",
              "bfcl_multi_turn": "bfcl_multi_turn_long_context"}
MODELS = ("oracle", "oracle_reread")
BUDGET = 2000


def slug(variant: str) -> str:
    """The method name a variant's records carry (its job files' stem): plus_no_<switch> or plus_with_<switch>."""
    if variant == PLUS:
        return PLUS
    sign, rest = ("no", variant.split("−", 1)[1]) if "−" in variant else ("with", variant.split("+", 1)[1])
    return f"plus_{sign}_" + "".join(c if c.isalnum() else "_" for c in rest.split(" (")[0].strip())


def _compose(overrides: Sequence[str]) -> Any:
    from hydra import compose, initialize_config_module

    from contextrender.experiments.catalogue import register_resolver

    register_resolver()
    with initialize_config_module(config_module="contextrender.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_variants(budget: int = BUDGET, benchmarks: Sequence[str] = tuple(BENCHMARKS), models: Sequence[str] = MODELS,
                 variants: Mapping[str, Mapping[str, Any]] = VARIANTS, runs: Path = RUNS) -> None:
    """Run every variant (and the paper's method) with the harness's runner, in this process; a rerun resumes."""
    from contextrender.experiments.runtime.runner import run_job

    # The plus and the paper's method come from the task-success grid's records (collect reads both run
    # directories): only the variants run here.
    jobs = [(m, b, v) for m in models for b in benchmarks for v in variants if v != PLUS]
    for k, (model, bench, variant) in enumerate(jobs):
        over = [f"model={model}", f"benchmark={bench}", f"budget={budget}", f"run_dir={runs}", "progress=false",
                "experiment_name=plus"]
        over += [f"method={PLUS}", f"method.name={slug(variant)}",
                 *(f"method.{key}={json.dumps(val)}" for key, val in variants[variant].items())]
        log.info("[%d/%d] %s %s %s", k + 1, len(jobs), model, bench, variant)
        run_job(_compose(over))


def replay_variants(budget: int = BUDGET, benchmarks: Sequence[str] = tuple(BENCHMARKS),
                    variants: Mapping[str, Mapping[str, Any]] = VARIANTS, runs: Path = RUNS) -> dict[str, Any]:
    """Call readiness and recall of every variant on each benchmark's Full traces (the plus's own runs)."""
    from contextrender.compaction import make_compactor
    from contextrender.embed import make_embedder
    from contextrender.experiments.evaluation.replay import replay_traces

    out: dict[str, Any] = {}
    for bench in benchmarks:
        name = BENCHMARKS[bench]
        traces = _full_traces(name, budget)
        if traces is None:
            log.warning("no Full-history traces of %s at B=%d: run make task-success first", name, budget)
            continue
        methods = [REFERENCE, PLUS]
        overrides: dict[str, dict[str, Any]] = {}
        res = replay_traces(traces, budget, methods, embedder=make_embedder("local"), compactor=make_compactor(
            "extractive"), ceiling=False, benchmark=name)
        per = {REFERENCE: res.methods[REFERENCE].summary(), PLUS: res.methods[PLUS].summary()}
        for variant, over in variants.items():
            if variant == PLUS:
                continue
            overrides[PLUS] = dict(over)
            r = replay_traces(traces, budget, [PLUS], embedder=make_embedder("local"),
                              compactor=make_compactor("extractive"), ceiling=False, overrides=overrides,
                              benchmark=name)
            per[variant] = r.methods[PLUS].summary()
        out[name] = {m: {k: s.get(k) for k in ("call_readiness", "trace_readiness", "recall")} for m, s in per.items()}
    return out


def _full_traces(bench: str, budget: int) -> Path | None:
    for root in (ROOT / "results" / "runs" / "task_success", ROOT / "results" / "runs" / "table1"):
        p = root / "traces" / f"oracle__{bench}__full__B{budget}.jsonl"
        if p.is_file():
            return p
    return None


def collect(runs: Path = RUNS, budget: int = BUDGET) -> dict[str, Any]:
    """Per benchmark, mode and variant: pass, normalised cost, re-reads per task (from the records)."""
    from contextrender.analysis.tables import build

    df, summary, _, _ = build([runs, ROOT / "results" / "runs" / "task_success"])
    names = {slug(v): v for v in VARIANTS} | {REFERENCE: REFERENCE}
    out: dict[str, Any] = {}
    for r in summary.to_dict("records"):
        if int(r["budget"]) != budget or r["method"] not in names or r["model"] not in MODELS:
            continue
        cell = out.setdefault(r["benchmark"], {}).setdefault(r["model"], {})
        cell[names[r["method"]]] = {"pass": r["perf"], "normalised_cost": r["normalised_cost"],
                                    "rereads_per_task": None if r.get("rereads_per_task") != r.get("rereads_per_task")
                                    else r.get("rereads_per_task"), "n": int(r["n"])}
    return out


def _f(x: Any, nd: int = 1) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def verdicts(runs: Mapping[str, Any], ready: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per switch: what removing it did (Σ Δ pass over benchmarks and modes, Δ call readiness) and whether it stays.

    A switch stays when removing it lowers the summed pass, or leaves it equal and lowers readiness; it is a
    candidate to drop when removing it changes no pass and no readiness figure, or raises the pass.
    """
    out: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        if variant == PLUS:
            continue
        d_pass = [cells[variant]["pass"] - cells[PLUS]["pass"] for bench in runs.values() for cells in bench.values()
                  if variant in cells and PLUS in cells]
        d_ready = [r[variant]["call_readiness"] - r[PLUS]["call_readiness"] for r in ready.values()
                   if variant in r and r[variant]["call_readiness"] is not None
                   and r[PLUS]["call_readiness"] is not None]
        total, total_ready = sum(d_pass), sum(d_ready)
        if not d_pass:
            verdict = "not run"
        elif total < -1e-9 or (abs(total) <= 1e-9 and total_ready < -1e-9):
            verdict = "keep"
        elif abs(total) <= 1e-9 and abs(total_ready) <= 1e-9:
            verdict = "no effect here"
        else:
            verdict = "drop?"
        out[variant] = {"delta_pass_sum": total, "delta_pass_min": min(d_pass, default=None),
                        "delta_call_readiness_sum": total_ready, "cells": len(d_pass), "verdict": verdict}
    return out


def report(runs: Mapping[str, Any], ready: Mapping[str, Any], verdict: Mapping[str, Any], budget: int = BUDGET) -> str:
    lines = ["# contextrender_plus: what each switch buys (ours, NOT the paper's method)", "",
             f"Offline oracle (not an LLM) at B = {budget}, both modes; call readiness and recall from one replay "
             "of each benchmark's Full traces. Generated by `make plus` (experiments/studies/plus.py) from the "
             "records under results/runs/plus; every figure below comes from them.", ""]
    for bench, modes in sorted(runs.items()):
        r = ready.get(bench, {})
        lines += [f"## {bench}", "",
                  "| variant | pass strict | pass reread | re-reads/task | norm. cost strict | call ready | "
                  "trace ready | recall |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for variant in [REFERENCE, *VARIANTS]:
            s = modes.get("oracle", {}).get(variant, {})
            rr = modes.get("oracle_reread", {}).get(variant, {})
            rd = r.get(variant, {})
            if not s and not rr:
                continue
            lines.append(f"| {variant} | {_f(s.get('pass'))} | {_f(rr.get('pass'))} | "
                         f"{_f(rr.get('rereads_per_task'), 2)} | {_f(s.get('normalised_cost'), 3)} | "
                         f"{_f(rd.get('call_readiness'))} | {_f(rd.get('trace_readiness'))} | {_f(rd.get('recall'))} |")
        lines.append("")
    lines += ["## Verdict per switch", "",
              "Σ Δ pass: the change in pass (percentage points) when the switch is flipped from its default (−: "
              "turned off; +: a switch that is off by default turned on), summed over the benchmarks and both "
              "oracle modes; Δ call readiness summed over the benchmarks. A default stays when flipping it lowers "
              "the summed pass (or leaves it and lowers readiness).", "",
              "| flipped | Σ Δ pass | worst cell | Σ Δ call readiness | verdict |", "|---|---:|---:|---:|---|"]
    for variant, v in verdict.items():
        lines.append(f"| {variant.replace('plus ', '')} | {v['delta_pass_sum']:+.1f} | "
                     f"{_f(v['delta_pass_min'])} | {v['delta_call_readiness_sum']:+.1f} | {v['verdict']} |")
    kept = [k.replace("plus ", "") for k, v in verdict.items() if v["verdict"] == "keep"]
    idle = [k.replace("plus ", "") for k, v in verdict.items() if v["verdict"] == "no effect here"]
    drop = [k.replace("plus ", "") for k, v in verdict.items() if v["verdict"] == "drop?"]
    unrun = [k.replace("plus ", "") for k, v in verdict.items() if v["verdict"] == "not run"]
    lines += ["", f"Defaults that flipping makes worse here (kept): {', '.join(kept) or 'none'}."]
    if idle:
        lines.append(f"No effect on these benchmarks (kept for transcripts they were made for, e.g. real dialogues "
                     f"with prose or results without ids): {', '.join(idle)}.")
    if drop:
        lines.append(f"Flipping these did as well or better here: {', '.join(drop)} — see the cells above "
                     "before changing the default.")
    if unrun:
        lines.append(f"Not run yet (no records): {', '.join(unrun)}.")
    lines += ["", "Recall counts only tokens of ≥ 6 characters with an uppercase letter or an underscore and only "
              "results shown in full; an id form is never counted. Read it after the task score and readiness.", ""]
    return "\n".join(lines)


def plot(runs: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    benches = sorted(runs)
    names = [REFERENCE, *VARIANTS]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for ax, model in zip(axes, MODELS, strict=True):
        x = np.arange(len(benches))
        w = 0.8 / len(names)
        for k, name in enumerate(names):
            ys = [runs[b].get(model, {}).get(name, {}).get("pass") for b in benches]
            ax.bar(x + k * w, [y if y is not None else 0 for y in ys], w, label=name,
                   color="0.6" if name == REFERENCE else None, edgecolor="black" if name == PLUS else None)
        ax.set_xticks(x + 0.4 - w / 2, benches)
        ax.set_title(f"{'strict' if model == 'oracle' else 'reread'} oracle, B={BUDGET}")
        ax.set_ylim(0, 105)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("pass (%)")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("contextrender_plus (ours): each switch off in turn  [offline oracle]", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m contextrender.experiments.studies.plus",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", choices=["all", "runs", "replay", "report"], default="all")
    ap.add_argument("--benchmarks", default=",".join(BENCHMARKS), metavar="A,B",
                    help=f"which of {', '.join(BENCHMARKS)} to run and replay")
    a = ap.parse_args(argv)
    benches = [b for b in a.benchmarks.split(",") if b]
    unknown = sorted(set(benches) - set(BENCHMARKS))
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
    offline.enable()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    if a.stage in ("all", "runs"):
        run_variants(benchmarks=benches)
    if a.stage in ("all", "replay"):
        write_json(OUT / "readiness.json", replay_variants(benchmarks=benches))
    if a.stage in ("all", "runs", "replay", "report"):
        runs = collect()
        ready = json.loads((OUT / "readiness.json").read_text()) if (OUT / "readiness.json").is_file() else {}
        verdict = verdicts(runs, ready)
        write_json(OUT / "plus.json", {"budget": BUDGET, "runs": runs, "readiness": ready, "verdicts": verdict})
        (OUT / "plus.md").write_text(report(runs, ready, verdict), encoding="utf-8")
        plot(runs, OUT / "plus.png")


if __name__ == "__main__":
    main()
