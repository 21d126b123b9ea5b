"""Loopback HTTP fixtures: uvicorn servers in background threads and a fake OpenAI upstream."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from contextrender import HashingEmbedder, TokenCounter
from contextrender.service.sessions import ContextService

SYSTEM = "You are a careful agent. Use the tools."
PAD = " ".join(f"w{i}" for i in range(120))  # ~240 tokens of filler per tool result


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yield its base URL."""
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only then (else ~40 ms delayed-ACK stalls).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


def history_tokens(messages: list[dict[str, Any]], counter: TokenCounter | None = None) -> int:
    """Tok(H): everything but the leading system prompt and the latest user message (docs/method.md §1)."""
    counter = counter or TokenCounter()
    n_sys = 0
    while n_sys < len(messages) and messages[n_sys].get("role") == "system":
        n_sys += 1
    body = messages[n_sys:]
    users = [i for i, m in enumerate(body) if m.get("role") == "user"]
    if users:
        body = body[:users[-1]] + body[users[-1] + 1:]
    return counter.messages(body)


# -- the fake upstream -------------------------------------------------------------------

_REC = re.compile(r"REC_[A-Za-z0-9_]+")


def scripted_reply(messages: list[dict[str, Any]], n_calls: int, salt: str) -> dict[str, Any]:
    """A deterministic 'model': call ``lookup`` on the newest REC_ id in the newest tool result.

    Using a value from a result makes TFA draw a reuse edge to that result.
    """
    target = "REC_start"
    for m in reversed(messages):
        if m.get("role") == "tool":
            found = _REC.findall(m.get("content") or "")
            if found:
                target = found[-1]
                break
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    calls = [{"id": f"call_{salt}_{turn}_{k}", "type": "function",
              "function": {"name": "lookup", "arguments": json.dumps({"record": target, "part": k})}}
             for k in range(n_calls)]
    return {"role": "assistant", "content": f"Checking {target} now.", "tool_calls": calls}


def billed(n: int) -> tuple[int, int, int, int]:
    """What the scripted upstreams bill their n-th answer (n from 1): prompt tokens (the cached ones included), of
    them read from the cache and written to it, and output tokens — different in every field and every request,
    so a field read from the wrong place, dropped or summed twice shows."""
    return 1000 + 100 * n, 128 * ((n - 1) % 8), 16 + n, 20 + n


def chat_usage(n: int) -> dict[str, Any]:
    """A chat completion's ``usage`` as OpenAI sends it (``prompt_tokens`` includes the cached tokens)."""
    prompt, read, _, out = billed(n)  # chat completions report no cache writes
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": read, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                          "rejected_prediction_tokens": 0}}


