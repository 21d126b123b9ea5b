"""The fitted-profile study's evaluation, on held-out traces only (:mod:`.plus_fitted`): one replay per
set and budget through the profile, its ablations, contextrender, the hindsight ceilings and the set's
causal reference, and the gap shares read from those replays."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from contextrender.experiments.evaluation.ceiling import gap_covered, gap_interval, gap_traces
from contextrender.experiments.evaluation.traces import Episode
from contextrender.experiments.studies.plus_fitted_data import (
    CEILING,
    CEILINGS,
    EVAL_BUDGETS,
    FIT_BUDGETS,
    OTHER_BUDGETS,
    PLUS,
    REFERENCES,
    ROOT,
    SET_REFERENCES,
    run_replay,
)
from contextrender.experiments.studies.plus_fitted_fit import AGE_CHOICES
from contextrender.registry import method_config

log = logging.getLogger(__name__)

OTHER_SPECS = (PLUS, "contextrender")
#: The acceptance target: the share (%) of the hindsight gap the profile must cover on each held-out set.
TARGET_SHARE = 80.0
#: The budget the acceptance check reads (the evaluation's; the fit's too).
ACCEPT_BUDGET = str(EVAL_BUDGETS[0])
PAPER_FLAT = {"lam": 0.3, "gamma": 0.2, "weights.reuse": 1.0, "weights.relevance": 1.0, "weights.recency": 1.0}


def eval_specs() -> dict[str, tuple[str, dict[str, Any]]]:
    """contextrender_plus as configured (conf/method/contextrender_plus_fitted.yaml), one ablation per switch
    that can change which results are shown, the other prior_min_age choices, every switch off, and
    contextrender. (tabular, stubs and compact_omitted fill only the budget left after the full results:
    they never change recall, so their ablations are oracle rows.)"""
    off = {"packing": False, "stubs": False, "tabular": False, "lexical": 0.0, "compact_omitted": False,
           "prior_weight": 0.0, "session_prior": 0.0, "use_call_prior": False, "trim_prose_first": False}
    age = int(method_config(PLUS).get("prior_min_age", 0))
    ages = {f"plus, prior_min_age {a}": (PLUS, {"prior_min_age": a}) for a in AGE_CHOICES if a != age}
    return {
        PLUS: (PLUS, {}),
        "plus −prior (fitted and session)": (PLUS, {"prior_weight": 0.0, "session_prior": 0.0}),
        "plus −session prior (W_sess 0)": (PLUS, {"session_prior": 0.0}),
        "plus −call prior (per-tool P only)": (PLUS, {"use_call_prior": False}),
        **ages,
        "plus −lexical": (PLUS, {"lexical": 0.0}),
        "plus −packing": (PLUS, {"packing": False}),
        "plus −prose-first trim": (PLUS, {"trim_prose_first": False}),
        "plus −fit (paper λ,γ,W)": (PLUS, dict(PAPER_FLAT)),
        "switches off (fitted λ,W)": (PLUS, off),
        "contextrender": ("contextrender", {}),
    }


def relative_places(j: dict[str, Any]) -> dict[str, Any]:
    """A replay's JSON with each trace's place relative to the checkout (the trace sets live under it):
    the written results name no machine's paths."""
    root = f"{ROOT}{os.sep}"
    j["trace_where"] = [w[len(root):] if w.startswith(root) else w for w in j.get("trace_where", [])]
    return j


def evaluate(split: Mapping[str, Mapping[str, Sequence[Episode]]], budgets: Sequence[int] = EVAL_BUDGETS,
             specs: Mapping[str, tuple[str, Mapping[str, Any]]] | None = None) -> dict[str, Any]:
    """Replay every TEST half (τ²-airline: every trace) once per budget through every spec and the ceiling."""
    specs = eval_specs() if specs is None else specs
    out: dict[str, Any] = {}
    for set_name, parts in split.items():
        for b in budgets:
            res = run_replay(specs, parts["test"], b, with_ceilings=True, references=SET_REFERENCES.get(set_name, ()))
            j = relative_places(res.to_json())
            for name, t in res.methods.items():
                j["methods"][name]["budgeted"] = t.budgeted
                if name in CEILINGS or name in REFERENCES:
                    j["methods"][name]["reference"] = True
            out.setdefault(set_name, {})[str(b)] = j
            log.info("%s B=%d: %s", set_name, b, {k: round(v["recall"] or 0, 1) for k, v in j["methods"].items()})
    return out


