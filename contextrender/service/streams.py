"""Between an OpenAI-compatible client and the model: what goes up, and what comes back streamed.

:func:`forwarded_messages` is the forwarding rule the proxy and the wrapper share: the rendered
history in the client's own message objects, only changed bodies replaced. :class:`StreamAssembler`
rebuilds the assistant message from a streamed answer (SSE bytes), so both can record it.
Neither knows about HTTP or the graph.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from contextrender.events import Message
from contextrender.service.results import RenderResult


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


class StreamAssembler:
    """Rebuilds choice 0's assistant message from OpenAI SSE chunks.

    Content deltas are concatenated. Tool-call fragments follow OpenAI's
    chunk semantics: a fragment's ``index`` names its call; a fragment with
    an ``id`` the call at that index (or, without an index, the latest call)
    does not have starts a new call; a fragment with neither index nor id
    continues the latest call. The id and name come from the first fragment
    that has them; argument strings are concatenated in arrival order.
    Malformed events (not JSON, a non-object delta or fragment) are counted
    in ``bad_events`` and skipped: assembling never raises on upstream data.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._content: list[str] = []
        self._calls: list[dict[str, Any]] = []  # in order of first appearance
        self._by_index: dict[int, int] = {}  # fragment index -> position in _calls
        self.finish_reason: str | None = None
        self.done = False  # saw ``data: [DONE]``
        self.bad_events = 0

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
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            self.bad_events += 1
            return
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


__all__ = ["StreamAssembler", "forwarded_messages"]
