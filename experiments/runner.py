"""Run one (model, benchmark, method, budget) job: every task, resumable, priced.

Layout under ``run_dir``::

    records/<model>__<benchmark>__<method>__B<budget>.jsonl   one line per episode
    traces/<same>.jsonl                                       replay-format traces
    graphs/<same>.sqlite                                      the persistent context graphs

A rerun skips done keys, so a job killed at any point and restarted loses
nothing and duplicates nothing. A trace line is written before its record;
trace lines without a record (a kill in between) are dropped on restart.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import traceback
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from contextrender.config import build_policy
from contextrender.graph import ContextGraph

from .cost import upper_bound_cost
from .episode import Episode, EpisodeStop, Limits
from .records import EpisodeRecord, RecordFile, config_hash, episode_key, load_records

log = logging.getLogger(__name__)

#: config keys that do not change results (excluded from the config hash)
_RUN_CONTROL = ("workers", "run_dir", "experiment_name", "sweep_cost_cap_usd", "hydra", "progress")


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s)


@dataclass(frozen=True)
class JobSummary:
    records: str
    done: int
    ran: int
    skipped: int
    stopped_by_sweep_cap: bool
    mean_score: float | None


class TraceFile:
    """Replay-format traces (``{"task_id", "messages"}`` plus the record key)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def prune(self, done: set[str]) -> None:
        """Drop lines whose record was never written (killed in between)."""
        if not self.path.exists():
            return
        keep, seen = [], set()
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if d.get("key") in done and d["key"] not in seen:
                    seen.add(d["key"])
                    keep.append(line if line.endswith("\n") else line + "\n")
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(keep), encoding="utf-8")
        os.replace(tmp, self.path)

    def append(self, key: str, task_id: str, messages: list[dict[str, Any]]) -> None:
        line = json.dumps({"task_id": task_id, "key": key, "messages": messages}, ensure_ascii=False) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def result_config(cfg: DictConfig) -> dict[str, Any]:
    """The config that determines results (hashed into every record key)."""
    d = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(d, dict)
    return {k: v for k, v in d.items() if k not in _RUN_CONTROL}


def run_job(cfg: DictConfig) -> JobSummary:
    """Run every task of ``cfg.benchmark`` with ``cfg.method`` at ``cfg.budget``."""
    budget = int(cfg.budget)
    benchmark = instantiate(cfg.benchmark)
    model = instantiate(cfg.model)
    embedder = instantiate(cfg.embedding)
    compactor = instantiate(cfg.compactor)
    method_name = str(cfg.method.name)
    chash = config_hash(result_config(cfg))
    stem = _slug(f"{model.name}__{benchmark.name}__{method_name}__B{budget}")
    run_dir = Path(cfg.run_dir)
    records = RecordFile(run_dir / "records" / f"{stem}.jsonl")
    traces = TraceFile(run_dir / "traces" / f"{stem}.jsonl")
    graph = ContextGraph(run_dir / "graphs" / f"{stem}.sqlite")
    done = records.done_keys()
    traces.prune(done)
    limits = Limits(max_steps=int(cfg.limits.max_steps), max_cost_usd=cfg.limits.max_task_cost_usd)
    weights = OmegaConf.to_container(cfg.method.weights) if "weights" in cfg.method else None

    tasks = benchmark.tasks()
    todo = [t for t in tasks if episode_key(model.name, benchmark.name, t.id, method_name, budget, chash) not in done]
    log.info("%s: %d tasks, %d done, %d to run", stem, len(tasks), len(tasks) - len(todo), len(todo))

    cap = cfg.get("sweep_cost_cap_usd")
    spent = sum(r.get("cost_upper_usd", 0.0) for r in load_records(run_dir)) if cap is not None else 0.0
    lock = threading.Lock()
    state = {"spent": spent, "stopped": False, "scores": [], "ran": 0}
    bar = tqdm(total=len(todo), desc=f"{method_name} B={budget}", disable=not cfg.get("progress", True),
               dynamic_ncols=True)

    def one(task: Any) -> None:
        with lock:
            if cap is not None and state["spent"] >= cap:
                state["stopped"] = True
                return
        key = episode_key(model.name, benchmark.name, task.id, method_name, budget, chash)
        attempt = sum(1 for s in graph.session_ids() if s.startswith(key + "#"))
        session = graph.session(f"{key}#{attempt}")
        # A fresh policy per episode: stateful baselines keep state per session anyway,
        # and this keeps worker threads from sharing mutable policy objects.
        policy = build_policy(cfg.method, embedder=embedder, compactor=compactor)
        ep = Episode(session, policy, model.episode(task, session), budget, limits)
        status, score, extra, error = "ok", {}, {}, None
        try:
            outcome = benchmark.run_episode(task, ep)
            status, score, extra = outcome.status, dict(outcome.score), dict(outcome.extra)
        except EpisodeStop as stop:
            status, error = stop.status, str(stop)
            score = {benchmark.primary_metric: 0.0}
        except Exception as exc:  # noqa: BLE001 — a failure is a row with a status
            status, error = "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
            score = {benchmark.primary_metric: 0.0}
            log.warning("%s %s failed: %s", stem, task.id, exc)
        traces.append(key, task.id, session.openai_messages())
        rec = EpisodeRecord(
            key=key, model=model.name, benchmark=benchmark.name, task=task.id, method=method_name,
            budget=budget, status=status, score=score, usage=ep.usage(), cost_upper_usd=ep.cost_upper(),
            exceeded_budget=ep.exceeded_budget, invocations=ep.invocations, renders=ep.renders,
            weights=weights, compactor=getattr(compactor, "name", None), embedder=getattr(embedder, "name", None),
            error=error, synthetic=bool(getattr(benchmark, "synthetic", False)), trace=str(traces.path),
            config_hash=chash, extra=extra)
        records.append(rec)
        with lock:
            state["spent"] += upper_bound_cost(rec.usage)
            state["scores"].append(score.get(benchmark.primary_metric, 0.0))
            state["ran"] += 1
            mean = sum(state["scores"]) / len(state["scores"])
            bar.set_postfix({benchmark.primary_metric: f"{mean:.3f}", "spent≤$": f"{state['spent']:.3f}"})
            bar.update(1)

    workers = max(1, int(cfg.get("workers", 1)))
    try:
        if workers == 1:
            for t in todo:
                one(t)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(one, todo))
    finally:
        bar.close()
        graph.close()
    if state["stopped"]:
        log.warning("sweep spend cap %.2f USD reached (spent ≤ %.4f); stopping cleanly", cap, state["spent"])
    scores: list[float] = state["scores"]
    return JobSummary(str(records.path), len(tasks) - len(todo) + state["ran"], state["ran"],
                      len(tasks) - len(todo), bool(state["stopped"]),
                      sum(scores) / len(scores) if scores else None)


def iter_job_configs(cfgs: Iterable[DictConfig]) -> Iterable[JobSummary]:
    for cfg in cfgs:
        yield run_job(cfg)
