"""ACON's thresholds follow the benchmark (docs/method.md §6): QA's 2048/400 on moqa8*, AppWorld's 4096/1024 elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from contextrender.baselines.acon import Acon, is_acon_config, resolve_thresholds, thresholds_for
from contextrender.experiments.records.schema import config_hash
from contextrender.experiments.runtime.runner import result_config, run_job
from contextrender.registry import CONF_DIR, build_policy, method_config

#: conf/method/acon.yaml as committed before thresholds were chosen by benchmark (the Table 1 runs).
OLD_ACON_YAML = """
_target_: contextrender.baselines.acon.Acon
name: acon
history_threshold: 4096
observation_threshold: 1024
keep_last_turns: 1
summary_share: 0.5
observation_ratio: 0.5
guideline_path: null
observation_guideline_path: null
"""


def job(run_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[f"run_dir={run_dir}", "model=oracle", "embedding=hashing",
                                            "compactor=extractive", "progress=false", *overrides])


@pytest.mark.parametrize("benchmark, expected", [
    ("moqa8", (2048, 400)), ("moqa8_offline", (2048, 400)),
    ("bfcl_multi_turn_long_context", (4096, 1024)), ("bfcl_multi_turn_base", (4096, 1024)),
    ("tau2_retail", (4096, 1024)), ("appworld_test_normal", (4096, 1024)), (None, (4096, 1024)),
])
def test_the_table(benchmark, expected):
    assert thresholds_for(benchmark)[0] == expected


def test_auto_values_are_filled_and_explicit_ones_win():
    cfg = method_config("acon")
    assert (cfg.history_threshold, cfg.observation_threshold) == (0, 0)  # 0 = ACON's value for the benchmark
    used = resolve_thresholds(cfg, "moqa8")
    assert used == {"history_threshold": 2048, "observation_threshold": 400,
                    "thresholds_from": "ACON's QA values (moqa8* benchmark moqa8)"}
    assert (cfg.history_threshold, cfg.observation_threshold) == (2048, 400)
    policy = build_policy(cfg)
    assert (policy.history_threshold, policy.observation_threshold) == (2048, 400)
    both = method_config("acon", {"history_threshold": 3000, "observation_threshold": 700})
    assert resolve_thresholds(both, "moqa8")["thresholds_from"] == "set explicitly"
    assert (both.history_threshold, both.observation_threshold) == (3000, 700)
    assert resolve_thresholds(method_config("prune"), "moqa8") is None  # other methods untouched
    assert not is_acon_config(method_config("contextrender")) and is_acon_config(method_config("acon"))


def test_without_a_benchmark_acon_keeps_appworlds_values():
    assert (Acon().history_threshold, Acon().observation_threshold) == (4096, 1024)
    built = build_policy(method_config("acon"))  # the service and proxy: no benchmark known
    assert (built.history_threshold, built.observation_threshold) == (4096, 1024)
    with pytest.raises(ValueError, match="thresholds must be positive"):
        Acon(history_threshold=-1)


def test_bfcl_keeps_the_committed_values_and_config_hash(tmp_path):
    cfg = job(tmp_path, "benchmark=bfcl_multi_turn", "method=acon", "budget=2000")
    assert resolve_thresholds(cfg.method, "bfcl_multi_turn_long_context")["history_threshold"] == 4096
    old = job(tmp_path, "benchmark=bfcl_multi_turn", "method=acon", "budget=2000")
    old.method = OmegaConf.create(OLD_ACON_YAML)
    # The same result config, so the same key: committed Table 1 records stay done and identical.
    assert config_hash(result_config(cfg)) == config_hash(result_config(old))


def test_runner_applies_qa_thresholds_on_moqa8_and_records_them(tmp_path):
    summary = run_job(job(tmp_path / "qa", "benchmark=moqa8_offline", "benchmark.n_tasks=2", "method=acon",
                          "budget=3000"))
    assert summary.ran == 2
    records = [json.loads(line) for line in Path(summary.records).read_text().splitlines()]
    assert [r["extra"]["acon_thresholds"] for r in records] == [
        {"history_threshold": 2048, "observation_threshold": 400,
         "thresholds_from": "ACON's QA values (moqa8* benchmark moqa8_offline)"}] * 2
    explicit = job(tmp_path / "qa", "benchmark=moqa8_offline", "benchmark.n_tasks=2", "method=acon", "budget=3000",
                   "method.history_threshold=2048", "method.observation_threshold=400")
    assert records[0]["config_hash"] == config_hash(result_config(explicit))  # the hash sees the numbers used
    assert run_job(explicit).ran == 0  # ...so the explicit run is the same job, already done
    # An explicit value still wins on QA, and is recorded as set.
    own = run_job(job(tmp_path / "own", "benchmark=moqa8_offline", "benchmark.n_tasks=1", "method=acon",
                      "budget=3000", "method.history_threshold=4096", "method.observation_threshold=1024"))
    [rec] = [json.loads(line) for line in Path(own.records).read_text().splitlines()]
    assert rec["extra"]["acon_thresholds"] == {"history_threshold": 4096, "observation_threshold": 1024,
                                               "thresholds_from": "set explicitly"}


def test_runner_keeps_appworld_values_on_bfcl(tmp_path):
    summary = run_job(job(tmp_path, "benchmark=bfcl_multi_turn", "benchmark.limit=1", "method=acon", "budget=2000"))
    [rec] = [json.loads(line) for line in Path(summary.records).read_text().splitlines()]
    assert rec["extra"]["acon_thresholds"] == {
        "history_threshold": 4096, "observation_threshold": 1024,
        "thresholds_from": "ACON's AppWorld values (benchmark bfcl_multi_turn_long_context)"}
