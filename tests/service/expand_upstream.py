"""A scripted model that needs what a render omitted, and asks for it with ``contextrender_expand``.

The model is one decision over the request it gets, told in each API's wire format by the scripted upstreams
(:class:`ChatUpstream` here; :class:`~.anthropic_upstream.ScriptedAnthropic` and
:class:`~.responses_upstream.ScriptedResponsesUpstream` take :func:`messages_model` / :func:`responses_script`):

* fewer than ``TURNS`` lookups answered: look the next record up (each result a long text whose *code word* sits
  in the middle of prose, a word no id-keeping form has reason to keep);
* then the answer must name record 0's code word. Seen in the request: say it. Not seen, and the tool offered: read
  record 0 back through the handle its marker shows, narrowed to the line with the code word.

``forever=True`` makes a model that calls the tool at every request (the loop's bound is what stops it).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from contextrender.expand import TOOL_NAME

from .conftest import chat_usage, sse_chunks, sse_response

TURNS = 5
HANDLE = re.compile(rf'{TOOL_NAME}\(\\?"(\d{{9}})\\?"\)')
PROSE = " ".join(f"The registry keeps entry {i} of this record under review until the audit closes."
                 for i in range(14))


_WORDS = ("north", "south", "east", "west", "upper", "lower", "inner", "outer")


def code_word(k: int) -> str:
    """Plain words, not an identifier: what a values line or an id form keeps is identifiers."""
    return f"the {_WORDS[k % len(_WORDS)]} garden"


def record_text(k: int) -> str:
    """Lookup k's result: prose, the code word on a line of its own in the middle, more prose."""
    return f"record r{k} report\n{PROSE}\nThe code word is {code_word(k)}.\n{PROSE}"


LOOKUP_PARAMS = {"type": "object", "properties": {"record": {"type": "string"}}, "required": ["record"]}
CHAT_LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look a record up.",
                                                "parameters": LOOKUP_PARAMS}}
RESPONSES_LOOKUP = {"type": "function", "name": "lookup", "description": "Look a record up.",
                    "parameters": LOOKUP_PARAMS, "strict": False}
MESSAGES_LOOKUP = {"name": "lookup", "description": "Look a record up.", "input_schema": LOOKUP_PARAMS}
FINAL = "Record 0's code word is "


def offered(tools: Any) -> bool:
    for t in tools or []:
        name = t.get("name") or (t.get("function") or {}).get("name")
        if name == TOOL_NAME:
            return True
    return False


def decide(body: dict[str, Any], lookups_done: int, forever: bool = False) -> tuple[str, str]:
    """("lookup", record) | ("expand", arguments JSON) | ("final", text) for a request."""
    text = json.dumps(body, ensure_ascii=False)
    handles = HANDLE.findall(text)
    if forever and offered(body.get("tools")) and handles:
        return "expand", json.dumps({"handle": handles[0]})
    if lookups_done < TURNS:
        return "lookup", json.dumps({"record": f"r{lookups_done}"})
    if code_word(0) in text:
        return "final", FINAL + code_word(0) + "."
    if offered(body.get("tools")) and handles:
        return "expand", json.dumps({"handle": handles[0], "match": "code word"})
    return "final", "I cannot see record 0's code word."


# -- Chat Completions --------------------------------------------------------------------------------


def chat_message(resp_or_chunks: Any, stream: bool) -> dict[str, Any]:
    """The assistant message an openai SDK client got, in OpenAI format: a completion's choice 0, or a stream's
    chunks assembled."""
    if not stream:
        msg = resp_or_chunks.choices[0].message
        out: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if msg.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in msg.tool_calls]
        return out
    content, calls = [], {}
    for chunk in resp_or_chunks:
        for ch in chunk.choices:
            content.append(ch.delta.content or "")
            for tc in ch.delta.tool_calls or []:
                cur = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                cur["id"] = cur["id"] or tc.id
                cur["name"] = cur["name"] or (tc.function.name if tc.function else "") or ""
                cur["arguments"] += (tc.function.arguments if tc.function else "") or ""
    out = {"role": "assistant", "content": "".join(content)}
    if calls:
        out["tool_calls"] = [{"id": c["id"], "type": "function", "function": {"name": c["name"],
                                                                              "arguments": c["arguments"]}}
                             for _, c in sorted(calls.items())]
    return out


