"""A scripted OpenAI Responses API server for the tests (``POST /v1/responses``, JSON and SSE), and what the
tests measure in the requests it received: the history's tokens and the pairing of calls and outputs.

The "model" is deterministic: it follows a chain of records. With no tool output in its input it calls the
client's first function tool on ``REC_start``; after an output that names ``next=REC_…`` and ``step=k`` it
calls the tool on that record (step k+1), until the task's ``steps=N`` are done; then it answers in text,
naming the last record it saw. Every request is recorded (body, headers, the bytes sent back).
The measuring helpers read items on their own (they do not use the module under test).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from contextrender import TokenCounter

from .conftest import billed, sse_response

PAD = " ".join(f"w{i}" for i in range(120))  # ~240 tokens of filler per tool result
_NEXT = re.compile(r"next=(REC_[A-Za-z0-9_]+)")
_STEP = re.compile(r"step=(\d+)")
_STEPS = re.compile(r"steps=(\d+)")


def record_text(record: str, step: int, tag: str = "t") -> str:
    """What the client's lookup tool returns: a large result naming the next record and the step."""
    return f"record {record} owner user_{tag}_{step} step={step} next=REC_{tag}_{step}\n{PAD}"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text") or p.get("refusal") or "" for p in content if isinstance(p, dict)
                         and p.get("type") in ("input_text", "output_text", "text", "refusal"))
    return ""


def _kind(item: dict[str, Any]) -> str:
    return item.get("type") or ("message" if "role" in item else "?")


def items_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    inp = body.get("input")
    return [{"type": "message", "role": "user", "content": inp}] if isinstance(inp, str) else list(inp or [])


def function_tools(body: dict[str, Any]) -> list[str]:
    return [t["name"] for t in body.get("tools") or [] if t.get("type") == "function"]


# -- the scripted model -------------------------------------------------------------------------------


def default_script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The next output items for a request (module docstring)."""
    items = items_of(body)
    task = next((_text_of(i.get("content")) for i in items if _kind(i) == "message" and i.get("role") == "user"), "")
    steps = int(m.group(1)) if (m := _STEPS.search(task)) else 3
    outputs = [str(i.get("output")) for i in items if _kind(i).endswith("_call_output")]
    last = next((o for o in reversed(outputs) if "step=" in o), "")
    step = int(m.group(1)) if (m := _STEP.search(last)) else 0
    record = m.group(1) if (m := _NEXT.search(last)) else "REC_start"
    tools = function_tools(body)
    if step >= steps or not tools:
        return [message_item(f"msg_{n}", f"Done: the chain ends at {record} after {step} steps.")]
    out: list[dict[str, Any]] = [{"type": "reasoning", "id": f"rs_{n}", "summary": [],
                                  "encrypted_content": f"ENCRYPTED-{n}-" + "x" * 40}]
    calls = 2 if len(tools) >= 2 else 1
    for k in range(calls):
        args = json.dumps({"record": record, "part": k}) if k == 0 else json.dumps({"note": f"aside {n}"})
        out.append({"type": "function_call", "id": f"fc_{n}_{k}", "call_id": f"call_{n}_{k}", "name": tools[k],
                    "arguments": args, "status": "completed"})
    return out


def message_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def responses_usage(n: int) -> dict[str, Any]:
    """A response's ``usage`` as OpenAI sends it (``input_tokens`` includes the cached and written tokens;
    conftest.billed's figures for the n-th response)."""
    prompt, read, write, out = billed(n)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": read, "cache_write_tokens": write},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + out}


def response_object(body: dict[str, Any], rid: str, output: list[dict[str, Any]], status: str = "completed",
                    n: int | None = None) -> dict[str, Any]:
    """A Response as the API returns it: with the n-th response's usage once it is complete (default: the number in
    ``rid``), ``null`` while it is in progress."""
    return {"id": rid, "object": "response", "created_at": 1700000000, "status": status, "background": False,
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": body.get("model") or "scripted",
            "output": output, "parallel_tool_calls": True, "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": bool(body.get("store", True)),
            "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
            "tools": body.get("tools") or [], "top_p": 1.0, "truncation": "disabled", "metadata": {},
            "usage": None if status == "in_progress" else responses_usage(n if n is not None else _number(rid))}