def evaluate_other_budgets(split: Mapping[str, Mapping[str, Sequence[Episode]]],
                           budgets: Sequence[int] = OTHER_BUDGETS) -> dict[str, Any]:
    """As :func:`evaluate`, at budgets the fit never saw, for the plus and contextrender (with the ceiling
    and the set's references): does the B=2000 fit carry over to a tighter and a looser budget?"""
    return evaluate(split, budgets, {k: v for k, v in eval_specs().items() if k in OTHER_SPECS})


def budget_rows(evald: Mapping[str, Any], other: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per held-out set and budget (the evaluation's and the other budgets, in order of B): contextrender,
    plus, ceiling, gap covered, plus's renders above B."""
    rows = []
    for set_name in evald:
        by_b = {**evald[set_name], **other.get(set_name, {})}
        for b in sorted(by_b, key=int):
            rows.append({**gap_row(set_name, by_b[b]), "budget": int(b), "fitted": int(b) in FIT_BUDGETS})
    return rows


def oracle_pairs(orc: Mapping[str, Any]) -> list[tuple[str, str, float, float]]:
    """(benchmark, budget, plus's mean, contextrender's mean) for every oracle cell both were measured in."""
    out = []
    for bench, ms in orc.items():
        if {"contextrender", PLUS} <= set(ms):
            for b, v in ms[PLUS].items():
                c = ms["contextrender"].get(b, {}).get("mean")
                if v["mean"] is not None and c is not None:
                    out.append((bench, b, float(v["mean"]), float(c)))
    return out


def gap_row(set_name: str, res: Mapping[str, Any]) -> dict[str, Any]:
    """One replay of a held-out set (its JSON): contextrender, plus, ceiling, gap covered, the set's causal
    reference and the share of the gap to it, plus's renders above B."""
    ms = res["methods"]
    cr, pl, ce = (ms[k]["recall"] for k in ("contextrender", PLUS, CEILING))
    ref_name = next((k for k in SET_REFERENCES.get(set_name, ()) if k in ms), None)
    ref = ms[ref_name]["recall"] if ref_name is not None else None
    gap = gap_covered(pl, cr, ce)

    def hits(name: str | None) -> Any:
        return ms[name].get("hits_per_trace") if name is not None else None

    def interval(name: str | None, bound: str | None = CEILING) -> tuple[float, float] | None:
        """name's share of the gap from contextrender to ``bound``: its 95 % interval over traces."""
        per_trace = [hits(k) for k in (name, "contextrender", bound)]
        return gap_interval(*per_trace) if all(h is not None for h in per_trace) else None

    spread = [hits(k) for k in ("contextrender", CEILING)]
    reachable = gap_covered(pl, cr, ref)
    return {"set": set_name, "traces": res["traces"], "events": res["events"], "contextrender": cr,
            PLUS: pl, "ceiling": ce, "gap_covered": gap,
            "gap_ci": interval(PLUS) if gap is not None else None,
            "gap_traces": gap_traces(*spread) if all(h is not None for h in spread) else None,
            "reference_gap_covered": gap_covered(ref, cr, ce),
            "reference_gap_ci": interval(ref_name) if gap is not None else None,
            "causal_reference": ref, "reachable_covered": reachable,
            "reachable_ci": interval(PLUS, ref_name) if reachable is not None else None,
            "over_budget": ms[PLUS]["over_budget_renders"]}


def acceptance(evald: Mapping[str, Any], budget: str = ACCEPT_BUDGET) -> list[dict[str, Any]]:
    """Per held-out set: :func:`gap_row` at ``budget`` and whether it covers :data:`TARGET_SHARE` of the gap
    (or, with no gap, plus ≥ cr)."""
    rows = []
    for set_name, by_b in evald.items():
        if budget not in by_b:
            continue
        r = gap_row(set_name, by_b[budget])
        g, pl, cr = r["gap_covered"], r[PLUS], r["contextrender"]
        ok = (g is not None and g >= TARGET_SHARE) or (g is None and pl is not None and cr is not None and pl >= cr - 1e-9)
        rows.append({**r, "met": bool(ok)})
    return rows