def sse_chunks(msg: dict[str, Any], cid: str, include_usage: bool, n: int = 1) -> list[bytes]:
    """The reply as OpenAI SSE chunks: content in pieces, tool-call argument fragments interleaved by index; asked
    for usage (``stream_options.include_usage``), every chunk says ``"usage": null`` and a last chunk with no
    choices carries it, as OpenAI streams it."""
    def ev(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": 0, "model": "fake",
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if include_usage:
            obj["usage"] = None
        return f"data: {json.dumps(obj)}\n\n".encode()

    out = [ev({"role": "assistant", "content": ""})]
    text = msg["content"]
    out += [ev({"content": text[:7]}), ev({"content": text[7:]})]
    calls = msg.get("tool_calls") or []
    for k, c in enumerate(calls):
        out.append(ev({"tool_calls": [{"index": k, "id": c["id"], "type": "function",
                                       "function": {"name": c["function"]["name"], "arguments": ""}}]}))
    pieces = [[a[i:i + 9] for i in range(0, len(a), 9)] for a in (c["function"]["arguments"] for c in calls)]
    for step in range(max((len(p) for p in pieces), default=0)):
        for k, p in enumerate(pieces):  # interleave the calls' fragments
            if step < len(p):
                out.append(ev({"tool_calls": [{"index": k, "function": {"arguments": p[step]}}]}))
    out.append(ev({}, "tool_calls" if calls else "stop"))
    if include_usage:
        last = {"id": cid, "object": "chat.completion.chunk", "created": 0, "model": "fake", "choices": [],
                "usage": chat_usage(n)}
        out.append(f"data: {json.dumps(last)}\n\n".encode())
    out.append(b"data: [DONE]\n\n")
    return out


def sse_response(chunks: list[bytes], headers: dict[str, str] | None = None) -> StreamingResponse:
    """The scripted upstreams' streamed answer: ``chunks`` sent as they are, yielding to the loop between them."""

    async def gen() -> Any:
        for c in chunks:
            yield c
            await asyncio.sleep(0)

    return StreamingResponse(gen(), media_type="text/event-stream", headers=headers)


class FakeUpstream:
    """An OpenAI-compatible server that records what it receives."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []  # {"body", "headers", "sent"}
        self._lock = threading.Lock()
        self.stream_override: list[bytes] | None = None  # raw SSE chunks to send instead of the scripted reply
        self.other: list[dict[str, Any]] = []  # requests to any other path: {"path", "headers"}
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            rec = {"body": body, "headers": dict(request.headers), "sent": b""}
            with self._lock:
                self.requests.append(rec)
                n = len(self.requests)
            if body.get("model") == "fail-429":
                return JSONResponse({"error": {"message": "slow down", "type": "rate_limit_error"}}, 429,
                                    headers={"retry-after": "7"})
            n_calls = 2 if len(body.get("tools") or []) >= 2 else 1
            msg = scripted_reply(body["messages"], n_calls, salt=str(body.get("user") or "u"))
            if not body.get("stream"):
                data = {"id": f"cmpl-{n}", "object": "chat.completion", "created": 0, "model": body.get("model"),
                        "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls"}],
                        "usage": chat_usage(n)}
                raw = json.dumps(data).encode()
                rec["sent"] = raw
                return JSONResponse(data, headers={"x-request-id": f"req-{n}"})
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = self.stream_override or sse_chunks(msg, f"cmpl-{n}", include_usage, n)
            rec["sent"] = b"".join(chunks)
            return sse_response(chunks, {"x-request-id": f"req-{n}"})

        @app.get("/v1/models")
        async def models(request: Request) -> Any:
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}],
                    "auth": request.headers.get("authorization")}

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        async def anything(path: str, request: Request) -> Any:
            # Every other path the proxy forwards: recorded with its headers (where did the key go?).
            with self._lock:
                self.other.append({"path": "/" + path, "headers": dict(request.headers)})
            return {"path": "/" + path}

        return app


@pytest.fixture
def fake_upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with serve(fake.app) as url:
        yield fake, url


@pytest.fixture
def service(tmp_path) -> Iterator[ContextService]:
    svc = ContextService(str(tmp_path / "graph.sqlite"), embedder=HashingEmbedder(dim=256), default_budget=1500)
    yield svc
    svc.close()


def tool_result(session: str, turn: int, k: int, call: dict[str, Any]) -> str:
    """A large tool result with fresh identifiers; ``next=`` is what the fake model calls next."""
    args = json.loads(call["function"]["arguments"])
    return (f"record {args['record']} owner user_{session}_{turn}_{k} status OPEN_{turn} "
            f"next=REC_{session}_{turn}_{k}\n{PAD}")


def sse_message(raw: bytes) -> dict[str, Any]:
    """Assemble choice 0's message from raw SSE bytes (a client's own, independent assembly)."""
    content, calls = [], {}
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for ch in json.loads(line[6:]).get("choices", []):
            d = ch.get("delta", {})
            if d.get("content"):
                content.append(d["content"])
            for tc in d.get("tool_calls") or []:
                cur = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                cur["id"] = cur["id"] or tc.get("id")
                fn = tc.get("function") or {}
                cur["name"] = cur["name"] or fn.get("name") or ""
                cur["arguments"] += fn.get("arguments") or ""
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for _, c in sorted(calls.items())]
    return msg


def remembering_upstream() -> Any:
    """A scripted model that remembers what the render may hide: at turn k it looks up the record id that
    tool result k−1 named (the turn comes in the request's ``user`` field), whatever it was shown."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> dict[str, Any]:
        body = await request.json()
        turn = int(body["user"].rsplit("-", 1)[1])
        record = "REC_start" if turn == 0 else f"REC_r_{turn - 1}_0"
        call = {"id": f"call_{turn}", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"record": record, "part": 0})}}
        return {"id": f"r{turn}", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "tool_calls",
                             "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}

    return app
