"""Prompt-cache usage through the service (docs/service.md, "Prompt-cache usage"): each API's own usage fields read,
streamed and not, recorded per request in the session's graph, and reported — the session record,
``GET /sessions/{sid}/usage``, the ``X-ContextRender-Cache`` header, the proxy's ``GET /stats``, ``explain`` and
``view``, and wrap's ``last.usage`` and ``usage()``. The real openai and anthropic SDKs talk to the proxy (or are
wrapped) in front of the scripted upstreams on 127.0.0.1, which bill each answer in the providers' own shapes
(conftest.billed); what the tests expect is read from the bytes the upstream sent, by the providers' documented
rules, never from the code under test."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

import contextrender
from contextrender import ContextGraph, HashingEmbedder
from contextrender.billing import PromptUsage
from contextrender.cli import main
from contextrender.graph import UsageTotals
from contextrender.service import anthropic_messages, responses_api
from contextrender.service.guard import AccessPolicy
from contextrender.service.proxy import create_proxy_app
from contextrender.service.sessions import ContextService
from contextrender.service.streams import (
    AnthropicStreamAssembler,
    ResponsesStreamAssembler,
    StreamAssembler,
    chat_prompt_usage,
)
from contextrender.view import browser, chromium

from .anthropic_upstream import LOOKUP as ANTHROPIC_LOOKUP
from .anthropic_upstream import ScriptedAnthropic, tool_result_text
from .conftest import SYSTEM, FakeUpstream, remembering_upstream, serve, tool_result
from .responses_upstream import ScriptedResponsesUpstream, record_text

B = 1500
CHAT_TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {
    "record": {"type": "string"}, "part": {"type": "integer"}}, "required": ["record"]}}]
ANTHROPIC_SYSTEM = "You are a careful agent. Use the tools."


# -- what the upstream billed, read from the bytes it sent ----------------------------------------------------------


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def sent_usage(api: str, raw: bytes) -> PromptUsage | None:
    """The figures an upstream's answer (JSON or SSE) billed, by each provider's documented rules."""
    if raw.lstrip().startswith(b"{"):
        usage = json.loads(raw).get("usage")
    elif api == "chat":  # the last chunk, with no choices, when the client asked include_usage
        usage = next((e["usage"] for e in reversed(_events(raw)) if e.get("usage")), None)
    elif api == "responses":
        usage = next(e["response"]["usage"] for e in _events(raw) if e["type"] == "response.completed")
    else:  # message_start's usage, then each message_delta's non-null fields
        usage = {}
        for e in _events(raw):
            part = e["message"]["usage"] if e["type"] == "message_start" else e.get("usage") or {}
            usage.update({k: v for k, v in part.items() if v is not None})
    if not usage:
        return None
    if api == "chat":
        details = usage.get("prompt_tokens_details") or {}
        return PromptUsage(usage["prompt_tokens"], details.get("cached_tokens", 0),
                           details.get("cache_write_tokens", 0), usage["completion_tokens"])
    if api == "responses":
        details = usage["input_tokens_details"]
        return PromptUsage(usage["input_tokens"], details["cached_tokens"], details["cache_write_tokens"],
                           usage["output_tokens"])
    read, write = usage.get("cache_read_input_tokens", 0), usage.get("cache_creation_input_tokens", 0)
    return PromptUsage(usage["input_tokens"] + read + write, read, write, usage["output_tokens"])


def header(u: PromptUsage, scope: str, requests: int | None = None) -> str:
    text = f"read={u.cache_read}; write={u.cache_write}; prompt={u.prompt}; output={u.output}; scope={scope}"
    return text if requests is None else f"{text}; requests={requests}"


def total(usages: list[PromptUsage]) -> PromptUsage:
    out = PromptUsage()
    for u in usages:
        out = out + u
    return out


def assert_recorded(service: ContextService, sid: str, api: str, sent: list[bytes], streamed: bool) -> list[Any]:
    """The session's usage rows are the upstream's figures, request by request, each at its answer's seq; the
    totals and the session record sum them. Returns the expected figures."""
    expected = [sent_usage(api, raw) for raw in sent]
    report = service.usage(sid)
    assert [r.usage for r in report.rows] == expected
    assert [(r.n, r.api, r.streamed) for r in report.rows] == [(n, api, streamed) for n in range(len(sent))]
    transcript = service.transcript(sid).messages
    assert [transcript[r.at]["role"] for r in report.rows] == ["assistant"] * len(sent)
    assert len({r.at for r in report.rows}) == len(sent)
    known = [u for u in expected if u is not None]
    assert report.totals == UsageTotals(len(sent), len(known), total(known))
    assert service.info(sid).usage == report.totals
    return expected


# -- the readers and the stream assemblers ---------------------------------------------------------------------------


def test_each_api_reader_takes_its_own_fields():
    chat = {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0}}
    assert chat_prompt_usage(chat) == PromptUsage(2006, 1920, 0, 300)  # prompt_tokens already holds the cached ones
    assert chat_prompt_usage({**chat, "prompt_tokens_details": {"cached_tokens": 1920, "cache_write_tokens": 64}}) \
        == PromptUsage(2006, 1920, 64, 300)
    assert chat_prompt_usage({"prompt_tokens": 50, "completion_tokens": 7}) == PromptUsage(50, 0, 0, 7)
    claude = {"input_tokens": 21, "cache_creation_input_tokens": 188, "cache_read_input_tokens": 1500,
              "cache_creation": {"ephemeral_5m_input_tokens": 188, "ephemeral_1h_input_tokens": 0},
              "output_tokens": 393, "service_tier": "standard"}
    # Anthropic's input_tokens is the uncached part only: the prompt is it plus the reads and the writes.
    assert anthropic_messages.prompt_usage(claude) == PromptUsage(1709, 1500, 188, 393)
    assert anthropic_messages.prompt_usage({"input_tokens": 12, "output_tokens": 3}) == PromptUsage(12, 0, 0, 3)
    resp = {"input_tokens": 5000, "input_tokens_details": {"cached_tokens": 4096, "cache_write_tokens": 512},
            "output_tokens": 80, "output_tokens_details": {"reasoning_tokens": 10}, "total_tokens": 5080}
    assert responses_api.prompt_usage(resp) == PromptUsage(5000, 4096, 512, 80)
    # Unknown, never zero: no usage, no prompt count, a field that is not a count, reads above the prompt.
    for bad in (None, {}, "12", {"completion_tokens": 5}, {**chat, "prompt_tokens": True},
                {**chat, "prompt_tokens": 20.0}, {**chat, "prompt_tokens": -1}, {**chat, "prompt_tokens": 10**13},
                {**chat, "prompt_tokens_details": {"cached_tokens": 3000}},
                {**chat, "prompt_tokens_details": {"cached_tokens": "1920"}}):
        assert chat_prompt_usage(bad) is None, bad
    assert anthropic_messages.prompt_usage({"output_tokens": 5, "cache_read_input_tokens": 9}) is None
    assert anthropic_messages.prompt_usage({**claude, "cache_read_input_tokens": -3}) is None
    assert responses_api.prompt_usage({**resp, "input_tokens_details": {"cached_tokens": 4096,
                                                                        "cache_write_tokens": 1000}}) is None


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)


def test_the_assemblers_keep_what_the_stream_billed():
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"},
                                                                      "finish_reason": None}], "usage": None}
    done = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    last = {"id": "c", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 900, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 768}}}
    asm = StreamAssembler()
    asm.feed(_sse(chunk, done))
    assert asm.complete and asm.usage() is None  # finished, but the usage chunk is still to come
    asm.feed(_sse(last) + b"data: [DONE]\n\n")
    assert asm.usage() == PromptUsage(900, 768, 0, 4) and asm.message()["content"] == "hi"
    plain = StreamAssembler()
    plain.feed(_sse(chunk, done) + b"data: [DONE]\n\n")
    assert plain.done and plain.usage() is None  # no include_usage: unknown

    start = {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [],
                                                  "usage": {"input_tokens": 30, "cache_creation_input_tokens": 200,
                                                            "cache_read_input_tokens": 4000, "output_tokens": 1}}}
    old_delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 57}}
    a = AnthropicStreamAssembler()
    a.feed(_sse(start))
    assert a.usage() == PromptUsage(4230, 4000, 200, 1)  # what the stream billed so far
    a.feed(_sse(old_delta, {"type": "message_stop"}))
    assert a.usage() == PromptUsage(4230, 4000, 200, 57)  # input and cache figures from message_start
    b = AnthropicStreamAssembler()  # a delta repeating the cumulative figures: the latest non-null value of each
    b.feed(_sse(start, {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                        "usage": {"input_tokens": 31, "cache_read_input_tokens": None, "output_tokens": 60}}))
    assert b.usage() == PromptUsage(4231, 4000, 200, 60)
    assert AnthropicStreamAssembler().usage() is None

    created = {"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": [],
                                                        "usage": None}}
    completed = {"type": "response.completed", "response": {
        "id": "r", "status": "completed", "output": [],
        "usage": {"input_tokens": 3000, "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 0},
                  "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 3012}}}
    r = ResponsesStreamAssembler()
    r.feed(_sse(created))
    assert r.usage() is None
    r.feed(_sse(completed))
    assert r.usage() == PromptUsage(3000, 2048, 0, 12)


# -- agents on the real SDKs -----------------------------------------------------------------------------------------


def _assembled(chunks: list[Any]) -> dict[str, Any]:
    """The caller's own assembly of streamed chat chunks (SDK objects) into its next history entry."""
    content, calls = [], {}
    for ch in chunks:
        for c in ch.choices:
            if c.delta.content:
                content.append(c.delta.content)
            for tc in c.delta.tool_calls or []:
                cur = calls.setdefault(tc.index, {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
                cur["id"] = cur["id"] or tc.id
                cur["function"]["name"] += (tc.function.name or "") if tc.function else ""
                cur["function"]["arguments"] += (tc.function.arguments or "") if tc.function else ""
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def chat_agent(client: Any, turns: int, *, stream: bool = False, include_usage: bool = False,
               raw: bool = True, sid: str = "c") -> list[Any]:
    """A tool loop on ``client.chat.completions`` (through the proxy: ``raw``, for the headers); returns each
    answer's headers (None without ``raw``)."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Follow REC_start."}]
    seen = []
    for turn in range(turns):
        kw: dict[str, Any] = {"model": "fake-model", "messages": messages, "tools": CHAT_TOOLS, "user": sid}
        if stream:
            kw["stream"] = True
        if include_usage:
            kw["stream_options"] = {"include_usage": True}
        if raw:
            resp = client.chat.completions.with_raw_response.create(
                extra_headers={"X-ContextRender-Session": sid}, **kw)
            seen.append(resp.headers)
            out = resp.parse()
        else:
            out = client.chat.completions.create(**kw)
            seen.append(None)
        if stream:
            chunks = list(out)
            assert [c for c in chunks if not c.choices] == ([chunks[-1]] if include_usage else [])
            msg = _assembled(chunks)
        else:
            msg = out.choices[0].message.model_dump(exclude_none=True)
        messages.append(msg)
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": tool_result(sid, turn, k, call)}
                     for k, call in enumerate(msg.get("tool_calls") or [])]
    return seen


async def async_chat_agent(client: Any, turns: int, *, stream: bool, sid: str) -> None:
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Follow REC_start."}]
    for turn in range(turns):
        kw: dict[str, Any] = {"model": "fake-model", "messages": messages, "tools": CHAT_TOOLS, "user": sid}
        if stream:
            out = await client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
            msg = _assembled([c async for c in out])
        else:
            msg = (await client.chat.completions.create(**kw)).choices[0].message.model_dump(exclude_none=True)
        messages.append(msg)
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": tool_result(sid, turn, k, call)}
                     for k, call in enumerate(msg.get("tool_calls") or [])]


def _outputs(output: list[Any]) -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": item.call_id,
             "output": record_text(json.loads(item.arguments)["record"], int(item.call_id.split("_")[1]))}
            for item in output if item.type == "function_call"]


def responses_agent(client: Any, turns: int, *, stream: bool, raw: bool = True, sid: str = "r") -> list[Any]:
    """A tool loop on ``client.responses`` with the whole conversation in ``input``; returns each answer's headers."""
    history: list[Any] = [{"role": "user", "content": f"Follow the chain from REC_start; steps={turns + 5}."}]
    seen = []
    for _ in range(turns):
        kw: dict[str, Any] = {"model": "fake-model", "instructions": "Follow the records.", "input": history,
                              "tools": RESPONSES_TOOLS, "store": False}
        if stream:
            kw["stream"] = True
        if raw:
            resp = client.responses.with_raw_response.create(extra_headers={"X-ContextRender-Session": sid}, **kw)
            seen.append(resp.headers)
            out = resp.parse()
        else:
            out = client.responses.create(**kw)
            seen.append(None)
        answer = [e for e in out if e.type == "response.completed"][0].response if stream else out
        history += [item.model_dump(mode="json", exclude_none=True) for item in answer.output]
        history += _outputs(answer.output)
    return seen


async def async_responses_agent(client: Any, turns: int, *, stream: bool) -> None:
    history: list[Any] = [{"role": "user", "content": f"Follow the chain from REC_start; steps={turns + 5}."}]
    for _ in range(turns):
        kw: dict[str, Any] = {"model": "fake-model", "input": history, "tools": RESPONSES_TOOLS, "store": False}
        if stream:
            answer = [e async for e in await client.responses.create(stream=True, **kw)
                      if e.type == "response.completed"][0].response
        else:
            answer = await client.responses.create(**kw)
        history += [item.model_dump(mode="json", exclude_none=True) for item in answer.output]
        history += _outputs(answer.output)


def _results(msg: Any, turn: int) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b.id, "content": tool_result_text("a", turn, k, b.input["record"])}
        for k, b in enumerate(b for b in msg.content if b.type == "tool_use")]}


