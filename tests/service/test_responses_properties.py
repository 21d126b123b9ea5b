"""Property tests over random Responses API conversations: what goes upstream holds the history within B, with
every tool output after its call and every call answered, and kept items are the client's own objects —
for the proxy's conversion (contextrender/service/responses_api.py over a real render) and for ``wrap``
(the real ``openai`` SDK against the scripted upstream on 127.0.0.1)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contextrender
from contextrender import HashingEmbedder
from contextrender.service import responses_api
from contextrender.service.sessions import ContextService

from .conftest import serve
from .responses_upstream import (
    ScriptedResponsesUpstream,
    as_chat,
    history_tokens,
    items_of,
    pairing_problems,
    regrouped,
)

METHODS = ["contextrender", "prune", "cr_recency", "semantic_retrieval", "openhands_summary", "langchain_trim"]
WORDS = st.lists(st.sampled_from(["alpha", "REC_7", "owner", "beta", "x=1", "ünï", "ok", "gamma"]), min_size=1,
                 max_size=8).map(" ".join)


@st.composite
def conversations(draw: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """Instructions and an input list: a task (string or parts, maybe with an image), then steps of
    reasoning / text / parallel calls (function or custom) and their outputs (string or parts), sometimes a
    new user message between steps, sometimes a final text answer."""
    instructions = draw(st.none() | WORDS)
    items: list[dict[str, Any]] = []
    if draw(st.booleans()):
        items.append({"type": "message", "role": "developer", "content": draw(WORDS)})
    task = draw(WORDS) + " task"
    if draw(st.booleans()):
        parts: list[dict[str, Any]] = [{"type": "input_text", "text": task}]
        if draw(st.booleans()):
            parts.append({"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"})
        items.append({"type": "message", "role": "user", "content": parts})
    else:
        items.append({"role": "user", "content": task})
    n = 0
    for step in range(draw(st.integers(0, 9))):
        if draw(st.booleans()):
            items.append({"type": "reasoning", "id": f"rs_{step}", "summary": [], "encrypted_content": f"E{step}"})
        if draw(st.booleans()):
            items.append({"type": "message", "role": "assistant", "id": f"msg_{step}", "status": "completed",
                          "content": [{"type": "output_text", "text": draw(WORDS), "annotations": []}]})
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            if draw(st.integers(0, 4)) == 0:
                calls.append({"type": "custom_tool_call", "call_id": f"c{n}", "name": "patch", "input": draw(WORDS)})
            else:
                calls.append({"type": "function_call", "call_id": f"c{n}", "id": f"fc_{n}", "name": "lookup",
                              "arguments": json.dumps({"q": draw(WORDS)}), "status": "completed"})
        items.extend(calls)
        for call in calls:
            size = draw(st.integers(1, 400))
            text = f"result of {call['call_id']}: " + " ".join(f"v{k}" for k in range(size))
            kind = "custom_tool_call_output" if call["type"] == "custom_tool_call" else "function_call_output"
            output: Any = text if draw(st.booleans()) else [{"type": "input_text", "text": text}]
            items.append({"type": kind, "call_id": call["call_id"], "output": output})
        if draw(st.integers(0, 3)) == 0:
            items.append({"role": "user", "content": draw(WORDS)})
    if draw(st.booleans()):
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                            "text": draw(WORDS)}]})
    return instructions, items


def check_forwarded(instructions: str | None, original: list[Any], sent: Any, budget: int) -> None:
    sent_items = items_of({"input": sent})
    assert history_tokens(as_chat(sent_items, instructions)) <= budget
    assert pairing_problems(sent_items) == []
    # kept items are the client's own, in the client's order; the others are the render's changed bodies
    ids = {id(item): k for k, item in enumerate(original)}
    kept = [ids[id(item)] for item in sent_items if id(item) in ids]
    assert kept == sorted(kept)
    for item in sent_items:
        if id(item) not in ids:
            kind = item.get("type")
            assert kind in ("function_call_output", "custom_tool_call_output", "message"), item


@pytest.fixture(scope="module")
def service():
    svc = ContextService(":memory:", embedder=HashingEmbedder(dim=256), warm=False)
    yield svc
    svc.close()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), budget=st.integers(100, 3000), method=st.sampled_from(METHODS), salt=st.integers())
def test_proxy_conversion_never_above_budget_and_always_paired(service, conv, budget, method, salt):
    instructions, items = conv
    converted = responses_api.to_openai(instructions, items)
    res = service.render(f"prop-{salt}", messages=list(converted.messages), budget=budget, method=method,
                         on_conflict="fork")
    assert res.tokens <= budget
    sent = responses_api.forwarded_input(items, converted, res)
    check_forwarded(instructions, items, sent, budget)


_FRESH = itertools.count()  # a new session per example


def interleaved(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` as Codex sends a turn's calls back: each call followed at once by its output."""
    out: list[dict[str, Any]] = []
    k = 0
    while k < len(items):
        if not items[k].get("type", "").endswith("_call"):
            out.append(items[k])
            k += 1
            continue
        run = k
        while run < len(items) and items[run].get("type", "").endswith("_call"):
            run += 1
        end = run
        while end < len(items) and items[end].get("type", "").endswith("_call_output"):
            end += 1
        outputs = {o["call_id"]: o for o in items[run:end]}
        for call in items[k:run]:
            out += [call, outputs[call["call_id"]]]
        k = end
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), budget=st.integers(100, 3000), method=st.sampled_from(METHODS), cut=st.floats(0, 1))
def test_interleaved_outputs_sync_as_the_recorded_turns(service, conv, budget, method, cut):
    """A history stored with each turn's calls in one assistant message (as the proxy records answers), sent
    back interleaved: the conversion is the stored one as far as the stored answers go (no fork), the render
    is within B and paired, and the items go upstream in the client's order."""
    instructions, grouped = conv
    items = interleaved(grouped)
    stored = responses_api.to_openai(instructions, grouped).messages
    sid = f"il-{next(_FRESH)}"
    n = round(cut * len(stored))
    service.sync(sid, list(stored[:n]), on_conflict="fork")
    together = service.answered_together(sid)
    converted = responses_api.to_openai(instructions, items, lambda cid: together.get(cid, frozenset()))
    assert converted.messages[:n] == stored[:n]
    if n == len(stored):
        assert converted.messages == stored
    res = service.render(sid, messages=list(converted.messages), budget=budget, method=method, on_conflict="fork")
    assert res.session == sid and not res.forked and res.tokens <= budget
    sent = responses_api.forwarded_input(items, converted, res)
    turns = {c["id"]: k for k, m in enumerate(converted.messages) for c in m.get("tool_calls") or []}
    assert history_tokens(as_chat(regrouped(sent, turns), instructions)) <= budget
    assert pairing_problems(sent) == []
    ids = {id(item): k for k, item in enumerate(items)}
    kept = [ids[id(item)] for item in sent if id(item) in ids]
    assert kept == sorted(kept)
    full = service.render(sid, budget=10**6, method="prune")
    assert [id(i) for i in responses_api.forwarded_input(items, converted, full)] == [id(i) for i in items]


@pytest.fixture(scope="module")
def upstream():
    fake = ScriptedResponsesUpstream()
    with serve(fake.app) as url:
        yield fake, url


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), budget=st.integers(100, 3000), method=st.sampled_from(METHODS[:3]))
def test_wrap_never_sends_above_budget_and_always_paired(upstream, conv, budget, method):
    fake, url = upstream
    instructions, items = conv
    client = contextrender.wrap(openai.OpenAI(base_url=f"{url}/v1", api_key="sk-p", max_retries=0), budget=budget,
                                method=method, embedder=HashingEmbedder(dim=64))
    try:
        before = len(fake.requests)
        kw = {"instructions": instructions} if instructions is not None else {}
        client.responses.create(model="m", input=items, **kw)
        assert len(fake.requests) == before + 1
        body = fake.requests[-1]["body"]
        assert history_tokens(as_chat(items_of(body), instructions)) <= budget
        assert pairing_problems(items_of(body)) == []
        assert client.contextrender.last is not None and client.contextrender.last.tokens <= budget
        check_forwarded(instructions, items, list(client.contextrender.last.messages), budget)
    finally:
        client.close()
