"""Schema 3: a record names its primary metric and the code version that produced it; schema 4: its measures;
schema 5: each request's tokens and its cache reads and writes under each billing profile."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

import contextrender
from contextrender.experiments.records.schema import SCHEMA_VERSION, load_records
from contextrender.experiments.runtime.runner import run_job
from contextrender.registry import CONF_DIR


def test_record_names_metric_and_code_version(tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={tmp_path}", "embedding=hashing", "progress=false",
                                           "model=oracle", "method=prune", "budget=1500", "benchmark.limit=1"])
    run_job(cfg)
    (rec,) = load_records(tmp_path)
    assert rec["schema_version"] == SCHEMA_VERSION == 5
    # schema 4: the failure-mode measures' counts, and per render the prefix and identifier counts
    assert rec["measures"]["episodes"] == 1 and rec["measures"]["renders"] == rec["invocations"]
    assert rec["measures"]["tool_calls"] == sum(r["calls"] for r in rec["renders"]) > 0
    assert rec["renders"][0]["prefix_tokens"] is None
    assert all(0 <= r["prefix_tokens"] <= r["input_tokens"] for r in rec["renders"][1:])
    assert rec["metric"] == "task_acc" and rec["metric"] in rec["score"]
    # schema 5 (docs/method.md §14): per request its prompt as sent (tools included) and, per billing profile,
    # the cache reads and writes simulated from what it sent; the oracle reports no provider figures
    agent = rec["usage"]["agent"]
    assert sum(r["prompt"] for r in rec["renders"]) == agent["input"]
    assert sum(r["output"] for r in rec["renders"]) == agent["output"]
    for r in rec["renders"]:
        assert set(r["cache"]) == {"anthropic", "openai"} and r["provider_cache"] is None
        assert all(0 <= x <= r["prompt"] for x in r["cache"]["anthropic"]) and r["cache"]["openai"][1] == 0
    # the first request finds nothing cached; once the prompt only grew, the next one reads what it had sent
    first, second = rec["renders"][:2]
    assert first["cache"]["anthropic"][0] == first["cache"]["openai"][0] == 0
    assert second["cache"]["anthropic"][0] == first["prompt"] == first["cache"]["anthropic"][1]
    assert rec["code_version"].startswith(contextrender.__version__)
    # From a checkout the commit is part of the version, so records of different code never look alike.
    assert rec["git_sha"] == "unknown" or rec["code_version"].endswith(rec["git_sha"])


def test_mixed_config_notes_count_each_tasks_latest_record_and_read_old_keys():
    from contextrender.experiments.records.schema import mixed_config_notes, record_config

    def rec(task: str, chash: str, field: bool = True) -> dict:
        r = {"key": f"m|b|{task}|prune|1500|{chash}", "model": "m", "benchmark": "b", "task": task,
             "method": "prune", "budget": 1500}
        return {**r, "config_hash": chash} if field else r  # records before the field: the key's last part

    assert record_config(rec("t1", "aaa", field=False)) == "aaa"
    old = [rec("t1", "aaa", field=False), rec("t2", "aaa"), rec("t3", "aaa")]
    assert mixed_config_notes(old) == []
    (note,) = mixed_config_notes([*old, rec("t2", "bbb")])
    assert note.startswith("m × b × prune at B=1500: the counted records come from 2 configs — 1 task(s) "
                           "from the newest (bbb), 2 from older ones")
    assert mixed_config_notes([*old, rec("t1", "bbb"), rec("t2", "bbb"), rec("t3", "bbb")]) == []
    other_budget = {**rec("t1", "ccc"), "budget": 3000}  # another job: its own config
    assert mixed_config_notes([*old, other_budget]) == []
