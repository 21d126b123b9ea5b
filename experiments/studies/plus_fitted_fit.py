"""The fitted-profile study's fit, on TRAIN halves only (:mod:`.plus_fitted`): the per-tool reuse prior,
the call prior, the grid (W_prior, W_lex, then W_sess), ``prior_min_age``, and the check that
conf/method/contextrender_plus_fitted.yaml carries what the fit found."""

from __future__ import annotations

import bisect
import itertools
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from contextrender.experiments.evaluation.traces import Episode
from contextrender.experiments.studies.plus_fitted_data import FIT_BUDGETS, FIT_SETS, PLUS, run_replay
from contextrender.experiments.studies.plus_fitted_oracle import oracle
from contextrender.registry import method_config

log = logging.getLogger(__name__)

#: The oracle benchmark whose TRAIN task ids (:data:`~.plus_fitted_oracle.ORACLE_SPLIT`) choose
#: prior_min_age (the task-score constraint).
AGE_BENCH = "tau2_retail"
AGE_CHOICES = (0, 1, 2, 3)


def _result_outcomes(episode: Episode) -> Iterator[tuple[str, Mapping[str, Any] | None, int, int]]:
    """Per tool result of a TRAIN episode: (tool name, its call's ``function`` entry or None for an orphan
    result, how many later assistant turns there are, how many of them reuse it — docs/method.md §7 events). A
    result pairs with the latest call so far with its id, as the graph pairs them; an orphan's tool is
    "tool"."""
    from contextrender.experiments.evaluation.recall import reuse_events

    msgs = list(episode.messages)
    used = {(e.j, e.result_seq) for e in reuse_events(msgs)}
    turns = episode.assistant_indices  # transcript index of invocation j, increasing
    calls: dict[Any, Mapping[str, Any]] = {}
    for r, m in enumerate(msgs):
        for tc in m.get("tool_calls") or []:
            calls[tc.get("id")] = tc["function"]
        if m.get("role") != "tool":
            continue
        fn = calls.get(m.get("tool_call_id"))
        later = range(bisect.bisect_right(turns, r), len(turns))  # the invocations after the result
        yield (fn["name"] if fn else "tool"), fn, len(later), sum((j, r) in used for j in later)


def fit_tool_prior(episodes: Iterable[Episode], smooth: float = 2.0) -> tuple[dict[str, float], float]:
    """P(tool): per tool, the share of (later assistant turn, earlier result of that tool) pairs in which
    the turn reuses the result (docs/method.md §7 events), smoothed toward the pooled rate with ``smooth``
    pseudo-pairs. Returns the prior and the pooled rate (the default for unseen tools).
    Called on TRAIN episodes only."""
    hits: dict[str, int] = {}
    pairs: dict[str, int] = {}
    for ep in episodes:
        for t, _, n_later, n_hit in _result_outcomes(ep):
            pairs[t] = pairs.get(t, 0) + n_later
            hits[t] = hits.get(t, 0) + n_hit
    pooled = sum(hits.values()) / max(1, sum(pairs.values()))
    prior = {t: round((hits[t] + smooth * pooled) / (pairs[t] + smooth), 4) for t in sorted(pairs)}
    return prior, round(pooled, 4)


#: A word enters the call prior when calls of its tool containing it occur in at least this many TRAIN
#: episodes (rarer words — most names and ids — would only memorise single tasks; τ² users recur across
#: tasks, so some of their names pass), and when it moves the log-odds of P(tool) by at least
#: CALL_MIN_LOGIT (a word at P(tool) says nothing).
CALL_MIN_EPISODES = 5
CALL_MIN_LOGIT = 0.01


def fit_call_prior(episodes: Iterable[Episode], tool_prior: Mapping[str, float],
                   smooth: float = 2.0) -> dict[str, dict[str, float]]:
    """P(tool, word): as :func:`fit_tool_prior`, over the pairs whose earlier result's call contains the word
    (:func:`~contextrender.plus.call_words`), smoothed toward P(tool) with ``smooth`` pseudo-pairs; words in
    fewer than :data:`CALL_MIN_EPISODES` train episodes or within :data:`CALL_MIN_LOGIT` of P(tool) are left
    out, and so are tools with no word kept.
    Called on TRAIN episodes only."""
    from contextrender.plus import call_words, log_odds

    hits: dict[tuple[str, str], int] = {}
    pairs: dict[tuple[str, str], int] = {}
    where: dict[tuple[str, str], set[str]] = {}
    for ep in episodes:
        for t, fn, n_later, n_hit in _result_outcomes(ep):
            if fn is None:
                continue
            for w in call_words(fn.get("arguments") or ""):
                key = (t, w)
                pairs[key] = pairs.get(key, 0) + n_later
                hits[key] = hits.get(key, 0) + n_hit
                where.setdefault(key, set()).add(ep.task_id)
    out: dict[str, dict[str, float]] = {}
    for (t, w), n in sorted(pairs.items()):
        if t not in tool_prior or len(where[(t, w)]) < CALL_MIN_EPISODES:
            continue
        p = round((hits[(t, w)] + smooth * tool_prior[t]) / (n + smooth), 4)
        if abs(log_odds(p) - log_odds(tool_prior[t])) >= CALL_MIN_LOGIT:
            out.setdefault(t, {})[w] = p
    return out


