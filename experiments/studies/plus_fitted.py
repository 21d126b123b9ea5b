"""The OPTIONAL fitted profile of contextrender_plus (NOT the paper's method, and not the plus's default):
how ``conf/method/contextrender_plus_fitted.yaml`` was fitted and evaluated — results/plus_fitted/plus.md.

The default contextrender_plus names no tool and learns from the user's own graph file
(:mod:`~contextrender.experiments.studies.plus`); this profile carries per-tool and call priors fitted on
this project's benchmarks, which do nothing for another agent's tools. It is kept to reproduce those
figures. (The committed results/plus_fitted/ files were written when this profile was the plus itself:
their method key ``contextrender_plus`` is this profile.)

    make plus-fitted  (= python -m contextrender.experiments.studies.plus_fitted)   # every stage
    python -m contextrender.experiments.studies.plus_fitted --stage fit      # traces, split, fit on TRAIN only
    python -m contextrender.experiments.studies.plus_fitted --stage select   # prior_min_age: TRAIN recall + task ids
    python -m contextrender.experiments.studies.plus_fitted --stage eval     # recall on held-out traces + ceiling
    python -m contextrender.experiments.studies.plus_fitted --stage oracle   # oracle task score at B=2000

Trace sets (Full-history transcripts of the offline oracle at B=2000, recorded by
``contextrender.experiments.run`` when missing; recall is spec §7's, computed by
contextrender.experiments.evaluation.replay):
- ``bfcl``, ``tau2_retail``: results/runs/table1/traces (the Full runs of ``make reproduce-table1``);
- ``tau2_airline``, ``moqa``: results/runs/fullsets/traces (τ²-airline's 50 tasks; 200 moqa8_offline tasks);
- ``synth``: synthetic support/ops-agent transcripts with long-range reuse, generated here
  with a fixed seed (see :func:`synth_episode`). WRITTEN BY THE SAME AUTHOR AS THE METHOD:
  weaker evidence than the recorded sets, reported separately.

Each set is split by task id with a deterministic hash (:func:`is_train`, 50/50), except
τ²-airline, an evaluation-only domain reported whole. The per-tool reuse prior, the call prior
(P(tool, word of the call)) and the grid (W_prior, W_lex) are fitted on the TRAIN halves of
:data:`FIT_SETS` only (BFCL, τ²-retail, synth, moqa8_offline); the fitted values are carried by
conf/method/contextrender_plus_fitted.yaml (the eval stage refuses to run if it differs from
results/plus_fitted/fit.json). ``prior_min_age`` is then chosen with
the fitted values fixed (:func:`select_min_age`): the largest TRAIN recall among the choices whose
oracle pass^1 on τ²-retail's TRAIN task ids is not below contextrender's. Held-out traces are
replayed once, after fitting, with one ablation per switch.

Each replay also reports the hindsight ceiling (:class:`HindsightCeiling`, not a policy): the
most reused results any selector with the same scope, verbatim trim and markers could have
shown; "gap covered" is (plus − contextrender) / (ceiling − contextrender). The synthetic set also
gets a causal reference (:class:`SynthBayes`): a selector that knows the generator's own reuse
probabilities but nothing of the future — what any selector that sees only the past can expect there.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contextrender import offline
from contextrender.compaction import make_compactor
from contextrender.embed import make_embedder
from contextrender.experiments import catalogue
from contextrender.experiments.evaluation.ceiling import (
    GAP_CI_DRAWS,
    GAP_CI_MIN_TRACES,
    GAP_CI_SEED,
    HindsightCeiling,
    gap_covered,
    gap_interval,
    gap_traces,
)
from contextrender.experiments.evaluation.recall import AGE_BINS, FirstAppearance
from contextrender.experiments.evaluation.replay import (
    MemoCompactor,
    ReplayResult,
    Shared,
    SharedEmbeddings,
    replay,
    write_json,
)
from contextrender.experiments.evaluation.traces import Episode, read_traces
from contextrender.experiments.records.schema import effective_records
from contextrender.graph import Session
from contextrender.registry import build_policy, method_config
from contextrender.scoring import Weights
from contextrender.selector import Choice, ContextRender, Stage, greedy

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "plus_fitted"
#: The profile this study fits and evaluates (conf/method/contextrender_plus_fitted.yaml).
PLUS = "contextrender_plus_fitted"
TRACE_SETS = {
    "bfcl": ROOT / "results/runs/table1/traces/oracle__bfcl_multi_turn_long_context__full__B2000.jsonl",
    "tau2_retail": ROOT / "results/runs/table1/traces/oracle__tau2_retail__full__B2000.jsonl",
    "tau2_airline": ROOT / "results/runs/fullsets/traces/oracle__tau2_airline__full__B2000.jsonl",
    "moqa": ROOT / "results/runs/fullsets/traces/oracle__moqa8_offline__full__B2000.jsonl",
    "synth": OUT / "traces/synth_seed0.jsonl",
    # a second moqa8_offline corpus (seed 1: other entities, other questions), never fitted on
    "moqa_fresh": ROOT / "results/runs/fresh_moqa/traces/oracle__moqa8_offline__full__B2000.jsonl",
}
#: Trace sets the fit may read (their TRAIN halves only). τ²-airline is an evaluation-only domain and
#: moqa_fresh a corpus the fit never saw (generated with another seed): both reported whole.
FIT_SETS = ("bfcl", "tau2_retail", "synth", "moqa")
EVAL_ONLY = ("tau2_airline", "moqa_fresh")
FIT_BUDGETS = (2000,)
EVAL_BUDGETS = (2000,)
#: Budgets the plus is also reported at (held-out, never fitted there), with contextrender and the bounds only.
OTHER_BUDGETS = (1000, 4000)
OTHER_SPECS = (PLUS, "contextrender")
PAPER_PARAMS = {"lam": 0.3, "gamma": 0.2, "weights": {"recency": 1.0, "relevance": 1.0, "reuse": 1.0}}


# -- split ---------------------------------------------------------------------------------

def is_train(task_id: str) -> bool:
    """Deterministic 50/50 split by task id (sha256, independent of order and of the method)."""
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % 2 == 0


# -- synthetic traces ----------------------------------------------------------------------

_SYSTEM = ("You are a support-operations agent. Use the tools to investigate and fix customer issues. "
           "Refer to records by their ids exactly as the tools return them.")
_SERVICES = ["billing", "checkout", "inventory", "shipping", "auth", "search", "payments", "notifications"]
_NAMES = ["Avery Stone", "Jordan Lee", "Priya Nair", "Mateo Ruiz", "Hana Kato", "Lena Vogel", "Omar Haddad"]


#: The generator's reuse model (see :class:`_Synth`), also read by :class:`SynthBayes`.
SYNTH_P_RECENT = 0.40  # a call reuses an id of a result of the last 3 invocations
SYNTH_P_OLD = 0.25  # ... of an older one (half of those: of a result already reused, when there is one)
SYNTH_RECENT_AGE = 3
SYNTH_WEIGHT = {"small": 4.0, "medium": 1.5, "large": 0.5}  # which result of the pool, by its kind
SYNTH_KIND = {"get_logs": "large", "read_config": "medium"}  # every other tool: "small"
SYNTH_FOLLOW_UP = re.compile(r"follow up on (\S+) from earlier")
SYNTH_DONE = "Done with that step."  # the assistant turn before a follow-up user message (no reuse)
SYNTH_FOLLOW_GAP = (6, 10)  # invocations from one follow-up check to the next, uniform (integers(6, 11))
SYNTH_LENGTH = (25, 45)  # invocations of an episode, uniform; then "All issues are handled." (no reuse)


class _Synth:
    """One synthetic episode: tools return records whose ids the agent reuses, some much later.

    Modelled behaviour (fixed before the method was tuned; probabilities below):
    - exploratory calls (search/list/logs/config) return results of very different size:
      logs 600–1400 tokens, configs 250–600, listings and records 60–250;
    - 40% of calls reuse an id from a result of the last 3 turns, 25% from an older one
      (half of those from a result already reused: chains), the rest explore;
    - ids in small records are reused far more often than ids inside large logs;
    - every 6–10 turns the user sends a follow-up naming an id seen earlier (age ≥ 4),
      which the next call uses.
    """

    def __init__(self, rng: np.random.Generator, idx: int) -> None:
        self.rng = rng
        self.idx = idx
        self.msgs: list[dict[str, Any]] = []
        self.results: list[dict[str, Any]] = []  # {"inv", "ids", "kind", "reused"}
        self.inv = 0
        self.seen: set[str] = set()

    def _id(self, prefix: str, n: int = 5) -> str:
        while True:
            v = f"{prefix}_{int(self.rng.integers(10 ** (n - 1), 10 ** n))}"
            if v not in self.seen:
                self.seen.add(v)
                return v

    def _hex(self, prefix: str) -> str:
        v = f"{prefix}_{self.rng.integers(0, 2 ** 40):010x}"
        self.seen.add(v)
        return v

    # results: (text, usable ids, kind)
    def r_search_orders(self) -> tuple[str, list[str], str]:
        rows, ids = [], []
        for _ in range(int(self.rng.integers(4, 9))):
            o, s = self._id("ord"), self._id("sku", 6)
            ids += [o, s]
            rows.append(f"{o} | {s} | qty {int(self.rng.integers(1, 5))} | "
                        f"{self.rng.choice(['shipped', 'pending', 'refunded', 'delayed'])} | "
                        f"2026-0{int(self.rng.integers(1, 9))}-{int(self.rng.integers(10, 28))}")
        return "order_id | sku | qty | status | date\n" + "\n".join(rows), ids, "small"

    def r_get_order(self, oid: str) -> tuple[str, list[str], str]:
        u, t, s, w = self._id("usr"), self._id("tck"), self._id("sku", 6), self._id("whs", 4)
        text = json.dumps({"order_id": oid, "customer": u, "ticket": t, "items": [{"sku": s, "qty": 2}],
                           "warehouse": w, "carrier_ref": self._hex("trk"), "total": float(self.rng.integers(20, 900))})
        return text, [u, t, s, w], "small"

    def r_get_user(self, uid: str) -> tuple[str, list[str], str]:
        a, p = self._id("acct"), self._id("pay", 6)
        text = json.dumps({"user_id": uid, "name": str(self.rng.choice(_NAMES)), "account": a,
                           "payment_method": p, "tier": str(self.rng.choice(["gold", "basic"]))})
        return text, [a, p], "small"

    def r_list_tickets(self) -> tuple[str, list[str], str]:
        rows, ids = [], []
        for _ in range(int(self.rng.integers(5, 12))):
            t = self._id("tck")
            ids.append(t)
            rows.append(f"{t}: {self.rng.choice(['late delivery', 'double charge', 'wrong item', 'login loop'])}"
                        f" (priority {int(self.rng.integers(1, 4))})")
        return "\n".join(rows), ids, "small"

    def r_get_ticket(self, tid: str) -> tuple[str, list[str], str]:
        o, e = self._id("ord"), self._id("esc", 4)
        text = (f"ticket {tid}\nstatus: open\nrelated order: {o}\nescalation: {e}\n"
                f"notes: customer wrote twice; agent_note_{int(self.rng.integers(100, 999))}")
        return text, [o, e], "small"

    def r_get_logs(self, service: str) -> tuple[str, list[str], str]:
        lines, ids = [], []
        for _ in range(int(self.rng.integers(25, 55))):
            lvl = self.rng.choice(["INFO", "INFO", "INFO", "WARN", "ERROR"])
            req = self._hex("req")
            lines.append(f"2026-03-0{int(self.rng.integers(1, 9))}T{int(self.rng.integers(10, 23))}:"
                         f"{int(self.rng.integers(10, 59))}:{int(self.rng.integers(10, 59))}Z {lvl} {service} "
                         f"request_id={req} latency_ms={int(self.rng.integers(5, 900))} "
                         f"node=node_{int(self.rng.integers(1, 40))} msg={self.rng.choice(['ok', 'retry', 'timeout', 'cache miss'])}")
            if lvl == "ERROR":
                ids.append(req)
        return "\n".join(lines), ids, "large"

    def r_read_config(self, service: str) -> tuple[str, list[str], str]:
        lines, ids = [], []
        for _ in range(int(self.rng.integers(15, 35))):
            key = f"{service}_{self.rng.choice(['pool', 'timeout', 'retry', 'cache', 'queue', 'limit'])}_" \
                  f"{self.rng.choice(['size', 'ms', 'max', 'ttl', 'depth'])}_{int(self.rng.integers(1, 99))}"
            if key in self.seen:
                continue
            self.seen.add(key)
            ids.append(key)
            lines.append(f"{key} = {int(self.rng.integers(1, 5000))}  # {self.rng.choice(['tuned', 'default', 'see runbook'])}")
        return "\n".join(lines), ids, "medium"

    def _call(self, name: str, args: dict[str, Any], thought: str) -> None:
        cid = f"call_{self.idx}_{self.inv}"
        self.msgs.append({"role": "assistant", "content": thought,
                          "tool_calls": [{"id": cid, "type": "function",
                                          "function": {"name": name, "arguments": json.dumps(args)}}]})
        if name == "search_orders":
            text, ids, kind = self.r_search_orders()
        elif name == "get_order":
            text, ids, kind = self.r_get_order(args["order_id"])
        elif name == "get_user":
            text, ids, kind = self.r_get_user(args["user_id"])
        elif name == "list_tickets":
            text, ids, kind = self.r_list_tickets()
        elif name == "get_ticket":
            text, ids, kind = self.r_get_ticket(args["ticket_id"])
        elif name == "get_logs":
            text, ids, kind = self.r_get_logs(args["service"])
        elif name == "read_config":
            text, ids, kind = self.r_read_config(args["service"])
        else:  # act on a value: a short confirmation
            text, ids, kind = json.dumps({"ok": True, "ref": self._hex("op")}), [], "small"
        self.msgs.append({"role": "tool", "tool_call_id": cid, "content": text})
        self.results.append({"inv": self.inv, "ids": ids, "kind": kind, "reused": 0})
        self.inv += 1

    def _use(self, value: str) -> None:
        p = value.split("_")[0]
        if p == "ord":
            self._call(str(self.rng.choice(["get_order", "refund_order"])), {"order_id": value}, f"Checking {value}.")
        elif p == "usr":
            self._call("get_user", {"user_id": value}, "Looking up the customer.")
        elif p == "tck":
            self._call(str(self.rng.choice(["get_ticket", "close_ticket"])), {"ticket_id": value}, "Opening the ticket.")
        else:
            self._call(str(self.rng.choice(["apply_fix", "annotate"])), {"ref": value}, f"Acting on {value}.")

    def _explore(self) -> None:
        svc = str(self.rng.choice(_SERVICES))
        name = str(self.rng.choice(["search_orders", "list_tickets", "get_logs", "get_logs", "read_config"]))
        args = {"service": svc} if name in ("get_logs", "read_config") else {"query": svc}
        self._call(name, args, "Gathering more information.")

    def _pick(self, recent: bool) -> str | None:
        if not self.results:
            return None
        lo = self.inv - SYNTH_RECENT_AGE
        pool = [r for r in self.results if r["ids"] and ((r["inv"] >= lo) == recent)]
        if not pool:
            return None
        if not recent and self.rng.random() < 0.5:
            chain = [r for r in pool if r["reused"]]
            pool = chain or pool
        w = np.array([SYNTH_WEIGHT[r["kind"]] for r in pool])
        r = pool[int(self.rng.choice(len(pool), p=w / w.sum()))]
        r["reused"] += 1
        return str(self.rng.choice(r["ids"]))

    def build(self) -> dict[str, Any]:
        self.msgs = [{"role": "system", "content": _SYSTEM},
                     {"role": "user", "content": f"Customer {self.rng.choice(_NAMES)} reports problems with recent "
                                                 f"orders and a failing {self.rng.choice(_SERVICES)} flow. Investigate and fix."}]
        n = int(self.rng.integers(SYNTH_LENGTH[0], SYNTH_LENGTH[1] + 1))
        next_user = int(self.rng.integers(SYNTH_FOLLOW_GAP[0], SYNTH_FOLLOW_GAP[1] + 1))
        while self.inv < n:
            if self.inv >= next_user:
                next_user = self.inv + int(self.rng.integers(SYNTH_FOLLOW_GAP[0], SYNTH_FOLLOW_GAP[1] + 1))
                v = self._pick(recent=False)
                if v is not None:
                    self.msgs.append({"role": "assistant", "content": SYNTH_DONE})
                    self.inv += 1
                    self.msgs.append({"role": "user", "content": f"Thanks. Next, please follow up on {v} from earlier."})
                    self._use(v)
                    continue
            u = self.rng.random()
            v = (self._pick(recent=True) if u < SYNTH_P_RECENT
                 else self._pick(recent=False) if u < SYNTH_P_RECENT + SYNTH_P_OLD else None)
            if v is None:
                self._explore()
            else:
                self._use(v)
        self.msgs.append({"role": "assistant", "content": "All issues are handled."})
        return {"task_id": f"synth-{self.idx:04d}", "messages": self.msgs}


#: Tools whose result is a confirmation without ids (never reused by the generator).
SYNTH_ACTIONS = frozenset({"refund_order", "close_ticket", "apply_fix", "annotate"})
#: The share of each id prefix among a result's ids, by tool (the ``r_*`` methods of :class:`_Synth`).
SYNTH_ID_PREFIXES: dict[str, dict[str, float]] = {
    "search_orders": {"ord": 0.5, "sku": 0.5}, "get_order": {"usr": 0.25, "tck": 0.25, "sku": 0.25, "whs": 0.25},
    "get_user": {"acct": 0.5, "pay": 0.5}, "list_tickets": {"tck": 1.0}, "get_ticket": {"ord": 0.5, "esc": 0.5},
    "get_logs": {"req": 1.0}, "read_config": {"key": 1.0}}
#: The argument key of the call that uses a value, by the value's prefix (:meth:`_Synth._use`); any other: "ref".
SYNTH_KEY = {"ord": "order_id", "usr": "user_id", "tck": "ticket_id"}
#: An exploring call's argument key (:meth:`_Synth._explore`: 2 of its 5 tools take "query").
SYNTH_EXPLORE_KEYS = {"query": 0.4, "service": 0.6}


class _Seen:
    """What spec §7 attributes so far in one transcript, kept up to date as it grows (the metric's own
    :class:`~contextrender.recall.FirstAppearance`), and the results whose own ids a later assistant turn
    used (what the generator calls "reused")."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.n = 0  # messages read so far
        self.attribution = FirstAppearance()
        self.used: set[int] = set()
        self.invocations = 0  # assistant turns so far: the next one is invocation `invocations`
        self.last_done = 0  # invocation of the latest SYNTH_DONE turn (0: none yet, the schedule's start)

    @property
    def first_in(self) -> dict[str, int | None]:
        return self.attribution.first_in

    def update(self, session: Session) -> None:
        if self.n > len(session):  # a shorter transcript under the same id: read it from the start
            self.reset()
        for seq in range(self.n, len(session)):
            msg = session.message(seq)
            if msg.role == "assistant":
                if msg.content == SYNTH_DONE:
                    self.last_done = self.invocations
                self.invocations += 1
            for tok, src in self.attribution.add(seq, msg).items():
                if any(c.isdigit() for c in tok):  # an id (argument keys have no digits)
                    self.used.add(src)
        self.n = len(session)


