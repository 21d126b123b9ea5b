"""Held-out evaluation of contextrender_plus (NOT the paper's method) — see results/plus/plus.md.

    make plus  (= python -m contextrender.experiments.studies.plus)   # every stage
    python -m contextrender.experiments.studies.plus --stage fit      # traces, split, fit on TRAIN only
    python -m contextrender.experiments.studies.plus --stage eval     # recall on TEST (uses results/plus/fit.json)
    python -m contextrender.experiments.studies.plus --stage oracle   # oracle task accuracy, BFCL offline, B=2000

Trace sets (Full-history transcripts; recall is spec §7's, computed by contextrender.experiments.evaluation.replay):
- ``bfcl``: results/runs/table1/traces/*__full__B2000.jsonl (200 BFCL long-context tasks);
- ``moqa``: moqa8_offline Full-history traces recorded by ``contextrender.experiments.run`` (200 tasks);
- ``synth``: synthetic support/ops-agent transcripts with long-range reuse, generated here
  with a fixed seed (see :func:`synth_episode`). WRITTEN BY THE SAME AUTHOR AS THE METHOD:
  weaker evidence than the two recorded sets, reported separately.

Each set is split by task id with a deterministic hash (:func:`is_train`, 50/50).
λ, γ, the weights and W_lex are fitted by coordinate search on the TRAIN halves only
(objective: mean of the per-set recalls at the fit budgets); the test halves are
replayed once, after fitting, for every method and budget.

Each test replay also reports the hindsight ceiling (:class:`HindsightCeiling`, not a
policy): the most reused results any selector with the same scope and markers could have
shown. It says how much room a better selector has at all on a trace set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contextrender import offline
from contextrender.compaction import make_compactor
from contextrender.embed import make_embedder
from contextrender.experiments import catalogue
from contextrender.experiments.evaluation.ceiling import HindsightCeiling, reuse_by_turn
from contextrender.experiments.evaluation.recall import AGE_BINS
from contextrender.experiments.evaluation.replay import (
    MemoCompactor,
    ReplayResult,
    Shared,
    SharedEmbeddings,
    replay,
    write_json,
)
from contextrender.experiments.evaluation.traces import Episode, read_traces
from contextrender.registry import build_policy, method_config

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "plus"
TRACE_SETS = {
    "bfcl": ROOT / "results/runs/table1/traces/oracle__bfcl_multi_turn_long_context__full__B2000.jsonl",
    "moqa": OUT / "runs/moqa/traces/oracle__moqa8_offline__full__B2000.jsonl",
    "synth": OUT / "traces/synth_seed0.jsonl",
}
FIT_BUDGETS = (2000,)
EVAL_BUDGETS = (1000, 2000, 4000, 6000)
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
        lo = self.inv - 3
        pool = [r for r in self.results if r["ids"] and ((r["inv"] >= lo) == recent)]
        if not pool:
            return None
        if not recent and self.rng.random() < 0.5:
            chain = [r for r in pool if r["reused"]]
            pool = chain or pool
        w = np.array([{"small": 4.0, "medium": 1.5, "large": 0.5}[r["kind"]] for r in pool])
        r = pool[int(self.rng.choice(len(pool), p=w / w.sum()))]
        r["reused"] += 1
        return str(self.rng.choice(r["ids"]))

    def build(self) -> dict[str, Any]:
        self.msgs = [{"role": "system", "content": _SYSTEM},
                     {"role": "user", "content": f"Customer {self.rng.choice(_NAMES)} reports problems with recent "
                                                 f"orders and a failing {self.rng.choice(_SERVICES)} flow. Investigate and fix."}]
        n = int(self.rng.integers(25, 46))
        next_user = int(self.rng.integers(6, 11))
        while self.inv < n:
            if self.inv >= next_user:
                next_user = self.inv + int(self.rng.integers(6, 11))
                v = self._pick(recent=False)
                if v is not None:
                    self.msgs.append({"role": "assistant", "content": "Done with that step."})
                    self.inv += 1
                    self.msgs.append({"role": "user", "content": f"Thanks. Next, please follow up on {v} from earlier."})
                    self._use(v)
                    continue
            u = self.rng.random()
            v = self._pick(recent=True) if u < 0.40 else self._pick(recent=False) if u < 0.65 else None
            if v is None:
                self._explore()
            else:
                self._use(v)
        self.msgs.append({"role": "assistant", "content": "All issues are handled."})
        return {"task_id": f"synth-{self.idx:04d}", "messages": self.msgs}


def synth_episode(rng: np.random.Generator, idx: int) -> dict[str, Any]:
    return _Synth(rng, idx).build()


def write_synth(path: Path, n: int = 300, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(synth_episode(rng, i), ensure_ascii=False) + "\n")


def ensure_traces() -> None:
    """Record or generate whichever trace set is missing (a fresh clone has none of them)."""
    if not TRACE_SETS["bfcl"].is_file():  # the Full runs of `make reproduce-table1`
        _run(["+experiment=table1", "method=full", "budget=2000"])
    if not TRACE_SETS["synth"].is_file():
        write_synth(TRACE_SETS["synth"])
    if not TRACE_SETS["moqa"].is_file():
        _run(["method=full", "benchmark=moqa8_offline", "benchmark.n_tasks=200", "budget=2000",
              "experiment_name=plus_moqa", f"run_dir={OUT / 'runs/moqa'}"])


def load_split() -> dict[str, dict[str, list[Episode]]]:
    out: dict[str, dict[str, list[Episode]]] = {}
    for name, path in TRACE_SETS.items():
        eps = list(read_traces(path))
        out[name] = {"train": [e for e in eps if is_train(f"{name}:{e.task_id}")],
                     "test": [e for e in eps if not is_train(f"{name}:{e.task_id}")]}
    return out


# -- policies and replay -------------------------------------------------------------------

def _embedder() -> SharedEmbeddings:
    return SharedEmbeddings(make_embedder("hashing", dim=256))


def build(specs: Mapping[str, tuple[str, Mapping[str, Any]]], shared_emb: SharedEmbeddings,
          compactor: MemoCompactor | None = None) -> dict[str, Any]:
    """name -> (method yaml, overrides) built through the Hydra registry (conf/method)."""
    out = {}
    for name, (method, over) in specs.items():
        cfg = method_config(method, over, label=name)
        out[name] = build_policy(cfg, embedder=shared_emb, compactor=compactor)
    return out


def run_replay(specs: Mapping[str, tuple[str, Mapping[str, Any]]], episodes: Sequence[Episode],
               budget: int, *, with_ceilings: bool = False) -> ReplayResult:
    """Replay ``episodes`` through the specs with the harness's offline defaults: hashing-256
    embeddings and the extractive compactor (the compaction baselines' summariser and every
    ContextRender variant's oversized-result fallback). ``with_ceilings`` adds the two
    :class:`HindsightCeiling` bounds (named as in :data:`CEILINGS`) to the same pass."""
    emb = _embedder()
    comp = MemoCompactor(make_compactor("extractive"))
    policies = build(specs, emb, comp)
    bounds = {name: HindsightCeiling(embedder=emb) for name in CEILINGS
              } if with_ceilings else {}
    policies.update(bounds)

    def watched() -> Iterable[Episode]:
        for ep in episodes:  # the ceilings learn each episode's reuse events before it is replayed
            future = reuse_by_turn(ep)
            for bound in bounds.values():
                bound.future = future
            yield ep

    with tempfile.TemporaryDirectory(prefix="cr-plus-") as tmp:
        return replay(watched(), policies, budget, os.path.join(tmp, "g.sqlite"), shared=Shared(emb, comp),
                      progress=False)


# -- fitting (TRAIN only) --------------------------------------------------------------------

# Coordinate search, one pass in this order (kept small for the time budget of the study).
GRID: dict[str, list[float]] = {
    "lam": [0.1, 0.2, 0.3, 0.5],
    "gamma": [0.2, 0.5, 1.0],
    "weights.reuse": [1.0, 2.0, 3.0],
    "weights.relevance": [0.0, 0.5, 1.0],
    "lexical": [1.0, 2.0, 4.0],
}


def _objective(specs: Mapping[str, tuple[str, Mapping[str, Any]]],
               train: Mapping[str, Sequence[Episode]]) -> dict[str, float]:
    """Mean over trace sets and FIT_BUDGETS of the train-split recall, per spec name."""
    acc: dict[str, list[float]] = {k: [] for k in specs}
    for episodes in train.values():
        for b in FIT_BUDGETS:
            res = run_replay(specs, episodes, b)
            for k, t in res.methods.items():
                assert t.over_budget == 0, (k, b)
                acc[k].append(t.stats.pct or 0.0)
    return {k: float(np.mean(v)) for k, v in acc.items()}


def fit(split: Mapping[str, Mapping[str, Sequence[Episode]]], rounds: int = 2) -> dict[str, Any]:
    train = {k: v["train"] for k, v in split.items()}
    cur: dict[str, float] = {"lam": 0.3, "gamma": 0.2, "weights.reuse": 1.0, "weights.relevance": 1.0,
                             "weights.recency": 1.0, "lexical": 1.0}
    history = []
    best = _objective({"cur": ("contextrender_plus", cur)}, train)["cur"]
    history.append({"params": dict(cur), "train_recall": best})
    for _ in range(rounds):
        changed = False
        for key, values in GRID.items():
            specs = {f"{key}={v}": ("contextrender_plus", {**cur, key: v}) for v in values if v != cur[key]}
            scores = _objective(specs, train)
            for name, s in scores.items():
                history.append({"params": {**cur, key: specs[name][1][key]}, "train_recall": s})
            name, s = max(scores.items(), key=lambda kv: kv[1])
            if s > best + 1e-9:
                best, cur, changed = s, dict(specs[name][1]), True
            log.info("fit %s -> %s (train %.2f)", key, cur[key], best)
        if not changed:
            break
    return {"params": cur, "train_objective": best, "fit_budgets": list(FIT_BUDGETS), "history": history,
            "train_tasks": {k: len(v) for k, v in train.items()}}


# -- evaluation (TEST only) ------------------------------------------------------------------

def eval_specs(params: Mapping[str, float]) -> dict[str, tuple[str, dict[str, Any]]]:
    fitted = dict(params)
    paper = {"lam": 0.3, "gamma": 0.2, "weights.reuse": 1.0, "weights.relevance": 1.0, "weights.recency": 1.0}
    off = {"packing": False, "stubs": False, "lexical": 0.0}
    return {
        "contextrender_plus": ("contextrender_plus", fitted),
        "plus −packing": ("contextrender_plus", {**fitted, "packing": False}),
        "plus −stubs": ("contextrender_plus", {**fitted, "stubs": False}),
        "plus −lexical": ("contextrender_plus", {**fitted, "lexical": 0.0}),
        "plus −fit (paper λ,γ,W)": ("contextrender_plus", {**fitted, **paper}),
        "fit only (switches off)": ("contextrender_plus", {**fitted, **off}),
        "contextrender": ("contextrender", {}),
        "cr_recency_relevance": ("cr_recency_relevance", {}),
        "semantic_retrieval": ("semantic_retrieval", {}),
        "prune": ("prune", {}),
        "compact": ("compact", {}),
        "recency_summary": ("recency_summary", {}),
        "acon": ("acon", {}),
        "full": ("full", {}),
    }


CEILINGS = ("hindsight ceiling",)


def ceilings(episodes: Sequence[Episode], budget: int) -> ReplayResult:
    """Replay ``episodes`` through the two :class:`HindsightCeiling` bounds only."""
    return run_replay({}, episodes, budget, with_ceilings=True)


def evaluate(split: Mapping[str, Mapping[str, Sequence[Episode]]], params: Mapping[str, float],
             budgets: Sequence[int] = EVAL_BUDGETS) -> dict[str, Any]:
    """Replay every TEST half once per budget through every method and both ceilings."""
    specs = eval_specs(params)
    out: dict[str, Any] = {}
    for set_name, parts in split.items():
        for b in budgets:
            res = run_replay(specs, parts["test"], b, with_ceilings=True)
            j = res.to_json()
            for name, t in res.methods.items():
                j["methods"][name]["budgeted"] = t.budgeted
                if name in CEILINGS:
                    j["methods"][name]["reference"] = True
            out.setdefault(set_name, {})[str(b)] = j
            log.info("%s B=%d: %s", set_name, b, {k: round(v["recall"] or 0, 1) for k, v in j["methods"].items()})
    return out


# -- oracle task accuracy ------------------------------------------------------------------

PLUS_SOURCE = ROOT / "contextrender" / "plus.py"
ORACLE_METHODS = catalogue.group("oracle")
ORACLE_BUDGETS = (1000, 2000, 4000)
#: benchmark -> (extra overrides, score key): all 200 BFCL long-context tasks; 100 moqa8_offline tasks
#: drawn with seed 1 (the replay's moqa traces were recorded with seed 0).
ORACLE_BENCHES = {"bfcl_multi_turn": ((), "task_acc"),
                  "moqa8_offline": (("benchmark.n_tasks=100", "benchmark.seed=1"), "f1")}


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
            if path == PLUS_SOURCE and method != "contextrender_plus":
                continue  # only contextrender_plus runs it
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:10]


#: Oracle ablations of contextrender_plus's context-only switches (they never change recall).
ORACLE_ABLATIONS = {"plus −compact omitted": ("contextrender_plus", ("method.compact_omitted=false",)),
                    "plus −stubs −compact omitted": ("contextrender_plus",
                                                     ("method.compact_omitted=false", "method.stubs=false"))}


def oracle(methods: Sequence[str] = ORACLE_METHODS, budgets: Sequence[int] = ORACLE_BUDGETS,
           ablations: Mapping[str, tuple[str, Sequence[str]]] = ORACLE_ABLATIONS,
           workers: int = 2) -> dict[str, Any]:
    """Oracle task score of every method (and ablation) at every budget on both offline
    benchmarks (Hydra multirun over the budgets, one process per benchmark and row, ``workers``
    at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    rows = {m: (m, ()) for m in methods} | dict(ablations)
    jobs = [(bench, label) for bench in ORACLE_BENCHES for label in rows]
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
            vals = [float((r.get("score") or {}).get(key, 0.0) or 0.0) for r in recs]  # failures score 0
            out.setdefault(bench, {}).setdefault(label, {})[str(b)] = {
                "tasks": len(recs), "mean": 100 * float(np.mean(vals)) if vals else None, "metric": key}
    return out


# -- report ---------------------------------------------------------------------------------

NOTES = [
    "## Notes", "",
    "- Verdict: the issue's recall target (≥ +9 points over contextrender at B=2000 on held-out traces) is NOT "
    "met. Best: +6.0 on the synthetic set (81.4 vs 75.4). The hindsight ceilings say why the recorded sets "
    "cannot get there: on BFCL contextrender already equals the ceiling (97.5 = 97.5), so no selector with "
    "this scope can gain a point; on moqa8_offline the ceiling (42.7) is reachable only with hindsight — "
    "whether an answer becomes a later-used value depends on whether the answer string is a qualifying token "
    "(a name, not a date), and on the train split every search-result position is used 52–66% of the time, so "
    "which two of the eight ~600-token results to show is a coin flip for any causal selector.",
    "- Where the recall gain comes from (synth, B=2000, removing one switch): lexical −2.7, terse markers "
    "−2.6, packing −0.9, fitted λ/weights −0.7; stubs and compact_omitted 0 by construction (they use "
    "only budget left after the full results and are never visible). With every switch off and the fitted "
    "parameters, 75.0 (contextrender 75.4).",
    "- Where the oracle gain comes from: compact_omitted removes contextrender's B=4000 dip on BFCL "
    "(97.0 → 100.0; the paper compacts only results larger than B, so a 3.8K-token result at B=4000 is "
    "shown whole or lost); stubs carry moqa8_offline (F1 25.0 → 41.2 at B=2000).",
    "- Tried and dropped (no gain on the train split, so not kept): a logistic model of P(used next step) "
    "on ten features (recency at three scales, c_t, relevance, lexical overlap, log size, the session's "
    "per-tool reuse rate) with an exact 0/1 knapsack on Σ P — synthetic train recall 84.8 against 84.9 for "
    "the kept switches; trimming verbatim messages to 30–60% of B instead of 50% — no effect on the "
    "synthetic train traces (their verbatim messages never overflow B at B=2000).",
    "- The synthetic generator (`synth_episode`, seed 0) was written in the same project as the method: "
    "weaker evidence than the recorded sets. The coordinate-search fit was flat (train 68.96 at the start "
    "→ 68.99); relevance weight 0 won by 0.03 points, with hashing-256 embeddings.",
    "- Oracle runs use all tasks (BFCL 200; moqa8_offline seed 1, 100 tasks, not the replay's seed-0 set); "
    "λ and the weights were fitted on the train halves of the replay traces, which include half the BFCL "
    "tasks. Oracle run directories are keyed by a digest of the method config and policy sources, so a "
    "changed policy is never scored from stale records.",
    "",
]


def report(evald: Mapping[str, Any], fitted: Mapping[str, Any], orc: Mapping[str, Any] | None) -> str:
    lines = ["# contextrender_plus — beyond the paper (ours, NOT the paper's method)", "",
             "Later-Used Result Recall (spec §7) on the HELD-OUT TEST split (hash of task id), "
             "parameters fitted on the TRAIN split only. Embedding: hashing-256. "
             "`over B` = renders above the budget (must be 0 for budgeted methods; `full` ignores B).", "",
             f"Fitted on train (budgets {fitted['fit_budgets']}): `{json.dumps(fitted['params'])}` "
             f"(train objective {fitted['train_objective']:.2f}; train tasks {fitted['train_tasks']}).", ""]
    for set_name, by_b in evald.items():
        budgets = list(by_b)
        first = by_b[budgets[0]]
        lines += [f"## {set_name}: {first['traces']} test traces, {first['events']} events "
                  f"(by age {first['events_by_age']})", "",
                  "| method | " + " | ".join(f"B={b}" for b in budgets) + " | ≤3 / 4–10 / 11–25 / >25 @B=2000 | over B |",
                  "|---|" + "---:|" * (len(budgets) + 2)]
        for m in first["methods"]:
            cells = [f"{by_b[b]['methods'][m]['recall']:.1f}" if by_b[b]['methods'][m]['recall'] is not None else "–"
                     for b in budgets]
            ages = by_b.get("2000", first)["methods"][m]["recall_by_age"]
            age = " / ".join("–" if ages[a] is None else f"{ages[a]:.0f}" for a in AGE_BINS)
            over = sum(by_b[b]["methods"][m]["over_budget_renders"] for b in budgets)
            label = f"**{m}** (ours)" if m == "contextrender_plus" else m
            if by_b[budgets[0]]["methods"][m].get("reference"):
                label = f"*{m}* — not a policy, knows the future"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {age} | {over} |")
        lines.append("")
    lines += ["## Acceptance check (held-out test split, B=2000)", "",
              "| trace set | contextrender_plus | contextrender | Δ (points) | ≥ +9? | hindsight ceiling "
              "| room above contextrender | plus over-B renders (all B) |",
              "|---|---:|---:|---:|---|---:|---:|---:|"]
    for set_name, by_b in evald.items():
        if "2000" not in by_b:
            continue
        ms = by_b["2000"]["methods"]
        a, c = ms["contextrender_plus"]["recall"], ms["contextrender"]["recall"]
        ct = ms[CEILINGS[0]]["recall"]
        over = sum(by_b[b]["methods"]["contextrender_plus"]["over_budget_renders"] for b in by_b)
        lines.append(f"| {set_name} | {a:.1f} | {c:.1f} | {a - c:+.1f} | {'yes' if a - c >= 9 else 'NO'} | "
                     f"{ct:.1f} | {ct - c:+.1f} | {over} |")
    lines.append("")
    if orc:
        benches = list(orc)
        cols = [(bench, b) for bench in benches for b in next(iter(orc[bench].values()))]
        lines += ["## Oracle task score by budget (offline oracle, not an LLM; all tasks, not a split)", "",
                  "BFCL: task accuracy % (200 long-context tasks); moqa8_offline: mean F1 × 100 (100 tasks, seed 1).",
                  "",
                  "| method | " + " | ".join(f"{bench} B={b}" for bench, b in cols) + " |",
                  "|---|" + "---:|" * len(cols)]
        for m in orc[benches[0]]:
            cells = []
            for bench, b in cols:
                v = orc[bench].get(m, {}).get(b)
                cells.append("–" if not v or v["mean"] is None else f"{v['mean']:.1f}")
            label = f"**{m}** (ours)" if m == "contextrender_plus" else m
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        checks = []
        for bench, b in cols:
            ms = orc[bench]
            if {"contextrender", "contextrender_plus"} <= set(ms):
                a_, c_ = ms["contextrender_plus"][b]["mean"], ms["contextrender"][b]["mean"]
                if a_ is not None and c_ is not None:
                    checks.append(f"{bench} B={b}: {a_:.1f} vs {c_:.1f} ({'≥' if a_ >= c_ else 'BELOW'})")
        if checks:
            lines += ["Oracle score, contextrender_plus vs contextrender: " + "; ".join(checks) + ".", ""]
    lines += NOTES
    return "\n".join(lines)


def plot(evald: Mapping[str, Any], orc: Mapping[str, Any] | None, path: Path) -> None:
    """Top row: held-out recall vs B per trace set (with the hindsight ceilings);
    bottom row: oracle task score vs B per offline benchmark."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(evald)
    benches = list(orc or {})
    ncol = max(len(sets), len(benches), 1)
    nrow = 2 if benches else 1
    fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 4 * nrow), squeeze=False)
    show = ["contextrender_plus", "contextrender", "cr_recency_relevance", "semantic_retrieval", "prune",
            "compact", "recency_summary", "acon", "full"]

    def style(m: str) -> dict[str, Any]:  # the catalogue's colour and label: the same in every figure
        info = catalogue.catalogue()[m]
        return {"marker": "o", "lw": 2.5 if info.ours else 1.2, "color": info.colour,
                "ls": "--" if m == "full" else "-", "label": info.label}

    def axis(ax: Any, budgets: list[int], title: str, ylabel: str) -> None:
        ax.set_title(title)
        ax.set_xlabel("history budget B (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.grid(alpha=0.3)

    for ax, s in zip(axes[0], sets, strict=False):
        budgets = [int(b) for b in evald[s]]
        for m in show:
            if m in evald[s][str(budgets[0])]["methods"]:
                ax.plot(budgets, [evald[s][str(b)]["methods"][m]["recall"] for b in budgets], **style(m))
        for name in CEILINGS:
            if name in evald[s][str(budgets[0])]["methods"]:
                ys = [evald[s][str(b)]["methods"][name]["recall"] for b in budgets]
                ax.plot(budgets, ys, color="0.45", lw=1.0, ls="-.",
                        label=name.replace("hindsight ceiling", "ceiling (hindsight)"))
        axis(ax, budgets, f"recall: {s} (held-out test split)", "Later-Used Result Recall (%)")
    for ax, bench in zip(axes[1] if benches else [], benches, strict=False):
        ms = orc[bench]  # type: ignore[index]
        budgets = [int(b) for b in next(iter(ms.values()))]
        for m in show:
            if m in ms:
                ax.plot(budgets, [ms[m][str(b)]["mean"] for b in budgets], **style(m))
        axis(ax, budgets, f"oracle: {bench}", "task accuracy %" if "bfcl" in bench else "F1 × 100")
    used = [len(sets), len(benches)]
    for r in range(nrow):
        for ax in axes[r][used[r]:]:
            ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    spare = axes[nrow - 1][used[nrow - 1]] if used[nrow - 1] < ncol else None
    if spare is not None:  # the legend gets the empty panel instead of covering data
        spare.legend(handles, labels, loc="center", fontsize=9)
    else:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main(argv: Sequence[str] | None = None) -> None:
    offline.enable()
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", choices=["all", "fit", "eval", "oracle", "report"], default="all")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    ensure_traces()
    split = load_split()
    write_json(OUT / "split.json", {k: {p: sorted(e.task_id for e in v[p]) for p in v} for k, v in split.items()})
    if a.stage in ("all", "fit"):
        write_json(OUT / "fit.json", fit(split, a.rounds))
    fitted = json.loads((OUT / "fit.json").read_text())
    if a.stage in ("all", "eval"):
        write_json(OUT / "plus_recall.json", evaluate(split, fitted["params"]))
    if a.stage in ("all", "oracle"):
        write_json(OUT / "oracle.json", oracle())
    if a.stage in ("all", "eval", "oracle", "report"):
        evald = json.loads((OUT / "plus_recall.json").read_text())
        orc = json.loads((OUT / "oracle.json").read_text()) if (OUT / "oracle.json").is_file() else None
        (OUT / "plus.md").write_text(report(evald, fitted, orc), encoding="utf-8")
        write_json(OUT / "plus.json", {"fit": {k: v for k, v in fitted.items() if k != "history"},
                                       "recall_test": evald, "oracle": orc})
        plot(evald, orc, OUT / "plus.png")


if __name__ == "__main__":
    main()
