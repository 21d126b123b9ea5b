"""Eq. 3 and the record file's crash safety."""

from __future__ import annotations

import json

import pytest

from contextrender.experiments.records.cost import (
    cache_fraction,
    comparison_set,
    normalised_cost,
    record_cost,
    task_cost,
)
from contextrender.experiments.records.schema import RecordFile


def test_eq3_by_hand():
    # P=1M input, O=0.1M output, E=2M embedding, rho=0.25:
    # [2(0.75) + 0.5(0.25)]·1 + 8·0.1 + 0.13·2 = 1.625 + 0.8 + 0.26
    assert task_cost(1_000_000, 100_000, 2_000_000, 0.25) == pytest.approx(2.685)
    assert task_cost(1_000_000, 0, 0, 1.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        task_cost(1, 1, 1, 1.5)


def test_all_calls_count_agent_compactor_embeddings():
    rec = {"usage": {"agent": {"input": 1000, "output": 10, "cached": 500},
                     "compactor": {"input": 300, "output": 50},
                     "embeddings": {"embedding": 4000}}}
    expected = ((2 * 0.5 + 0.5 * 0.5) * 1300 + 8 * 60 + 0.13 * 4000) / 1e6
    assert record_cost(rec, 0.5) == pytest.approx(expected)


def test_rho_from_agent_calls_and_T():
    full = [{"task": "a", "exceeded_budget": True, "usage": {"agent": {"input": 100, "cached": 30}}},
            {"task": "b", "exceeded_budget": False, "usage": {"agent": {"input": 300, "cached": 10}}}]
    assert cache_fraction(full) == pytest.approx(40 / 400)
    assert comparison_set(full) == {"a"}
    assert normalised_cost(0.5, 2.0) == 0.25 and normalised_cost(None, 1.0) is None


def test_torn_tail_is_cut_and_appends_resume(tmp_path):
    path = tmp_path / "records" / "r.jsonl"
    rf = RecordFile(path)
    rf.append({"key": "k1", "x": 1})
    rf.append({"key": "k2", "x": 2})
    with open(path, "ab") as f:  # a kill in the middle of a write
        f.write(b'{"key": "k3", "x"')
    rf = RecordFile(path)
    assert rf.done_keys() == {"k1", "k2"}
    rf.append({"key": "k3", "x": 3})
    lines = path.read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["k1", "k2", "k3"]


def _rec(renders, usage=None, extra=None):
    return {"renders": renders, "usage": usage or {"agent": {}, "compactor": {}, "embeddings": {}},
            "extra": extra or {}}


def test_billed_cost_by_hand_per_profile():
    """docs/method.md §14: each request from its own cache reads and writes, at the profile model's prices."""
    from contextrender.billing import Prices
    from contextrender.experiments.records.cost import billed_cost, cache_hit_share, record_billed

    p = Prices("m", "x", input=1.0, output=4.0, cache_read=0.1, cache_write=1.25)
    renders = [{"prompt": 2000, "output": 10, "cache": {"anthropic": [0, 2000], "openai": [0, 0]}},
               {"prompt": 2500, "output": 20, "cache": {"anthropic": [2000, 500], "openai": [1920, 0]}}]
    rec = _rec(renders, usage={"agent": {}, "compactor": {"input": 300, "output": 30}, "embeddings": {"embedding": 50}})
    # anthropic: writes 2500 × 1.25, reads 2000 × 0.1, output 30 × 4; compactor 300 × 1 + 30 × 4; embeddings 50 × 0.01
    assert billed_cost(rec, "anthropic", p, 0.01) == pytest.approx(2500 * 1.25 + 2000 * 0.1 + 30 * 4 + 300 + 120 + 0.5)
    # openai: 1920 read, the other 2580 prompt tokens plain
    assert billed_cost(rec, "openai", p) == pytest.approx(1920 * 0.1 + 2580 + 120 + 300 + 120)
    assert billed_cost(rec, "none", p) == pytest.approx(4500 + 120 + 300 + 120)
    assert cache_hit_share([rec], "anthropic") == pytest.approx(2000 / 4500)
    # a record written before schema 5 cannot be billed: unknown, never zero
    old = _rec([{"t": 0, "tokens": 10}])
    assert record_billed(old, "anthropic") is None and billed_cost(old, "openai", p) is None


def test_a_live_run_is_billed_from_its_providers_own_figures_under_its_profile():
    from contextrender.experiments.records.cost import record_billed

    renders = [{"prompt": 2000, "output": 5, "cache": {"anthropic": [0, 2000], "openai": [0, 0]},
                "provider_cache": [2100, 1900, 150]}]
    rec = _rec(renders, extra={"provider_profile": "anthropic"})
    u = record_billed(rec, "anthropic")
    assert (u.prompt, u.cache_read, u.cache_write, u.output) == (2100, 1900, 150, 5)
    assert record_billed(rec, "openai").prompt == 2000  # another profile: what the request would cost there