class ChatUpstream:
    """A Chat Completions server answering with :func:`decide`, JSON or SSE as asked; records every request."""

    def __init__(self, forever: bool = False) -> None:
        self.forever = forever
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            with self._lock:
                self.requests.append(body)
                n = len(self.requests)
            done = sum(1 for m in body["messages"] if m.get("role") == "tool"
                       and str(m.get("tool_call_id", "")).startswith("call_lookup"))
            kind, payload = decide(body, done, self.forever)
            if kind == "final":
                msg: dict[str, Any] = {"role": "assistant", "content": payload}
            else:
                name = "lookup" if kind == "lookup" else TOOL_NAME
                msg = {"role": "assistant", "content": "",
                       "tool_calls": [{"id": f"call_{name}_{n}", "type": "function",
                                       "function": {"name": name, "arguments": payload}}]}
            if not body.get("stream"):
                return JSONResponse({"id": f"cmpl-{n}", "object": "chat.completion", "created": 0,
                                     "model": body.get("model"),
                                     "choices": [{"index": 0, "message": msg, "logprobs": None,
                                                  "finish_reason": "stop" if kind == "final" else "tool_calls"}],
                                     "usage": chat_usage(n)})
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return sse_response(sse_chunks(msg, f"cmpl-{n}", include, n))


# -- Messages -----------------------------------------------------------------------------------------


def messages_content(got: Any, stream: bool) -> list[dict[str, Any]]:
    """The content blocks an anthropic SDK client got: a message's, or a stream's events put together as the SDK
    does (text deltas appended, a tool use's input from its JSON deltas)."""
    if not stream:
        return [b.model_dump(exclude_none=True) for b in got.content]
    blocks: dict[int, dict[str, Any]] = {}
    for ev in got:
        if ev.type == "content_block_start":
            blocks[ev.index] = {**ev.content_block.model_dump(exclude_none=True), "_json": ""}
        elif ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            blocks[ev.index]["text"] += ev.delta.text
        elif ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
            blocks[ev.index]["_json"] += ev.delta.partial_json
    out = []
    for _, b in sorted(blocks.items()):
        raw = b.pop("_json")
        if b["type"] == "tool_use":
            b["input"] = json.loads(raw or "{}")
        out.append(b)
    return out


def messages_model(forever: bool = False) -> Any:
    """A :class:`~.anthropic_upstream.ScriptedAnthropic` model: content blocks from :func:`decide`."""
    count = iter(range(1, 10 ** 6))

    def model(body: dict[str, Any]) -> list[dict[str, Any]]:
        n = next(count)
        done = sum(1 for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"
                   and str(b.get("tool_use_id", "")).startswith("toolu_lookup"))
        kind, payload = decide(body, done, forever)
        if kind == "final":
            return [{"type": "text", "text": payload}]
        name = "lookup" if kind == "lookup" else TOOL_NAME
        return [{"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": f"toolu_{name}_{n}", "name": name, "input": json.loads(payload)}]

    return model


# -- Responses ----------------------------------------------------------------------------------------


def responses_script(forever: bool = False) -> Any:
    """A :class:`~.responses_upstream.ScriptedResponsesUpstream` script: output items from :func:`decide`."""

    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        items = body["input"] if isinstance(body["input"], list) else []
        done = sum(1 for it in items if it.get("type") == "function_call_output"
                   and str(it.get("call_id", "")).startswith("call_lookup"))
        kind, payload = decide(body, done, forever)
        if kind == "final":
            return [{"type": "message", "id": f"msg_{n}", "status": "completed", "role": "assistant",
                     "content": [{"type": "output_text", "text": payload, "annotations": [], "logprobs": []}]}]
        name = "lookup" if kind == "lookup" else TOOL_NAME
        return [{"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{name}_{n}", "name": name,
                 "arguments": payload, "status": "completed"}]

    return script
