"""The fitted-profile study's report, results/plus_fitted/plus.md, and its figure (:mod:`.plus_fitted`).

Every number in the report is read from the data handed to :func:`report` (fit.json, the held-out
replays, the oracle scores) or is a parameter of the computation it reports (the acceptance target,
the bootstrap's draws and seed, the verbatim trim's share): the notes are generated from the same data
as the tables, so they cannot fall out of step with them. What the data cannot say — why each piece
exists, what was tried and dropped — is in results/plus_fitted/README.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contextrender.experiments import catalogue
from contextrender.experiments.evaluation.ceiling import (
    GAP_CI_DRAWS,
    GAP_CI_LEVEL,
    GAP_CI_MIN_TRACES,
    GAP_CI_SEED,
    gap_covered,
)
from contextrender.experiments.evaluation.recall import AGE_BINS
from contextrender.experiments.evaluation.replay import write_json
from contextrender.experiments.studies.plus_fitted_data import CEILING, CEILINGS, EMBEDDING, PLUS, REFERENCES
from contextrender.experiments.studies.plus_fitted_evaluate import (
    ACCEPT_BUDGET,
    TARGET_SHARE,
    acceptance,
    budget_rows,
    gap_row,
    oracle_pairs,
)
from contextrender.experiments.studies.plus_fitted_oracle import ORACLE_SPLIT
from contextrender.render import TRIM_TARGET_SHARE

#: How each oracle score key reads in the report.
METRIC_NAMES = {"task_acc": "task accuracy %", "pass": "pass^1 %", "f1": "mean F1 %"}
#: The held-out rows the notes compare with the profile (their names in the evaluation's JSON).
SESSION_ROW = "plus −session prior (W_sess 0)"
TRIM_ROW = "plus −prose-first trim"
AGE_ROW = "plus, prior_min_age 2"
#: (what the row removes, eval row) for the computed "where the gain comes from" note.
GAIN_ROWS = (("the priors (per-tool, call and session)", "plus −prior (fitted and session)"),
             ("the call prior alone", "plus −call prior (per-tool P only)"),
             ("the session prior alone", SESSION_ROW),
             (f"protecting the latest results from the priors ({AGE_ROW.split(', ')[1]})", AGE_ROW),
             ("lexical", "plus −lexical"), ("packing", "plus −packing"), ("the fitted λ/W", "plus −fit (paper λ,γ,W)"))
SWITCHES_OFF = "switches off (fitted λ,W)"
#: The oracle row that drops the session prior (its name in the oracle's JSON).
ORACLE_SESSION_ROW = "plus −session prior"
#: A difference below this (percentage points) is no difference: the JSON holds exact ratios.
SAME = 1e-9


# -- formatting --------------------------------------------------------------------------------

def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def _pct(x: float | None) -> str:
    return _f(x, "{:.0f} %")


def _few_traces(traces: int | None) -> str | None:
    """"k traces" when the gap lies in too few for an interval (fewer than GAP_CI_MIN_TRACES), else None."""
    if not traces or traces >= GAP_CI_MIN_TRACES:
        return None
    return f"{traces} trace{'' if traces == 1 else 's'}"


def _ci(ci: Sequence[float] | None, traces: int | None = None) -> str:
    """An interval's cell; without one, how many traces hold the gap when that is why (gap_interval)."""
    if ci is not None:
        return f"{ci[0]:.0f} to {ci[1]:.0f} %"
    few = _few_traces(traces)
    return f"– (gap in {few})" if few else "–"


def _share(share: float | None, ci: Sequence[float] | None) -> str:
    return _pct(share) + ("" if ci is None else f" ({_ci(ci)})")


def _age_label(age_bin: str) -> str:
    """An age bin's name as the report prints it: le3 → ≤3, 4_10 → 4–10, gt25 → >25."""
    if age_bin.startswith("le"):
        return "≤" + age_bin[2:]
    if age_bin.startswith("gt"):
        return ">" + age_bin[2:]
    return age_bin.replace("_", "–")


def _level() -> str:
    return f"{100 * GAP_CI_LEVEL:.0f} %"


def _join(parts: Sequence[str], empty: str = "none") -> str:
    return ", ".join(parts) if parts else empty