def synth_reuse_probability(session: Session, st: Stage, seen: _Seen) -> np.ndarray:
    """P(the next turn reuses r) — a spec §7 event (next turn, r) —, per result of the stage, under the
    generator's own model (:class:`_Synth`) and from what a causal selector sees (``seen``: kept up to date
    here). The next call uses one value: after a follow-up user message, the value it names; otherwise an id
    of a result of the last 3 invocations with P 0.40, of an older one with P 0.25 (half of that from results
    already reused), each pool weighted by kind, or it explores. The event falls on the result the value
    first appeared in, and also on the one its argument key first appeared in (the `order_id` column of an
    order search is a qualifying token too). Results without ids (confirmations, logs without ERROR lines)
    are never picked."""
    seen.update(session)
    pos = {seq: i for i, seq in enumerate(st.results)}
    p = np.zeros(len(st.results))
    key_p: dict[str, float] = {}  # argument key -> P(the next call has it)

    latest = session.message(len(session) - 1)
    m = SYNTH_FOLLOW_UP.search(latest.content or "") if latest.role == "user" else None
    if m is not None:
        v = m.group(1)
        src = seen.first_in.get(v)
        if src in pos:
            p[pos[src]] = 1.0
        key_p[SYNTH_KEY.get(v.split("_")[0], "ref")] = 1.0
    else:
        tools = [session.result(q).tool_name for q in st.results]
        has_ids = np.array([t not in SYNTH_ACTIONS and (t != "get_logs" or " ERROR " in session.message(q).content)
                            for t, q in zip(tools, st.results, strict=True)], dtype=bool)
        w = np.array([SYNTH_WEIGHT[SYNTH_KIND.get(t, "small")] for t in tools]) * has_ids
        recent = st.ages <= SYNTH_RECENT_AGE
        old = ~recent
        chain = old & has_ids & np.array([q in seen.used for q in st.results], dtype=bool)

        def share(mask: np.ndarray) -> np.ndarray:
            tot = float((w * mask).sum())
            return w * mask / tot if tot > 0 else np.zeros_like(w)

        recent_share, old_share = share(recent), share(old)
        pick = SYNTH_P_RECENT * recent_share
        pick += SYNTH_P_OLD * (0.5 * (share(chain) if chain.any() else old_share) + 0.5 * old_share)
        p += pick
        for i, t in enumerate(tools):
            for prefix, frac in SYNTH_ID_PREFIXES.get(t, {}).items():
                k = SYNTH_KEY.get(prefix, "ref")
                key_p[k] = key_p.get(k, 0.0) + float(pick[i]) * frac
        # an empty pool falls through to exploring (the generator's _pick returns None)
        explore = (1.0 - SYNTH_P_RECENT - SYNTH_P_OLD) + SYNTH_P_RECENT * (recent_share.sum() == 0) \
            + SYNTH_P_OLD * (old_share.sum() == 0)
        for k, frac in SYNTH_EXPLORE_KEYS.items():
            key_p[k] = key_p.get(k, 0.0) + explore * frac
        # The key's event on its first source r0 adds only when the value's own event is not already on r0.
        for k, pk in key_p.items():
            r0 = seen.first_in.get(k)
            if r0 in pos:
                i0 = pos[r0]
                own = float(pick[i0]) * sum(f for x, f in SYNTH_ID_PREFIXES.get(tools[i0], {}).items()
                                            if SYNTH_KEY.get(x, "ref") == k)
                p[i0] += pk - own
        # The next turn may be one that reuses nothing: a SYNTH_DONE turn (due when the follow-up gap, uniform,
        # ends — if there is an older result to follow up on) or the episode's last turn (length uniform).
        inv, gap = seen.invocations, seen.invocations - seen.last_done
        lo, hi = SYNTH_FOLLOW_GAP
        h_done = 1.0 / (hi + 1 - gap) if lo <= gap <= hi and old_share.sum() > 0 else 0.0
        lo, hi = SYNTH_LENGTH
        h_end = 1.0 / (hi + 1 - inv) if lo <= inv <= hi else 0.0
        return np.clip(p * (1.0 - h_done) * (1.0 - h_end), 0.0, 1.0)
    for k, pk in key_p.items():
        r0 = seen.first_in.get(k)
        if r0 in pos and p[pos[r0]] < 1.0:
            p[pos[r0]] = pk
    return p


