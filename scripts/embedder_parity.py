"""Replay the shipped recorded runs with both runtimes of all-MiniLM-L6-v2 and compare what the methods keep.

    python scripts/embedder_parity.py [--runs results/runs/task_success] [--out results/bench/embedder_parity.json]

The default embedder (``local``: the model in numpy, contextrender/minilm.py) and ``sentence-transformers``
(the same weights on torch, the ``[local]`` extra) replay the recorded runs under tests/data — τ²-bench,
τ-bench and BFCL result files written by the real packages, and our own JSONL traces, at B = 300 and 600
(they are short) — and, when the task-success grid has run, its Full-history traces of τ²-retail,
τ²-airline and BFCL at B = 1000 and 2000, with the methods a user would pick. The figures are call readiness and Later-Used Result Recall per
method; the script writes each side's figures and the largest difference in points (the acceptance of the
numpy runtime: within 0.2 points), and exits 1 when a difference exceeds it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = {
    "tau2 (retail, telecom)": [REPO / "tests/data/tau2"],
    "tau-bench": [REPO / "tests/data/taubench"],
    "bfcl multi-turn": [REPO / "tests/data/bfcl"],
    "contextrender jsonl": [REPO / "tests/data/react_traces.jsonl", REPO / "tests/data/parallel_agent_traces.jsonl"],
}
METHODS = ["prune", "contextrender", "contextrender_plus"]
FIXTURE_BUDGETS = (300, 600)
GRID_BUDGETS = (1000, 2000)
GRID = ("tau2_retail", "tau2_airline", "bfcl_multi_turn_long_context")
TOLERANCE = 0.2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "results/bench/embedder_parity.json"))
    ap.add_argument("--runs", default=str(REPO / "results/runs/task_success"),
                    help="the task-success grid's run directory (its Full traces are replayed too, when present)")
    args = ap.parse_args(argv)
    from contextrender import ExtractiveCompactor, make_embedder, offline
    from contextrender.experiments.evaluation.replay import replay_traces

    offline.enable()
    embedders = {name: make_embedder(name) for name in ("local", "sentence-transformers")}
    sets = [(label, paths, FIXTURE_BUDGETS) for label, paths in TRACES.items()]
    for bench in GRID:
        trace = Path(args.runs) / "traces" / f"oracle__{bench}__full__B2000.jsonl"
        if trace.exists():
            sets.append((f"oracle Full traces, {bench}", [trace], GRID_BUDGETS))
    rows, worst = [], 0.0
    for label, paths, budgets in sets:
        for budget in budgets:
            figures = {}
            for name, emb in embedders.items():
                res = replay_traces([str(p) for p in paths], budget, METHODS, embedder=emb,
                                    compactor=ExtractiveCompactor(), ceiling=False).to_json()
                figures[name] = {m: {"call_readiness": s["call_readiness"], "recall": s["recall"]}
                                 for m, s in res["methods"].items()}
            for m in METHODS:
                a, b = figures["local"][m], figures["sentence-transformers"][m]
                diff = {k: None if a[k] is None or b[k] is None else abs(a[k] - b[k]) for k in a}
                worst = max([worst, *(d for d in diff.values() if d is not None)])
                rows.append({"traces": label, "budget": budget, "method": m, "local": a,
                             "sentence_transformers": b, "abs_diff_points": diff})
    out = {"methods": METHODS, "tolerance_points": TOLERANCE,
           "max_abs_diff_points": worst, "within_tolerance": worst <= TOLERANCE, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{args.out}: largest difference {worst:.3f} points over {len(rows)} (trace set, B, method) cells "
          f"({'within' if worst <= TOLERANCE else 'OVER'} {TOLERANCE})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
