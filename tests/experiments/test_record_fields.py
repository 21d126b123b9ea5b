"""Schema 3: a record names its primary metric and the code version that produced it; schema 4: its measures."""

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
    assert rec["schema_version"] == SCHEMA_VERSION == 4
    # schema 4: the failure-mode measures' counts, and per render the prefix and identifier counts
    assert rec["measures"]["episodes"] == 1 and rec["measures"]["renders"] == rec["invocations"]
    assert rec["measures"]["tool_calls"] == sum(r["calls"] for r in rec["renders"]) > 0
    assert rec["renders"][0]["prefix_tokens"] is None
    assert all(0 <= r["prefix_tokens"] <= r["input_tokens"] for r in rec["renders"][1:])
    assert rec["metric"] == "task_acc" and rec["metric"] in rec["score"]
    assert rec["code_version"].startswith(contextrender.__version__)
    # From a checkout the commit is part of the version, so records of different code never look alike.
    assert rec["git_sha"] == "unknown" or rec["code_version"].endswith(rec["git_sha"])