class SynthBayes(ContextRender):
    """Not a policy, a reference for the synthetic set: the same scope, trim and markers as every row, and
    a chooser that knows the generator's reuse probabilities (:func:`synth_reuse_probability`) but nothing
    of the future, and shows the results with the largest expected number of reuse events at the next turn
    that fit (value-per-token or plain greedy on P, whichever collects more). In expectation about the best
    a selector that sees only the past can do on this set (the greedy is not an exact knapsack; on this set
    an exact one gained nothing)."""

    def __init__(self, *, embedder: Any, name: str = "generator-aware causal selector") -> None:
        super().__init__(weights=Weights(recency=1.0, relevance=0.0, reuse=0.0), embedder=embedder,
                         chooser=self._choose, name=name)
        self._seen: dict[str, _Seen] = {}

    def _choose(self, session: Session, st: Stage, budget: int, diversity: float, trace: bool) -> Choice:
        del diversity
        seen = self._seen.setdefault(session.id, _Seen())
        p = np.where(st.cand, synth_reuse_probability(session, st, seen), 0.0)
        for i in st.compacted:  # a compacted result is not the original: it covers no event (spec §7)
            p[i] = 0.0
        args = (p, st.delta, st.cand, st.embs, st.base_tokens, budget, 0.0)
        plain, dense = greedy(*args, trace=trace), greedy(*args, density=True, trace=trace)
        return dense if dense.total > plain.total + 1e-12 else plain


