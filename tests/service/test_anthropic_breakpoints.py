"""The client's prompt-cache breakpoints through a render (docs/service.md, "Cache breakpoints"):
:func:`~contextrender.service.anthropic_messages.forwarded_messages` on hand-made Messages API bodies, and
over random conversations, breakpoints, budgets and methods."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextrender import HashingEmbedder
from contextrender.graph import OMISSION_MARKER
from contextrender.registry import method_names
from contextrender.service import anthropic_messages as am
from contextrender.service.results import RenderResult
from contextrender.service.sessions import ContextService

from .anthropic_breakpoints import (
    CARRIERS,
    breakpoint_problems,
    cache_control_problems,
    located_breakpoints,
)
from .anthropic_upstream import LOOKUP, pairing_problems

EPH = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


@pytest.fixture(scope="module")
def service():
    svc = ContextService(":memory:", embedder=HashingEmbedder(dim=64), default_budget=400, warm=False)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def any_render(service) -> RenderResult:
    """A real render, whose fields the hand-made renders below take but for what they say to show."""
    return service.render("base", messages=[{"role": "user", "content": "hi"}], budget=400, method="contextrender")


def seq(conv: am.Converted, kind: str, index: int, block: int = -1) -> int:
    """The stored seq of the converted message from request message ``index`` (its ``block`` for a result)."""
    return next(s for s, o in enumerate(conv.origins) if (o.kind, o.index, o.block) == (kind, index, block))


def forward(base: RenderResult, body: dict[str, Any], drop: Iterable[int] = (), omit: Iterable[int] = (),
            calls: dict[int, list[str]] | None = None) -> dict[str, Any]:
    """The request that goes upstream for ``body`` when the render leaves out the converted messages ``drop``,
    shows results ``omit`` as the omission marker and keeps only tool calls ``calls[seq]`` of an assistant
    message: the render's choice is made here, the forwarding is the code under test's."""
    conv = am.to_openai(body.get("system"), body["messages"])
    drop, omit, calls = set(drop), set(omit), calls or {}
    layout, rendered = [], []
    for s, m in enumerate(conv.messages):
        if s in drop:
            continue
        if s in omit:
            m = {**m, "content": OMISSION_MARKER}
        if s in calls:
            m = {**m, "tool_calls": [c for c in m["tool_calls"] if c["id"] in calls[s]]}
        layout.append(s)
        rendered.append(m)
    render = dataclasses.replace(base, messages=tuple(rendered), layout=tuple(layout))
    before = copy.deepcopy(body)
    fwd = {**body, "messages": am.forwarded_messages(body["messages"], conv, render, request=body)}
    assert body == before  # the client's objects are never changed
    assert pairing_problems(fwd["messages"]) == []
    return fwd


def text(t: str, cc: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "text", "text": t, **({"cache_control": cc} if cc else {})}


def use(i: str, cc: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": i, "name": "lookup", "input": {"record": i},
            **({"cache_control": cc} if cc else {})}


def result(i: str, content: Any = None, cc: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": i, "content": f"result {i} " * 20 if content is None else content,
            **({"cache_control": cc} if cc else {})}


THINK = {"type": "thinking", "thinking": "Which record first?", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "EuYBCkQYAiJA=="}


def body_of(*messages: dict[str, Any], system: Any = None, tools: Any = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": list(messages), **extra}
    if system is not None:
        out["system"] = system
    if tools is not None:
        out["tools"] = tools
    return out


def cc_places(fwd: dict[str, Any]) -> list[str]:
    return [p for p, _ in located_breakpoints(fwd)]


# -- hand-made bodies ---------------------------------------------------------------------------------


def test_breakpoint_on_a_dropped_pair_moves_back_in_its_message(any_render):
    """Pair b goes: its tool_use's breakpoint moves to tool_use a (before it, kept), its tool_result's to
    tool_result a; the blocks before them, thinking included, stay the client's own objects."""
    body = body_of({"role": "user", "content": [text("Follow REC_start.")]},
                   {"role": "assistant", "content": [THINK, text("Two lookups."), use("a"), use("b", EPH)]},
                   {"role": "user", "content": [result("a"), result("b", cc=EPH)]},
                   {"role": "assistant", "content": [text("Done.")]},
                   {"role": "user", "content": "Thanks."}, system=[text("Sys.", EPH)])
    conv = am.to_openai(body["system"], body["messages"])
    fwd = forward(any_render, body, drop=[seq(conv, am.RESULT, 2, 1)], calls={seq(conv, am.ASSISTANT, 1): ["a"]})
    msgs, sent = fwd["messages"], body["messages"]
    assert msgs[1]["content"] == [THINK, text("Two lookups."), use("a", EPH)]
    assert [msgs[1]["content"][k] is sent[1]["content"][k] for k in range(2)] == [True, True]
    assert msgs[2]["content"] == [result("a", cc=EPH)]
    assert msgs[0] is sent[0] and msgs[3] is sent[3] and msgs[4] is sent[4]
    assert cc_places(fwd) == ["system.0", "messages.1.content.2", "messages.2.content.0"]
    assert breakpoint_problems(body, fwd) == [] and cache_control_problems(fwd) == []