def _row_label(m: str, v: Mapping[str, Any]) -> str:
    if m in REFERENCES:
        return f"*{m}* — not a policy, knows the generator's reuse probabilities (nothing of the future)"
    if v.get("reference"):
        return f"*{m}* — not a policy, knows the future"
    return f"**{m}** (ours)" if m == PLUS else m


def _call_summary(fitted: Mapping[str, Any]) -> str:
    calls = fitted.get("call_prior") or {}
    if not calls:
        return "no call prior"
    n = sum(len(v) for v in calls.values())
    text = f"call prior: {n} words over {len(calls)} tools"
    tool = max(calls, key=lambda t: len(calls[t]))
    ws = sorted(calls[tool].items(), key=lambda kv: kv[1])
    if len(ws) >= 4:
        p = fitted["tool_prior"].get(tool)
        text += (f" (e.g. {tool}, P(tool) {p}: " + ", ".join(f"{w} {v:.3f}" for w, v in ws[:3]) + " … "
                 + ", ".join(f"{w} {v:.3f}" for w, v in ws[-3:]) + ")")
    without = fitted.get("without_call_prior")
    if without:
        text += f"; the best train objective without it {without['mean']:.2f}"
    return text


# -- sections ----------------------------------------------------------------------------------

def _header(evald: Mapping[str, Any], fitted: Mapping[str, Any]) -> list[str]:
    fit_sets = list(fitted.get("fit_sets", []))
    halves = [s for s in evald if s in fit_sets]
    whole = [s for s in evald if s not in fit_sets]
    prior = fitted.get("tool_prior", {})
    top = sorted(prior.items(), key=lambda kv: -kv[1])[:8]
    scope = f"the test half (hash of task id, `is_train`) of {_join(halves)}"
    if whole:
        scope += f", and every trace of {_join(whole)} (never fitted on)"
    return ["# contextrender_plus_fitted — the optional fitted profile of contextrender_plus "
            "(ours, NOT the paper's method; not the plus's default)", "",
            f"Later-Used Result Recall (docs/method.md §7) on HELD-OUT traces only: {scope}. Embedding: "
            f"{EMBEDDING[0]}-{EMBEDDING[1]}. The hindsight ceiling (experiments/evaluation/ceiling.py) has the same "
            f"scope, verbatim trim ({100 * TRIM_TARGET_SHARE:.0f} % of B) and `[omitted]` markers as every row, so it "
            "bounds every row but plus's: plus's prose-first trim (when the verbatim messages alone exceed B, old "
            "assistant prose goes before the oldest units) is bounded by the second ceiling row, which uses that "
            "trim. gap covered = (row − contextrender) / (ceiling − contextrender), always against the first "
            "ceiling. `over B` = renders above the budget.", "",
            f"Fitted on the TRAIN halves of {', '.join(fit_sets)} only "
            f"(budgets {fitted['fit_budgets']}; train tasks {fitted['train_tasks']}): "
            f"`{json.dumps(fitted['params'])}`, train objective {fitted['train_objective']:.2f}; "
            f"per-tool reuse prior over {len(prior)} tools (default {fitted.get('prior_default')}), highest: "
            + ", ".join(f"{t} {v:.2f}" for t, v in top) + "; " + _call_summary(fitted) + ". The priors live in "
            "conf/method/contextrender_plus_fitted.yaml and are read from there at render time.", ""]


def _set_table(set_name: str, b: str, res: Mapping[str, Any]) -> list[str]:
    ms = res["methods"]
    cr, ce = ms["contextrender"]["recall"], ms[CEILING]["recall"]
    lines = [f"## {set_name}: {res['traces']} held-out traces, {res['events']} events at B={b} "
             f"(by age {res['events_by_age']})", "",
             "| row | recall | Δ vs contextrender | gap covered | "
             + " / ".join(_age_label(a) for a in AGE_BINS) + " | over B |",
             "|---|---:|---:|---:|---:|---:|"]
    for m, v in ms.items():
        ages = v["recall_by_age"]
        age = " / ".join("–" if ages[a] is None else f"{ages[a]:.0f}" for a in AGE_BINS)
        d = None if v["recall"] is None or cr is None else v["recall"] - cr
        g = gap_covered(v["recall"], cr, ce)
        lines.append(f"| {_row_label(m, v)} | {_f(v['recall'])} | {_f(d, '{:+.1f}')} | "
                     f"{_pct(g) if ce is not None and cr is not None and ce > cr else 'no gap'} | "
                     f"{age} | {v['over_budget_renders']} |")
    return [*lines, ""]


