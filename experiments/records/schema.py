"""Episode records: one JSON line per episode, written atomically, resumable.

A record is a row with a status (ok / error / step_limit / cost_limit, or a
benchmark's own) — a failure is never an answer string. Two kinds of rows:

- an **outcome**: the task ran to an end (scored, or stopped by a step/cost
  limit). Its key is done and a rerun skips it.
- a **retryable error** (``status: "error"``, ``retryable: true``, schema 2):
  the infrastructure failed (disk full, SQLite or graph I/O, a model still
  rate-limited after its retries, a crashed worker). It says nothing about the
  task, so it is not done: the next run tries again, and until an outcome
  supersedes it it is left out of scores, ρ, T and spend
  (:func:`effective_records`).

Records of schema 1 have no ``retryable`` field and are all outcomes, as
they were when written. Lines are appended with one ``write`` on an
``O_APPEND`` descriptor and fsynced (:mod:`~contextrender.experiments.records.jsonl`); a line torn by
a kill is moved to a quarantine file when the file is next opened for
writing, so a killed run restarted with the same config loses nothing and
duplicates nothing.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from contextrender.experiments.records.jsonl import JsonlFile, read_jsonl
from contextrender.files import private_dir

#: 2: ``retryable`` (infrastructure errors are rerun; schema 1 records have none and are outcomes)
#: 3: ``metric`` (the benchmark's primary metric, which tables report) and ``code_version``
#: 4: ``measures`` (the failure-mode measures' counts, experiments.evaluation.measures) and, per render,
#:    ``input_tokens``, ``prefix_tokens``, ``id_uses``, ``id_survived``, ``calls``, ``rereads``; older
#:    records have none of them (readers treat the measures as unknown, never as zero)
#: 5: per render, ``prompt`` and ``output`` (the request's tokens, tool schemas included), ``cache`` (the
#:    request's cache reads and writes simulated under each billing profile, docs/method.md §14) and, for a model
#:    that reports them, ``provider_cache`` (the provider's own [prompt, read, write]); ``usage.*.cache_write``
SCHEMA_VERSION = 5
STATUSES = ("ok", "error", "step_limit", "cost_limit")


@lru_cache(maxsize=1)
def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parents[2])
        sha = out.stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_version() -> str:
    """The installed package version plus the git commit when run from a checkout."""
    from contextrender import __version__

    sha = git_sha()
    return __version__ if sha == "unknown" else f"{__version__}+{sha}"


def config_hash(cfg: Any) -> str:
    """Stable hash of the parts of a config that change results."""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RenderStat:
    """One invocation: what the policy rendered (and, schema 4, how it fared on the measures)."""

    t: int
    tokens: int  # Tok(H_t) rendered
    full_tokens: int  # Tok(H_full) before this invocation
    visible: tuple[int, ...]  # seqs of results visible in full
    # schema 4 (experiments.evaluation.measures); None / 0 in what older code wrote
    input_tokens: int | None = None  # Tok of every rendered message (system prompt and current user included)
    prefix_tokens: int | None = None  # of them, the leading messages unchanged since the previous render
    id_uses: int = 0  # identifier uses by the turn that followed this render
    id_survived: int = 0  # of them, visible (whole token, any form) in this render
    calls: int = 0  # tool calls of that turn
    rereads: int = 0  # of them, repeats of an earlier call whose result this render hid
    # schema 5 (docs/method.md §14); None in what older code wrote
    prompt: int | None = None  # the request's prompt tokens: tool schemas and every rendered message
    output: int | None = None  # the answer's output tokens
    cache: dict[str, list[int]] | None = None  # profile -> [cache read, cache write], simulated for this request
    provider_cache: list[int] | None = None  # [prompt, cache read, cache write] as the provider reported them


@dataclass
class EpisodeRecord:
    """One episode of one (model, benchmark, task, method, weights, budget)."""

    key: str
    model: str
    benchmark: str
    task: str
    method: str
    budget: int
    status: str
    score: dict[str, float]  # the benchmark's metrics; ``metric`` names the one tables report
    usage: dict[str, dict[str, int]]  # {"agent": Usage, "compactor": Usage, "embeddings": Usage}
    cost_upper_usd: float  # Eq. 3 with ρ = 0 (the realised ρ is applied in analysis)
    exceeded_budget: bool  # Full history exceeded B before some invocation
    invocations: int
    renders: list[RenderStat]
    metric: str = ""  # the benchmark's primary metric (schema 3; older records: analysis infers it)
    #: the failure-mode measures' counts (schema 4: MeasureStats.to_dict(); None in older records and
    #: in a retryable error without an episode)
    measures: dict[str, Any] | None = None
    weights: dict[str, float] | None = None
    compactor: str | None = None
    embedder: str | None = None
    error: str | None = None  # redacted (contextrender.redact) before it gets here
    retryable: bool = False  # an infrastructure error: not done, rerun, not scored (schema 2)
    synthetic: bool = False  # task data generated by this project (not the paper's benchmark)
    trace: str | None = None  # path of the replay-format trace file holding this episode
    config_hash: str = ""
    git_sha: str = field(default_factory=git_sha)
    code_version: str = field(default_factory=code_version)  # schema 3
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        d["renders"] = [asdict(r) if not isinstance(r, dict) else r for r in self.renders]
        return json.dumps(d, ensure_ascii=False, sort_keys=True)


def episode_key(model: str, benchmark: str, task: str, method: str, budget: int, chash: str) -> str:
    """The record key of one episode, ``model|benchmark|task|method|budget|config hash`` (:func:`parse_key`)."""
    return f"{model}|{benchmark}|{task}|{method}|{budget}|{chash}"


@dataclass(frozen=True)
class KeyParts:
    """An :func:`episode_key` taken apart, each part as written (the budget stays text)."""

    model: str
    benchmark: str
    task: str
    method: str
    budget: str
    config: str  # the config hash

    @property
    def job(self) -> str:
        """``model|benchmark|method|budget``: the job, whatever the task and config."""
        return f"{self.model}|{self.benchmark}|{self.method}|{self.budget}"

    @property
    def job_task(self) -> str:
        """The key without its config hash, ``model|benchmark|task|method|budget``: one task of one job."""
        return f"{self.model}|{self.benchmark}|{self.task}|{self.method}|{self.budget}"


def parse_key(key: Any) -> KeyParts | None:
    """The parts of an :func:`episode_key`; None for anything else (not a string, fewer than six parts).

    A task id may hold ``|``, so the parts after it are counted from the end.
    """
    parts = key.split("|") if isinstance(key, str) else []
    if len(parts) < 6:
        return None
    return KeyParts(parts[0], parts[1], "|".join(parts[2:-3]), parts[-3], parts[-2], parts[-1])


def _require_record(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a record object, got {type(obj).__name__}")
    if not isinstance(obj.get("key"), str):
        raise ValueError("record has no string 'key'")


def is_retryable(record: Mapping[str, Any]) -> bool:
    """An infrastructure failure waiting for a rerun (schema ≥ 2); older error records are outcomes."""
    return record.get("status") == "error" and record.get("retryable") is True


def effective_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records that count, one per key, in file order of the record chosen.

    Per key: the latest outcome (any non-retryable record); a retryable error
    only when the key has no outcome (then the latest one), so a failure that
    a rerun fixed leaves no trace in scores, ρ, T or spend. Spec §8 runs each
    method once per task, hence one record per key.
    """
    chosen: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for i, r in enumerate(records):
        key = r.get("key")
        if key is None:  # hand-made rows without a key stand for themselves
            chosen[f"\0{i}"] = (i, r)
            continue
        prev = chosen.get(key)
        if prev is None or not is_retryable(r) or is_retryable(prev[1]):
            chosen[key] = (i, r)
    return [r for _, r in sorted(chosen.values(), key=lambda x: x[0])]