def test_breakpoint_on_a_dropped_turn_moves_to_an_earlier_message_never_onto_thinking(any_render):
    """The turn (thinking, tool_use c; its result with a breakpoint) loses its pair: what is left of it is
    thinking and redacted thinking, which cannot carry one, so the breakpoint moves to the result before."""
    body = body_of({"role": "user", "content": [text("Follow REC_start.")]},
                   {"role": "assistant", "content": [use("a")]},
                   {"role": "user", "content": [result("a")]},
                   {"role": "assistant", "content": [REDACTED, THINK, use("c")]},
                   {"role": "user", "content": [result("c", cc=EPH)]},
                   {"role": "assistant", "content": [text("Done.")]},
                   {"role": "user", "content": [text("Thanks.", EPH)]})
    conv = am.to_openai(None, body["messages"])
    fwd = forward(any_render, body, drop=[seq(conv, am.RESULT, 4, 0)])
    msgs = fwd["messages"]
    assert msgs[3]["content"] == [REDACTED, THINK] and "cache_control" not in json.dumps(msgs[3])
    assert msgs[2]["content"] == [result("a", cc=EPH)]
    assert cc_places(fwd) == ["messages.2.content.0", "messages.5.content.0"]
    assert breakpoint_problems(body, fwd) == [] and cache_control_problems(fwd) == []


def test_breakpoint_with_nothing_kept_before_it_that_can_carry_one_is_left_out(any_render):
    """Before the dropped pair there is only thinking and the task as a string (no block to mark)."""
    body = body_of({"role": "user", "content": "Follow REC_start."},
                   {"role": "assistant", "content": [THINK, use("a", EPH)]},
                   {"role": "user", "content": [result("a")]},
                   {"role": "assistant", "content": [text("Done.")]},
                   {"role": "user", "content": "Thanks."}, system=[text("Sys.", EPH)])
    conv = am.to_openai(body["system"], body["messages"])
    fwd = forward(any_render, body, drop=[seq(conv, am.RESULT, 2, 0)])
    assert fwd["messages"][1] == {"role": "assistant", "content": [THINK]}
    assert cc_places(fwd) == ["system.0"] and breakpoint_problems(body, fwd) == []


def test_breakpoint_on_an_omitted_result_stays(any_render):
    """An omitted result keeps its own breakpoint in place; one inside its content moves onto it."""
    body = body_of({"role": "user", "content": "Follow REC_start."},
                   {"role": "assistant", "content": [use("a"), use("b")]},
                   {"role": "user", "content": [result("a", cc=EPH),
                                                result("b", [text("result b " * 20, EPH)]), text("More?")]},
                   {"role": "assistant", "content": [text("Yes.")]},
                   {"role": "user", "content": "Go."})
    conv = am.to_openai(None, body["messages"])
    fwd = forward(any_render, body, omit=[seq(conv, am.RESULT, 2, 0), seq(conv, am.RESULT, 2, 1)])
    got = fwd["messages"][2]["content"]
    assert got[0] == {"type": "tool_result", "tool_use_id": "a", "content": OMISSION_MARKER, "cache_control": EPH}
    assert list(got[0]) == list(body["messages"][2]["content"][0])  # its keys in the client's order
    assert got[1] == {"type": "tool_result", "tool_use_id": "b", "content": OMISSION_MARKER, "cache_control": EPH}
    assert got[2] is body["messages"][2]["content"][2]
    assert cc_places(fwd) == ["messages.2.content.0", "messages.2.content.1"]
    assert breakpoint_problems(body, fwd) == []