def messages_agent(client: Any, turns: int, *, mode: str, raw: bool = True, sid: str = "m") -> list[Any]:
    """A tool loop on ``client.messages``: ``mode`` "plain", "create" (stream=True) or "helper" (messages.stream);
    returns each answer's headers (through the proxy)."""
    history: list[Any] = [{"role": "user", "content": f"Follow REC_start; steps={turns + 5}."}]
    kw: dict[str, Any] = {"model": "claude-test", "max_tokens": 256, "system": ANTHROPIC_SYSTEM,
                          "tools": [ANTHROPIC_LOOKUP]}
    if raw:
        kw["extra_headers"] = {"X-ContextRender-Session": sid}
    seen = []
    for turn in range(turns):
        if mode == "helper":
            with client.messages.stream(messages=history, **kw) as s:
                msg = s.get_final_message()
                seen.append(s.response.headers if raw else None)
        elif raw:
            resp = client.messages.with_raw_response.create(messages=history, stream=mode == "create", **kw)
            seen.append(resp.headers)
            out = resp.parse()
            msg = _final(list(out)) if mode == "create" else out
        else:
            out = client.messages.create(messages=history, stream=mode == "create", **kw)
            msg = _final(list(out)) if mode == "create" else out
            seen.append(None)
        history += [{"role": "assistant", "content": msg.content}, _results(msg, turn)]
    return seen