def record_config(record: Mapping[str, Any]) -> str:
    """The config hash a record was run with (its field, else the last part of its key)."""
    chash = record.get("config_hash")
    if isinstance(chash, str) and chash:
        return chash
    parts = parse_key(record.get("key"))
    return parts.config if parts is not None else ""


def mixed_config_notes(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """A note for each job whose counted records (one per task) come from more than one config.

    A job rerun under another config (a changed weight or model setting under the same
    method name) counts the newest record of each task; until the rerun has reached every
    task, the others still count their older config's record. Tables and replays follow
    that rule (``analysis.tables.dedupe``, the trace reader); this says when it applies.
    ``records``: in file order, as :func:`effective_records` returns them; the last record of a
    task counts, and the newest config is the job's last record's.
    """
    tasks: dict[tuple[str, str, str, int], dict[str, str]] = {}
    newest: dict[tuple[str, str, str, int], str] = {}
    for r in records:
        try:
            job = (str(r["model"]), str(r["benchmark"]), str(r["method"]), int(r["budget"]))
            task = str(r["task"])
        except (KeyError, TypeError, ValueError):
            continue
        tasks.setdefault(job, {})[task] = newest[job] = record_config(r)
    notes = []
    for job, by_task in tasks.items():
        configs = list(by_task.values())
        if len(set(configs)) > 1:
            model, bench, method, budget = job
            n_new = configs.count(newest[job])
            notes.append(f"{model} × {bench} × {method} at B={budget}: the counted records come from "
                         f"{len(set(configs))} configs — {n_new} task(s) from the newest ({newest[job][:10]}), "
                         f"{len(configs) - n_new} from older ones it has not rerun yet (rerun the job to "
                         "bring every task to one config)")
    return notes


class RecordFile:
    """The writer of one job's records: thread-safe atomic appends; repaired when opened.

    Opening repairs the file as :class:`~contextrender.experiments.records.jsonl.JsonlFile` does (a
    torn tail or a corrupt line goes to ``<name>.quarantine``, nothing else is
    touched), so open a RecordFile only as the job's writer (the runner holds
    the job lock); readers use :func:`load_records`.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        private_dir(self.path.parent)
        self._file = JsonlFile(self.path, _require_record)
        self._file.repair()

    @property
    def quarantine(self) -> Path:
        return self._file.quarantine

    def load(self) -> list[dict[str, Any]]:
        """Every readable record, in file order (the file is never rewritten here)."""
        return self._file.read()

    def effective(self) -> list[Mapping[str, Any]]:
        return effective_records(self.load())

    def done_keys(self) -> set[str]:
        """Keys with an outcome; a key with only retryable errors is run again."""
        return {r["key"] for r in self.load() if not is_retryable(r)}

    def append(self, record: EpisodeRecord | dict[str, Any]) -> None:
        self._file.append_line(record.to_json() if isinstance(record, EpisodeRecord)
                               else json.dumps(record, sort_keys=True))


def read_record_file(path: str | Path) -> list[dict[str, Any]]:
    """The readable records of one file, without repairing it (warnings name file:line)."""
    return read_jsonl(path, _require_record)


def load_records(root: str | Path) -> list[dict[str, Any]]:
    """Every readable record under ``root`` (``**/records/*.jsonl``), raw, in file order; never rewrites.

    Analysis and the spend cap want :func:`load_effective` (or
    :func:`effective_records` over this), which applies the retry rule.
    """
    out: list[dict[str, Any]] = []
    for p in sorted(Path(root).rglob("*.jsonl")):
        if p.parent.name == "records":
            out.extend(read_record_file(p))
    return out


def load_effective(root: str | Path) -> list[Mapping[str, Any]]:
    """:func:`effective_records` of everything under ``root``."""
    return effective_records(load_records(root))