def test_a_block_that_already_carries_one_gets_no_second(any_render):
    body = body_of({"role": "user", "content": "Follow REC_start."},
                   {"role": "assistant", "content": [use("a"), use("b")]},
                   {"role": "user", "content": [result("a", cc=EPH), result("b", cc=HOUR)]},
                   {"role": "user", "content": "Go."})
    conv = am.to_openai(None, body["messages"])
    fwd = forward(any_render, body, drop=[seq(conv, am.RESULT, 2, 1)], calls={seq(conv, am.ASSISTANT, 1): ["a"]})
    assert fwd["messages"][2]["content"] == [result("a", cc=EPH)] and cc_places(fwd) == ["messages.2.content.0"]


@pytest.mark.parametrize("last_cc, top, moved", [(None, False, True), (EPH, False, False), (None, True, False)])
def test_the_cap_counts_tools_system_and_a_top_level_breakpoint(any_render, last_cc, top, moved):
    """Tools 1 + system 2 + a kept message breakpoint 1 = 4: the breakpoint of the dropped pair is left out
    (the client's kept ones all stay); without the kept one it moves; a top-level cache_control counts too."""
    tools = [LOOKUP, {**LOOKUP, "name": "other", "cache_control": EPH}]
    system = [text("Sys one.", EPH), text("Sys two.", EPH)]
    body = body_of({"role": "user", "content": "Follow REC_start."},
                   {"role": "assistant", "content": [use("a"), use("b")]},
                   {"role": "user", "content": [result("a"), result("b", cc=EPH)]},
                   {"role": "assistant", "content": [text("Next.")]},
                   {"role": "user", "content": [text("Go.", last_cc)]},
                   system=system, tools=tools, **({"cache_control": EPH} if top else {}))
    conv = am.to_openai(body["system"], body["messages"])
    fwd = forward(any_render, body, drop=[seq(conv, am.RESULT, 2, 1)], calls={seq(conv, am.ASSISTANT, 1): ["a"]})
    places = cc_places(fwd)
    assert places[:3] == ["tools.1", "system.0", "system.1"]
    assert ("messages.2.content.0" in places) is moved
    assert ("messages.4.content.0" in places) is (last_cc is not None)
    assert len(places) + top == 4 and cache_control_problems(fwd) == []
    assert breakpoint_problems(body, fwd) == []


def test_ttl_order_kept_a_moved_1h_breakpoint_stays_1h(any_render):
    body = body_of({"role": "user", "content": "Follow REC_start."},
                   {"role": "assistant", "content": [use("a"), use("b")]},
                   {"role": "user", "content": [result("a"), result("b", cc=HOUR)]},
                   {"role": "assistant", "content": [text("Next.")]},
                   {"role": "user", "content": [text("Go.", EPH)]}, system=[text("Sys.", HOUR)])
    conv = am.to_openai(body["system"], body["messages"])
    fwd = forward(any_render, body, drop=[seq(conv, am.RESULT, 2, 1)], calls={seq(conv, am.ASSISTANT, 1): ["a"]})
    assert [cc for _, cc in located_breakpoints(fwd)] == [HOUR, HOUR, EPH]
    assert fwd["messages"][2]["content"] == [result("a", cc=HOUR)]
    assert cache_control_problems(fwd) == [] and breakpoint_problems(body, fwd) == []


def test_ttl_order_never_a_1h_breakpoint_moved_after_a_5m_one(any_render):
    """The client's 1h breakpoint after its 5m one is one the API refuses; moved, it would still be after the
    5m one, so it is left out (and the render's request is one the API takes)."""
    body = body_of({"role": "user", "content": "Follow REC_start."},
                   {"role": "assistant", "content": [use("a"), use("b")]},
                   {"role": "user", "content": [result("a"), result("b", cc=HOUR)]},
                   {"role": "user", "content": "Go."}, system=[text("Sys.", EPH)])
    assert cache_control_problems(body) != []
    conv = am.to_openai(body["system"], body["messages"])
    fwd = forward(any_render, body, drop=[seq(conv, am.RESULT, 2, 1)], calls={seq(conv, am.ASSISTANT, 1): ["a"]})
    assert cc_places(fwd) == ["system.0"] and cache_control_problems(fwd) == []


def test_kept_blocks_stay_byte_identical_when_a_pair_goes(any_render):
    """An assistant message that loses one tool call keeps its other blocks as they were — two text blocks
    stay two (joining them would change the prefix the client cached, its breakpoint with it)."""
    body = body_of({"role": "user", "content": [text("Follow REC_start.", EPH)]},
                   {"role": "assistant", "content": [THINK, text("First this."), text("Then that.", EPH),
                                                     use("a"), use("b")]},
                   {"role": "user", "content": [result("a"), result("b")]},
                   {"role": "user", "content": "Go."})
    conv = am.to_openai(None, body["messages"])
    fwd = forward(any_render, body, drop=[seq(conv, am.RESULT, 2, 1)], calls={seq(conv, am.ASSISTANT, 1): ["a"]})
    sent, got = body["messages"], fwd["messages"]
    assert [b is o for b, o in zip(got[1]["content"], sent[1]["content"], strict=False)] == [True] * 4
    assert len(got[1]["content"]) == 4 and got[0] is sent[0]
    assert json.dumps(got[:2]) == json.dumps([sent[0], {**sent[1], "content": sent[1]["content"][:4]}])
    assert breakpoint_problems(body, fwd) == []


