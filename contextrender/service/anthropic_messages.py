"""The Anthropic Messages API over the graph's OpenAI chat format, both ways (docs/service.md, "Messages API").

The graph stores OpenAI chat messages (:mod:`contextrender.events`); a Messages API request is another
shape of the same conversation. :func:`to_openai` converts a request's ``system`` and ``messages``:

- ``system`` (a string, or a list of text blocks) → leading system message(s), one per text block;
- an assistant message → one assistant message: its text blocks joined by newlines, each ``tool_use``
  block a tool call whose arguments are its ``input`` as a JSON string;
- a user message → one tool message per ``tool_result`` block (its text: a string ``content``, or the
  text blocks of a list), then, if the message holds any other block (or is a plain string), one user
  message with the text of its text blocks.

Thinking blocks, images and other non-text blocks carry no text into the graph, so they are not charged
to B (an image costs no text tokens on the OpenAI path either): the history charged to B is the text of
text, ``tool_use`` and ``tool_result`` blocks (docs/method.md §1), and a conversation stored through either
API is the same session. Thinking and redacted thinking blocks are forwarded as sent, signatures included,
in every assistant message the render keeps, whatever their size.

:func:`forwarded_messages` turns a render of that history back into the client's own Messages API
messages: every kept message and block is the client's own object (``cache_control``, thinking blocks
and their signatures, images untouched); an omitted result's ``tool_result`` gets the render's text
as its ``content``; a clipped task keeps its non-text blocks and its first text block carries the
clipped text. The result always pairs: every ``tool_use`` has its ``tool_result`` in the next user
message and every ``tool_result`` answers a ``tool_use`` of the assistant message just before it
(:func:`repair_pairing` removes what a render left unpaired, which only ever lowers the count).

Nothing here knows about HTTP or the graph; request data is only read, never evaluated.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextrender.service.errors import InvalidMessages
from contextrender.service.results import RenderResult

SYSTEM = "system"
USER = "user"
ASSISTANT = "assistant"
RESULT = "result"


@dataclass(frozen=True)
class Origin:
    """Where a converted message came from: ``kind`` (one of SYSTEM, USER, ASSISTANT, RESULT), the index of
    the request's message (-1 for the system prompt) and, for a RESULT, its ``tool_result`` block."""

    kind: str
    index: int
    block: int = -1


@dataclass(frozen=True)
class Converted:
    """A Messages API conversation as OpenAI chat messages, and the origin of each."""

    messages: tuple[dict[str, Any], ...]
    origins: tuple[Origin, ...]


def _kind(block: Any) -> str | None:
    return block.get("type") if isinstance(block, Mapping) and isinstance(block.get("type"), str) else None


def text_of(blocks: Sequence[Any]) -> str:
    """The text blocks' text, joined by newlines (as OpenAI content parts are joined)."""
    return "\n".join(b["text"] for b in blocks if _kind(b) == "text" and isinstance(b.get("text"), str))


def _blocks(content: Any, where: str) -> list[Mapping[str, Any]] | None:
    """The content's blocks, None for a plain string; anything else is refused, naming where."""
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        raise InvalidMessages(f"{where}.content must be a string or a list of content blocks")
    for j, block in enumerate(content):
        if _kind(block) is None:
            raise InvalidMessages(f"{where}.content[{j}] must be an object with a string 'type'")
    return content


def _result_text(block: Mapping[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None:
        return ""
    inner = _blocks(content, where)
    return content if inner is None else text_of(inner)


def _arguments(value: Any) -> str:
    # A string is what an unparseable streamed input was kept as; anything else is the call's JSON input.
    return value if isinstance(value, str) else json.dumps({} if value is None else value, ensure_ascii=False)


def _tool_call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id, name = block.get("id"), block.get("name")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
        raise InvalidMessages(f"{where}: a tool_use block needs a non-empty string 'id' and a string 'name'")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(block.get("input"))}}


