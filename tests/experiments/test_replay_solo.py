"""Replay of a τ² solo-mode run: no user message at all, the agent starts with a tool call.

``tests/data/tau2/scripted_telecom_solo.json`` was written by ``tau2 run --agent llm_agent_solo
--user dummy_user`` itself (``tests/data/make_tau2_fixture.py --solo``). Policies that split the
history into user turns met no turn start there; one crashed on exactly this shape, so every
registered method is replayed on the real file, with room to spare and under pressure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from contextrender import ExtractiveCompactor, HashingEmbedder
from contextrender.experiments.evaluation.replay import replay_traces
from contextrender.experiments.evaluation.traces import open_traces
from contextrender.registry import method_names

SOLO = Path(__file__).resolve().parents[1] / "data" / "tau2" / "scripted_telecom_solo.json"
ROOMY, TIGHT = 2000, 300


def test_the_solo_run_has_no_user_and_opens_with_a_tool_call():
    [ep] = list(open_traces(SOLO))
    roles = [m["role"] for m in ep.messages]
    assert "user" not in roles
    first = next(m for m in ep.messages if m["role"] != "system")
    assert first["role"] == "assistant" and first.get("tool_calls")
    calls = [c["function"]["name"] for m in ep.messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    # Real calls on tau2's databases and the phone; tau2 records the closing `done` call as a text stop.
    assert 3 <= len(calls) <= 6 and "done" not in calls
    assert ep.messages[-1] == {"role": "assistant", "content": "###STOP###"}
    assert ep.benchmark == "tau2_telecom"


def test_the_solo_fixture_is_a_passing_tau2_solo_run():
    simulation = pytest.importorskip("tau2.data_model.simulation")
    results = simulation.Results.load(SOLO)  # tau2's own loader and pydantic models
    assert (results.info.agent_info.implementation, results.info.user_info.implementation) == (
        "llm_agent_solo", "dummy_user")
    [sim] = results.simulations
    assert sim.reward_info.reward == 1.0 and sim.termination_reason == "agent_stop"
    assert {m.requestor for m in sim.messages if m.role == "tool"} == {"assistant"}  # the phone's tools too


@pytest.mark.parametrize("budget", [ROOMY, TIGHT])
def test_every_method_replays_the_solo_run_within_budget(budget):
    [ep] = list(open_traces(SOLO))
    res = replay_traces(SOLO, budget, method_names(), embedder=HashingEmbedder(dim=64),
                        compactor=ExtractiveCompactor(), progress=False)
    assert set(res.methods) == set(method_names())
    if budget == TIGHT:
        # Otherwise no policy would have to cut anything and the turnless history would go untested.
        assert res.methods["full"].over_budget >= 1
    for name, tally in res.methods.items():
        assert tally.renders == len(ep.assistant_indices) > 0, name
        if tally.budgeted:
            assert tally.over_budget == 0, (name, tally.summary()["max_rendered_tokens"])