async def async_messages_agent(client: Any, turns: int, *, mode: str) -> None:
    history: list[Any] = [{"role": "user", "content": f"Follow REC_start; steps={turns + 5}."}]
    kw: dict[str, Any] = {"model": "claude-test", "max_tokens": 256, "system": ANTHROPIC_SYSTEM,
                          "tools": [ANTHROPIC_LOOKUP]}
    for turn in range(turns):
        if mode == "helper":
            async with client.messages.stream(messages=history, **kw) as s:
                msg = await s.get_final_message()
        elif mode == "create":
            msg = _final([e async for e in await client.messages.create(messages=history, stream=True, **kw)])
        else:
            msg = await client.messages.create(messages=history, **kw)
        history += [{"role": "assistant", "content": msg.content}, _results(msg, turn)]


def _final(events: list[Any]) -> Any:
    """The caller's own assembly of raw Messages API events (SDK objects) into the answer's content."""
    blocks: dict[int, dict[str, Any]] = {}
    parts: dict[int, str] = {}
    for e in events:
        if e.type == "content_block_start":
            blocks[e.index] = e.content_block.model_dump(exclude_none=True)
        elif e.type == "content_block_delta" and e.delta.type == "text_delta":
            blocks[e.index]["text"] += e.delta.text
        elif e.type == "content_block_delta" and e.delta.type == "input_json_delta":
            parts[e.index] = parts.get(e.index, "") + e.delta.partial_json
    for i, text in parts.items():
        blocks[i]["input"] = json.loads(text)
    start = next(e for e in events if e.type == "message_start").message
    content = [blocks[i] for i in sorted(blocks)]
    return anthropic.types.Message.model_validate({**start.model_dump(), "content": content})


