"""What each method costs as the provider bills it, against B and against session length (docs/method.md §14, §15).

``python -m contextrender.experiments.studies.billing [--runs results/runs/task_success] [--out results]``
(``make billing``).

Two sources, both billed per request from its own cached prefix under the ``anthropic`` and ``openai`` profiles:

1. **The oracle against B**: the task-success grid's records (every method, τ²-retail, τ²-airline, BFCL at
   B = 1000, 2000, 4000; strict mode), each method's mean billed cost over T as a ratio of Full's
   (:func:`contextrender.analysis.tables.summarise`).
2. **Recorded runs against session length**: the grid's Full traces of τ²-retail, chained into longer sessions
   — k consecutive recorded tasks in one conversation, the system prompt once, each task's turns after the
   last one's (call ids made unique), as one support session that handles k customers' requests in a row
   (:func:`chain_traces`) — replayed at B = 2000 with every method, for k = 1, 2, 4, 8. The chaining is ours; every
   message in it was recorded from the real τ²-bench environment.

Writes ``<out>/billing/billing.json`` (every figure), ``<out>/table_billing.md`` and ``<out>/fig_billing.{png,pdf}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: The methods the study shows: the references, the paper's method, ours, and the peers users run most.
METHODS = ("full", "prune", "contextrender", "contextrender_plus", "opencode_prune", "openhands_masking",
           "swe_last_n", "langchain_trim")
PROFILES = ("anthropic", "openai")
CHAINS = (1, 2, 4, 8)
CHAIN_BUDGET = 2000
#: The plus without its cache-aware render, replayed beside it so the option's effect shows on its own.
PLUS_OFF = "contextrender_plus (cache-aware off)"

log = logging.getLogger(__name__)


def chain_traces(episodes: Sequence[Mapping[str, Any]], k: int) -> list[dict[str, Any]]:
    """Consecutive groups of ``k`` recorded episodes as one session each (module docstring).

    Each group keeps the first episode's leading system messages and tool definitions (where its line carries them)
    and then every other message of each episode in order; call ids are prefixed with the episode's place in the
    group so they stay unique. A trailing group of fewer than ``k`` episodes is left out.
    """
    out = []
    for start in range(0, len(episodes) - k + 1, k):
        group = episodes[start:start + k]
        messages: list[dict[str, Any]] = []
        for j, ep in enumerate(group):
            msgs = [dict(m) for m in ep["messages"]]
            n_sys = 0
            while n_sys < len(msgs) and msgs[n_sys].get("role") in ("system", "developer"):
                n_sys += 1
            for m in msgs[n_sys:] if j else msgs:
                if m.get("tool_calls"):
                    m["tool_calls"] = [{**c, "id": f"s{j}_{c['id']}"} for c in m["tool_calls"]]
                if m.get("role") == "tool" and m.get("tool_call_id"):
                    m["tool_call_id"] = f"s{j}_{m['tool_call_id']}"
                messages.append(m)
        line: dict[str, Any] = {"task_id": "+".join(str(ep["task_id"]) for ep in group), "messages": messages}
        if group[0].get("tools"):
            line["tools"] = list(group[0]["tools"])
        out.append(line)
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def replay_chains(trace: Path, out_dir: Path, methods: Sequence[str], chains: Iterable[int], budget: int,
                  embedder: Any, compactor: Any) -> dict[str, Any]:
    """Replay each chaining of ``trace`` (one Full trace file) with ``methods`` and the plus with its option off; the
    billing of each, keyed by k."""
    from contextrender.experiments.evaluation.replay import replay_traces
    from contextrender.files import open_private, private_dir

    episodes = _read_jsonl(trace)
    private_dir(out_dir)
    out: dict[str, Any] = {}
    for k in chains:
        sessions = chain_traces(episodes, k)
        path = out_dir / f"chained_k{k}.jsonl"
        with open_private(path, "w") as f:  # transcripts: owner-only, like every trace file
            f.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in sessions)
        res = replay_traces(path, budget, list(methods), embedder=embedder, compactor=compactor, ceiling=False,
                            progress=True).to_json()
        off = replay_traces(path, budget, ["contextrender_plus"], embedder=embedder, compactor=compactor,
                            overrides={"contextrender_plus": {"cache_aware": False}}, ceiling=False).to_json()
        bill = res["billing"]
        plus_off = off["billing"]["methods"]["contextrender_plus"]
        for profile, row in plus_off.items():  # the same traces: Full's cost is the first replay's
            ref = bill["methods"]["full"][profile]["usd"]
            row["vs_full"] = row["usd"] / ref if row["usd"] is not None and ref else None
        bill["methods"][PLUS_OFF] = plus_off
        history = [sum(1 for m in s["messages"] if m["role"] == "assistant") for s in sessions]
        out[str(k)] = {"sessions": len(sessions), "mean_invocations": sum(history) / max(1, len(history)),
                       "mean_history_tokens": _mean_history(sessions), "billing": bill,
                       "readiness": {m: res["methods"][m]["call_readiness"] for m in methods},
                       "readiness_plus_off": off["methods"]["contextrender_plus"]["call_readiness"]}
        path.unlink()  # the chained transcripts are a derivative of the traces; the figures are what we keep
    return out


def _mean_history(sessions: Sequence[Mapping[str, Any]]) -> float:
    from contextrender.tokens import TokenCounter

    counter = TokenCounter()
    sizes = [sum(counter.message(m) for m in s["messages"] if m.get("role") not in ("system", "developer"))
             for s in sessions]
    return sum(sizes) / max(1, len(sizes))


def oracle_by_budget(runs: Path, methods: Sequence[str]) -> dict[str, Any]:
    """Per benchmark, B and method (strict oracle): billed ×Full per profile and the cache-hit share, from the records'
    summary (:func:`contextrender.analysis.tables.summarise`)."""
    from contextrender.analysis.tables import group_info, records_frame, summarise
    from contextrender.experiments.records.schema import load_effective

    records = [r for r in load_effective(runs) if r.get("model") == "oracle" and r.get("method") in methods]
    if not records:
        return {}
    groups = group_info(records)
    summary = summarise(records_frame(records, groups), groups)
    out: dict[str, Any] = {}
    for r in summary.to_dict("records"):
        cell = out.setdefault(r["benchmark"], {}).setdefault(str(r["budget"]), {})
        cell[r["method"]] = {**{f"billed_{p}": _num(r.get(f"billed_{p}")) for p in PROFILES},
                             **{f"hit_{p}": _num(r.get(f"hit_{p}")) for p in PROFILES},
                             "eq3": _num(r.get("normalised_cost")), "perf": _num(r.get("perf"))}
    return out


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def table(data: Mapping[str, Any]) -> str:
    """The study's markdown: billed ×Full under both profiles against B (oracle) and against session length."""
    lines = ["# Billed cost against B and against session length", "",
             "Each request billed from its own cached prefix (docs/method.md §14): `anthropic` (claude-sonnet-4-5: "
             "read 0.1×, write 1.25×) and `openai` (gpt-4.1: read 0.25×), as a ratio of Full's bill on the same "
             "tasks (T: histories that exceeded B); Eq. 3 (the paper's model, every method credited with Full's "
             "cache share) beside it.", ""]
    oracle = data.get("oracle") or {}
    for bench, cells in oracle.items():
        budgets = sorted(cells, key=int)
        lines += [f"## Oracle, {bench} (strict)", "",
                  "| method | " + " | ".join(f"B={b} anthropic / openai / Eq. 3" for b in budgets) + " |",
                  "|---|" + "---:|" * len(budgets)]
        for m in METHODS:
            row = [m]
            for b in budgets:
                c = cells[b].get(m)
                row.append("–" if c is None else " / ".join(_f(c.get(k)) for k in ("billed_anthropic", "billed_openai",
                                                                                    "eq3")))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    chains = data.get("chains") or {}
    if chains:
        ks = sorted(chains, key=int)
        lines += [f"## Recorded τ²-retail runs chained into longer sessions, B = {CHAIN_BUDGET}", "",
                  "| k tasks per session | " + " | ".join(ks) + " |", "|---|" + "---:|" * len(ks),
                  "| sessions | " + " | ".join(str(chains[k]["sessions"]) for k in ks) + " |",
                  "| mean history (tokens) | " + " | ".join(f"{chains[k]['mean_history_tokens']:.0f}" for k in ks) + " |"]
        for m in (*METHODS, PLUS_OFF):
            for p in PROFILES:
                vals = [chains[k]["billing"]["methods"].get(m, {}).get(p, {}).get("vs_full") for k in ks]
                lines.append(f"| {m}, {p} ×Full | " + " | ".join(_f(v) for v in vals) + " |")
        lines.append("| contextrender_plus call readiness | " + " | ".join(
            _f(chains[k]["readiness"].get("contextrender_plus"), ".1f") for k in ks) + " |")
        lines.append(f"| {PLUS_OFF} call readiness | " + " | ".join(
            _f(chains[k]["readiness_plus_off"], ".1f") for k in ks) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _f(x: Any, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def figure(data: Mapping[str, Any], out: Path) -> list[Path]:
    """One picture: billed ×Full against B (oracle, one panel per benchmark) and against session length (chained
    recorded runs), a row per profile."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from contextrender.experiments import catalogue

    oracle = data.get("oracle") or {}
    chains = data.get("chains") or {}
    cols = len(oracle) + (1 if chains else 0)
    if not cols:
        return []
    fig, axes = plt.subplots(len(PROFILES), cols, figsize=(4.2 * cols, 3.6 * len(PROFILES)), squeeze=False)
    for row, p in enumerate(PROFILES):
        for col, (bench, cells) in enumerate(oracle.items()):
            ax = axes[row][col]
            budgets = sorted(cells, key=int)
            for m in METHODS:
                ys = [cells[b].get(m, {}).get(f"billed_{p}") for b in budgets]
                if any(y is not None for y in ys):
                    e = catalogue.info(m)
                    ax.plot([int(b) for b in budgets], [math.nan if y is None else y for y in ys],
                            marker=e.marker if e else "o", color=e.colour if e else None, label=e.label if e else m,
                            lw=2.5 if m == "contextrender_plus" else 1.2)
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_title(f"oracle, {bench}", fontsize=9)
            ax.set_xlabel("B (tokens)")
            ax.set_ylabel(f"billed ×Full ({p})")
            ax.set_xscale("log", base=2)
        if chains:
            ax = axes[row][cols - 1]
            ks = sorted(chains, key=int)
            for m in (*METHODS, PLUS_OFF):
                ys = [chains[k]["billing"]["methods"].get(m, {}).get(p, {}).get("vs_full") for k in ks]
                e = catalogue.info("contextrender_plus" if m == PLUS_OFF else m)
                ax.plot([chains[k]["mean_history_tokens"] for k in ks], [math.nan if y is None else y for y in ys],
                        marker=e.marker if e else "o", color=e.colour if e else None, ls=":" if m == PLUS_OFF else "-",
                        label=PLUS_OFF if m == PLUS_OFF else (e.label if e else m),
                        lw=2.5 if m == "contextrender_plus" else 1.2)
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xscale("log")
            xs = [chains[k]["mean_history_tokens"] for k in ks]
            ax.set_xticks(xs, [f"{x / 1000:.1f}K\nk={k}" for x, k in zip(xs, ks, strict=True)])
            ax.minorticks_off()
            ax.set_title(f"recorded τ²-retail sessions chained, B={CHAIN_BUDGET}", fontsize=9)
            ax.set_xlabel("mean history per session (tokens)")
            ax.set_ylabel(f"billed ×Full ({p})")
    handles, labels = axes[0][cols - 1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8)
    fig.suptitle("What each method costs as the provider bills it (Full = 1)", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    paths = [out / "fig_billing.png", out / "fig_billing.pdf"]
    for path in paths:
        fig.savefig(path, dpi=130)
    plt.close(fig)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m contextrender.experiments.studies.billing", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="results/runs/task_success", help="the task-success grid's run directory")
    ap.add_argument("--out", default="results", help="where the table, figure and billing/ go")
    ap.add_argument("--chains", default=",".join(map(str, CHAINS)), help="tasks per chained session")
    ap.add_argument("--embedding", default="local", help="embedder of the replays (local, hashing)")
    args = ap.parse_args(argv)
    from contextrender import make_embedder, offline
    from contextrender.compaction import make_compactor

    offline.enable()
    logging.basicConfig(level=logging.WARNING)
    runs, out = Path(args.runs), Path(args.out)
    data: dict[str, Any] = {"oracle": oracle_by_budget(runs, METHODS)}
    trace = runs / "traces" / "oracle__tau2_retail__full__B2000.jsonl"
    if trace.exists():
        data["chains"] = replay_chains(trace, out / "billing", METHODS, [int(k) for k in args.chains.split(",")],
                                       CHAIN_BUDGET, make_embedder(args.embedding), make_compactor("extractive"))
    else:
        print(f"no Full trace at {trace}: run make task-success first; the chained sessions are skipped",
              file=sys.stderr)
    (out / "billing").mkdir(parents=True, exist_ok=True)
    (out / "billing" / "billing.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    (out / "table_billing.md").write_text(table(data))
    for p in figure(data, out):
        print(p)


if __name__ == "__main__":
    main()