def synth_episode(rng: np.random.Generator, idx: int) -> dict[str, Any]:
    return _Synth(rng, idx).build()


def write_synth(path: Path, n: int = 300, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(synth_episode(rng, i), ensure_ascii=False) + "\n")


def ensure_traces() -> None:
    """Record or generate whichever trace set is missing (a fresh clone has none of them):
    the offline oracle's Full-history runs at B=2000 (``contextrender.experiments.run``)."""
    if not (TRACE_SETS["bfcl"].is_file() and TRACE_SETS["tau2_retail"].is_file()):
        # the Full runs of `make reproduce-table1` (BFCL long-context and τ²-retail)
        _run(["+experiment=table1", "method=full", "benchmark=bfcl_multi_turn,tau2_retail", "budget=2000"],
             multirun=True)
    for name, extra in (("tau2_airline", ["benchmark=tau2_airline", "experiment_name=fullsets"]),
                        ("moqa", ["benchmark=moqa8_offline", "benchmark.n_tasks=200", "experiment_name=fullsets"]),
                        ("moqa_fresh", ["benchmark=moqa8_offline", "benchmark.n_tasks=100", "benchmark.seed=1",
                                        "experiment_name=fresh_moqa"])):
        if not TRACE_SETS[name].is_file():
            _run(["method=full", *extra, "budget=2000"])
    if not TRACE_SETS["synth"].is_file():
        write_synth(TRACE_SETS["synth"])


def load_split() -> dict[str, dict[str, list[Episode]]]:
    """Every set split by :func:`is_train`; the evaluation-only sets are test only (train empty)."""
    out: dict[str, dict[str, list[Episode]]] = {}
    for name, path in TRACE_SETS.items():
        eps = list(read_traces(path))
        if name in EVAL_ONLY:
            out[name] = {"train": [], "test": eps}
            continue
        out[name] = {"train": [e for e in eps if is_train(f"{name}:{e.task_id}")],
                     "test": [e for e in eps if not is_train(f"{name}:{e.task_id}")]}
    return out


# -- policies and replay -------------------------------------------------------------------

def _embedder() -> SharedEmbeddings:
    return SharedEmbeddings(make_embedder("hashing", dim=256))


def build(specs: Mapping[str, tuple[str, Mapping[str, Any]]], shared_emb: SharedEmbeddings,
          compactor: MemoCompactor | None = None) -> dict[str, Any]:
    """name -> (method yaml, overrides) built through the Hydra registry (conf/method)."""
    from omegaconf import OmegaConf

    out = {}
    for name, (method, over) in specs.items():
        over = dict(over)
        # Whole mappings (the fit's candidates: tool -> P, tool -> word -> P) replace the config's.
        whole = {k: over.pop(k) for k in ("tool_prior", "call_prior") if k in over}
        cfg = method_config(method, over, label=name)
        for k, v in whole.items():
            OmegaConf.update(cfg, k, dict(v), merge=False)
        out[name] = build_policy(cfg, embedder=shared_emb, compactor=compactor)
    return out


def run_replay(specs: Mapping[str, tuple[str, Mapping[str, Any]]], episodes: Sequence[Episode],
               budget: int, *, with_ceilings: bool = False, references: Sequence[str] = ()) -> ReplayResult:
    """Replay ``episodes`` through the specs with the harness's offline defaults: hashing-256
    embeddings and the extractive compactor (the compaction baselines' summariser and every
    ContextRender variant's oversized-result fallback). ``with_ceilings`` adds the
    :class:`HindsightCeiling` (named as in :data:`CEILINGS`) to the same pass, ``references`` the
    named :data:`REFERENCES`."""
    emb = _embedder()
    comp = MemoCompactor(make_compactor("extractive"))
    policies = build(specs, emb, comp)
    bounds = {name: HindsightCeiling(embedder=emb, trim_prose_first=prose)
              for name, prose in CEILINGS.items()} if with_ceilings else {}
    policies.update(bounds)  # replay hands each one the episode's reuse events first (prepare_episode)
    policies.update({name: REFERENCES[name](embedder=emb) for name in references})

    with tempfile.TemporaryDirectory(prefix="cr-plus-") as tmp:
        return replay(episodes, policies, budget, os.path.join(tmp, "g.sqlite"), shared=Shared(emb, comp),
                      progress=False)


# -- fitting (TRAIN only) --------------------------------------------------------------------

