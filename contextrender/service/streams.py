"""Between a client and the model: what goes up, and what comes back streamed.

:func:`forwarded_messages` is the forwarding rule the proxy and the wrapper share: the rendered
history in the client's own message objects, only changed bodies replaced (for the Anthropic
Messages API, :func:`contextrender.service.anthropic_messages.forwarded_messages`).
:class:`StreamAssembler` rebuilds the assistant message from a streamed chat completion (SSE bytes),
:class:`AnthropicStreamAssembler` from a streamed Messages API answer and
:class:`ResponsesStreamAssembler` from a streamed Responses API answer, so each can be recorded.
Each assembler also keeps the answer's usage as the upstream reported it (``usage()``: a
:class:`~contextrender.billing.PromptUsage`, or None when the stream carried none); :func:`chat_prompt_usage`
reads a chat completion's ``usage`` object (the Messages and Responses APIs' readers are in their own modules).
None of them knows about HTTP or the graph.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from contextrender.billing import PromptUsage
from contextrender.events import Message
from contextrender.service import anthropic_messages, responses_api
from contextrender.service.anthropic_messages import assistant_message
from contextrender.service.errors import ServiceError
from contextrender.service.responses_api import assistant_message as responses_assistant_message
from contextrender.service.results import RenderResult
from contextrender.service.usage import prompt_usage


def forwarded_messages(original: Sequence[Any], render: RenderResult) -> list[Any]:
    """The rendered history in the client's own message dicts; only changed bodies are replaced.

    After a sync, stored seq i is the client's message i, so ``render.layout`` (the render's
    ``Rendered.sources``) indexes ``original`` directly. A kept message is the client's own dict,
    untouched (images, extra fields intact); a message whose body the render changed (an omitted
    result's marker, a clipped task) is a copy with the new ``content``; an inserted message (a
    summary) is the render's own.
    """
    out: list[Any] = []
    for msg, seq in zip(render.messages, render.layout, strict=True):
        if seq is None:
            out.append(msg)
            continue
        orig = original[seq]
        body = msg.get("content") or ""
        if Message.from_openai(orig).content == body:
            out.append(orig)
        else:
            out.append({**orig, "content": msg.get("content")})
    return out


def chat_prompt_usage(usage: Any) -> PromptUsage | None:
    """A chat completion's ``usage`` object as billed, or None (unknown: absent, or not counts).

    ``prompt_tokens`` counts every prompt token, the cached ones included; ``prompt_tokens_details.cached_tokens``
    were read from the prompt cache and ``prompt_tokens_details.cache_write_tokens`` (where an upstream reports it)
    written to it; ``completion_tokens`` is the output (docs/service.md, "Prompt-cache usage").
    """
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    return prompt_usage(usage.get("prompt_tokens"), details.get("cached_tokens"), details.get("cache_write_tokens"),
                        usage.get("completion_tokens"))


#: The highest index (a chat tool call's, an Anthropic content block's, a Responses output item's or content
#: part's) an assembler takes from the upstream; an event above it is counted in ``bad_events`` and skipped,
#: so an upstream-chosen number never sizes what is kept.
MAX_STREAM_INDEX = 1024


def _stream_index(value: Any) -> int | None:
    """``value`` as an index an assembler takes (an int of at most MAX_STREAM_INDEX), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value <= MAX_STREAM_INDEX:
        return value
    return None


class _ServerSentEvents:
    """Splits SSE bytes, cut anywhere, into the data of each event (``event:`` and ``id:`` lines are
    not needed: both APIs name the event inside its JSON); a subclass takes each in :meth:`_data_event`."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the SSE stream, split anywhere (mid-line, mid-character)."""
        self._buf += chunk
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                return
            line, self._buf = self._buf[:i].rstrip(b"\r"), self._buf[i + 1:]
            self._line(line.decode("utf-8", "replace"))

    def close(self) -> None:
        """The stream ended: a last line without its newline, or an event without its blank line, still counts."""
        if self._buf:
            self._line(self._buf.rstrip(b"\r").decode("utf-8", "replace"))
            self._buf = b""
        self._dispatch()

    def _line(self, line: str) -> None:
        if not line:
            self._dispatch()
            return
        if line.startswith(":"):
            return  # SSE comment / keep-alive
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)

    def _dispatch(self) -> None:
        if not self._data:
            return
        data, self._data = "\n".join(self._data), []
        self._data_event(data)

    def _data_event(self, data: str) -> None:
        raise NotImplementedError