def _number(rid: str) -> int:
    digits = re.sub(r"\D", "", rid)
    return int(digits) if digits else 1


def sse_events(body: dict[str, Any], rid: str, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of a streamed response, in the API's order, text and arguments in small deltas."""
    events: list[dict[str, Any]] = []
    start = response_object(body, rid, [], "in_progress")
    events += [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start}]
    for idx, item in enumerate(output):
        kind = item["type"]
        if kind == "message":
            events.append({"type": "response.output_item.added", "output_index": idx,
                           "item": {**item, "status": "in_progress", "content": []}})
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": idx,
                           "content_index": 0, "part": part})
            for i in range(0, len(text), 7):
                events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": idx,
                               "content_index": 0, "delta": text[i:i + 7], "logprobs": []})
            events.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": idx,
                           "content_index": 0, "text": text, "logprobs": []})
            events.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": idx,
                           "content_index": 0, "part": {**part, "text": text}})
        elif kind == "function_call":
            events.append({"type": "response.output_item.added", "output_index": idx,
                           "item": {**item, "arguments": "", "status": "in_progress"}})
            args = item["arguments"]
            for i in range(0, len(args), 9):
                events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": idx, "delta": args[i:i + 9]})
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": idx, "name": item["name"], "arguments": args})
        else:
            events.append({"type": "response.output_item.added", "output_index": idx, "item": item})
        events.append({"type": "response.output_item.done", "output_index": idx, "item": item})
    events.append({"type": "response.completed", "response": response_object(body, rid, output)})
    for k, ev in enumerate(events):
        ev["sequence_number"] = k
    return events


def sse_bytes(events: list[dict[str, Any]]) -> list[bytes]:
    return [f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode() for ev in events]


class ScriptedResponsesUpstream:
    """An OpenAI Responses API server on loopback that records every request it gets.

    ``script(body, n)`` gives the output items of the n-th response (default :func:`default_script`).
    """

    def __init__(self, script: Callable[[dict[str, Any], int], list[dict[str, Any]]] = default_script) -> None:
        self.script = script
        self.events = sse_events  # how a streamed response is told (a test may end it differently)
        self.requests: list[dict[str, Any]] = []  # {"path", "body", "headers", "sent"}
        self.other: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/responses")
        async def responses(request: Request) -> Any:
            body = await request.json()
            rec = {"path": "/v1/responses", "body": body, "headers": dict(request.headers), "sent": b""}
            with self._lock:
                self.requests.append(rec)
                n = next(self._ids)
            if body.get("model") == "fail-429":
                return JSONResponse({"error": {"message": "slow down", "type": "rate_limit_error", "param": None,
                                               "code": None}}, 429, headers={"retry-after": "7"})
            output = self.script(body, n)
            rid = f"resp_{n}"
            if not body.get("stream"):
                data = response_object(body, rid, output)
                rec["sent"] = json.dumps(data).encode()
                return JSONResponse(data, headers={"x-request-id": f"req-{n}"})
            chunks = sse_bytes(self.events(body, rid, output))
            rec["sent"] = b"".join(chunks)
            return sse_response(chunks, {"x-request-id": f"req-{n}"})

        @app.get("/v1/models")
        async def models() -> Any:
            return {"object": "list", "data": [{"id": "scripted-model", "object": "model", "created": 0,
                                                "owned_by": "test"}]}

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        async def anything(path: str, request: Request) -> Any:
            with self._lock:
                self.other.append({"path": "/" + path, "body": await request.body(),
                                   "headers": dict(request.headers)})
            return {"path": "/" + path}

        return app


# -- what the tests measure -----------------------------------------------------------------------------

_CALLS = ("function_call", "custom_tool_call", "shell_call", "local_shell_call", "apply_patch_call", "computer_call")


