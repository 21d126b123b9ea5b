"""``contextrender.wrap``: the real ``openai`` SDK's ``client.responses.create`` (sync and async, plain and
streamed), wrapped, against the scripted Responses API upstream on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import openai
import pytest

import contextrender
from contextrender import HashingEmbedder, MessageError
from contextrender.graph import OMISSION_MARKER
from contextrender.wrapper import AsyncRecordingStream, RecordingStream, WrappedClient

from .conftest import serve
from .responses_upstream import (
    ScriptedResponsesUpstream,
    items_of,
    pairing_problems,
    record_text,
    request_history_tokens,
)

B = 1500
INSTRUCTIONS = "You are a careful agent. Follow the records with the tools."
LOOKUP = {"type": "function", "name": "lookup",
          "parameters": {"type": "object", "properties": {"record": {"type": "string"}}, "required": ["record"]}}
NOTE = {"type": "function", "name": "note", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture
def upstream():
    fake = ScriptedResponsesUpstream()
    with serve(fake.app) as url:
        yield fake, url


def wrapped(url: str, asynchronous: bool = False, **kw: Any) -> WrappedClient:
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return contextrender.wrap(cls(base_url=f"{url}/v1", api_key="sk-test", max_retries=0), budget=B,
                              embedder=HashingEmbedder(), **kw)


def outputs_for(output: list[Any], tag: str) -> list[dict[str, Any]]:
    outs = []
    for item in output:
        if item.type == "function_call":
            step = int(item.call_id.split("_")[1])
            text = record_text(json.loads(item.arguments)["record"], step, tag) if item.name == "lookup" else "ok"
            outs.append({"type": "function_call_output", "call_id": item.call_id, "output": text})
    return outs


def check_upstream(fake: ScriptedResponsesUpstream, history: list[Any]) -> None:
    assert fake.requests
    for rec in fake.requests:
        assert request_history_tokens(rec["body"]) <= B
        assert pairing_problems(items_of(rec["body"])) == []
        assert rec["body"]["instructions"] == INSTRUCTIONS
    plain = [i if isinstance(i, dict) else i.model_dump(mode="json", exclude_none=True) for i in history]
    assert request_history_tokens({"input": plain, "instructions": INSTRUCTIONS}) > B
    last = fake.requests[-1]["body"]["input"]
    assert any(OMISSION_MARKER in str(i.get("output")) for i in last)


def test_sync_plain_multi_step(upstream):
    fake, url = upstream
    client = wrapped(url, session="w1")
    history: list[Any] = [{"role": "user", "content": "Follow the chain from REC_start; steps=8."}]
    for _ in range(12):
        resp = client.responses.create(model="fake-model", instructions=INSTRUCTIONS, input=history, tools=[LOOKUP])
        assert isinstance(resp, openai.types.responses.Response)
        assert client.contextrender.last is not None and client.contextrender.last.tokens <= B
        history += list(resp.output)  # the SDK's own item objects, as an agent appends them
        outs = outputs_for(resp.output, "w")
        if not outs:
            break
        history += outs
    assert resp.output_text == "Done: the chain ends at REC_w_8 after 8 steps."
    check_upstream(fake, history)
    stored = list(client.contextrender.service.transcript("w1").messages)
    assert stored[0] == {"role": "system", "content": INSTRUCTIONS}
    assert sum(m["role"] == "assistant" for m in stored) == 9 and stored[-1]["content"] == resp.output_text
    # kept SDK objects went out as the caller's own objects (dumped by the SDK as it sends them)
    sent = client.contextrender.last.messages
    assert any(isinstance(i, openai.types.responses.ResponseReasoningItem) for i in sent)
    assert any(isinstance(i, openai.types.responses.ResponseFunctionToolCall) for i in sent)
    client.close()


def test_sync_stream_is_relayed_and_recorded(upstream):
    fake, url = upstream
    client = wrapped(url, session="ws")
    history: list[Any] = [{"role": "user", "content": "Stream it from REC_start; steps=5."}]
    kinds: list[str] = []
    for _ in range(10):
        stream = client.responses.create(model="m", instructions=INSTRUCTIONS, input=history, tools=[LOOKUP, NOTE],
                                         stream=True)
        assert isinstance(stream, RecordingStream)
        with stream:
            events = list(stream)
        kinds += [e.type for e in events]
        resp = events[-1].response
        history += [i.model_dump(mode="json", exclude_none=True) for i in resp.output]
        outs = outputs_for(resp.output, "s")
        if not outs:
            break
        history += outs
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    assert resp.output_text.startswith("Done: the chain ends at REC_s_5")
    check_upstream(fake, history)
    stored = list(client.contextrender.service.transcript("ws").messages)
    asst = [m for m in stored if m["role"] == "assistant"]
    assert len(asst) == 6 and all(len(m["tool_calls"]) == 2 for m in asst[:-1])
    # recorded once each: the client's last request, carrying the recorded items, added only its two outputs
    assert client.contextrender.last.added == 2


@pytest.mark.parametrize("stream", [False, True])
def test_async_client(upstream, stream):
    fake, url = upstream

    async def run() -> tuple[list[Any], Any, WrappedClient]:
        client = wrapped(url, asynchronous=True, session=f"a{stream}")
        history: list[Any] = [{"role": "user", "content": "Async chain from REC_start; steps=6."}]
        for _ in range(10):
            out = await client.responses.create(model="m", instructions=INSTRUCTIONS, input=history, tools=[LOOKUP],
                                                stream=stream)
            if stream:
                assert isinstance(out, AsyncRecordingStream)
                events = [e async for e in out]
                out = events[-1].response
            history += [i.model_dump(mode="json", exclude_none=True) for i in out.output]
            outs = outputs_for(out.output, "y")
            if not outs:
                break
            history += outs
        return history, out, client

    history, last, client = asyncio.run(run())
    assert last.output_text.startswith("Done: the chain ends at REC_y_6")
    check_upstream(fake, history)
    stored = list(client.contextrender.service.transcript(f"a{stream}").messages)
    assert sum(m["role"] == "assistant" for m in stored) == 7 and stored[-1]["content"] == last.output_text


def test_stateful_calls_refused_or_passed_through(upstream, caplog):
    fake, url = upstream
    client = wrapped(url)
    with pytest.raises(ValueError, match="previous_response_id.*stateful_responses='passthrough'"):
        client.responses.create(model="m", input="go on", previous_response_id="resp_1")
    with pytest.raises(ValueError, match="conversation"):
        client.responses.create(model="m", input="go on", conversation="conv_1")
    assert fake.requests == []
    passing = wrapped(url, stateful_responses="passthrough")
    with caplog.at_level(logging.WARNING, logger="contextrender.adapters.openai_responses"):
        for _ in range(2):
            passing.responses.create(model="m", input="go on; steps=0.", previous_response_id="resp_1")
    assert [r["body"]["previous_response_id"] for r in fake.requests] == ["resp_1", "resp_1"]
    assert len([r for r in caplog.records if "unmanaged" in r.getMessage()]) == 1
    assert passing.contextrender.last is None and passing.contextrender.service.sessions() == []
    with pytest.raises(ValueError, match="stateful_responses"):
        wrapped(url, stateful_responses="sometimes")


def test_bad_input_is_refused_before_anything_is_sent(upstream):
    fake, url = upstream
    client = wrapped(url)
    with pytest.raises(MessageError, match="input\\[0\\]"):
        client.responses.create(model="m", input=[{"role": "wizard", "content": "x"}])
    with pytest.raises(MessageError, match="'input'"):
        client.responses.create(model="m", input=[])
    assert fake.requests == []


def test_string_input_and_rewrapped_clients(upstream):
    fake, url = upstream
    client = wrapped(url)
    resp = client.with_options(timeout=20).responses.create(model="m", input="Just REC_start; steps=1.",
                                                            tools=[LOOKUP])
    assert resp.output[1].type == "function_call"
    assert fake.requests[0]["body"]["input"] == "Just REC_start; steps=1."
    assert "responses" in dir(client)
    # the rest of client.responses is the client's own
    assert client.responses.retrieve == client.wrapped.responses.retrieve


def test_interleaved_calls_and_outputs_never_fork(upstream):
    """Each call sent back followed by its output (as Codex does): the wrapper syncs it as the recorded answer
    (one assistant message with both calls), so the session never forks."""
    fake, url = upstream
    client = wrapped(url, session="wil")
    try:
        history: list[Any] = [{"role": "user", "content": "Follow the chain from REC_start; steps=5."}]
        answers = 0
        while True:
            resp = client.responses.create(model="m", instructions=INSTRUCTIONS, input=history, tools=[LOOKUP, NOTE])
            answers += 1
            assert client.contextrender.last is not None and client.contextrender.last.session == "wil"
            assert not client.contextrender.last.forked
            outs = {o["call_id"]: o for o in outputs_for(resp.output, "w")}
            for item in resp.output:
                history.append(item.model_dump(mode="json", exclude_none=True))
                if item.type == "function_call":
                    history.append(outs[item.call_id])
            if not outs:
                break
        stored = [m["role"] for m in client.contextrender.graph.session("wil").openai_messages()]
        assert client.contextrender.graph.session_ids() == ["wil"]  # no wil~1, wil~2, ...
    finally:
        client.close()
    assert answers == 6 and stored == ["system", "user", *["assistant", "tool", "tool"] * 5, "assistant"]
    for rec in fake.requests:
        items = items_of(rec["body"])
        assert pairing_problems(items) == []
        for k, item in enumerate(items):
            if item.get("type") == "function_call_output":
                assert items[k - 1].get("call_id") == item["call_id"]