#: The grid of the fit (kept small for the study's time budget); λ, γ and the weights stay at the
#: values conf/method/contextrender_plus_fitted.yaml carries (fitted on train in an earlier round).
GRID: dict[str, list[float]] = {"prior_weight": [0.0, 1.0, 2.0, 4.0, 8.0], "lexical": [0.0, 1.0]}
#: W_sess is for tools the prior never saw, so it is fitted with the prior left out (an empty
#: tool_prior: every train tool plays an unseen one), with the chosen W_prior and W_lex.
SESSION_GRID = [0.0, 1.0, 2.0, 4.0]


def _objective(specs: Mapping[str, tuple[str, Mapping[str, Any]]],
               train: Mapping[str, Sequence[Episode]]) -> dict[str, dict[str, float]]:
    """Train-split recall per spec name and trace set (at FIT_BUDGETS), plus their mean under "mean"."""
    acc: dict[str, dict[str, float]] = {k: {} for k in specs}
    for set_name, episodes in train.items():
        for b in FIT_BUDGETS:
            res = run_replay(specs, episodes, b)
            for k, t in res.methods.items():
                assert t.over_budget == 0, (k, b)
                acc[k][f"{set_name}@{b}"] = t.stats.pct or 0.0
    for v in acc.values():
        v["mean"] = float(np.mean(list(v.values())))
    return acc


def _fit_session_prior(params: Mapping[str, Any], pooled: float, train: Mapping[str, Sequence[Episode]]
                       ) -> tuple[float, dict[str, dict[str, float]]]:
    """W_sess on :data:`SESSION_GRID` with both priors left out and the grid's other values fixed: the
    best choice (ties: the smaller) and the train recall of every choice, keyed "session_prior=<w>"."""
    sess_specs = {f"session_prior={w}": (PLUS, {**params, "tool_prior": {}, "call_prior": {},
                                                "prior_default": pooled, "session_prior": w})
                  for w in SESSION_GRID}
    sess = _objective(sess_specs, train)
    w_best = max(SESSION_GRID, key=lambda w: (round(sess[f"session_prior={w}"]["mean"], 6), -w))
    log.info("fit: session_prior %s (train, prior left out, %.2f)", w_best, sess[f"session_prior={w_best}"]["mean"])
    return w_best, sess


def fit(split: Mapping[str, Mapping[str, Sequence[Episode]]], rounds: int = 1) -> dict[str, Any]:
    """Fit the per-tool prior and the grid on the TRAIN halves of :data:`FIT_SETS` (never τ²-airline)."""
    del rounds  # one grid pass
    train = {k: split[k]["train"] for k in FIT_SETS}
    prior, pooled = fit_tool_prior(e for k in FIT_SETS for e in train[k])
    calls = fit_call_prior((e for k in FIT_SETS for e in train[k]), prior)
    grid = [dict(zip(GRID, vals, strict=True)) for vals in itertools.product(*GRID.values())]
    # The call prior is one more dimension of the grid: kept only if a point with it wins (train).
    specs = {json.dumps({**g, "call_prior": on}, sort_keys=True): (
        PLUS, {**g, "tool_prior": prior, "call_prior": calls if on else {}, "prior_default": pooled})
        for g in grid for on in (False, True)}
    scores = _objective(specs, train)
    best = max(scores, key=lambda k: (round(scores[k]["mean"], 6), -json.loads(k)["prior_weight"],
                                      not json.loads(k)["call_prior"]))
    log.info("fit: best %s (train %.2f)", best, scores[best]["mean"])
    params = json.loads(best)
    with_calls = params.pop("call_prior")
    no_calls = max((v for k, v in scores.items() if not json.loads(k)["call_prior"]), key=lambda v: v["mean"])
    if not with_calls:
        calls = {}
    log.info("fit: call prior %s (train %.2f; best without it %.2f)", "kept" if calls else "dropped",
             scores[best]["mean"], no_calls["mean"])
    w_best, sess = _fit_session_prior(params, pooled, train)
    return {"params": {**params, "session_prior": w_best}, "train_objective": scores[best]["mean"],
            "fit_budgets": list(FIT_BUDGETS), "fit_sets": list(FIT_SETS), "tool_prior": prior,
            "prior_default": pooled, "call_prior": calls, "without_call_prior": no_calls,
            "history": [{"params": json.loads(k), "train_recall": v} for k, v in scores.items()],
            "session_history": [{"session_prior": w, "prior": "left out", "train_recall": sess[f"session_prior={w}"]}
                                for w in SESSION_GRID],
            "train_tasks": {k: len(v) for k, v in train.items()}}