def test_nothing_lost_forwards_the_clients_own_messages(any_render):
    body = body_of({"role": "user", "content": [text("Follow REC_start.", EPH)]},
                   {"role": "assistant", "content": [THINK, use("a")]},
                   {"role": "user", "content": [result("a", cc=EPH)]}, system=[text("Sys.", EPH)])
    conv = am.to_openai(body["system"], body["messages"])
    fwd = forward(any_render, body, omit=[seq(conv, am.RESULT, 2, 0)])
    assert fwd["messages"][0] is body["messages"][0] and fwd["messages"][1] is body["messages"][1]
    assert cc_places(fwd) == ["system.0", "messages.0.content.0", "messages.2.content.0"]


# -- as a property -----------------------------------------------------------------------------------

_words = st.text(alphabet="abcdefgh REC_0123456789", min_size=0, max_size=40)


@st.composite
def requests(draw: Any) -> dict[str, Any]:
    """A random Messages API request the API takes: text and tool turns, thinking, results as strings or
    blocks, sizes that often exceed B, and up to 4 breakpoints on blocks that can carry one (tools, system,
    message blocks, the blocks inside results), every 1h one before every 5m one."""
    tools = [dict(LOOKUP), {**LOOKUP, "name": "other"}]
    system = [text(f"system {k} " + draw(_words)) for k in range(draw(st.integers(1, 2)))]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": [text("task " + draw(_words))]}]
    for i in range(draw(st.integers(1, 10))):
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(_words), "signature": f"s{i}"})
        if draw(st.booleans()):
            blocks.append(text(f"say {i} " + draw(_words)))
        calls = [f"toolu_{i}_{k}" for k in range(draw(st.integers(0, 3)))]
        blocks += [use(c) for c in calls]
        msgs.append({"role": "assistant", "content": blocks or [text(f"ok {i}")]})
        user: list[dict[str, Any]] = []
        for c in calls:
            body = " ".join(f"v{j}" for j in range(draw(st.integers(0, 300))))
            user.append(result(c, body if draw(st.booleans()) else [text(f"{c}: {body}")]))
        if not calls or draw(st.booleans()):
            user.append(text(f"next {i} " + draw(_words)))
        msgs.append({"role": "user", "content": user if calls or draw(st.booleans()) else user[-1]["text"]})
    # every place that can carry a breakpoint, in the provider's order
    places: list[dict[str, Any]] = [*tools, *system]
    for m in msgs:
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b["type"] in CARRIERS:
                places.append(b)
            if b["type"] == "tool_result" and isinstance(b["content"], list):
                places += b["content"]
    chosen = sorted(draw(st.sets(st.integers(0, len(places) - 1), max_size=4)))
    hours = draw(st.integers(0, len(chosen)))
    for n, k in enumerate(chosen):
        places[k]["cache_control"] = dict(HOUR) if n < hours else dict(EPH)
    return body_of(*msgs, system=system, tools=tools)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=requests(), budget=st.sampled_from([120, 400, 1200]), method=st.sampled_from(method_names()))
def test_forwarded_breakpoints_valid_for_any_render(service, body, budget, method):
    """Whatever any method's render keeps: at most 4 breakpoints (tools and system counted), each on a block
    present in what goes upstream — the client's own where it kept the block, else the nearest kept one before
    it — every 1h one before every 5m one, the client's blocks otherwise as sent (a summary a method inserts
    is its own message)."""
    assert cache_control_problems(body) == []
    conv = am.to_openai(body["system"], body["messages"])
    sid = f"bp-{abs(hash(json.dumps(body))) % 10**12}-{budget}-{method}"
    res = service.render(sid, messages=list(conv.messages), budget=budget, method=method, on_conflict="fork")
    fwd = {**body, "messages": am.forwarded_messages(body["messages"], conv, res, request=body)}
    assert len(located_breakpoints(fwd)) <= 4
    assert breakpoint_problems(body, fwd, inserted=True) == []