def assistant_message(content: Any, where: str = "content") -> dict[str, Any]:
    """An assistant message's (or a response's) content as one OpenAI assistant message."""
    blocks = _blocks(content, where)
    if blocks is None:
        return {"role": "assistant", "content": content}
    msg: dict[str, Any] = {"role": "assistant", "content": text_of(blocks)}
    calls = [_tool_call(b, f"{where}[{j}]") for j, b in enumerate(blocks) if _kind(b) == "tool_use"]
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user_messages(content: Any, i: int, where: str) -> list[tuple[dict[str, Any], Origin]]:
    blocks = _blocks(content, where)
    if blocks is None:
        return [({"role": "user", "content": content}, Origin(USER, i))]
    out: list[tuple[dict[str, Any], Origin]] = []
    for j, b in enumerate(blocks):
        if _kind(b) != "tool_result":
            continue
        call_id = b.get("tool_use_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessages(f"{where}.content[{j}]: a tool_result block needs a non-empty string 'tool_use_id'")
        out.append(({"role": "tool", "tool_call_id": call_id, "content": _result_text(b, f"{where}.content[{j}]")},
                    Origin(RESULT, i, j)))
    if not out or len(out) < len(blocks):  # other blocks (or none at all): the user's own part of the message
        out.append(({"role": "user", "content": text_of(blocks)}, Origin(USER, i)))
    return out


def _system_messages(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, list):
        raise InvalidMessages("'system' must be a string or a list of text blocks")
    return [{"role": "system", "content": b["text"]} for b in system
            if _kind(b) == "text" and isinstance(b.get("text"), str)]


def to_openai(system: Any, messages: Any) -> Converted:
    """A Messages API request's ``system`` and ``messages`` as OpenAI chat messages (module docstring).

    Raises:
        InvalidMessages: a message or block that is not the Messages API's (naming it); nothing is stored.
    """
    if not isinstance(messages, list):
        raise InvalidMessages("'messages' must be a list of messages")
    pairs = [(m, Origin(SYSTEM, -1)) for m in _system_messages(system)]
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping) or m.get("role") not in (USER, ASSISTANT):
            raise InvalidMessages(f"{where} must be an object whose 'role' is 'user' or 'assistant'")
        if m["role"] == ASSISTANT:
            pairs.append((assistant_message(m.get("content"), f"{where}.content"), Origin(ASSISTANT, i)))
        else:
            pairs.extend(_user_messages(m.get("content"), i, where))
    return Converted(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


# -- a render back into the client's messages ---------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """One rendered message: its origin (None: inserted by the render) and what it says."""

    origin: Origin | None
    rendered: Mapping[str, Any]
    changed: bool


def _call_ids(msg: Mapping[str, Any]) -> list[Any]:
    return [c.get("id") for c in msg.get("tool_calls") or [] if isinstance(c, Mapping)]


def _pieces(converted: Converted, render: RenderResult) -> list[_Piece]:
    out = []
    for msg, seq in zip(render.messages, render.layout, strict=True):
        if seq is None:
            out.append(_Piece(None, msg, True))
            continue
        origin, mine = converted.origins[seq], converted.messages[seq]
        if origin.kind == SYSTEM:
            continue  # the request's own ``system`` goes upstream unchanged
        changed = (msg.get("content") or "") != (mine.get("content") or "") or _call_ids(msg) != _call_ids(mine)
        out.append(_Piece(origin, msg, changed))
    return out


def _with_text(blocks: Sequence[Any], text: str, keep: Callable[[Any], bool]) -> list[Any]:
    """``blocks`` that ``keep`` accepts, their text blocks replaced by ``text`` in the first one's place."""
    out: list[Any] = []
    placed = False
    for b in blocks:
        if not keep(b):
            continue
        if _kind(b) != "text":
            out.append(b)
        elif not placed:
            placed = True
            if text:
                out.append({**b, "text": text})
    if text and not placed:
        out.append({"type": "text", "text": text})
    return out


def _assistant_back(orig: Mapping[str, Any], piece: _Piece) -> Any:
    if not piece.changed:
        return orig
    text = piece.rendered.get("content") or ""
    content = orig.get("content")
    if not isinstance(content, list):
        return {**orig, "content": text}
    calls = set(_call_ids(piece.rendered))
    return {**orig, "content": _with_text(content, text,
                                          lambda b: _kind(b) != "tool_use" or b.get("id") in calls)}


def _user_back(orig: Mapping[str, Any], pieces: Sequence[_Piece]) -> Any:
    """User message ``orig`` with only the rendered pieces of it, each as the render left it."""
    content = orig.get("content")
    own = next((p for p in pieces if p.origin is not None and p.origin.kind == USER), None)
    if not isinstance(content, list):
        return orig if own is None or not own.changed else {**orig, "content": own.rendered.get("content") or ""}
    results = {p.origin.block: p for p in pieces if p.origin is not None and p.origin.kind == RESULT}
    kept: list[Any] = []
    for j, b in enumerate(content):
        if _kind(b) == "tool_result":
            p = results.get(j)
            if p is not None:
                kept.append(b if not p.changed else {**b, "content": p.rendered.get("content") or ""})
        elif own is not None:
            kept.append(b)
    if own is not None and own.changed:
        kept = _with_text(kept, own.rendered.get("content") or "", lambda b: True)
    if len(kept) == len(content) and all(a is b for a, b in zip(kept, content, strict=True)):
        return orig
    return {**orig, "content": kept}


def _inserted(piece: _Piece) -> dict[str, Any] | None:
    text = piece.rendered.get("content") or ""
    if not text:
        return None
    role = ASSISTANT if piece.rendered.get("role") == ASSISTANT else USER
    return {"role": role, "content": text}


def forwarded_messages(original: Sequence[Any], converted: Converted, render: RenderResult) -> list[Any]:
    """The render of ``converted`` (the conversion of ``original``) as the client's own Messages API messages.

    After a sync, stored seq i is converted message i (``render.layout`` indexes ``converted``); each
    rendered message is mapped back to the request message it came from, the pieces of one user message
    (its results, its own part) are put back together in their original block order, and pairing is
    made valid (:func:`repair_pairing`).
    """
    groups: list[tuple[int | None, list[_Piece]]] = []
    for p in _pieces(converted, render):
        i = p.origin.index if p.origin is not None else None
        if i is not None and groups and groups[-1][0] == i:
            groups[-1][1].append(p)
        else:
            groups.append((i, [p]))
    out: list[Any] = []
    for i, ps in groups:
        if i is None:
            msg = _inserted(ps[0])
        elif ps[0].origin is not None and ps[0].origin.kind == ASSISTANT:
            msg = _assistant_back(original[i], ps[0])
        else:
            msg = _user_back(original[i], ps)
        if msg is not None:
            out.append(msg)
    return repair_pairing(out)


# -- pairing --------------------------------------------------------------------------------------


def _ids(msg: Any, kind: str, key: str) -> list[Any]:
    content = msg.get("content") if isinstance(msg, Mapping) else None
    if not isinstance(content, list):
        return []
    return [b.get(key) for b in content if _kind(b) == kind]


def tool_use_ids(msg: Any) -> list[Any]:
    """The ids of an assistant message's ``tool_use`` blocks."""
    return _ids(msg, "tool_use", "id")


def tool_result_ids(msg: Any) -> list[Any]:
    """The ``tool_use_id`` of each of a user message's ``tool_result`` blocks."""
    return _ids(msg, "tool_result", "tool_use_id")


def _role(msg: Any) -> Any:
    return msg.get("role") if isinstance(msg, Mapping) else None


def _only_paired(msg: Any, kind: str, key: str, paired: set[Any]) -> Any:
    """``msg`` without its ``kind`` blocks whose ``key`` is not in ``paired`` (itself if none goes)."""
    content = msg.get("content")
    kept = [b for b in content if _kind(b) != kind or b.get(key) in paired]
    return msg if len(kept) == len(content) else {**msg, "content": kept}


def _repair_once(messages: Sequence[Any]) -> list[Any]:
    out = []
    last = len(messages) - 1
    for k, m in enumerate(messages):
        if _role(m) == ASSISTANT and k < last:  # a trailing assistant message is the client's prefill
            nxt = messages[k + 1]
            answered = set(tool_result_ids(nxt)) if _role(nxt) == USER else set()
            if tool_use_ids(m):
                m = _only_paired(m, "tool_use", "id", answered)
        elif _role(m) == USER and tool_result_ids(m):
            prev = messages[k - 1] if k else None
            asked = set(tool_use_ids(prev)) if _role(prev) == ASSISTANT else set()
            m = _only_paired(m, "tool_result", "tool_use_id", asked)
        if isinstance(m.get("content"), list) and not m["content"]:
            continue  # nothing left of it
        out.append(m)
    return out


def repair_pairing(messages: Sequence[Any]) -> list[Any]:
    """``messages`` with every unpaired ``tool_use`` / ``tool_result`` block removed (and messages left
    empty), repeated until nothing changes. Messages that need nothing removed stay the same objects."""
    current = list(messages)
    while True:
        nxt = _repair_once(current)
        if len(nxt) == len(current) and all(a is b for a, b in zip(nxt, current, strict=True)):
            return current
        current = nxt


def pairing_errors(messages: Sequence[Any]) -> list[str]:
    """What the Messages API would refuse about tool pairing in ``messages`` (empty when they pair)."""
    errors = []
    for k, m in enumerate(messages):
        nxt = messages[k + 1] if k + 1 < len(messages) else None
        prev = messages[k - 1] if k else None
        if _role(m) == ASSISTANT and nxt is not None:
            missing = set(tool_use_ids(m)) - (set(tool_result_ids(nxt)) if _role(nxt) == USER else set())
            errors += [f"messages[{k}]: tool_use {i!r} has no tool_result in the next message" for i in sorted(missing)]
        if _role(m) == USER:
            orphan = set(tool_result_ids(m)) - (set(tool_use_ids(prev)) if _role(prev) == ASSISTANT else set())
            errors += [f"messages[{k}]: tool_result {i!r} answers no tool_use of the message before"
                       for i in sorted(orphan)]
    return errors


__all__ = ["Converted", "Origin", "assistant_message", "forwarded_messages", "pairing_errors", "repair_pairing",
           "text_of", "to_openai", "tool_result_ids", "tool_use_ids"]
