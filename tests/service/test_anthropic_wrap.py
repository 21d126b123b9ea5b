"""contextrender.wrap over the real anthropic SDK (Anthropic, AsyncAnthropic) against a scripted Messages API
upstream on 127.0.0.1: messages.create (plain and stream=True) and the messages.stream helper."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contextrender
from contextrender import HashingEmbedder, MessageError
from contextrender.adapters import anthropic_client
from contextrender.adapters.anthropic_client import AnthropicWrappedClient
from contextrender.graph import OMISSION_MARKER
from contextrender.wrapper import AsyncRecordingStream, RecordingStream

from .anthropic_upstream import LOOKUP, OTHER, ScriptedAnthropic, history_tokens, pairing_problems
from .conftest import serve
from .test_anthropic_proxy import SYSTEM, as_sent, assert_blocks_as_sent, conversations, results_for

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK: pip install anthropic")

B = 1500


@pytest.fixture
def upstream():
    fake = ScriptedAnthropic()
    with serve(fake.app) as url:
        yield fake, url


def wrapped(url: str, asynchronous: bool = False, **kw: Any) -> Any:
    cls = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
    return contextrender.wrap(cls(base_url=url, api_key="sk-ant-wrap", max_retries=0), budget=B,
                              embedder=HashingEmbedder(), **kw)


def _kw(thinking: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"model": "claude-test", "max_tokens": 512, "system": SYSTEM, "tools": [LOOKUP, OTHER]}
    if thinking:
        kw["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    return kw


def agent(client: Any, task: str, mode: str, thinking: bool = False) -> tuple[list[Any], list[Any]]:
    history: list[Any] = [{"role": "user", "content": task}]
    answers = []
    for turn in range(20):
        if mode == "helper":
            with client.messages.stream(messages=history, **_kw(thinking)) as s:
                texts = list(s.text_stream)
                msg = s.get_final_message()
            assert "".join(texts) == "".join(b.text for b in msg.content if b.type == "text")
        elif mode == "create":
            out = client.messages.create(messages=history, stream=True, **_kw(thinking))
            assert isinstance(out, RecordingStream)
            events = list(out)
            assert events[-1].type == "message_stop"
            msg = _final(events)
        else:
            msg = client.messages.create(messages=history, **_kw(thinking))
        answers.append(msg)
        history.append({"role": "assistant", "content": msg.content})
        if msg.stop_reason != "tool_use":
            return history, answers
        history.append(results_for(msg, "w", turn))
    raise AssertionError("the scripted model never finished")


async def agent_async(client: Any, task: str, mode: str) -> tuple[list[Any], list[Any]]:
    history: list[Any] = [{"role": "user", "content": task}]
    answers = []
    for turn in range(20):
        if mode == "helper":
            async with client.messages.stream(messages=history, **_kw(False)) as s:
                msg = await s.get_final_message()
        elif mode == "create":
            out = await client.messages.create(messages=history, stream=True, **_kw(False))
            assert isinstance(out, AsyncRecordingStream)
            msg = _final([e async for e in out])
        else:
            msg = await client.messages.create(messages=history, **_kw(False))
        answers.append(msg)
        history.append({"role": "assistant", "content": msg.content})
        if msg.stop_reason != "tool_use":
            return history, answers
        history.append(results_for(msg, "w", turn))
    raise AssertionError("the scripted model never finished")


def _final(events: list[Any]) -> Any:
    from .test_anthropic_proxy import _assemble

    return _assemble(events)


def check_episode(fake: ScriptedAnthropic, client: Any, history: list[Any], answers: list[Any]) -> None:
    reqs = fake.messages_requests()
    assert len(reqs) == len(answers) == 9
    for rec in reqs:
        assert history_tokens(rec["body"]) <= B
        assert pairing_problems(rec["body"]["messages"]) == []
        assert rec["body"]["system"] == SYSTEM and [t["name"] for t in rec["body"]["tools"]] == ["lookup", "other"]
    assert history_tokens({"system": SYSTEM, "messages": as_sent(history[:-1])}) > B
    assert any(OMISSION_MARKER in json.dumps(m) for m in reqs[-1]["body"]["messages"])
    last = client.contextrender.last
    assert last.tokens <= B and last.budget == B
    assert last.messages[-1] is history[-2]  # the current turn: the caller's own object
    # the final answer, never sent back, is in the graph: the wrapper recorded it
    stored = client.contextrender.service.transcript(last.session).messages
    assert stored[-1] == {"role": "assistant", "content": answers[-1].content[-1].text}
    assert len(stored) == 2 + 1 + 8 * 3 + 1 and answers[-1].content[-1].text.startswith("DONE REC_w_7_")


@pytest.mark.parametrize("mode", ["", "create", "helper"])
def test_sync_client(upstream, mode):
    fake, url = upstream
    client = wrapped(url)
    assert isinstance(client, AnthropicWrappedClient)
    history, answers = agent(client, "Follow REC_start. steps=8", mode)
    check_episode(fake, client, history, answers)
    client.close()


@pytest.mark.parametrize("mode", ["", "create", "helper"])
def test_async_client(upstream, mode):
    fake, url = upstream

    async def run() -> None:
        client = wrapped(url, asynchronous=True)
        history, answers = await agent_async(client, "Follow REC_start. steps=8", mode)
        check_episode(fake, client, history, answers)
        await client.close()

    asyncio.run(run())


def test_thinking_blocks_and_cache_control_go_as_given(upstream):
    fake, url = upstream
    client = wrapped(url, session="think")
    history, answers = agent(client, "Think about REC_start. steps=4", "", thinking=True)
    assert answers[0].content[0].type == "thinking"
    sent = as_sent(history)
    for rec in fake.messages_requests():
        for m in rec["body"]["messages"]:
            if isinstance(m["content"], list) and any(b["type"] == "thinking" for b in m["content"]):
                assert m in sent  # signature and all, as the caller holds it
    stored = client.contextrender.service.transcript("think").messages
    assert not any("sig-" in json.dumps(m) for m in stored)


def test_refused_history_raises_and_sends_nothing(upstream):
    fake, url = upstream
    client = wrapped(url)
    with pytest.raises(MessageError, match="tool_use_id"):
        client.messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": [{"type": "tool_result"}]}])
    with pytest.raises(MessageError, match="'role'"):
        client.messages.create(model="m", max_tokens=9, messages=[{"role": "tool", "content": "x"}])
    assert fake.requests == [] and client.contextrender.service.sessions() == []
    # the client's other parts are its own; with_options keeps the wrapper and the graph
    other = client.with_options(timeout=5)
    assert isinstance(other, AnthropicWrappedClient) and other.contextrender is client.contextrender
    assert client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}]).input_tokens > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=conversations(), budget=st.sampled_from([150, 600]))
def test_prepare_never_above_budget_and_always_paired(conv, budget):
    system, msgs = conv
    client = contextrender.wrap(anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="-"), budget=budget,
                                method="contextrender", embedder=HashingEmbedder(dim=64))
    try:
        _, sent = anthropic_client.prepare(client.contextrender, system, msgs)
    finally:
        client.close()
    assert history_tokens({"system": system, "messages": sent}) <= budget
    assert pairing_problems(sent) == []
    assert_blocks_as_sent(msgs, sent)


def test_stream_helper_text_and_events_are_the_sdks(upstream):
    fake, url = upstream
    client = wrapped(url, session="events")
    with client.messages.stream(model="m", max_tokens=64, tools=[LOOKUP],
                                messages=[{"role": "user", "content": "Events. steps=1"}]) as s:
        kinds = [e.type for e in s]
    # the helper's own derived events (text, input_json, content_block_stop with the block) still come
    assert {"text", "input_json", "message_stop", "content_block_stop"} <= set(kinds)
    stored = client.contextrender.service.transcript("events").messages
    assert stored[-1]["tool_calls"][0]["function"]["arguments"] == json.dumps({"record": "REC_start", "part": 0})