# -- the proxy -----------------------------------------------------------------------------------------------------


@pytest.fixture
def chat_proxy(service: ContextService) -> Iterator[tuple[str, FakeUpstream, ContextService]]:
    fake = FakeUpstream()
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
        yield url, fake, service


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-client", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_proxied_chat_completions_record_the_upstreams_figures(chat_proxy, stream):
    url, fake, service = chat_proxy
    headers = chat_agent(_openai(url), 4, stream=stream, include_usage=stream, sid="chat1")
    assert len(fake.requests) == 4
    expected = assert_recorded(service, "chat1", "chat", [r["sent"] for r in fake.requests], stream)
    assert all(u is not None for u in expected) and expected[1].cache_read > 0  # the figures are the upstream's
    # The client's own stream options went up as sent: the proxy asks for nothing the client did not.
    assert [r["body"].get("stream_options") for r in fake.requests] == [{"include_usage": True} if stream else None] * 4
    cache = [h.get("x-contextrender-cache") for h in headers]
    if stream:  # the headers leave before the stream's usage: the session's totals through the previous request
        assert cache == [None] + [header(total(expected[:k]), "session", k) for k in range(1, 4)]
    else:  # a whole answer: this request's own figures
        assert cache == [header(u, "request") for u in expected]
    # The session record and the usage route say the same, over HTTP.
    with httpx.Client(base_url=url) as http:
        info = http.get("/sessions/chat1").json()
        body = http.get("/sessions/chat1/usage").json()
        latest = http.get("/sessions/chat1/usage", params={"last": 2}).json()
        assert http.get("/sessions/chat1/usage", params={"last": 0}).status_code == 422
    want = total(expected)
    assert info["usage"] == {"requests": 4, "requests_with_usage": 4, "prompt": want.prompt,
                             "cache_read": want.cache_read, "cache_write": want.cache_write, "output": want.output,
                             "cache_hit_share": want.cache_read / want.prompt}
    assert body["totals"] == info["usage"] == latest["totals"]
    assert [(r["n"], r["prompt"], r["cache_read"], r["cache_write"], r["output"]) for r in body["rows"]] == \
        [(n, u.prompt, u.cache_read, u.cache_write, u.output) for n, u in enumerate(expected)]
    assert [r["n"] for r in latest["rows"]] == [2, 3]
    assert [r["cache_hit_share"] for r in body["rows"]] == [u.cache_read / u.prompt for u in expected]