def _acceptance_section(evald: Mapping[str, Any]) -> list[str]:
    rows = acceptance(evald)
    target = f"{TARGET_SHARE:.0f} %"
    lines = [f"## Acceptance check (held-out, B={ACCEPT_BUDGET}): gap covered ≥ {target}, never above B", "",
             f"| held-out set | traces | events | contextrender | {PLUS} | hindsight ceiling "
             f"| gap covered | {_level()} CI | ≥ {target}? | plus over-B renders | causal reference "
             "| of the causally reachable gap |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        gap = "no gap (cr = ceiling)" if r["gap_covered"] is None else _pct(r["gap_covered"])
        lines.append(f"| {r['set']} | {r['traces']} | {r['events']} | {_f(r['contextrender'])} | "
                     f"{_f(r[PLUS])} | {_f(r['ceiling'])} | {gap} | {_ci(r['gap_ci'], r['gap_traces'])} "
                     f"| {'yes' if r['met'] else 'NO'} "
                     f"| {r['over_budget']} | {_f(r['causal_reference'])} "
                     f"| {_share(r['reachable_covered'], r['reachable_ci'])} |")
    lines += ["", f"{_level()} CI: a percentile interval of the gap share from a paired bootstrap over the set's "
              f"traces ({GAP_CI_DRAWS} draws, seed {GAP_CI_SEED}; experiments/evaluation/ceiling.py `gap_interval`): "
              "the events of one trace are not independent, so traces, not events, are resampled, and the three "
              f"rows together. None (–) when fewer than {GAP_CI_MIN_TRACES} traces hold some of the gap (the "
              "ceiling covers another number of events than contextrender there; the count is shown): a "
              f"percentile bootstrap over a handful of such traces covers well under {_level()} (simulated by "
              "scripts/gap_interval_coverage.py). The verdict column reads the point estimate.", ""]
    refs = [r for r in rows if r["causal_reference"] is not None
            and r["contextrender"] is not None and r["ceiling"] is not None]
    if refs:
        need = "; ".join(f"{r['set']} {_need(r):.1f}, and the reference itself reaches "
                         f"{_pct(r['reference_gap_covered'])} of that gap ({_level()} CI {_ci(r['reference_gap_ci'])})"
                         for r in refs)
        lines += ["causal reference: on the synthetic set, the generator-aware selector (`SynthBayes`): it knows "
                  "the generator's own reuse probabilities and nothing of the future, so in expectation it is about "
                  "the best a selector that sees only the past can do there (its greedy packing is not an exact "
                  f"knapsack); covering {target} of the hindsight gap needs {need}.", ""]
    return lines


def _need(r: Mapping[str, Any]) -> float:
    """The recall that covers the target share of the gap from contextrender to the ceiling."""
    return float(r["contextrender"] + TARGET_SHARE / 100 * (r["ceiling"] - r["contextrender"]))


def _other_budgets_section(evald: Mapping[str, Any], other: Mapping[str, Any],
                           fitted: Mapping[str, Any]) -> list[str]:
    lines = ["## Other budgets (held-out; the fit saw B=" + "/".join(map(str, fitted["fit_budgets"])) + " only)", "",
             "The same held-out traces and the same configuration at a tighter and a looser budget.", "",
             f"| held-out set | B | events | contextrender | {PLUS} | hindsight ceiling | gap covered "
             f"| {_level()} CI | plus over-B renders | causal reference | of the causally reachable gap |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in budget_rows(evald, other):
        gap = "no gap" if r["gap_covered"] is None else _pct(r["gap_covered"])
        fit_b = " (the fit's B)" if r["fitted"] else ""
        lines.append(f"| {r['set']} | {r['budget']}{fit_b} | {r['events']} | "
                     f"{_f(r['contextrender'])} | {_f(r[PLUS])} | {_f(r['ceiling'])} | {gap} | "
                     f"{_ci(r['gap_ci'], r['gap_traces'] if r['gap_covered'] is not None else None)} | "
                     f"{r['over_budget']} | {_f(r['causal_reference'])} "
                     f"| {_share(r['reachable_covered'], r['reachable_ci'])} |")
    return [*lines, ""]


def _oracle_scope(orc: Mapping[str, Any]) -> str:
    """Per benchmark: its score's name, its task count(s), and how many of the rows ran there."""
    labels = list(dict.fromkeys(m for bench in orc for m in orc[bench]))
    parts = []
    for bench, rows in orc.items():
        cells = [c for by_b in rows.values() for c in by_b.values() if c]
        metrics = sorted({str(c["metric"]) for c in cells if c.get("metric")})
        tasks = sorted({int(c["tasks"]) for c in cells if c.get("tasks") is not None})
        what = " / ".join(METRIC_NAMES.get(m, m) for m in metrics) or "score %"
        extra = []
        if tasks:
            extra.append(f"{tasks[0]}" + (f"–{tasks[-1]}" if tasks[-1] != tasks[0] else "") + " tasks")
        if len(rows) < len(labels):
            extra.append(f"{len(rows)} of the {len(labels)} rows")
        parts.append(f"{bench}: {what}" + (f" ({', '.join(extra)})" if extra else ""))
    return "; ".join(parts)


def _oracle_section(orc: Mapping[str, Any]) -> list[str]:
    benches = list(orc)
    labels = list(dict.fromkeys(m for bench in benches for m in orc[bench]))
    budgets = list(next(iter(orc[benches[0]].values())))
    head = ["| row | " + " | ".join(f"{bench} B={b}" for bench in benches for b in budgets) + " |",
            "|---|" + "---:|" * (len(benches) * len(budgets))]
    lines = ["## Oracle task score (offline oracle, not an LLM; every task, not a split)", "",
             _oracle_scope(orc) + ".", "", *head]
    for part, key in (("", "mean"), ("test", "test_mean")):
        if part:
            whole = [bench for bench in benches if bench not in ORACLE_SPLIT]
            lines += ["Held-out tasks only — the TEST half of each split (is_train of the trace set's task ids, "
                      "as for recall)" + (f"; {', '.join(whole)}: every task" if whole else "") + ":", "", *head]
        for m in labels:
            cells = []
            for bench in benches:
                for b in budgets:
                    v = orc[bench].get(m, {}).get(b) or {}
                    x = v.get(key if bench in ORACLE_SPLIT else "mean")
                    cells.append(_f(x))
            label = f"**{m}** (ours)" if m == PLUS else m
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    checks = [f"{bench} B={b}: {p:.1f} vs {c:.1f} ({'≥' if p >= c else 'BELOW'})"
              for bench, b, p, c in oracle_pairs(orc)]
    if checks:
        lines += [f"Oracle score, {PLUS} vs contextrender: " + "; ".join(checks) + ".", ""]
    return lines


# -- notes, generated from the data ------------------------------------------------------------

def verdict(evald: Mapping[str, Any], orc: Mapping[str, Any] | None) -> str:
    """The acceptance sentence, from the measured rows (gap covered per held-out set; oracle vs contextrender)."""
    rows = acceptance(evald)
    gap = [r for r in rows if r["gap_covered"] is not None]
    met = [r for r in gap if r["met"]]
    missed = [r for r in gap if not r["met"]]
    nogap = [r for r in rows if r["gap_covered"] is None]

    def part(rs: Sequence[Mapping[str, Any]]) -> str:
        def ci(r: Mapping[str, Any]) -> str:
            if r.get("gap_ci") is not None:
                return f" ({_level()} CI {_ci(r['gap_ci'])})"
            few = _few_traces(r.get("gap_traces"))
            return f" (the gap lies in {few})" if few else ""

        return ", ".join(f"{r['set']} {_pct(r['gap_covered'])}{ci(r)}" for r in rs)

    target = f"the {TARGET_SHARE:.0f} % target is "
    if not gap:
        text = "- Verdict: no held-out set has a gap to cover"
    else:
        text = "- Verdict: " + target + ("met on every held-out set with a gap" if not missed else
                                         (f"met on {part(met)} and NOT met on {part(missed)}" if met
                                          else f"NOT met: {part(missed)}"))
    if nogap:
        same = [r["set"] for r in nogap if r["met"]]
        below = [f"{r['set']} ({_f(r[PLUS])} < {_f(r['contextrender'])})" for r in nogap if not r["met"]]
        if same:
            text += f"; no gap on {', '.join(same)} (contextrender already equals the ceiling)"
        if below:
            text += f"; no gap but plus BELOW contextrender on {', '.join(below)}"
    text += f". Renders above B: {sum(r['over_budget'] for r in rows)}."
    if orc:
        checks = [f"{bench} {p:.1f} vs {c:.1f}{'' if p >= c else ' (BELOW)'}" for bench, _, p, c in oracle_pairs(orc)]
        text += " Oracle task score, plus vs contextrender: " + "; ".join(checks) + "."
    return text


def _recall(evald: Mapping[str, Any], set_name: str, row: str, budget: str = ACCEPT_BUDGET) -> float | None:
    return evald[set_name].get(budget, {}).get("methods", {}).get(row, {}).get("recall")


def gain_note(evald: Mapping[str, Any], budget: str = ACCEPT_BUDGET) -> str:
    """Where the recall gain comes from, computed from the held-out rows: Δ of each one-switch ablation vs
    the plus (negative: the switch helps), then every switch off, per trace set."""
    sets = [k for k, v in evald.items() if budget in v]
    parts = []
    for what, row in GAIN_ROWS:
        cells = []
        for k in sets:
            a, b = _recall(evald, k, row, budget), _recall(evald, k, PLUS, budget)
            if a is not None and b is not None:
                cells.append(f"{k} {a - b:+.1f}")
        parts.append(f"{what}: " + ", ".join(cells))
    off = []
    for k in sets:
        x, c = _recall(evald, k, SWITCHES_OFF, budget), _recall(evald, k, "contextrender", budget)
        if x is not None and c is not None:
            off.append(f"{k} {x:.1f} (contextrender {c:.1f})")
    return (f"- Where the gain comes from (held-out B={budget}, remove one switch; Δ recall vs the plus, computed "
            "from the rows above): " + "; ".join(parts) + f". Every switch off, with the fitted λ/W: {', '.join(off)}. "
            "Tabular forms, stubs and compacted omitted results fill only the budget left after the full "
            "results: they never change recall (their effect is on the oracle rows).")


def prior_note(fitted: Mapping[str, Any], n: int = 3) -> str | None:
    """The per-tool prior's low end, beside the highest tools the header lists (fit.json ``tool_prior``):
    the tools no later train turn ever reused, then the ``n`` lowest above them."""
    prior = fitted.get("tool_prior") or {}
    if len(prior) <= n:
        return None
    never = sorted(t for t, v in prior.items() if v <= 0)
    low = sorted(((t, v) for t, v in prior.items() if v > 0), key=lambda kv: (kv[1], kv[0]))[:n]
    text = ("- The per-tool prior (fit.json `tool_prior`: per tool, the share of later turns that reuse one of "
            f"its results, smoothed toward the pooled rate {fitted.get('prior_default')})")
    if never:
        text += f". Never reused on train: {_join(never)}; lowest above them"
    else:
        text += ", lowest"
    return text + ": " + ", ".join(f"{t} {v}" for t, v in low) + "."


def min_age_note(fitted: Mapping[str, Any]) -> str | None:
    """How the select stage chose prior_min_age (fit.json ``train_task_score`` and ``train_recall``)."""
    task, recall = fitted.get("train_task_score"), fitted.get("train_recall")
    if not task or not recall or "prior_min_age" not in fitted:
        return None
    floor = task["contextrender"]
    ages = {label.rsplit(" ", 1)[1]: label for label in recall}
    allowed = [a for a, label in ages.items() if task.get(label) is not None and task[label] >= floor - SAME]
    below = [f"{a} ({task[label]:.1f})" for a, label in ages.items() if a not in allowed and label in task]
    scores = "; ".join(f"{a}: train recall {recall[label]['mean']:.2f}, task score {task[label]:.1f}"
                       for a, label in ages.items() if label in task)
    return (f"- prior_min_age {fitted['prior_min_age']}, chosen by the select stage on TRAIN data only (fit.json "
            f"`train_task_score`, `train_recall`, B={fitted.get('budget')}): the largest train recall among the "
            f"choices whose {fitted.get('task_score_bench')} train-task score "
            f"({fitted.get('task_score_train_tasks')} tasks) is not below contextrender's {floor:.1f} — {scores}; "
            f"below that floor: {_join(below)}.")


def oracle_note(orc: Mapping[str, Any] | None) -> str | None:
    """Where the task-score gain comes from: each oracle ablation's score minus the plus's, per benchmark
    (every task), then plus vs contextrender on the held-out task ids."""
    if not orc:
        return None
    rows = list(dict.fromkeys(m for bench in orc for m in orc[bench] if m not in (PLUS, "contextrender")))
    parts = []
    for row in rows:
        cells = [f"{bench} {a - p:+.1f}" for bench, p, a in _oracle_deltas(orc, row)]
        if cells:
            parts.append(f"{row}: " + ", ".join(cells))
    held = []
    for bench, ms in orc.items():
        for b, v in (ms.get(PLUS) or {}).items():
            c = (ms.get("contextrender", {}).get(b) or {}).get("test_mean")
            if v.get("test_mean") is not None and c is not None:
                held.append(f"{bench} {v['test_mean']:.1f} vs {c:.1f}")
    if not parts and not held:
        return None
    text = "- Where the task-score gain comes from (oracle rows, every task; Δ score vs the plus): " + "; ".join(parts)
    if held:
        text += ". On held-out task ids only, plus vs contextrender: " + ", ".join(held)
    return text + "."


def ceiling_note(evald: Mapping[str, Any], budget: str = ACCEPT_BUDGET) -> str | None:
    """What still separates the plus from the ceiling (events, per set), and on sets with a causal reference
    how far a selector that sees only the past gets, and at which age it gains most over the plus."""
    missed, refs = [], []
    for set_name, by_b in evald.items():
        res = by_b.get(budget)
        if res is None:
            continue
        ms = res["methods"]
        pl, ce = ms[PLUS]["recall"], ms[CEILING]["recall"]
        if pl is not None and ce is not None and ce > pl + SAME:
            missed.append(f"{set_name} {round((ce - pl) / 100 * res['events'])} of {res['events']}")
        refs += [_reference_text(set_name, res, name) for name in REFERENCES if name in ms]
    if not missed and not refs:
        return None
    text = f"- What the ceiling still shows that the plus does not (held-out B={budget}, events): {_join(missed)}"
    return text + "".join(f". {r}" for r in refs) + "."


def _reference_text(set_name: str, res: Mapping[str, Any], name: str) -> str:
    ms = res["methods"]
    r = gap_row(set_name, res)
    ref, pl = ms[name], ms[PLUS]
    gains = {a: ((ref["recall_by_age"][a] or 0.0) - (pl["recall_by_age"][a] or 0.0)) / 100 * n
             for a, n in res["events_by_age"].items() if n and ref["recall_by_age"].get(a) is not None
             and pl["recall_by_age"].get(a) is not None}
    text = (f"On {set_name} the {name} reaches {_f(r['causal_reference'])}, while covering {TARGET_SHARE:.0f} % "
            f"of the hindsight gap needs {_f(_need(r)) if r['ceiling'] is not None else '–'}; the plus covers "
            f"{_pct(r['reachable_covered'])} of the gap to the reference")
    if gains:
        a = max(gains, key=lambda k: gains[k])
        text += (f", which gains the most events over the plus at age {_age_label(a)} "
                 f"({ref['recall_by_age'][a]:.0f} vs {pl['recall_by_age'][a]:.0f}, {round(gains[a])} events)")
    return text


def unseen_note(evald: Mapping[str, Any], fitted: Mapping[str, Any], budget: str = ACCEPT_BUDGET) -> str | None:
    """The held-out sets the fit never read any half of, reported whole."""
    fit_sets = set(fitted.get("fit_sets", []))
    parts = []
    for r in acceptance(evald, budget):
        if r["set"] not in fit_sets:
            parts.append(f"{r['set']} ({r['traces']} traces): contextrender {_f(r['contextrender'])}, plus "
                         f"{_f(r[PLUS])}, ceiling {_f(r['ceiling'])}"
                         + ("" if r["gap_covered"] is None else f" ({_pct(r['gap_covered'])} of the gap)"))
    if not parts:
        return None
    return f"- Never fitted on, reported whole (B={budget}): " + "; ".join(parts) + "."


def session_note(fitted: Mapping[str, Any], evald: Mapping[str, Any], orc: Mapping[str, Any] | None,
                 budget: str = ACCEPT_BUDGET) -> str | None:
    """How W_sess was chosen (fit.json ``session_history``) and what removing it changes held-out."""
    hist = fitted.get("session_history") or []
    if not hist:
        return None
    means = sorted(((h["train_recall"]["mean"], float(h["session_prior"])) for h in hist), reverse=True)
    (m1, w1), rest = means[0], means[1:]
    text = (f"- W_sess (this session's per-tool reuse share, for tools the prior never saw) is fitted with both "
            f"priors left out (fit.json `session_history`): {w1} has the best train mean, {m1:.2f}")
    if rest:
        text += f", {m1 - rest[0][0]:.2f} points above the next, {rest[0][0]:.2f} at {rest[0][1]}"
    totals, by_age = [], []
    for set_name, by_b in evald.items():
        ms = by_b.get(budget, {}).get("methods", {})
        if SESSION_ROW in ms and PLUS in ms:
            a, b = ms[SESSION_ROW], ms[PLUS]
            if abs((a["recall"] or 0.0) - (b["recall"] or 0.0)) > SAME:
                totals.append(f"{set_name} {b['recall']:.1f} → {a['recall']:.1f}")
            elif a.get("recall_by_age") != b.get("recall_by_age"):
                by_age.append(set_name)
    text += (f". Held-out, without it (the `{SESSION_ROW}` rows), recall totals change on: {_join(totals)}"
             f"; only the split by age changes on: {_join(by_age)}")
    if orc:
        moved = [f"{bench} {p:.1f} → {a:.1f}" for bench, p, a in _oracle_deltas(orc, ORACLE_SESSION_ROW)
                 if abs(a - p) > SAME]
        text += f"; oracle scores change on: {_join(moved)}"
    return text + "."


def _oracle_deltas(orc: Mapping[str, Any], row: str, key: str = "mean") -> list[tuple[str, float, float]]:
    """(benchmark, the plus's score, ``row``'s score) for every oracle cell both were measured in."""
    out = []
    for bench, ms in orc.items():
        for b, v in (ms.get(row) or {}).items():
            p = (ms.get(PLUS, {}).get(b) or {}).get(key)
            if v.get(key) is not None and p is not None:
                out.append((bench, float(p), float(v[key])))
    return out


def trim_note(evald: Mapping[str, Any], other: Mapping[str, Any] | None, budget: str = ACCEPT_BUDGET) -> str | None:
    """What the prose-first trim changes on these sets: the plus without it, and the ceiling with it."""
    prose = next((k for k, v in CEILINGS.items() if v), None)
    if prose is None or not any(TRIM_ROW in by_b.get(budget, {}).get("methods", {}) for by_b in evald.values()):
        return None
    rows, bounds = [], []
    for set_name in evald:
        by_b = {**evald[set_name], **((other or {}).get(set_name, {}))}
        a, b = _recall(evald, set_name, TRIM_ROW, budget), _recall(evald, set_name, PLUS, budget)
        if a is not None and b is not None and abs(a - b) > SAME:
            rows.append(f"{set_name} {b:.1f} → {a:.1f}")
        for bud in sorted(by_b, key=int):
            ms = by_b[bud]["methods"]
            x, y = ms.get(CEILING, {}).get("recall"), ms.get(prose, {}).get("recall")
            if x is not None and y is not None and abs(x - y) > SAME:
                bounds.append(f"{set_name} B={bud} {x:.1f} → {y:.1f}")
    return (f"- The prose-first trim (`trim_prose_first`, kept, not fitted): without it (the `{TRIM_ROW}` rows, "
            f"B={budget}) recall changes on: {_join(rows)}; the ceiling with that trim differs from the first "
            f"ceiling, at every budget reported, on: {_join(bounds)}.")


def notes(evald: Mapping[str, Any], fitted: Mapping[str, Any], orc: Mapping[str, Any] | None,
          other: Mapping[str, Any] | None = None) -> list[str]:
    """The report's notes, one bullet each, every figure computed from the data; the README says why."""
    found = [verdict(evald, orc), gain_note(evald), prior_note(fitted), min_age_note(fitted), oracle_note(orc),
             ceiling_note(evald), unseen_note(evald, fitted), session_note(fitted, evald, orc),
             trim_note(evald, other)]
    return [n for n in found if n] + [
        "- Why each piece is there, what was tried and dropped, and the caveats of the synthetic set: "
        "results/plus_fitted/README.md.", ""]


# -- the report and its figure -----------------------------------------------------------------

def report(evald: Mapping[str, Any], fitted: Mapping[str, Any], orc: Mapping[str, Any] | None,
           other: Mapping[str, Any] | None = None) -> str:
    """results/plus_fitted/plus.md: the held-out recall per set and budget, the acceptance check, the other
    budgets, the oracle's task score, and notes generated from the same data."""
    lines = _header(evald, fitted)
    for set_name, by_b in evald.items():
        for b, res in by_b.items():
            lines += _set_table(set_name, b, res)
    lines += _acceptance_section(evald)
    if other:
        lines += _other_budgets_section(evald, other, fitted)
    if orc:
        lines += _oracle_section(orc)
    lines += ["## Notes", "", *notes(evald, fitted, orc, other)]
    return "\n".join(lines)


def plot(evald: Mapping[str, Any], orc: Mapping[str, Any] | None, path: Path) -> None:
    """Left: held-out recall at the acceptance budget per set (contextrender, plus, ceiling); right: oracle task score."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncol = 2 if orc else 1
    fig, axes = plt.subplots(1, ncol, figsize=(7 * ncol, 4.2), squeeze=False)
    _plot_recall(axes[0][0], acceptance(evald))
    if orc:
        _plot_oracle(axes[0][1], orc)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def _plot_recall(ax: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    cat = catalogue.catalogue()
    x = np.arange(len(rows))
    for k, (key, colour, label) in enumerate((("contextrender", cat["contextrender"].colour, "contextrender"),
                                              (PLUS, cat[PLUS].colour, f"{PLUS} (ours)"),
                                              ("ceiling", "0.6", "hindsight ceiling (not a policy)"))):
        ax.bar(x + (k - 1) * 0.27, [r[key] or 0.0 for r in rows], 0.27, color=colour, label=label)
    for i, r in enumerate(rows):
        g = "no gap" if r["gap_covered"] is None else f"{r['gap_covered']:.0f}%"
        if r.get("gap_ci") is not None:
            g += f"\n[{r['gap_ci'][0]:.0f}, {r['gap_ci'][1]:.0f}]"
        ax.text(i, 2, g, ha="center", va="bottom", fontsize=7, color="white")
    ax.set_xticks(x, [r["set"] for r in rows])
    ax.set_ylabel(f"Later-Used Result Recall (%), B={ACCEPT_BUDGET}")
    ax.set_title(f"held-out recall (label: gap covered [{_level()} CI])")
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.legend(fontsize=8, loc="upper center", ncol=3)


def _plot_oracle(ax: Any, orc: Mapping[str, Any]) -> None:
    cat = catalogue.catalogue()
    benches = list(orc)
    labels = list(dict.fromkeys(m for bench in benches for m in orc[bench]))
    w = 0.8 / max(1, len(labels))
    for k, m in enumerate(labels):
        ys = [(orc[bench].get(m, {}).get(ACCEPT_BUDGET) or {}).get("mean") or 0.0 for bench in benches]
        colour = cat[m].colour if m in cat else None
        ax.bar(np.arange(len(benches)) + (k - (len(labels) - 1) / 2) * w, ys, w, label=m, color=colour,
               alpha=1.0 if m in cat else 0.5)
    ax.set_xticks(np.arange(len(benches)), benches)
    ax.set_ylabel(f"oracle task score %, B={ACCEPT_BUDGET}")
    ax.set_title("oracle (offline, every task)")
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.legend(fontsize=8, loc="upper center", ncol=3)


def write_outputs(out: Path, fitted: Mapping[str, Any]) -> str:
    """The report stage: read the evaluation's and the oracle's JSON under ``out`` and write plus.md,
    plus.json and plus.png there. Returns the report's text."""
    evald = json.loads((out / "plus_recall.json").read_text())
    orc = json.loads((out / "oracle.json").read_text()) if (out / "oracle.json").is_file() else None
    other = json.loads((out / "plus_budgets.json").read_text()) if (out / "plus_budgets.json").is_file() else None
    md = report(evald, fitted, orc, other)
    (out / "plus.md").write_text(md, encoding="utf-8")
    write_json(out / "plus.json", {"fit": {k: v for k, v in fitted.items() if k != "history"},
                                   "recall_test": evald, "oracle": orc, "recall_test_other_budgets": other})
    plot(evald, orc, out / "plus.png")
    return md