def _result_outcomes(episode: Episode) -> Iterator[tuple[str, Mapping[str, Any] | None, int, int]]:
    """Per tool result of a TRAIN episode: (tool name, its call's ``function`` entry or None for an orphan
    result, how many later assistant turns there are, how many of them reuse it — spec §7 events). A
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
    the turn reuses the result (spec §7 events), smoothed toward the pooled rate with ``smooth``
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
#: values conf/method/contextrender_plus_fitted.yaml carries (fitted on train in an earlier round, issue 12).
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
    sess_specs = {f"session_prior={w}": (PLUS, {**params, "tool_prior": {}, "call_prior": {},
                                                                "prior_default": pooled,
                                                                "session_prior": w}) for w in SESSION_GRID}
    sess = _objective(sess_specs, train)
    w_best = max(SESSION_GRID, key=lambda w: (round(sess[f"session_prior={w}"]["mean"], 6), -w))
    log.info("fit: session_prior %s (train, prior left out, %.2f)", w_best, sess[f"session_prior={w_best}"]["mean"])
    return {"params": {**params, "session_prior": w_best}, "train_objective": scores[best]["mean"],
            "fit_budgets": list(FIT_BUDGETS), "fit_sets": list(FIT_SETS), "tool_prior": prior,
            "prior_default": pooled, "call_prior": calls, "without_call_prior": no_calls,
            "history": [{"params": json.loads(k), "train_recall": v} for k, v in scores.items()],
            "session_history": [{"session_prior": w, "prior": "left out", "train_recall": sess[f"session_prior={w}"]}
                                for w in SESSION_GRID],
            "train_tasks": {k: len(v) for k, v in train.items()}}


# -- evaluation (TEST only) ------------------------------------------------------------------

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


PAPER_FLAT = {"lam": 0.3, "gamma": 0.2, "weights.reuse": 1.0, "weights.relevance": 1.0, "weights.recency": 1.0}


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


#: name -> its trim order (trim_prose_first). The first is THE ceiling every gap is measured against (the
#: selectors' own trim); the second bounds what any selector with plus's prose-first trim could show.
CEILINGS: dict[str, bool] = {"hindsight ceiling": False, "hindsight ceiling, prose-first trim": True}
CEILING = next(iter(CEILINGS))
#: Reference rows that are not policies either, by name; SET_REFERENCES says which set gets which.
REFERENCES: dict[str, Any] = {"generator-aware causal selector": SynthBayes}
SET_REFERENCES: dict[str, tuple[str, ...]] = {"synth": ("generator-aware causal selector",)}


def ceilings(episodes: Sequence[Episode], budget: int) -> ReplayResult:
    """Replay ``episodes`` through the two :class:`HindsightCeiling` bounds only."""
    return run_replay({}, episodes, budget, with_ceilings=True)


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


# -- oracle task accuracy ------------------------------------------------------------------

PLUS_SOURCE = ROOT / "contextrender" / "plus.py"
ORACLE_METHODS = ("contextrender", PLUS)
ORACLE_BUDGETS = (2000,)
#: benchmark -> (extra overrides, score key): all 200 BFCL long-context tasks (task accuracy), every
#: τ²-retail and τ²-airline task (pass^1), the 200 moqa8_offline tasks the trace set holds (mean F1).
ORACLE_BENCHES = {"bfcl_multi_turn": ((), "task_acc"),
                  "tau2_retail": ((), "pass"),
                  "tau2_airline": ((), "pass"),
                  "moqa8_offline": (("benchmark.n_tasks=200",), "f1")}
#: Oracle benchmark -> the trace set whose split its task ids follow (is_train of "set:task id"): the
#: oracle's mean is also reported over the TRAIN and the TEST (held-out) task ids.
ORACLE_SPLIT = {"bfcl_multi_turn": "bfcl", "tau2_retail": "tau2_retail", "moqa8_offline": "moqa"}
#: Benchmarks that run only some rows (moqa8_offline: what the call prior, which acts there, changes).
ORACLE_BENCH_ROWS = {"moqa8_offline": ("contextrender", PLUS, "plus −call prior")}


def _run(args: list[str], multirun: bool = False) -> None:
    hydra_dir = tempfile.mkdtemp(prefix="plus-hydra-")
    cmd = [sys.executable, "-m", "contextrender.experiments.run", *(["-m"] if multirun else []), "embedding=hashing",
           "progress=false", f"hydra.run.dir={hydra_dir}", f"hydra.sweep.dir={hydra_dir}", *args]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def code_key(method: str) -> str:
    """A digest of a method's config and of every policy source file it could run.

    The runner resumes by task key, so oracle records live in a directory named by this
    digest: records of an earlier configuration or earlier code are never reused.
    """
    h = hashlib.sha256((ROOT / "conf" / "method" / f"{method}.yaml").read_bytes())
    for pkg in ("contextrender", "baselines"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == PLUS_SOURCE and method != PLUS:
                continue  # only the plus runs it
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:10]


#: Oracle ablations of contextrender_plus: the prior (what changes which results are shown) and the
#: context-only switches (tabular forms, stubs, compacted omitted results: they never change recall).
ORACLE_ABLATIONS = {"plus −prior": (PLUS, ("method.prior_weight=0", "method.session_prior=0")),
                    "plus −session prior": (PLUS, ("method.session_prior=0",)),
                    "plus −call prior": (PLUS, ("method.use_call_prior=false",)),
                    "plus −tabular": (PLUS, ("method.tabular=false",)),
                    "plus −tabular −stubs −compact omitted": (PLUS, (
                        "method.tabular=false", "method.compact_omitted=false", "method.stubs=false"))}
#: The oracle benchmark whose TRAIN task ids (:data:`ORACLE_SPLIT`) choose prior_min_age (the task-score
#: constraint).
AGE_BENCH = "tau2_retail"
AGE_CHOICES = (0, 1, 2, 3)


def oracle(methods: Sequence[str] = ORACLE_METHODS, budgets: Sequence[int] = ORACLE_BUDGETS,
           ablations: Mapping[str, tuple[str, Sequence[str]]] = ORACLE_ABLATIONS,
           workers: int = 2, benches: Sequence[str] | None = None) -> dict[str, Any]:
    """Oracle task score of every method (and ablation) at every budget on the offline benchmarks
    (Hydra multirun over the budgets, one process per benchmark and row, ``workers`` at a time).
    On the benchmarks of :data:`ORACLE_SPLIT` the means over their TRAIN and TEST task ids are reported too."""
    from concurrent.futures import ThreadPoolExecutor

    benches = list(ORACLE_BENCHES) if benches is None else list(benches)
    rows = {m: (m, ()) for m in methods} | dict(ablations)
    jobs = [(bench, label) for bench in benches for label in rows
            if bench not in ORACLE_BENCH_ROWS or label in ORACLE_BENCH_ROWS[bench]]
    tags = {label: code_key(m) + (("-" + hashlib.sha256("\n".join(over).encode()).hexdigest()[:6]) if over else "")
            for label, (m, over) in rows.items()}
    run_dir = {(bench, label): OUT / "runs" / f"oracle_{bench}" / f"{rows[label][0]}-{tags[label]}"
               for bench, label in jobs}

    def one(job: tuple[str, str]) -> None:
        bench, label = job
        m, over = rows[label]
        extra, _ = ORACLE_BENCHES[bench]
        _run([f"method={m}", f"benchmark={bench}", "budget=" + ",".join(map(str, budgets)),
              "experiment_name=plus_oracle", f"run_dir={run_dir[job]}", *extra, *over], multirun=True)
        log.info("oracle %s %s done", bench, label)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, jobs))
    out: dict[str, Any] = {}
    for bench, label in jobs:
        m = rows[label][0]
        key = ORACLE_BENCHES[bench][1]
        for b in budgets:
            recs = []
            for p in (run_dir[(bench, label)] / "records").glob(f"*__{m}__B{b}.jsonl"):
                recs += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            # one record per task, the retry rule's (a rerun after an infrastructure error replaces it); failures 0
            score = {str(r["task"]): float((r.get("score") or {}).get(key, 0.0) or 0.0) for r in effective_records(recs)}
            cell: dict[str, Any] = {"tasks": len(score), "metric": key,
                                    "mean": 100 * float(np.mean(list(score.values()))) if score else None}
            if bench in ORACLE_SPLIT:
                for part, want in (("train", True), ("test", False)):
                    vals = [v for t, v in score.items() if is_train(f"{ORACLE_SPLIT[bench]}:{t}") == want]
                    cell[f"{part}_tasks"] = len(vals)
                    cell[f"{part}_mean"] = 100 * float(np.mean(vals)) if vals else None
            out.setdefault(bench, {}).setdefault(label, {})[str(b)] = cell
    return out


def select_min_age(split: Mapping[str, Mapping[str, Sequence[Episode]]], budget: int = 2000) -> dict[str, Any]:
    """prior_min_age, chosen on TRAIN data only: the choice with the largest train recall (FIT_SETS'
    train halves) among those whose oracle pass^1 on :data:`AGE_BENCH`'s TRAIN task ids is not below
    contextrender's (ties: the smaller age). Reads the rest of the configuration from the method yaml."""
    labels = {a: f"plus, prior_min_age {a}" for a in AGE_CHOICES}
    orc = oracle(methods=("contextrender",), budgets=(budget,), benches=(AGE_BENCH,),
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


# -- report ---------------------------------------------------------------------------------

#: What the measured results say (kept in step with results/plus_fitted/plus.json by hand; see the README's plus
#: section). The verdict line above them is computed (:func:`verdict`).
NOTES: list[str] = [
    "- The gap, studied on the TRAIN split first (contextrender vs ceiling, B=2000): BFCL 1 of 65 events; "
    "τ²-retail 29 of 336 events, all small results (< 400 tokens) at age 4–11, 25 of them `get_order_details` "
    "and 4 `get_user_details`, lost to recent 700–1,000-token `get_product_details` results that no later turn "
    "reuses (their item ids are plain numbers, which recall never counts). Hence the per-tool prior "
    "(P(get_product_details) = 0.0005, P(get_order_details) = 0.17, P(get_user_details) = 0.60). On "
    "moqa8_offline's train half the final answer quotes all eight answers, so every search result is reused "
    "— but only answers that are names qualify (spec §7: not a height, a date or a code like RN-53098), and "
    "one tool, `python_interpreter`, runs every search, so P(tool) cannot tell them apart. What was asked "
    "can: hence the call prior, P(reuse | tool, word of the call's arguments) (fit.json `call_prior`: "
    "python_interpreter 0.129; founder 0.252, shipyard 0.209, headquarters 0.214, ascent 0.209 against "
    "height 0.011, founded 0.064 — a founding year —, registration 0.001). It predicts which results the "
    "final answer will quote verbatim in a form the recall metric counts; the task needs the other answers "
    "too, which reach the final turn as stubs or compacted forms: the offline oracle's mean F1 there is 48.1 "
    "with the call prior, 43.4 without it, 25.1 for contextrender (held-out tasks: 47.5 / 43.1 / 25.0).",
    "- The prior conflicts with the task unless the omitted catalogue keeps its item ids: when the prior may "
    "reorder the latest result too (prior_min_age 0), the catalogue a task needs at once gives way to older "
    "order records, and without tabular forms the offline oracle then fails those tasks (τ²-retail pass^1 "
    "71.1, contextrender 73.7; the `plus −tabular` oracle row). The tabular form (contextrender/tabular.py: "
    "every key and value, a product's variants as one table, 0.44 of the tokens) fits the budget left over, "
    "so the ids stay in context and the task passes (75.4). prior_min_age is chosen by the select stage on "
    "TRAIN data only (fit.json `train_task_score`, `train_recall`): 0 keeps the τ²-retail train-task pass^1 at "
    "contextrender's (81.6) with the highest train recall (81.40; 2: 78.98, 3: 75.92; the mean now includes "
    "moqa8_offline's train half). Ages 0 and 1 are the same policy (the latest result is one invocation old).",
    "- Where the task-score gain comes from (oracle rows): tabular forms, stubs and compacted omitted results "
    "(all three off: τ²-retail 64.0, airline 88.0, BFCL 99.5; the plus 75.4 / 92.0 / 100.0); the priors cost "
    "τ²-retail 0.9 points of pass^1 (−prior 76.3) for +1.9 recall, add 2.0 on τ²-airline (−prior 90.0) and "
    "leave BFCL as it is; the call prior changes no τ² or BFCL score and adds 4.7 F1 on moqa8_offline. On "
    "held-out task ids only: τ²-retail 70.8 vs contextrender 67.7, BFCL 100.0 vs 100.0, moqa8_offline 47.5 "
    "vs 25.0.",
    "- What the ceiling needs that no causal selector here knows: on τ²-airline which of several similar "
    "reservations a later turn returns to (5 of its 184 events separate the plus from the ceiling, all "
    "`get_reservation_details` at age 5 (4, one task processing its reservations in the order it fetched "
    "them) or 17; airline is never fitted on, and I did not design a feature from its misses); on "
    "moqa8_offline 4 of 473 events remain. On the synthetic set the ceiling is far above what any selector "
    "that sees only the past can reach: the generator-aware reference (SynthBayes — it knows the generator's "
    "own probabilities: a call reuses an id of the last 3 results with P 0.40, of an older one with P 0.25, "
    "half of that from results already reused, small records 8× as likely as a log; the `order_id` column "
    "an order search shows first; the turns that reuse nothing; its expected events match the generator's "
    "within 1 % on fresh episodes, tests/plus) covers 86.9, while 80 % of the hindsight gap needs 88.8; the "
    "plus covers 56 % of the gap to that reference. It gains most on the latest three results (86 vs 80 at "
    "age ≤ 3): it knows the next call's reuse probability by result kind; the plus knows how often a tool's "
    "result is reused at any later turn.",
    "- The call prior was designed after moqa8_offline's held-out gap was on record (1 % covered, the previous "
    "report), so that half is not blind to the idea. Hence moqa_fresh: a second corpus (benchmark.seed=1, 100 "
    "tasks: other entities and questions), never fitted on and recorded after the fit: contextrender 24.5, "
    "plus 40.9, ceiling 41.9 (94 % of the gap).",
    "- W_sess (this session's per-tool reuse share, for tools the prior never saw) is fitted with both priors "
    "left out, every train tool playing an unseen one (fit.json `session_history`): 2.0 won by 0.02 points "
    "of the train mean (76.13 vs 76.11 at 0); it acts only on tools absent from the prior, and on the held-out "
    "sets it changes no recall total and no oracle score (the `−session prior` rows; airline's split by age "
    "moves). The verbatim trim: at B=2000 the verbatim messages of the train traces never overflow B (0 of "
    "915 BFCL, 454 τ²-retail and 5,050 synthetic train renders trim a turn), so no share or rule can be "
    "fitted here. On real multi-turn dialogues they do (150 τ²-airline conversations of an LLM agent, not in "
    "this repository; README): there a share of 30 / 50 / 70 / 90 % of B gives contextrender 45.4 / 46.1 / "
    "46.4 / 43.0 at B=1000, so 50 % stays, and dropping old assistant prose before the oldest units "
    "(`trim_prose_first`, kept, not fitted: the oldest units hold the user lookups later steps reuse) lifts "
    "the plus from 51.0 / 81.2 to 53.5 / 83.8 at B=1000 / 2000 (hashing embeddings); the `−prose-first trim` "
    "rows and the second ceiling (that trim) show it changes no recall on the sets here, at any of the three "
    "budgets (only the synthetic set's ceiling at B=1000 moves, 67.4 → 67.5). Tried and dropped: the "
    "terse-marker switch is gone (every policy now uses `[omitted]`); a prior per tool and age bin "
    "(P(tool, ≤3 / 4–10 / 11–25 / >25), fitted like the per-tool one): train objective 94.33 against 94.27 "
    "at W_prior 8 (before moqa8_offline joined the fit), too little to keep. Measured as prototypes over the "
    "configuration above (train objective, the mean of the four train sets at B=2000, against the plus's "
    "81.40) and not kept in the code: (1) *next in a fetched sequence* — a bonus for a tool's first "
    "not-yet-reused result after its last reused one, which is what τ²-airline's remaining misses look like "
    "(one task updates its five reservations in the order it fetched them): 81.05 / 80.90 / 80.65 / 80.39 "
    "at a bonus of 0.5 / 1 / 2 / 4 (τ²-retail and synthetic train recall fall), so train data reject it, "
    "although it would lift τ²-airline to 93.5 (the 80 % share needs 93.7); (2) a prior from the words of "
    "a tool's name for tools the prior never saw (`get`, `details`, ...; scored leave-one-tool-out with "
    "both priors left out, as W_sess is): 76.14 against 76.13; (3) a learned reuse hazard — a logistic "
    "model of P(turn j reuses r) on the result's age, reuse count, prior log-odds, lexical overlap, size "
    "and recency rank and their products, fitted on the train renders and packed by expected events per "
    "token: 81.33; (4) the task text as a second lexical focus (the issue's idea: W_task·(1 − exp(−k)), k = "
    "the result's qualifying values in the first user message): 81.40 at W_task 0.25 / 0.5 / 1 / 2, the "
    "same as without it (each of the four train recalls unchanged), so there is nothing to choose it by (held-out, for the "
    "record only: τ²-retail 98.7 → 98.9 from W_task 0.5, τ²-airline 92.4 → 91.8 at 2, synthetic unchanged); "
    "(5) the fit's replays with the MiniLM embedder (the harness default) instead of hashing-256, for W_rel: "
    "81.31 / 81.40 / 81.38 / 81.34 at W_rel 0 / 0.25 / 0.5 / 1, within 0.1 of the hashing fit's 81.40 at 0, "
    "so the fit keeps hashing-256 (five train replays took about 70 s with it and 390 s with MiniLM here, not side by side) and W_rel 0. "
    "A fit over B = 1000, 2000 and 4000 at once (the same grid) picks W_prior 8 instead of 4 "
    "(mean 76.77 against 76.66) with the same W_lex and call prior; τ²-retail train recall at B=1000 moves "
    "87.8 → 88.1, so the B=2000 fit stands.",
    "- The synthetic generator (`synth_episode`, seed 0) was written in the same project as the method: "
    "weaker evidence than the recorded sets. moqa8_offline is fitted on its train half and reported on its "
    "test half; τ²-airline and moqa_fresh are reported whole and never fitted on. Oracle runs use every task; "
    "the second oracle table keeps only the held-out task ids (the train tasks of BFCL, τ²-retail and "
    "moqa8_offline are those the priors were fitted on).",
    "",
]


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
                return f" (95 % CI {_ci(r['gap_ci'])})"
            few = _few_traces(r.get("gap_traces"))
            return f" (the gap lies in {few})" if few else ""

        return ", ".join(f"{r['set']} {r['gap_covered']:.0f} %{ci(r)}" for r in rs)

    if not gap:
        text = "- Verdict: no held-out set has a gap to cover"
    else:
        text = "- Verdict: the 80 % target is " + ("met on every held-out set with a gap" if not missed else
                                                   (f"met on {part(met)} and NOT met on {part(missed)}" if met
                                                    else f"NOT met: {part(missed)}"))
    if nogap:
        same = [r["set"] for r in nogap if r["met"]]
        below = [f"{r['set']} ({_f(r[PLUS])} < {_f(r['contextrender'])})" for r in nogap if not r["met"]]
        if same:
            text += f"; no gap on {', '.join(same)} (contextrender already equals the ceiling)"
        if below:
            text += f"; no gap but plus BELOW contextrender on {', '.join(below)}"
    text += "."
    over = sum(r["over_budget"] for r in rows)
    text += f" Renders above B: {over}."
    if orc:
        checks = [f"{bench} {p:.1f} vs {c:.1f}{'' if p >= c else ' (BELOW)'}" for bench, _, p, c in oracle_pairs(orc)]
        text += " Oracle task score, plus vs contextrender: " + "; ".join(checks) + "."
    return text


#: (what the row removes, eval row) for the computed "where the gain comes from" note.
GAIN_ROWS = (("the priors (per-tool, call and session)", "plus −prior (fitted and session)"),
             ("the call prior alone", "plus −call prior (per-tool P only)"),
             ("the session prior alone", "plus −session prior (W_sess 0)"),
             ("protecting the two latest results from the priors (prior_min_age 2)", "plus, prior_min_age 2"),
             ("lexical", "plus −lexical"), ("packing", "plus −packing"), ("the fitted λ/W", "plus −fit (paper λ,γ,W)"))


def gain_note(evald: Mapping[str, Any], budget: str = "2000") -> str:
    """Where the recall gain comes from, computed from the held-out rows: Δ of each one-switch ablation vs
    the plus (negative: the switch helps), then every switch off, per trace set."""
    sets = [k for k, v in evald.items() if budget in v]

    def rec(set_name: str, row: str) -> float | None:
        return evald[set_name][budget]["methods"].get(row, {}).get("recall")

    parts = []
    for what, row in GAIN_ROWS:
        cells = []
        for k in sets:
            a, b = rec(k, row), rec(k, PLUS)
            if a is not None and b is not None:
                cells.append(f"{k} {a - b:+.1f}")
        parts.append(f"{what}: " + ", ".join(cells))
    off = ", ".join(f"{k} {rec(k, 'switches off (fitted λ,W)'):.1f} (contextrender {rec(k, 'contextrender'):.1f})"
                    for k in sets if rec(k, "switches off (fitted λ,W)") is not None
                    and rec(k, "contextrender") is not None)
    return (f"- Where the gain comes from (held-out B={budget}, remove one switch; Δ recall vs the plus, computed "
            "from the rows above): " + "; ".join(parts) + f". Every switch off, with the fitted λ/W: {off}. "
            "Tabular forms, stubs and compacted omitted results fill only the budget left after the full "
            "results: they never change recall (their effect is on the oracle rows).")


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


def acceptance(evald: Mapping[str, Any], budget: str = "2000") -> list[dict[str, Any]]:
    """Per held-out set: :func:`gap_row` at ``budget`` and whether ≥ 80 % (or no gap and plus ≥ cr)."""
    rows = []
    for set_name, by_b in evald.items():
        if budget not in by_b:
            continue
        r = gap_row(set_name, by_b[budget])
        g, pl, cr = r["gap_covered"], r[PLUS], r["contextrender"]
        ok = (g is not None and g >= 80.0) or (g is None and pl is not None and cr is not None and pl >= cr - 1e-9)
        rows.append({**r, "met": bool(ok)})
    return rows


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


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
    return _f(share, "{:.0f} %") + ("" if ci is None else f" ({_ci(ci)})")


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


def report(evald: Mapping[str, Any], fitted: Mapping[str, Any], orc: Mapping[str, Any] | None,
           other: Mapping[str, Any] | None = None) -> str:
    prior = fitted.get("tool_prior", {})
    top = sorted(prior.items(), key=lambda kv: -kv[1])[:8]
    lines = ["# contextrender_plus_fitted — the optional fitted profile of contextrender_plus "
             "(ours, NOT the paper's method; not the plus's default)", "",
             "Later-Used Result Recall (spec §7) on HELD-OUT traces only: the test half (hash of task id, "
             "`is_train`) of BFCL, τ²-retail, moqa8_offline and the synthetic set, and every τ²-airline trace "
             "(an evaluation-only domain, never fitted on). Embedding: hashing-256. The hindsight ceiling "
             "(experiments/evaluation/ceiling.py) has the same scope, verbatim trim (50 % of B) and `[omitted]` "
             "markers as every row, so it bounds every row but plus's: plus's prose-first trim (when the "
             "verbatim messages alone exceed B, old assistant prose goes before the oldest units) is bounded by "
             "the second ceiling row, which uses that trim. gap covered = (row − contextrender) / "
             "(ceiling − contextrender), always against the first ceiling. `over B` = renders above the budget.", "",
             f"Fitted on the TRAIN halves of {', '.join(fitted.get('fit_sets', []))} only "
             f"(budgets {fitted['fit_budgets']}; train tasks {fitted['train_tasks']}): "
             f"`{json.dumps(fitted['params'])}`, train objective {fitted['train_objective']:.2f}; "
             f"per-tool reuse prior over {len(prior)} tools (default {fitted.get('prior_default')}), highest: "
             + ", ".join(f"{t} {v:.2f}" for t, v in top) + "; " + _call_summary(fitted) + ". The priors live in "
             "conf/method/contextrender_plus_fitted.yaml and are read from there at render time.", ""]
    for set_name, by_b in evald.items():
        for b, res in by_b.items():
            ms = res["methods"]
            cr, ce = ms["contextrender"]["recall"], ms[CEILING]["recall"]
            lines += [f"## {set_name}: {res['traces']} held-out traces, {res['events']} events at B={b} "
                      f"(by age {res['events_by_age']})", "",
                      "| row | recall | Δ vs contextrender | gap covered | ≤3 / 4–10 / 11–25 / >25 | over B |",
                      "|---|---:|---:|---:|---:|---:|"]
            for m, v in ms.items():
                ages = v["recall_by_age"]
                age = " / ".join("–" if ages[a] is None else f"{ages[a]:.0f}" for a in AGE_BINS)
                label = f"**{m}** (ours)" if m == PLUS else m
                if m in REFERENCES:
                    label = f"*{m}* — not a policy, knows the generator's reuse probabilities (nothing of the future)"
                elif v.get("reference"):
                    label = f"*{m}* — not a policy, knows the future"
                d = None if v["recall"] is None or cr is None else v["recall"] - cr
                g = gap_covered(v["recall"], cr, ce)
                lines.append(f"| {label} | {_f(v['recall'])} | {_f(d, '{:+.1f}')} | "
                             f"{_f(g, '{:.0f} %') if ce is not None and cr is not None and ce > cr else 'no gap'} | "
                             f"{age} | {v['over_budget_renders']} |")
            lines.append("")
    lines += ["## Acceptance check (held-out, B=2000): gap covered ≥ 80 %, never above B", "",
              "| held-out set | traces | events | contextrender | contextrender_plus_fitted | hindsight ceiling "
              "| gap covered | 95 % CI | ≥ 80 %? | plus over-B renders | causal reference | of the causally reachable gap |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in acceptance(evald):
        gap = "no gap (cr = ceiling)" if r["gap_covered"] is None else f"{r['gap_covered']:.0f} %"
        lines.append(f"| {r['set']} | {r['traces']} | {r['events']} | {_f(r['contextrender'])} | "
                     f"{_f(r[PLUS])} | {_f(r['ceiling'])} | {gap} | {_ci(r['gap_ci'], r['gap_traces'])} "
                     f"| {'yes' if r['met'] else 'NO'} "
                     f"| {r['over_budget']} | {_f(r['causal_reference'])} | {_share(r['reachable_covered'], r['reachable_ci'])} |")
    lines += ["", "95 % CI: a percentile interval of the gap share from a paired bootstrap over the set's traces "
              f"({GAP_CI_DRAWS} draws, seed {GAP_CI_SEED}; experiments/evaluation/ceiling.py `gap_interval`): the "
              "events of one trace are not independent, so traces, not events, are resampled, and the three "
              f"rows together. None (–) when fewer than {GAP_CI_MIN_TRACES} traces hold some of the gap (the "
              "ceiling covers another number of events than contextrender there; the count is shown): a "
              "percentile bootstrap over a handful of such traces covers well under 95 % (simulated, "
              "scripts/gap_interval_coverage.py: 58–77 % with 3 such traces of 50, 91–93 % with 6–10, 93–95 % "
              "with 20–40). The verdict column reads the point estimate.", "",
              "causal reference: on the synthetic set, the generator-aware selector (`SynthBayes`): it knows the "
              "generator's own reuse probabilities and nothing of the future, so in expectation it is about the "
              "best a selector that sees only the past can do there (its greedy packing is not an exact "
              "knapsack); an 80 % share of the hindsight gap needs "
              + "; ".join(f"{r['set']} {r['contextrender'] + 0.8 * (r['ceiling'] - r['contextrender']):.1f}, "
                          f"and the reference itself reaches {_f(r['reference_gap_covered'], '{:.0f} %')} of that gap "
                          f"(95 % CI {_ci(r['reference_gap_ci'])})"
                          for r in acceptance(evald) if r["causal_reference"] is not None
                          and r["contextrender"] is not None and r["ceiling"] is not None) + ".", ""]
    if other:
        lines += ["## Other budgets (held-out; the fit saw B=" + "/".join(map(str, FIT_BUDGETS)) + " only)", "",
                  "The same held-out traces and the same configuration at a tighter and a looser budget.", "",
                  "| held-out set | B | events | contextrender | contextrender_plus_fitted | hindsight ceiling | gap covered "
                  "| 95 % CI | plus over-B renders | causal reference | of the causally reachable gap |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in budget_rows(evald, other):
            gap = "no gap" if r["gap_covered"] is None else f"{r['gap_covered']:.0f} %"
            fit_b = " (the fit's B)" if r["fitted"] else ""
            lines.append(f"| {r['set']} | {r['budget']}{fit_b} | {r['events']} | "
                         f"{_f(r['contextrender'])} | {_f(r[PLUS])} | {_f(r['ceiling'])} | {gap} | "
                         f"{_ci(r['gap_ci'], r['gap_traces'] if r['gap_covered'] is not None else None)} | "
                         f"{r['over_budget']} | {_f(r['causal_reference'])} | {_share(r['reachable_covered'], r['reachable_ci'])} |")
        lines.append("")
    if orc:
        benches = list(orc)
        labels = list(dict.fromkeys(m for bench in benches for m in orc[bench]))
        budgets = list(next(iter(orc[benches[0]].values())))
        lines += ["## Oracle task score (offline oracle, not an LLM; every task, not a split)", "",
                  "BFCL long-context: task accuracy % (200 tasks); τ²-retail and τ²-airline: pass^1 %; moqa8_offline: "
                  "mean F1 % (200 tasks, three rows).", "",
                  "| row | " + " | ".join(f"{bench} B={b}" for bench in benches for b in budgets) + " |",
                  "|---|" + "---:|" * (len(benches) * len(budgets))]
        for part, key in (("", "mean"), ("test", "test_mean")):
            if part:
                lines += ["Held-out tasks only — the TEST half of each split (is_train of the trace set's task ids, "
                          "as for recall); τ²-airline: every task:", "",
                          "| row | " + " | ".join(f"{bench} B={b}" for bench in benches for b in budgets) + " |",
                          "|---|" + "---:|" * (len(benches) * len(budgets))]
            for m in labels:
                cells = []
                for bench in benches:
                    for b in budgets:
                        v = orc[bench].get(m, {}).get(b) or {}
                        x = v.get(key if bench in ORACLE_SPLIT else "mean")
                        cells.append("–" if x is None else f"{x:.1f}")
                label = f"**{m}** (ours)" if m == PLUS else m
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            lines.append("")
        checks = [f"{bench} B={b}: {p:.1f} vs {c:.1f} ({'≥' if p >= c else 'BELOW'})"
                  for bench, b, p, c in oracle_pairs(orc)]
        if checks:
            lines += ["Oracle score, contextrender_plus_fitted vs contextrender: " + "; ".join(checks) + ".", ""]
    lines += ["## Notes", "", verdict(evald, orc), gain_note(evald), *NOTES]
    return "\n".join(lines)


def plot(evald: Mapping[str, Any], orc: Mapping[str, Any] | None, path: Path) -> None:
    """Left: held-out recall at B=2000 per set (contextrender, plus, ceiling); right: oracle task score."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = acceptance(evald)
    ncol = 2 if orc else 1
    fig, axes = plt.subplots(1, ncol, figsize=(7 * ncol, 4.2), squeeze=False)
    cat = catalogue.catalogue()
    ax = axes[0][0]
    x = np.arange(len(rows))
    for k, (key, colour, label) in enumerate((("contextrender", cat["contextrender"].colour, "contextrender"),
                                              (PLUS, cat[PLUS].colour,
                                               "contextrender_plus_fitted (ours)"),
                                              ("ceiling", "0.6", "hindsight ceiling (not a policy)"))):
        ax.bar(x + (k - 1) * 0.27, [r[key] or 0.0 for r in rows], 0.27, color=colour, label=label)
    for i, r in enumerate(rows):
        g = "no gap" if r["gap_covered"] is None else f"{r['gap_covered']:.0f}%"
        if r.get("gap_ci") is not None:
            g += f"\n[{r['gap_ci'][0]:.0f}, {r['gap_ci'][1]:.0f}]"
        ax.text(i, 2, g, ha="center", va="bottom", fontsize=7, color="white")
    ax.set_xticks(x, [r["set"] for r in rows])
    ax.set_ylabel("Later-Used Result Recall (%), B=2000")
    ax.set_title("held-out recall (label: gap covered [95 % CI])")
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    if orc:
        ax = axes[0][1]
        benches = list(orc)
        labels = list(dict.fromkeys(m for bench in benches for m in orc[bench]))
        w = 0.8 / max(1, len(labels))
        for k, m in enumerate(labels):
            ys = [(orc[bench].get(m, {}).get("2000") or {}).get("mean") or 0.0 for bench in benches]
            colour = cat[m].colour if m in cat else None
            ax.bar(np.arange(len(benches)) + (k - (len(labels) - 1) / 2) * w, ys, w, label=m, color=colour,
                   alpha=1.0 if m in cat else 0.5)
        ax.set_xticks(np.arange(len(benches)), benches)
        ax.set_ylabel("oracle task score %, B=2000")
        ax.set_title("oracle (offline, every task)")
        ax.set_ylim(0, 125)
        ax.set_yticks(range(0, 101, 20))
        ax.legend(fontsize=8, loc="upper center", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main(argv: Sequence[str] | None = None) -> None:
    offline.enable()
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", choices=["all", "fit", "select", "eval", "oracle", "report"], default="all")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--print-config", action="store_true",
                    help="print results/plus_fitted/fit.json's values as YAML for conf/method/contextrender_plus_fitted.yaml, then exit")
    a = ap.parse_args(argv)
    if a.print_config:
        print(config_block(json.loads((OUT / "fit.json").read_text())), end="")
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    ensure_traces()
    split = load_split()
    write_json(OUT / "split.json", {k: {p: sorted(e.task_id for e in v[p]) for p in v} for k, v in split.items()})
    if a.stage in ("all", "fit"):
        write_json(OUT / "fit.json", fit(split, a.rounds))
    fitted = json.loads((OUT / "fit.json").read_text())
    if a.stage in ("all", "select"):
        check_config({k: v for k, v in fitted.items() if k != "prior_min_age"})
        fitted = {**fitted, **select_min_age(split)}
        write_json(OUT / "fit.json", fitted)
    if a.stage in ("all", "eval"):
        check_config(fitted)
        write_json(OUT / "plus_recall.json", evaluate(split))
        write_json(OUT / "plus_budgets.json", evaluate_other_budgets(split))
    if a.stage in ("all", "oracle"):
        write_json(OUT / "oracle.json", oracle())
    if a.stage in ("all", "eval", "oracle", "report"):
        evald = json.loads((OUT / "plus_recall.json").read_text())
        orc = json.loads((OUT / "oracle.json").read_text()) if (OUT / "oracle.json").is_file() else None
        other = json.loads((OUT / "plus_budgets.json").read_text()) if (OUT / "plus_budgets.json").is_file() else None
        (OUT / "plus.md").write_text(report(evald, fitted, orc, other), encoding="utf-8")
        write_json(OUT / "plus.json", {"fit": {k: v for k, v in fitted.items() if k != "history"},
                                       "recall_test": evald, "oracle": orc,
                                       "recall_test_other_budgets": other})
        plot(evald, orc, OUT / "plus.png")


if __name__ == "__main__":
    main()
