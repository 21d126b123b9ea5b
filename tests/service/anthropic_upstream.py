"""A scripted Anthropic Messages API upstream on loopback, and the checks the Anthropic tests share.

:class:`ScriptedAnthropic` answers ``POST /v1/messages`` as the API does — a JSON ``message``, or SSE
(``message_start``, ``content_block_start``, ``ping``, ``content_block_delta`` with ``text_delta`` /
``input_json_delta`` / ``thinking_delta`` / ``signature_delta``, ``content_block_stop``,
``message_delta``, ``message_stop``) — and records every request. Like the API it refuses (400,
Anthropic's error shape) a request whose ``tool_use``/``tool_result`` blocks do not pair, or whose
``cache_control`` breakpoints it does not take (:func:`~.anthropic_breakpoints.cache_control_problems`).

:func:`history_tokens` counts a forwarded request the way the project counts the chat path: the
conversation as OpenAI-format messages (written here independently of the code under test), minus the
system prompt and the latest user message.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from contextrender import TokenCounter

from .anthropic_breakpoints import cache_control_problems
from .conftest import billed, sse_response

PAD = " ".join(f"w{i}" for i in range(120))  # ~240 tokens of filler per tool result
_REC = re.compile(r"REC_[A-Za-z0-9_]+")
_STEPS = re.compile(r"steps=(\d+)")
_TURN = re.compile(r"^toolu_[a-z0-9]+_(\d+)_\d+$")

LOOKUP = {"name": "lookup", "description": "Look a record up.",
          "input_schema": {"type": "object", "properties": {"record": {"type": "string"},
                                                            "part": {"type": "integer"}}}}
OTHER = {"name": "other", "description": "Another tool.", "input_schema": {"type": "object", "properties": {}}}


# -- counting and checking what went upstream ------------------------------------------------


def _text(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    return "\n".join(b["text"] for b in blocks if b.get("type") == "text")


def as_openai(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Messages API conversation as the OpenAI-format messages the project counts."""
    out: list[dict[str, Any]] = []
    if isinstance(system, str) and system:
        out.append({"role": "system", "content": system})
    elif isinstance(system, list):
        out += [{"role": "system", "content": b["text"]} for b in system if b.get("type") == "text"]
    for m in messages:
        content = m["content"]
        if m["role"] == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": _text(content)}
            calls = [{"id": b["id"], "type": "function",
                      "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}}
                     for b in (content if isinstance(content, list) else []) if b.get("type") == "tool_use"]
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        if isinstance(content, str):
            out.append({"role": "user", "content": content})
            continue
        results = [b for b in content if b.get("type") == "tool_result"]
        out += [{"role": "tool", "tool_call_id": b["tool_use_id"], "content": _text(b.get("content") or "")}
                for b in results]
        if not results or len(results) < len(content):
            out.append({"role": "user", "content": _text(content)})
    return out


def history_tokens(body: dict[str, Any], counter: TokenCounter | None = None) -> int:
    """Tok(H) of a Messages API request body: all but the system prompt and the latest user message."""
    msgs = as_openai(body.get("system"), body["messages"])
    n_sys = 0
    while n_sys < len(msgs) and msgs[n_sys]["role"] == "system":
        n_sys += 1
    rest = msgs[n_sys:]
    users = [i for i, m in enumerate(rest) if m["role"] == "user"]
    if users:
        rest = rest[:users[-1]] + rest[users[-1] + 1:]
    return (counter or TokenCounter()).messages(rest)


def pairing_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What the Messages API refuses about tool pairing (every tool_use answered in the next user message,
    every tool_result answering the assistant message just before, tool_result blocks first)."""
    def ids(m: dict[str, Any] | None, kind: str, key: str) -> list[str]:
        if m is None or not isinstance(m.get("content"), list):
            return []
        return [b[key] for b in m["content"] if b.get("type") == kind]

    problems = []
    for k, m in enumerate(messages):
        prev = messages[k - 1] if k else None
        nxt = messages[k + 1] if k + 1 < len(messages) else None
        if m["role"] == "assistant" and nxt is not None:
            answered = set(ids(nxt, "tool_result", "tool_use_id")) if nxt["role"] == "user" else set()
            problems += [f"messages.{k}: tool_use {i} has no tool_result right after it"
                         for i in ids(m, "tool_use", "id") if i not in answered]
        if m["role"] == "user":
            asked = set(ids(prev, "tool_use", "id")) if prev is not None and prev["role"] == "assistant" else set()
            problems += [f"messages.{k}: unexpected tool_use_id {i} in tool_result"
                         for i in ids(m, "tool_result", "tool_use_id") if i not in asked]
            kinds = [b.get("type") for b in m["content"]] if isinstance(m["content"], list) else []
            first_other = next((i for i, kd in enumerate(kinds) if kd != "tool_result"), len(kinds))
            if "tool_result" in kinds[first_other:]:
                problems.append(f"messages.{k}: tool_result blocks must come first")
    if messages and messages[0]["role"] != "user":
        problems.append("messages.0: the first message must use the user role")
    return problems


def tool_result_text(tag: str, turn: int, k: int, record: str) -> str:
    """A large tool result naming the record the scripted model asks for next."""
    return f"record {record} owner user_{tag}_{turn}_{k} status OPEN_{turn} next=REC_{tag}_{turn}_{k}\n{PAD}"


# -- the scripted model ------------------------------------------------------------------------


def lookup_model(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Calls ``lookup`` on the newest REC_ id the newest tool result names (two calls when two tools are
    offered), ``steps=N`` times (N from the first user message), then answers ``DONE <id>``.

    The turn is read from the newest ``tool_use`` id (the render always keeps the latest turn), so the
    script never depends on what the render hid.
    """
    msgs = body["messages"]
    first = _text(msgs[0]["content"]) if msgs else ""
    steps = int(m.group(1)) if (m := _STEPS.search(first)) else 3
    turn = 0
    target = "REC_start"
    found_target = False
    for msg in reversed(msgs):
        content = msg["content"] if isinstance(msg["content"], list) else []
        if msg["role"] == "assistant" and turn == 0:
            turns = [int(t.group(1)) + 1 for b in content if b.get("type") == "tool_use"
                     and (t := _TURN.match(b["id"]))]
            turn = max(turns, default=0)
        if msg["role"] == "user" and not found_target:
            for b in content:
                if b.get("type") == "tool_result" and (ids := _REC.findall(_text(b.get("content") or ""))):
                    target, found_target = ids[-1], True
    blocks: list[dict[str, Any]] = []
    if (body.get("thinking") or {}).get("type") == "enabled":
        blocks.append({"type": "thinking", "thinking": f"Turn {turn}: follow {target}.", "signature": f"sig-{turn}-x"})
    if turn >= steps or not body.get("tools"):
        return [*blocks, {"type": "text", "text": f"DONE {target}"}]
    salt = str((body.get("metadata") or {}).get("user_id") or "u").lower()[:8]
    salt = re.sub(r"[^a-z0-9]", "", salt) or "u"
    n = 2 if len(body["tools"]) >= 2 else 1
    blocks.append({"type": "text", "text": f"Checking {target} now."})
    blocks += [{"type": "tool_use", "id": f"toolu_{salt}_{turn}_{k}", "name": body["tools"][k]["name"],
                "input": {"record": target, "part": k}} for k in range(n)]
    return blocks


def anthropic_usage(n: int) -> dict[str, Any]:
    """A Messages API answer's ``usage`` as Anthropic sends it: ``input_tokens`` is only the uncached part of the
    prompt, the reads and writes are beside it (conftest.billed's figures for the n-th answer)."""
    prompt, read, write, out = billed(n)
    return {"input_tokens": prompt - read - write, "cache_creation_input_tokens": write,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": write, "ephemeral_1h_input_tokens": 0},
            "output_tokens": out, "service_tier": "standard"}


def sse_events(message: dict[str, Any]) -> list[bytes]:
    """``message`` as the Messages API streams it: text and JSON in pieces, a ping; the usage as the API gives it —
    ``message_start`` with the input and cache figures (output 1 so far), ``message_delta`` with the final output
    and the cumulative input and cache figures again."""
    def ev(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    usage = message["usage"]
    head = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1}}
    out = [ev("message_start", {"message": head}), ev("ping", {})]
    for i, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            out.append(ev("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}))
            text = block["text"]
            out += [ev("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": text[j:j + 6]}})
                    for j in range(0, len(text), 6)]
        elif kind == "thinking":
            out.append(ev("content_block_start", {"index": i, "content_block": {"type": "thinking", "thinking": "",
                                                                              "signature": ""}}))
            out.append(ev("content_block_delta", {"index": i, "delta": {"type": "thinking_delta",
                                                                        "thinking": block["thinking"]}}))
            out.append(ev("content_block_delta", {"index": i, "delta": {"type": "signature_delta",
                                                                        "signature": block["signature"]}}))
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            out.append(ev("content_block_start", {"index": i, "content_block": start}))
            raw = json.dumps(block["input"])
            out += [ev("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                     "partial_json": raw[j:j + 7]}})
                    for j in range(0, len(raw), 7)]
        out.append(ev("content_block_stop", {"index": i}))
    delta_usage = {k: usage[k] for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                                         "output_tokens")}
    out.append(ev("message_delta", {"delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                    "usage": delta_usage}))
    out.append(ev("message_stop", {}))
    return out


def anthropic_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status)


class ScriptedAnthropic:
    """An Anthropic-compatible server answering with ``model(body)``'s content blocks; records every request
    (``body``, ``headers``, ``query``, ``path``, ``sent``: the bytes it answered with)."""

    def __init__(self, model: Callable[[dict[str, Any]], list[dict[str, Any]]] = lookup_model) -> None:
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.other: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.app = self._build()

    def messages_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["path"] == "/v1/messages"]

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/messages")
        async def messages(request: Request) -> Any:
            body = await request.json()
            rec = {"path": "/v1/messages", "body": body, "headers": dict(request.headers),
                   "query": dict(request.query_params), "sent": b""}
            with self._lock:
                self.requests.append(rec)
                n = len(self.requests)
            if body.get("model") == "fail-429":
                r = anthropic_error(429, "rate_limit_error", "slow down")
                r.headers["retry-after"] = "7"
                return r
            problems = pairing_problems(body.get("messages") or []) or cache_control_problems(body)
            if problems:
                return anthropic_error(400, "invalid_request_error", "; ".join(problems))
            content = self.model(body)
            stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
            message = {"id": f"msg_{n:04d}", "type": "message", "role": "assistant", "model": body.get("model"),
                       "content": content, "stop_reason": stop, "stop_sequence": None,
                       "usage": anthropic_usage(n)}
            headers = {"request-id": f"req_{n:04d}"}
            if not body.get("stream"):
                rec["sent"] = json.dumps(message).encode()
                return JSONResponse(message, headers=headers)
            chunks = sse_events(message)
            rec["sent"] = b"".join(chunks)
            return sse_response(chunks, headers)

        @app.post("/v1/messages/count_tokens")
        async def count_tokens(request: Request) -> Any:
            body = await request.json()
            with self._lock:
                self.requests.append({"path": "/v1/messages/count_tokens", "body": body,
                                      "headers": dict(request.headers), "query": dict(request.query_params)})
            return {"input_tokens": TokenCounter().messages(as_openai(body.get("system"), body["messages"]))}

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        async def anything(path: str, request: Request) -> Any:
            with self._lock:
                self.other.append({"path": "/" + path, "headers": dict(request.headers)})
            return anthropic_error(404, "not_found_error", f"no route /{path}")

        return app