class StreamAssembler(_ServerSentEvents):
    """Rebuilds choice 0's assistant message from OpenAI SSE chunks.

    Content deltas are concatenated. Tool-call fragments follow OpenAI's
    chunk semantics: a fragment's ``index`` names its call; a fragment with
    an ``id`` the call at that index (or, without an index, the latest call)
    does not have starts a new call; a fragment with neither index nor id
    continues the latest call. The id and name come from the first fragment
    that has them; argument strings are concatenated in arrival order.
    Malformed events (not JSON, a non-object delta or fragment, an ``index``
    above MAX_STREAM_INDEX) are counted in ``bad_events`` and skipped:
    assembling never raises on upstream data. The usage is the latest
    chunk's non-null ``usage`` (the last chunk's, ``choices: []``, when the
    client asked ``stream_options.include_usage``).
    """

    #: What says the answer is finished (named when a stream ends without it).
    FINISH = "finish_reason"

    def __init__(self) -> None:
        super().__init__()
        self._content: list[str] = []
        self._calls: list[dict[str, Any]] = []  # in order of first appearance
        self._by_index: dict[int, int] = {}  # fragment index -> position in _calls
        self._usage: Any = None
        self.finish_reason: str | None = None
        self.done = False  # saw ``data: [DONE]``
        self.bad_events = 0

    def _data_event(self, data: str) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            self.bad_events += 1
            return
        if isinstance(obj, dict) and obj.get("usage") is not None:
            self._usage = obj["usage"]
        choices = obj.get("choices") if isinstance(obj, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                continue
            delta = choice.get("delta")
            if delta is None:
                delta = {}
            if not isinstance(delta, dict):
                self.bad_events += 1
                delta = {}
            if isinstance(delta.get("content"), str):
                self._content.append(delta["content"])
            frags = delta.get("tool_calls")
            for frag in frags if isinstance(frags, list) else []:
                if isinstance(frag, dict):
                    self._fragment(frag)
                else:
                    self._bad()
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def _bad(self) -> None:
        self.bad_events += 1

    def _new_call(self, index: int | None) -> dict[str, Any]:
        call: dict[str, Any] = {"id": None, "name": "", "arguments": ""}
        self._calls.append(call)
        if index is not None:
            self._by_index[index] = len(self._calls) - 1
        return call

    def _fragment(self, frag: dict[str, Any]) -> None:
        raw_index = frag.get("index")
        index = raw_index if isinstance(raw_index, int) and not isinstance(raw_index, bool) else None
        if index is not None and index > MAX_STREAM_INDEX:
            self._bad()
            return
        fid = frag.get("id") if isinstance(frag.get("id"), str) and frag.get("id") else None
        if index is not None and index in self._by_index:
            cur = self._calls[self._by_index[index]]
            if fid and cur["id"] and fid != cur["id"]:
                cur = self._new_call(index)
        elif index is not None:
            cur = self._new_call(index)
        elif not self._calls or (fid and self._calls[-1]["id"] and fid != self._calls[-1]["id"]):
            cur = self._new_call(None)
        else:
            cur = self._calls[-1]
        if fid and not cur["id"]:
            cur["id"] = fid
        fn = frag.get("function")
        if fn is None:
            return
        if not isinstance(fn, dict):
            self._bad()
            return
        name = fn.get("name")
        if isinstance(name, str) and name and name != cur["name"]:
            # Some servers split the name across fragments; most send it whole, once.
            cur["name"] = name if not cur["name"] else cur["name"] + name
        args = fn.get("arguments")
        if isinstance(args, str):
            cur["arguments"] += args
        elif isinstance(args, dict):  # a few servers send the object itself
            cur["arguments"] += json.dumps(args, ensure_ascii=False)

    @property
    def complete(self) -> bool:
        """The answer is finished: ``[DONE]`` was seen or choice 0 got a ``finish_reason``."""
        return self.done or self.finish_reason is not None

    def usage(self) -> PromptUsage | None:
        """The usage the stream reported (:func:`chat_prompt_usage`), None before or without it."""
        return chat_prompt_usage(self._usage)

    def message(self) -> dict[str, Any]:
        """Choice 0's assistant message as assembled so far, in OpenAI format."""
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        # A fragment that carried nothing usable (junk at a fresh index) leaves an empty shell: not a call.
        calls = [c for c in self._calls if c["id"] or c["name"] or c["arguments"]]
        if calls:
            msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for c in calls]
        return msg