def test_a_stream_the_client_asked_no_usage_of_is_recorded_as_unknown(chat_proxy):
    url, fake, service = chat_proxy
    headers = chat_agent(_openai(url), 3, stream=True, include_usage=False, sid="nousage")
    assert all("stream_options" not in r["body"] for r in fake.requests)  # the proxy added no include_usage
    assert assert_recorded(service, "nousage", "chat", [r["sent"] for r in fake.requests], True) == [None] * 3
    assert service.usage("nousage").totals == UsageTotals(3, 0, PromptUsage())
    assert [h.get("x-contextrender-cache") for h in headers] == [None] * 3  # no figures to give
    with httpx.Client(base_url=url) as http:
        rows = http.get("/sessions/nousage/usage").json()["rows"]
    assert [r["prompt"] for r in rows] == [None] * 3 and [r["cache_hit_share"] for r in rows] == [None] * 3


def test_a_whole_answer_without_usage_is_unknown_and_has_no_cache_header(service):
    with serve(remembering_upstream()) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Go."}]
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages, "user": "u-0"},
                       headers={"X-ContextRender-Session": "bare"})
    assert r.status_code == 200 and "usage" not in r.json()
    assert "x-contextrender-cache" not in r.headers and r.headers["x-contextrender-session"] == "bare"
    report = service.usage("bare")
    assert [row.usage for row in report.rows] == [None] and report.totals == UsageTotals(1, 0, PromptUsage())


@pytest.fixture
def responses_proxy(service: ContextService) -> Iterator[tuple[str, ScriptedResponsesUpstream, ContextService]]:
    fake = ScriptedResponsesUpstream()
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
        yield url, fake, service