def as_chat(items: list[dict[str, Any]], instructions: str | None = None) -> list[dict[str, Any]]:
    """Input items as chat messages, read independently: runs of assistant-side items become one assistant
    message (text joined, calls as tool_calls), outputs become tool messages, other messages keep their role."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    asst: dict[str, Any] | None = None
    for item in items:
        kind = _kind(item)
        if kind == "message" and item.get("role") != "assistant":
            asst = None
            out.append({"role": item["role"], "content": _text_of(item.get("content"))})
        elif kind.endswith("_call_output"):
            asst = None
            out.append({"role": "tool", "tool_call_id": item.get("call_id") or item.get("id"),
                        "content": _text_of(item.get("output"))})
        elif kind in ("message", *_CALLS, "reasoning"):
            if asst is None:
                asst = {"role": "assistant", "content": ""}
                out.append(asst)
            if kind == "message":
                text = _text_of(item.get("content"))
                asst["content"] = "\n".join(t for t in (asst["content"], text) if t)
            elif kind != "reasoning":
                args = item.get("arguments") if kind == "function_call" else item.get("input")
                if not isinstance(args, str):
                    args = json.dumps({k: v for k, v in item.items()
                                       if k not in ("type", "id", "call_id", "status")}, sort_keys=True)
                asst.setdefault("tool_calls", []).append(
                    {"id": item["call_id"], "type": "function",
                     "function": {"name": item.get("name") or kind, "arguments": args}})
    return out


def history_tokens(messages: list[dict[str, Any]]) -> int:
    """Tok(H): everything but the leading system/developer messages and the latest user message."""
    n = 0
    while n < len(messages) and messages[n]["role"] in ("system", "developer"):
        n += 1
    body = messages[n:]
    users = [i for i, m in enumerate(body) if m["role"] == "user"]
    if users:
        body = body[:users[-1]] + body[users[-1] + 1:]
    for m in body:
        if m.get("tool_calls") and not m.get("content"):
            m["content"] = None
    return TokenCounter().messages(body)


def request_history_tokens(body: dict[str, Any]) -> int:
    return history_tokens(as_chat(items_of(body), body.get("instructions")))


def pairing_problems(items: list[dict[str, Any]]) -> list[str]:
    """Every output must follow a call with its call_id, every call must have a later output, and every
    reasoning item must be followed by an assistant-side item (its output)."""
    problems = []
    for k, item in enumerate(items):
        kind = _kind(item)
        if kind.endswith("_call_output"):
            cid = item.get("call_id") or item.get("id")
            if not any(_kind(p) in _CALLS and p.get("call_id") == cid for p in items[:k]):
                problems.append(f"{k}: output {cid} answers no earlier call")
        elif kind in _CALLS:
            if not any(_kind(p).endswith("_call_output") and (p.get("call_id") or p.get("id")) == item["call_id"]
                       for p in items[k + 1:]):
                problems.append(f"{k}: call {item['call_id']} has no later output")
        elif kind == "reasoning":
            nxt = items[k + 1] if k + 1 < len(items) else None
            if nxt is None or not (_kind(nxt) in _CALLS or (_kind(nxt) == "message" and nxt.get("role") == "assistant")
                                   or _kind(nxt) == "reasoning"):
                problems.append(f"{k}: reasoning {item.get('id')} is not followed by its output")
    return problems


def regrouped(items: list[dict[str, Any]], turns: dict[str, int]) -> list[dict[str, Any]]:
    """``items`` with each model turn's calls together: an output of a turn's call sent before the turn's last
    call (``call A, output A, call B, output B``) moves to right after that call, in the order sent. ``turns``
    maps a call id to its turn (the response that made it); how the tests measure an interleaved history."""
    last_call: dict[int, int] = {}
    for k, item in enumerate(items):
        if _kind(item) in _CALLS and item["call_id"] in turns:
            last_call[turns[item["call_id"]]] = k
    out: list[dict[str, Any]] = []
    held: dict[int, list[dict[str, Any]]] = {}
    for k, item in enumerate(items):
        kind = _kind(item)
        turn = turns.get(item.get("call_id") or item.get("id") or "") if kind.endswith("_call_output") else None
        if turn is not None and last_call.get(turn, -1) > k:
            held.setdefault(turn, []).append(item)
            continue
        out.append(item)
        if kind in _CALLS and (t := turns.get(item["call_id"])) is not None and last_call[t] == k:
            out.extend(held.pop(t, []))
    return out
