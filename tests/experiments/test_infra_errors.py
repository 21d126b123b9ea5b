"""Infrastructure failures are not task failures.

A full disk or a model still rate-limited after its retries says nothing
about the task: the runner records it ``status: "error", retryable: true``,
the key stays not done, the next run retries it, and the job ends with the
same effective records as a run that never failed. Everything is real: Hydra
composition, BFCL task data, the oracle, a graph file, the kernel's ENOSPC
from /dev/full and litellm's retry path against a registered custom provider.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _faults import SECRET_KEY, SECRET_URL, FaultyOracle, install_provider, uninstall_provider
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from contextrender.experiments.records.schema import (
    SCHEMA_VERSION,
    RecordFile,
    effective_records,
    load_effective,
    load_records,
)
from contextrender.experiments.runtime.runner import run_job
from contextrender.registry import CONF_DIR

TASKS = [f"multi_turn_long_context_{i}" for i in range(4)]
DISK, RATE = TASKS[1], TASKS[2]


def job(run_dir: Path, flag: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={run_dir}", "embedding=hashing", "progress=false",
                                           "method=contextrender", "budget=1500", "benchmark.limit=4", *overrides])
    with open_dict(cfg):  # the same model config for the clean and the faulty run: same keys
        cfg.model = {"_target_": f"{FaultyOracle.__module__}.{FaultyOracle.__qualname__}", "flag": str(flag),
                     "disk_full": [DISK], "rate_limited": [RATE]}
    return cfg


def comparable(records) -> list[dict]:
    # ``trace`` names the run directory; nothing else may differ between the two runs
    return sorted(({k: v for k, v in r.items() if k != "trace"} for r in records), key=lambda r: r["key"])


@pytest.fixture
def provider():
    handler = install_provider()
    yield handler
    uninstall_provider()


def test_disk_full_and_429_are_retried_and_end_like_an_uninterrupted_run(tmp_path, provider):
    flag = tmp_path / "faults.on"
    clean = run_job(job(tmp_path / "clean", flag))
    assert (clean.done, clean.errors) == (4, 0)
    expected = comparable(load_records(tmp_path / "clean"))
    assert len(expected) == 4 and provider.calls == 0

    run_dir = tmp_path / "faulty"
    flag.touch()
    first = run_job(job(run_dir, flag))
    # both failures are counted, neither is a done episode, neither is scored
    assert (first.ran, first.done, first.errors, first.skipped) == (4, 2, 2, 0)
    assert provider.calls == 3  # litellm really retried: 1 try + max_retries=2
    recs = {r["task"]: r for r in load_records(run_dir)}
    for task, exc in ((DISK, "OSError"), (RATE, "TransientModelError")):
        r = recs[task]
        assert (r["status"], r["retryable"], r["score"], r["trace"]) == ("error", True, {}, None)
        assert r["error"].startswith(exc) and r["invocations"] == 2 and r["schema_version"] == SCHEMA_VERSION
    assert "No space left on device" in recs[DISK]["error"]
    assert "RateLimitError" in recs[RATE]["error"]
    # the provider's error quoted a key and a credentialed URL: neither reaches the record file
    raw = (run_dir / "records").joinpath(Path(first.records).name).read_text()
    for secret in (SECRET_KEY, "hunter2pass", "querysecret42", SECRET_URL):
        assert secret not in raw
    assert RecordFile(first.records).done_keys() == {r["key"] for r in recs.values() if r["status"] != "error"}
    # the summary's mean is over outcomes only (an error would pull it towards 0)
    scores = [r["score"]["task_acc"] for t, r in recs.items() if t not in (DISK, RATE)]
    assert first.mean_score == pytest.approx(sum(scores) / 2)

    flag.unlink()  # disk freed, rate-limit window over
    second = run_job(job(run_dir, flag))
    assert (second.ran, second.skipped, second.errors, second.done) == (2, 2, 0, 4)
    assert second.mean_score == pytest.approx(clean.mean_score)
    assert len(load_records(run_dir)) == 6  # the two error rows stay in the file, superseded
    assert comparable(load_effective(run_dir)) == expected
    # one trace per outcome, none for the failed attempts
    traces = [json.loads(x) for p in (run_dir / "traces").glob("*.jsonl") for x in p.read_text().splitlines()]
    assert sorted(t["key"] for t in traces) == sorted(r["key"] for r in expected)

    third = run_job(job(run_dir, flag))  # and now everything is done
    assert (third.ran, third.skipped, third.done) == (0, 4, 4)


def test_effective_records_latest_outcome_wins_and_errors_only_stand_alone():
    def r(key, status, n, retryable=False):
        return {"key": key, "status": status, "n": n, **({"retryable": True} if retryable else {})}

    recs = [
        r("a", "error", 1, retryable=True), r("a", "ok", 2), r("a", "error", 3, retryable=True),  # outcome kept
        r("b", "error", 4, retryable=True), r("b", "error", 5, retryable=True),  # latest error, no outcome
        r("c", "ok", 6), r("c", "step_limit", 7),  # latest outcome
        r("d", "error", 8),  # a schema-1 error (no retryable field) is an outcome, as when it was written
    ]
    got = effective_records(recs)
    assert [(x["key"], x["n"]) for x in got] == [("a", 2), ("b", 5), ("c", 7), ("d", 8)]


def test_sweep_cap_counts_failed_attempts_too(tmp_path):
    """The spend cap is about money: a failed attempt's tokens were paid for even after a rerun succeeded."""
    run_dir = tmp_path / "run"
    other = RecordFile(run_dir / "records" / "other-job.jsonl")
    base = {"model": "oracle", "benchmark": "x", "task": "t", "method": "full", "budget": 1500}
    other.append({**base, "key": "k", "status": "error", "retryable": True, "cost_upper_usd": 5.0})
    other.append({**base, "key": "k", "status": "ok", "cost_upper_usd": 0.0})
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={run_dir}", "embedding=hashing", "progress=false",
                                           "model=oracle", "method=prune", "budget=1500", "benchmark.limit=2",
                                           "sweep_cost_cap_usd=1.0"])
    summary = run_job(cfg)
    assert summary.stopped_by_sweep_cap and summary.ran == 0