@pytest.mark.parametrize("stream", [False, True])
def test_proxied_responses_record_the_upstreams_figures(responses_proxy, stream):
    url, fake, service = responses_proxy
    headers = responses_agent(_openai(url), 3, stream=stream, sid="resp1")
    expected = assert_recorded(service, "resp1", "responses", [r["sent"] for r in fake.requests], stream)
    assert expected[1].cache_write > 0 and expected[1].cache_read > 0
    cache = [h.get("x-contextrender-cache") for h in headers]
    if stream:
        assert cache == [None, header(expected[0], "session", 1), header(total(expected[:2]), "session", 2)]
    else:
        assert cache == [header(u, "request") for u in expected]


@pytest.fixture
def messages_proxy(service: ContextService) -> Iterator[tuple[str, ScriptedAnthropic, ContextService]]:
    fake = ScriptedAnthropic()
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
        yield url, fake, service


@pytest.mark.parametrize("mode", ["plain", "create", "helper"])
def test_proxied_messages_record_the_upstreams_figures(messages_proxy, mode):
    url, fake, service = messages_proxy
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-client", max_retries=0)
    headers = messages_agent(client, 3, mode=mode, sid="msg1")
    sent = [r["sent"] for r in fake.messages_requests()]
    expected = assert_recorded(service, "msg1", "messages", sent, mode != "plain")
    # The prompt is Anthropic's uncached input plus the reads and writes, never input_tokens alone.
    first = json.loads(sent[0])["usage"] if mode == "plain" else None
    if first is not None:
        assert expected[0].prompt == first["input_tokens"] + first["cache_read_input_tokens"] + \
            first["cache_creation_input_tokens"] > first["input_tokens"]
    assert all(u.output > 1 for u in expected)  # a stream's output is message_delta's, not message_start's 1
    cache = [h.get("x-contextrender-cache") for h in headers]
    if mode == "plain":
        assert cache == [header(u, "request") for u in expected]
    else:
        assert cache == [None, header(expected[0], "session", 1), header(total(expected[:2]), "session", 2)]


def test_recorded_usage_survives_a_restart_and_explain_shows_it(tmp_path, capsys):
    path = tmp_path / "cache.sqlite"
    fake = FakeUpstream()
    svc = ContextService(str(path), embedder=HashingEmbedder(dim=256), default_budget=B)
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=svc, budget=B)) as url:
        chat_agent(_openai(url), 3, sid="keep")
        chat_agent(_openai(url), 2, stream=True, include_usage=False, sid="keep2")
    before = svc.usage("keep").to_json()
    svc.close()
    expected = [sent_usage("chat", r["sent"]) for r in fake.requests[:3]]
    again = ContextService(str(path), embedder=HashingEmbedder(dim=256), default_budget=B)
    try:
        assert again.usage("keep").to_json() == before  # rows and totals, identically
        assert again.usage("keep2").totals == UsageTotals(2, 0, PromptUsage())  # unknown stays unknown
        # the session goes on counting from where it was
        at = len(again.transcript("keep").messages)
        again.record_usage("keep", "chat", PromptUsage(10, 4, 0, 1), streamed=False, at=at)
        assert again.usage("keep").totals == UsageTotals(4, 4, total([*expected, PromptUsage(10, 4, 0, 1)]))
        assert [r.n for r in again.usage("keep").rows] == [0, 1, 2, 3]
    finally:
        again.close()
    with ContextGraph.snapshot(path) as copy:
        assert [r.usage for r in copy.session("keep").prompt_usage_rows()][:3] == expected
    want = total(expected)
    assert main(["explain", "keep", "--graph", str(path), "--budget", str(B), "--embedding", "hashing"]) == 0
    out = capsys.readouterr().out
    assert (f"4 answered requests, 4 with usage: {want.prompt + 10} prompt tokens, {want.cache_read + 4} read from "
            f"the cache ({100 * (want.cache_read + 4) / (want.prompt + 10):.1f} %), {want.cache_write} written") in out
    assert main(["explain", "keep2", "--graph", str(path), "--budget", str(B), "--embedding", "hashing"]) == 0
    assert "2 answered requests, 0 with usage (the upstream reported none)" in capsys.readouterr().out