class AnthropicStreamAssembler(_ServerSentEvents):
    """Rebuilds the assistant message of a streamed Anthropic Messages API answer.

    ``content_block_start`` opens block ``index`` as the event gives it; its deltas extend it —
    ``text_delta`` its text, ``thinking_delta`` its thinking, ``signature_delta`` its signature,
    ``citations_delta`` its citations, ``input_json_delta`` the JSON of a tool's input, parsed when the
    block stops (an input that is not JSON is kept as its text and counted in ``bad_events``).
    ``message_delta`` gives the ``stop_reason``, ``message_stop`` ends the answer, an ``error`` event
    fails it; ``ping`` and event types this does not know are skipped. Assembling never raises on
    upstream data: malformed events (a block ``index`` that is not an integer, or is above MAX_STREAM_INDEX)
    are counted in ``bad_events``. The usage is ``message_start``'s ``message.usage`` updated by each
    ``message_delta``'s ``usage`` (:func:`~contextrender.service.anthropic_messages.merged_usage`).
    """

    FINISH = "stop_reason"
    _EXTEND = {"text_delta": ("text", "text"), "thinking_delta": ("thinking", "thinking"),
               "signature_delta": ("signature", "signature")}

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.done = False  # saw ``message_stop``
        self.failed = False  # saw an ``error`` event
        self.bad_events = 0

    def _data_event(self, data: str) -> None:
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            self.bad_events += 1
            return
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            self._block_event(kind, obj)
        elif kind == "message_start":
            start = obj.get("message")
            content = start.get("content") if isinstance(start, dict) else None
            for i, block in enumerate(content if isinstance(content, list) else []):
                if isinstance(block, dict):
                    self._blocks[i] = dict(block)
            if isinstance(start, dict):
                self._usage = anthropic_messages.merged_usage(self._usage, start.get("usage"))
        elif kind == "message_delta":
            self._usage = anthropic_messages.merged_usage(self._usage, obj.get("usage"))
            delta = obj.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.stop_reason = delta["stop_reason"]
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.failed = True

    def _block_event(self, kind: str, obj: dict[str, Any]) -> None:
        index = _stream_index(obj.get("index"))
        if index is None:
            self.bad_events += 1
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict):
                self._blocks[index] = dict(block)
            else:
                self.bad_events += 1
        elif kind == "content_block_delta":
            self._delta(index, obj.get("delta"))
        else:
            self._stop(index)

    def _delta(self, index: int, delta: Any) -> None:
        block = self._blocks.get(index)
        if block is None or not isinstance(delta, dict) or not isinstance(delta.get("type"), str):
            self.bad_events += 1
            return
        kind = delta["type"]
        if kind in self._EXTEND:
            field, key = self._EXTEND[kind]
            piece, so_far = delta.get(key), block.get(field)
            if isinstance(piece, str):
                block[field] = (so_far if isinstance(so_far, str) else "") + piece
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self._json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "citations_delta" and "citation" in delta:
            cites = block.get("citations")
            block["citations"] = [*(cites if isinstance(cites, list) else []), delta["citation"]]

    def _stop(self, index: int) -> None:
        parts = self._json.pop(index, None)
        block = self._blocks.get(index)
        if block is None or not parts or not "".join(parts).strip():
            return  # no input streamed: the input the block started with stands
        raw = "".join(parts)
        try:
            block["input"] = json.loads(raw)
        except json.JSONDecodeError:
            self.bad_events += 1
            block["input"] = raw

    @property
    def complete(self) -> bool:
        """The answer is finished: ``message_stop`` or a ``stop_reason`` came, and no ``error`` event."""
        return (self.done or self.stop_reason is not None) and not self.failed

    def content(self) -> list[dict[str, Any]]:
        """The answer's content blocks as assembled so far, in index order (tool inputs still streaming
        are parsed as they stand)."""
        for index in list(self._json):
            self._stop(index)
        return [self._blocks[i] for i in sorted(self._blocks)]

    def usage(self) -> PromptUsage | None:
        """The usage the stream reported so far (:func:`~contextrender.service.anthropic_messages.prompt_usage`),
        None without ``message_start``'s."""
        return anthropic_messages.prompt_usage(self._usage) if self._usage else None

    def message(self) -> dict[str, Any]:
        """The answer as the OpenAI-format assistant message the graph stores
        (:func:`~contextrender.service.anthropic_messages.assistant_message`)."""
        return assistant_message(self.content())


