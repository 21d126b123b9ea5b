"""Property: every registered method renders the transcript shapes real recorded runs have.

Recorded runs do not always open with a user message. τ²-bench's solo-mode simulations (telecom
``no-user``) have none at all: the agent starts with tool calls. Every τ² simulation opens with the
assistant's greeting before the user speaks. Tools return empty text. Each shape is rendered
before every invocation by every method in ``conf/method/`` (whatever is added there is covered),
at budgets from below the verbatim messages to above the whole history: no render may fail, exceed B
or break call/result pairing.
"""

from __future__ import annotations

import json
import random

import pytest
from _baseline_util import history_recount, pairing_errors
from hypothesis import given, settings
from hypothesis import strategies as st

from contextrender import ContextGraph, ExtractiveCompactor, HashingEmbedder
from contextrender.registry import build_policy, method_config, method_names

EMB = HashingEmbedder(dim=64)
SHAPES = ("solo", "greeting_first", "user_first")


def _policies() -> dict[str, object]:
    compactor = ExtractiveCompactor()
    return {n: build_policy(method_config(n), embedder=EMB, compactor=compactor) for n in method_names()}


POLICIES = _policies()


@st.composite
def real_shaped(draw: st.DrawFn) -> list[dict]:
    """A transcript of one of :data:`SHAPES`, with some empty tool results and parallel calls."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    shape = draw(st.sampled_from(SHAPES))
    size = draw(st.sampled_from([3, 30, 300]))
    msgs: list[dict] = []
    if rng.random() < 0.7:
        msgs.append({"role": "system", "content": "You are a support agent. Policy: be careful."})
    if shape == "greeting_first":
        msgs.append({"role": "assistant", "content": "Hi! How can I help you today?"})
    if shape != "solo":
        msgs.append({"role": "user", "content": "My line 555-0142 has no data. Account ACC_" + str(rng.randint(0, 99))})
    n = 0
    ids: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        calls = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            calls.append({"id": f"call_{n}", "type": "function", "function": {
                "name": rng.choice(["get_line_status", "toggle_airplane_mode", "check_network"]),
                "arguments": json.dumps({"line": rng.choice(ids) if ids and rng.random() < 0.5 else "555-0142"})}})
            n += 1
        text = rng.choice([None, "", "Let me check."])
        msgs.append({"role": "assistant", "content": text, "tool_calls": calls})
        for c in calls:
            if rng.random() < 0.3:
                body = ""  # a tool that returns no text
            else:
                ident = f"LINE_{rng.randint(10**5, 10**6)}"
                ids.append(ident)
                body = json.dumps({"id": ident, "status": "ok", "notes": " ".join(["signal"] * rng.randint(1, size))})
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": body})
        if shape != "solo" and rng.random() < 0.2:
            msgs.append({"role": "assistant", "content": "Please restart your phone."})
            msgs.append({"role": "user", "content": "Done, still nothing."})
    if rng.random() < 0.5:
        msgs.append({"role": "assistant", "content": "Your line works again."})
    return msgs


def _render_all(messages: list[dict], budget: int) -> None:
    session = ContextGraph().session("shape")

    def render() -> None:
        for name, policy in POLICIES.items():
            try:
                out = policy.render(session, budget)
            except Exception as e:  # name the method and the shape in the failure
                raise AssertionError(f"{name} failed at B={budget} on {json.dumps(session.openai_messages())[:600]}") from e
            if getattr(policy, "budgeted", True):
                assert out.tokens <= budget, (name, out.tokens, budget)
            assert out.tokens == history_recount(session, out), name
            assert not pairing_errors(out.messages), (name, pairing_errors(out.messages))

    for m in messages:
        if m["role"] == "assistant":
            render()
        session.add(m)
    render()


@settings(max_examples=60, deadline=None)
@given(real_shaped(), st.sampled_from([20, 60, 150, 400, 1000, 5000]))
def test_every_method_renders_real_shapes(messages: list[dict], budget: int) -> None:
    _render_all(messages, budget)


@pytest.mark.parametrize("budget", [30, 80, 200])
def test_solo_simulation_without_any_user_message(budget: int) -> None:
    """τ²'s solo mode: system prompt, then the agent's tool calls; no user message anywhere."""
    msgs: list[dict] = [{"role": "system", "content": "Fix the customer's phone."}]
    for i in range(6):
        cid = f"c{i}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "run_speed_test", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": f"speed {i}: " + "slow " * 40})
    msgs.append({"role": "assistant", "content": "The data connection is restored."})
    _render_all(msgs, budget)