def _combined(*apps: Any) -> Any:
    """One ASGI app in front of the scripted upstreams, by path (each API's own); lifespan goes to the first."""
    chat, messages, responses = apps

    async def app(scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        target = messages if path.startswith("/v1/messages") else responses if path.startswith("/v1/responses") \
            else chat
        await target(scope, receive, send)

    return app


def test_stats_sums_each_api_since_start_behind_the_access_rules():
    chat, msgs, resp = FakeUpstream(), ScriptedAnthropic(), ScriptedResponsesUpstream()
    token = "t" * 24
    svc = ContextService(":memory:", embedder=HashingEmbedder(dim=256), default_budget=B)
    with serve(_combined(chat.app, msgs.app, resp.app)) as up, \
            serve(create_proxy_app(f"{up}/v1", service=svc, budget=B, session_api=False,
                                   access=AccessPolicy.for_bind("127.0.0.1", token=token))) as url:
        oai = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
        with httpx.Client(base_url=url) as http:
            empty = http.get("/stats", headers={"Authorization": f"Bearer {token}"}).json()
            chat_agent(oai, 2, sid="s-chat")
            chat_agent(oai, 1, stream=True, sid="s-chat2")  # no include_usage: counted, unknown
            responses_agent(oai, 2, stream=True, sid="s-resp")
            messages_agent(anthropic.Anthropic(base_url=url, api_key=token, max_retries=0), 1, mode="plain",
                           sid="s-msg")
            stats = http.get("/stats", headers={"Authorization": f"Bearer {token}"})
            refused = [http.get("/stats").status_code,
                       http.get("/stats", headers={"Authorization": "Bearer wrong-token-wrong-token"}).status_code,
                       http.get("/stats", headers={"Authorization": f"Bearer {token}", "Host": "evil.example"}
                                ).status_code]
    svc.close()
    assert stats.status_code == 200 and refused[0] == refused[1] == 401 and refused[2] in (400, 403, 421)
    assert "sessions" not in stats.text  # the proxy's totals only: no session ids, no text
    body = stats.json()

    def expect(api: str, raws: list[bytes]) -> dict[str, Any]:
        figures = [sent_usage(api, r) for r in raws]
        known = [u for u in figures if u is not None]
        s = total(known)
        return {"requests": len(raws), "requests_with_usage": len(known), "prompt": s.prompt,
                "cache_read": s.cache_read, "cache_write": s.cache_write, "output": s.output,
                "cache_hit_share": s.cache_read / s.prompt if known else None}

    apis = {"chat": expect("chat", [r["sent"] for r in chat.requests]),
            "messages": expect("messages", [r["sent"] for r in msgs.messages_requests()]),
            "responses": expect("responses", [r["sent"] for r in resp.requests])}
    assert body["apis"] == apis
    assert apis["chat"]["requests"] == 3 and apis["chat"]["requests_with_usage"] == 2
    assert body["total"]["requests"] == 6 and body["total"]["prompt"] == sum(a["prompt"] for a in apis.values())
    assert empty["total"]["requests"] == 0 and empty["since"] == body["since"]


# -- contextrender.wrap ---------------------------------------------------------------------------------------------


def _wrapped(client: Any, sid: str) -> Any:
    return contextrender.wrap(client, budget=B, embedder=HashingEmbedder(), session=sid)


def _assert_wrap_usage(client: Any, sid: str, api: str, sent: list[bytes], streamed: bool) -> None:
    state = client.contextrender
    expected = assert_recorded(state.service, sid, api, sent, streamed)
    assert all(u is not None for u in expected)
    assert state.last.usage == expected[-1] and state.last.session == sid
    assert state.usage() == UsageTotals(len(sent), len(sent), total(expected))


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_wrap_chat_completions_keeps_the_sdk_objects_usage(asynchronous, stream):
    fake = FakeUpstream()
    with serve(fake.app) as up:
        cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        client = _wrapped(cls(base_url=f"{up}/v1", api_key="sk-wrap", max_retries=0), "w-chat")
        if asynchronous:
            asyncio.run(async_chat_agent(client, 3, stream=stream, sid="w-chat"))
        else:
            chat_agent(client, 3, stream=stream, include_usage=stream, raw=False, sid="w-chat")
        _assert_wrap_usage(client, "w-chat", "chat", [r["sent"] for r in fake.requests], stream)
        client.contextrender.close()


def test_wrap_records_a_chat_stream_without_usage_as_unknown():
    fake = FakeUpstream()
    with serve(fake.app) as up:
        client = _wrapped(openai.OpenAI(base_url=f"{up}/v1", api_key="sk-wrap", max_retries=0), "w-bare")
        chat_agent(client, 2, stream=True, raw=False, sid="w-bare")
    state = client.contextrender
    assert all("stream_options" not in r["body"] for r in fake.requests)
    assert state.last.usage is None and state.usage() == UsageTotals(2, 0, PromptUsage())
    state.close()


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_wrap_responses_keeps_the_sdk_objects_usage(asynchronous, stream):
    fake = ScriptedResponsesUpstream()
    with serve(fake.app) as up:
        cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        client = _wrapped(cls(base_url=f"{up}/v1", api_key="sk-wrap", max_retries=0), "w-resp")
        if asynchronous:
            asyncio.run(async_responses_agent(client, 3, stream=stream))
        else:
            responses_agent(client, 3, stream=stream, raw=False)
        _assert_wrap_usage(client, "w-resp", "responses", [r["sent"] for r in fake.requests], stream)
        client.contextrender.close()


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("mode", ["plain", "create", "helper"])
def test_wrap_messages_keeps_the_sdk_objects_usage(asynchronous, mode):
    fake = ScriptedAnthropic()
    with serve(fake.app) as up:
        cls = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
        client = _wrapped(cls(base_url=up, api_key="sk-ant-wrap", max_retries=0), "w-msg")
        if asynchronous:
            asyncio.run(async_messages_agent(client, 3, mode=mode))
        else:
            messages_agent(client, 3, mode=mode, raw=False)
        _assert_wrap_usage(client, "w-msg", "messages", [r["sent"] for r in fake.messages_requests()],
                           mode != "plain")
        client.contextrender.close()


def test_wrap_usage_before_any_call_names_what_is_missing():
    client = contextrender.wrap(openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="-"), budget=B,
                                embedder=HashingEmbedder())
    with pytest.raises(contextrender.GraphError, match="no call yet"):
        client.contextrender.usage()
    assert client.contextrender.last is None
    client.contextrender.close()