def select_min_age(split: Mapping[str, Mapping[str, Sequence[Episode]]], budget: int = 2000,
                   workers: int = 1) -> dict[str, Any]:
    """prior_min_age, chosen on TRAIN data only: the choice with the largest train recall (FIT_SETS'
    train halves) among those whose oracle pass^1 on :data:`AGE_BENCH`'s TRAIN task ids is not below
    contextrender's (ties: the smaller age). Reads the rest of the configuration from the method yaml.
    ``workers``: oracle jobs at a time (:func:`~.plus_fitted_oracle.oracle`)."""
    labels = {a: f"plus, prior_min_age {a}" for a in AGE_CHOICES}
    orc = oracle(methods=("contextrender",), budgets=(budget,), benches=(AGE_BENCH,), workers=workers,
                 ablations={labels[a]: (PLUS, (f"method.prior_min_age={a}",)) for a in AGE_CHOICES})
    task = {label: v[str(budget)]["train_mean"] for label, v in orc[AGE_BENCH].items()}
    recall = _objective({labels[a]: (PLUS, {"prior_min_age": a}) for a in AGE_CHOICES},
                        {k: split[k]["train"] for k in FIT_SETS})
    floor = task["contextrender"]
    allowed = [a for a in AGE_CHOICES if task[labels[a]] >= floor - 1e-9]
    if not allowed:
        raise SystemExit(f"no prior_min_age in {AGE_CHOICES} keeps the train task score ({task}) at contextrender's")
    best = max(allowed, key=lambda a: (round(recall[labels[a]]["mean"], 6), -a))
    log.info("prior_min_age %d (train task score %s, train recall %s)", best, task,
             {a: round(recall[labels[a]]["mean"], 2) for a in AGE_CHOICES})
    return {"prior_min_age": best, "budget": budget, "task_score_bench": AGE_BENCH,
            "train_task_score": task, "train_recall": {labels[a]: recall[labels[a]] for a in AGE_CHOICES},
            "task_score_train_tasks": orc[AGE_BENCH]["contextrender"][str(budget)]["train_tasks"]}


def check_config(fitted: Mapping[str, Any]) -> None:
    """The method config must carry what the fit found (the prior is read from the config at render time)."""
    cfg = method_config(PLUS)
    have = {str(k): float(v) for k, v in dict(cfg.get("tool_prior") or {}).items()}
    want = {str(k): float(v) for k, v in fitted["tool_prior"].items()}
    diffs = [k for k in set(have) | set(want) if abs(have.get(k, -1.0) - want.get(k, -1.0)) > 1e-9]
    have_calls = {f"{t}.{w}": float(p) for t, ws in dict(cfg.get("call_prior") or {}).items() for w, p in dict(ws).items()}
    want_calls = {f"{t}.{w}": float(p) for t, ws in fitted.get("call_prior", {}).items() for w, p in ws.items()}
    diffs += [k for k in set(have_calls) | set(want_calls)
              if abs(have_calls.get(k, -1.0) - want_calls.get(k, -1.0)) > 1e-9]
    other = {k: (cfg.get(k), v) for k, v in {**fitted["params"], "prior_default": fitted["prior_default"]}.items()
             if abs(float(cfg.get(k)) - float(v)) > 1e-9}
    if "prior_min_age" in fitted and int(cfg.get("prior_min_age")) != int(fitted["prior_min_age"]):
        other["prior_min_age"] = (cfg.get("prior_min_age"), fitted["prior_min_age"])
    if diffs or other:
        raise SystemExit(f"conf/method/contextrender_plus_fitted.yaml differs from results/plus_fitted/fit.json "
                         f"(tool_prior / call_prior keys {sorted(diffs)[:5]}, params {other}): copy the fitted "
                         "values (python -m contextrender.experiments.studies.plus_fitted --print-config prints them)")


def config_block(fitted: Mapping[str, Any]) -> str:
    """The fitted values as YAML lines for conf/method/contextrender_plus_fitted.yaml (what :func:`check_config`
    compares): the grid's parameters, prior_min_age when selected, prior_default, tool_prior, call_prior."""
    import yaml

    flat = {**fitted["params"], **({"prior_min_age": fitted["prior_min_age"]} if "prior_min_age" in fitted else {}),
            "prior_default": fitted["prior_default"]}
    return yaml.safe_dump({**flat, "tool_prior": dict(fitted["tool_prior"]),
                           "call_prior": {t: dict(ws) for t, ws in fitted.get("call_prior", {}).items()}},
                          sort_keys=True, allow_unicode=True, default_flow_style=False)