class ResponsesStreamAssembler(_ServerSentEvents):
    """Rebuilds the output of a streamed OpenAI Responses API answer.

    ``response.output_item.added`` opens item ``output_index``; ``response.output_text.delta`` and
    ``response.refusal.delta`` extend its content part ``content_index``, ``response.function_call_arguments.delta``
    its arguments and ``response.custom_tool_call_input.delta`` its input; the matching ``.done`` events and
    ``response.output_item.done`` replace what the deltas built with the finished text or item. The
    terminal event's response (``response.completed``, or ``response.incomplete``: cut short, still an answer)
    gives the whole output when it lists one; ``response.failed`` and ``error`` fail the answer. Other events
    are skipped. Assembling never raises on upstream data: malformed events are counted in ``bad_events`` —
    an ``output_index`` that is not an integer or is above MAX_STREAM_INDEX among them, and a
    ``content_index`` beyond the next part of its item. The usage is the latest event's non-null
    ``response.usage`` (``response.completed``'s; the events before it carry none).
    """

    FINISH = "response.completed"
    _TERMINAL = frozenset({"response.completed", "response.incomplete"})
    _EXTEND = {"response.function_call_arguments.delta": "arguments", "response.custom_tool_call_input.delta": "input"}
    _FINISHED = {"response.function_call_arguments.done": "arguments", "response.custom_tool_call_input.done": "input"}

    def __init__(self) -> None:
        super().__init__()
        self._items: dict[int, dict[str, Any]] = {}
        self._final: list[Any] | None = None
        self._usage: Any = None
        self.status: str | None = None
        self.done = False  # saw the terminal event
        self.failed = False  # saw ``response.failed`` or ``error``
        self.bad_events = 0

    def _data_event(self, data: str) -> None:
        if data.strip() == "[DONE]":  # not the Responses API's, but some compatible servers end with it
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            self.bad_events += 1
            return
        kind = obj.get("type") if isinstance(obj, dict) else None
        resp = obj.get("response") if isinstance(obj, dict) else None
        if isinstance(resp, dict) and resp.get("usage") is not None:
            self._usage = resp["usage"]
        if not isinstance(kind, str):
            self.bad_events += 1
        elif kind in self._TERMINAL:
            self.done = True
            resp = obj.get("response")
            output = resp.get("output") if isinstance(resp, dict) else None
            self.status = resp.get("status") if isinstance(resp, dict) else None
            if isinstance(output, list) and output:
                self._final = output
        elif kind in ("response.failed", "error"):
            self.failed = True
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item, index = obj.get("item"), self._index(obj)
            if isinstance(item, dict) and index is not None:
                self._items[index] = dict(item)
            else:
                self.bad_events += 1
        elif kind in ("response.output_text.delta", "response.output_text.done", "response.refusal.delta",
                      "response.refusal.done", "response.content_part.added", "response.content_part.done"):
            self._part_event(kind, obj)
        elif kind in self._EXTEND or kind in self._FINISHED:
            self._call_event(kind, obj)

    def _index(self, obj: dict[str, Any]) -> int | None:
        return _stream_index(obj.get("output_index"))

    def _item(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        index = self._index(obj)
        item = self._items.get(index) if index is not None else None
        if item is None:
            self.bad_events += 1
        return item

    def _part_event(self, kind: str, obj: dict[str, Any]) -> None:
        item = self._item(obj)
        if item is None:
            return
        content = item.get("content")
        parts = list(content) if isinstance(content, list) else []
        j = _stream_index(obj.get("content_index", 0))
        if j is None or j < 0 or j > len(parts):  # not an index, or more than the next part: never padded up to it
            self.bad_events += 1
            return
        if j == len(parts):
            parts.append({})
        part = dict(parts[j]) if isinstance(parts[j], dict) else {}
        if kind.startswith("response.content_part."):
            if isinstance(obj.get("part"), dict):
                part = dict(obj["part"])
        else:
            field = "refusal" if kind.startswith("response.refusal.") else "text"
            part.setdefault("type", "refusal" if field == "refusal" else "output_text")
            if kind.endswith(".delta") and isinstance(obj.get("delta"), str):
                so_far = part.get(field)
                part[field] = (so_far if isinstance(so_far, str) else "") + obj["delta"]
            elif kind.endswith(".done") and isinstance(obj.get(field), str):
                part[field] = obj[field]
        parts[j] = part
        item["content"] = parts

    def _call_event(self, kind: str, obj: dict[str, Any]) -> None:
        item = self._item(obj)
        if item is None:
            return
        if kind in self._EXTEND and isinstance(obj.get("delta"), str):
            field = self._EXTEND[kind]
            so_far = item.get(field)
            item[field] = (so_far if isinstance(so_far, str) else "") + obj["delta"]
        elif kind in self._FINISHED and isinstance(obj.get(self._FINISHED[kind]), str):
            item[self._FINISHED[kind]] = obj[self._FINISHED[kind]]

    @property
    def complete(self) -> bool:
        """The answer is finished (``response.completed`` or ``response.incomplete``) and did not fail."""
        return self.done and not self.failed

    def output(self) -> list[Any]:
        """The answer's output items: the terminal response's, else the items as assembled so far."""
        if self._final is not None:
            return list(self._final)
        return [self._items[i] for i in sorted(self._items)]

    def usage(self) -> PromptUsage | None:
        """The usage the stream reported (:func:`~contextrender.service.responses_api.prompt_usage`), None
        before ``response.completed`` or without one."""
        return responses_api.prompt_usage(self._usage)

    def message(self) -> dict[str, Any]:
        """The answer as the OpenAI-format assistant message the graph stores
        (:func:`~contextrender.service.responses_api.assistant_message`); an item it cannot read (a call
        without its ``call_id``) is left out and counted in ``bad_events``."""
        items = []
        for item in self.output():
            try:
                responses_assistant_message([item])
            except ServiceError:
                self.bad_events += 1
            else:
                items.append(item)
        return responses_assistant_message(items)


__all__ = ["AnthropicStreamAssembler", "MAX_STREAM_INDEX", "ResponsesStreamAssembler", "StreamAssembler",
           "chat_prompt_usage", "forwarded_messages"]