# -- the session view ------------------------------------------------------------------------------------------------


def _view_data(page: str) -> dict[str, Any]:
    start = page.index('<script type="application/json" id="cr-data">') + len('<script type="application/json" '
                                                                              'id="cr-data">')
    return json.loads(page[start:page.index("</script>", start)])


def test_the_view_shows_the_session_totals_and_each_invocations_figures(chat_proxy, tmp_path):
    url, fake, service = chat_proxy
    chat_agent(_openai(url), 4, sid="viewed")
    expected = [sent_usage("chat", r["sent"]) for r in fake.requests]
    transcript = service.transcript("viewed").messages
    page = service.view("viewed", budget=B, methods=["contextrender"])
    cache = _view_data(page)["cache"]
    assert cache["totals"] == service.usage("viewed").totals.to_json()
    # each request under the invocation its answer is: the number of assistant messages before it
    rows = service.usage("viewed").rows
    want = {str(sum(m["role"] == "assistant" for m in transcript[:r.at])): [[r.n, "chat", u.prompt, u.cache_read,
                                                                            u.cache_write, u.output]]
            for r, u in zip(rows, expected, strict=True)}
    assert cache["by_invocation"] == want and len(want) == 4
    # a window reads the requests of its invocations only (the latest, t = 4, is still unanswered)
    narrow = _view_data(service.view("viewed", budget=B, methods=["contextrender"], last=3))["cache"]
    assert set(narrow["by_invocation"]) == {"2", "3"} and narrow["totals"] == cache["totals"]
    if chromium() is None:
        pytest.skip("Chromium is not installed: .ci/run installs Debian's chromium package")
    page_file = tmp_path / "viewed.html"
    page_file.write_text(page, encoding="utf-8")
    dom = browser(page_file, dump_dom=True, fragment="t=3")  # the invocation the last request answered
    t = total(expected)
    assert (f"prompt cache as billed: 4 requests (4 with usage) · read {t.cache_read} of {t.prompt} prompt tokens "
            f"({100 * t.cache_read / t.prompt:.1f} %) · written {t.cache_write} · output {t.output}") in dom
    last = expected[-1]
    assert (f"billed: read {last.cache_read} of {last.prompt} prompt tokens "
            f"({100 * last.cache_read / last.prompt:.1f} %), written {last.cache_write}") in dom
