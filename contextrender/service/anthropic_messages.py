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
(:func:`repair_pairing` removes what a render left unpaired, which only ever lowers the count), and user and
no two user messages go together (:func:`alternating` merges two that the render left adjacent).
The client's prompt-cache breakpoints stay valid (:func:`keep_breakpoints`): each one on a kept block
stays there, one on a dropped block moves back to the nearest kept block that can carry it, and never
more than :data:`MAX_BREAKPOINTS` go upstream.

Nothing here knows about HTTP or the graph; request data is only read, never evaluated.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextrender import expand as expand_tool
from contextrender.billing import PromptUsage
from contextrender.service.errors import InvalidMessages
from contextrender.service.expansion import Wire
from contextrender.service.results import RenderResult
from contextrender.service.usage import prompt_usage as usage_counts

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


#: A block the forwarding made from one of the client's, by id: (the new block, the client's block). The new
#: block is held so that its id stays its own; :func:`keep_breakpoints` reads where each block came from.
_Made = dict[int, tuple[Any, Any]]


def _derived(block: Mapping[str, Any], made: _Made, **change: Any) -> dict[str, Any]:
    """The client's ``block`` with ``change`` (every other key, ``cache_control`` included, in its place)."""
    new = {**block, **change}
    made[id(new)] = (new, block)
    return new


def _with_text(blocks: Sequence[Any], text: str, keep: Callable[[Any], bool], made: _Made) -> list[Any]:
    """``blocks`` that ``keep`` accepts, their text blocks replaced by ``text`` in the first one's place — or, when
    ``text`` is one text block's own text (a task left with the user's words, docs/method.md §5 "The task"),
    by that block as sent."""
    own = next((b for b in blocks if keep(b) and _kind(b) == "text" and b.get("text") == text), None) if text else None
    if own is not None:
        return [b for b in blocks if keep(b) and (_kind(b) != "text" or b is own)]
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
                out.append(_derived(b, made, text=text))
    if text and not placed:
        out.append({"type": "text", "text": text})
    return out


def _assistant_back(orig: Mapping[str, Any], piece: _Piece, made: _Made) -> Any:
    if not piece.changed:
        return orig
    text = piece.rendered.get("content") or ""
    content = orig.get("content")
    if not isinstance(content, list):
        return {**orig, "content": text}
    calls = set(_call_ids(piece.rendered))

    def keep(b: Any) -> bool:
        return _kind(b) != "tool_use" or b.get("id") in calls

    if text == text_of(content):  # only calls went: its text blocks stay as sent (docs/service.md, "Cache breakpoints")
        return {**orig, "content": [b for b in content if keep(b)]}
    return {**orig, "content": _with_text(content, text, keep, made)}


def _user_back(orig: Mapping[str, Any], pieces: Sequence[_Piece], made: _Made) -> Any:
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
                kept.append(b if not p.changed else _derived(b, made, content=p.rendered.get("content") or ""))
        elif own is not None:
            kept.append(b)
    if own is not None and own.changed:
        kept = _with_text(kept, own.rendered.get("content") or "", lambda b: True, made)
    if len(kept) == len(content) and all(a is b for a, b in zip(kept, content, strict=True)):
        return orig
    return {**orig, "content": kept}


def _inserted(piece: _Piece) -> dict[str, Any] | None:
    text = piece.rendered.get("content") or ""
    if not text:
        return None
    role = ASSISTANT if piece.rendered.get("role") == ASSISTANT else USER
    return {"role": role, "content": text}


def forwarded_messages(original: Sequence[Any], converted: Converted, render: RenderResult, *,
                       request: Mapping[str, Any] | None = None) -> list[Any]:
    """The render of ``converted`` (the conversion of ``original``) as the client's own Messages API messages.

    After a sync, stored seq i is converted message i (``render.layout`` indexes ``converted``); each
    rendered message is mapped back to the request message it came from, the pieces of one user message
    (its results, its own part) are put back together in their original block order, pairing is made
    valid (:func:`repair_pairing`), no two user messages are adjacent if the client's turns alternated (:func:`alternating`)
    and the client's cache breakpoints are kept valid
    (:func:`keep_breakpoints`). ``request``: the client's request body, whose ``tools``, ``system`` and
    top-level ``cache_control`` breakpoints go upstream as sent and count towards the cap.
    """
    made: _Made = {}
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
            msg = _assistant_back(original[i], ps[0], made)
        else:
            msg = _user_back(original[i], ps, made)
        if msg is not None:
            out.append(msg)
    out = repair_pairing(out)
    if all(_role(a) != _role(b) for a, b in zip(original, original[1:], strict=False)):
        out = alternating(out)  # a client that alternates gets a render that does
    return keep_breakpoints(original, out, made, request)


def _as_blocks(msg: Mapping[str, Any]) -> list[Any]:
    content = msg.get("content")
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def alternating(messages: Sequence[Any]) -> list[Any]:
    """``messages`` with each run of adjacent user messages merged into one, their blocks in order.

    The Messages API takes user and assistant turns in alternation; a render that leaves out the turns between
    two messages of one role (an old assistant turn between the task and a later user turn, a user message
    that was a client's wrapped blocks alone: docs/method.md §5) would send them back to back. Merging keeps
    every block the render kept, each the client's own object (a string content becomes one text block), so
    the breakpoints stay where they were; pairing stays valid, as a user message after another user message
    holds no ``tool_result`` once repaired. Two assistant messages a repair left adjacent (one that lost its
    calls) are not merged yet.
    Messages not merged stay the same objects. :func:`forwarded_messages` merges when the client's own
    messages alternate (every CLI and SDK here sends them so); a client that sent two of one role together
    gets its messages as it sent them."""
    out: list[Any] = []
    for m in messages:
        if out and _role(m) == USER and _role(out[-1]) == USER:
            out[-1] = {**out[-1], "content": _as_blocks(out[-1]) + _as_blocks(m)}
        else:
            out.append(m)
    return out


# -- cache breakpoints (docs/service.md, "Cache breakpoints") -------------------------------------

#: The most ``cache_control`` breakpoints the Messages API takes in one request (tools, system and messages
#: together); it refuses a request with more.
MAX_BREAKPOINTS = 4
#: The blocks a breakpoint may be moved onto. The API refuses one on a thinking or redacted thinking block
#: and on an empty text block; a kind not listed here is passed over, never marked.
_CARRIERS = frozenset({"text", "image", "document", "tool_use", "tool_result"})


def _breakpoint(block: Any) -> Mapping[str, Any] | None:
    cc = block.get("cache_control") if isinstance(block, Mapping) else None
    return cc if isinstance(cc, Mapping) else None


def _content(item: Any) -> list[Any]:
    """A message's (or a ``tool_result``'s) content blocks; none for a string."""
    content = item.get("content") if isinstance(item, Mapping) else None
    return content if isinstance(content, list) else []


def _marks(block: Any) -> list[Mapping[str, Any]]:
    """The breakpoints on ``block`` and, for a ``tool_result``, on the blocks of its content."""
    inner = _content(block) if _kind(block) == "tool_result" else []
    return [cc for b in (block, *inner) if (cc := _breakpoint(b)) is not None]


def _can_carry(block: Any) -> bool:
    kind = _kind(block)
    return kind in _CARRIERS and (kind != "text" or bool(block.get("text")))


def _one_hour(cc: Mapping[str, Any]) -> bool:
    return cc.get("ttl") == "1h"


def _outside_messages(request: Mapping[str, Any] | None) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None]:
    """The breakpoints a request carries outside its messages: on its tools and system blocks (in the order the
    provider renders them, before every message), and a top-level ``cache_control`` (automatic caching, which
    the provider puts on the last block: counted as one more)."""
    if request is None:
        return [], None
    head: list[Mapping[str, Any]] = []
    for part in (request.get("tools"), request.get("system")):
        if isinstance(part, list):
            head += [cc for b in part if (cc := _breakpoint(b)) is not None]
    return head, _breakpoint(request)


def _ttl_in_order(marks: Sequence[tuple[tuple[int, int], bool]], at: tuple[int, int], one_hour: bool) -> bool:
    """Whether a breakpoint at ``at`` keeps every 1h breakpoint before every 5m one (the API's rule)."""
    if one_hour:
        return not any(where < at and not long for where, long in marks)
    return not any(where > at and long for where, long in marks)


def keep_breakpoints(original: Sequence[Any], forwarded: Sequence[Any],
                     made: Mapping[int, tuple[Any, Any]] | None = None,
                     request: Mapping[str, Any] | None = None) -> list[Any]:
    """``forwarded`` (a render of the client's ``original`` messages) with the client's cache breakpoints valid.

    The provider caches the prefix up to each ``cache_control`` breakpoint and a later request reads it
    only if every block before it is unchanged (docs/service.md, "Cache breakpoints"). So a render keeps
    what the client asked to have cached, and changes nothing the method did not choose:

    1. a breakpoint on a block the render kept stays on it (kept blocks are the client's own objects; an
       omitted result's ``tool_result`` keeps its own ``cache_control``);
    2. a breakpoint the render dropped — with its block, or inside an omitted result's content — moves to
       the nearest block at or before its place, in the same message or an earlier one, that the render
       kept and that can carry one (not thinking, redacted thinking or empty text), so the prefix that is
       left of what the client marked is still marked; if that block already carries one, nothing is added;
    3. a moved breakpoint is left out if it would make more than :data:`MAX_BREAKPOINTS` in the request
       (``request``'s tools, system and top-level ``cache_control`` counted) or put a 1h TTL after a 5m
       one; the client's own are never removed, and nothing goes onto ``request``'s tools or system.

    ``made``: the blocks forwarding derived from the client's (a marker in a ``tool_result``, a clipped
    text), by id, as (derived block, the client's block). Messages that take no breakpoint stay the same
    objects; one that does is a copy, the client's objects are never changed.
    """
    made = made or {}
    where: dict[int, list[tuple[int, int]]] = {}
    for i, m in enumerate(original):
        for j, b in enumerate(_content(m)):
            where.setdefault(id(b), []).append((i, j))
    # each forwarded block's place in the client's request (None: the render's own); forwarded keeps the
    # client's order, so a block object the client sent twice is at the next of its places
    placed: list[tuple[tuple[int, int] | None, int, int]] = []
    kept: dict[tuple[int, int], Any] = {}
    last = (-1, -1)
    for k, m in enumerate(forwarded):
        for n, b in enumerate(_content(m)):
            src = made[id(b)][1] if id(b) in made else b
            pos = next((p for p in where.get(id(src), ()) if p > last), None)
            if pos is not None:
                kept[pos] = b
                last = pos
            placed.append((pos, k, n))
    # each breakpoint the render lost (its block dropped, or the content it sat in replaced) and its place
    lost: list[tuple[tuple[int, int], Mapping[str, Any]]] = []
    for i, m in enumerate(original):
        for j, b in enumerate(_content(m)):
            still = {id(cc) for cc in _marks(kept.get((i, j)))}
            lost += [((i, j), cc) for cc in _marks(b) if id(cc) not in still]
    out = list(forwarded)
    if not lost:
        return out
    head, top = _outside_messages(request)
    marks = [((-1, n), _one_hour(cc)) for n, cc in enumerate(head)]
    marks += [((k, n), _one_hour(cc)) for _, k, n in placed for cc in _marks(_content(out[k])[n])]
    if top is not None:
        marks.append(((len(out), 0), _one_hour(top)))
    for limit, cc in lost:
        target = _nearest_carrier(out, placed, limit)
        if target is None:
            continue
        k, n = target
        block = _content(out[k])[n]
        if _marks(block) or len(marks) >= MAX_BREAKPOINTS or not _ttl_in_order(marks, target, _one_hour(cc)):
            continue  # already marked there; or the cap, or the TTL order, leaves the moved one out
        content = list(_content(out[k]))
        content[n] = {**block, "cache_control": cc}
        out[k] = {**out[k], "content": content}
        marks.append((target, _one_hour(cc)))
    return out


def _nearest_carrier(out: Sequence[Any], placed: Sequence[tuple[tuple[int, int] | None, int, int]],
                     limit: tuple[int, int]) -> tuple[int, int] | None:
    """Where in ``out`` the kept block nearest at or before the client's place ``limit`` is that carries a
    breakpoint or can carry one (None: there is none). The block at ``limit`` is there only when the render
    kept it with other content (an omitted result), which is where a breakpoint inside it moves."""
    for pos, k, n in reversed(placed):
        if pos is None or pos > limit:
            continue
        block = _content(out[k])[n]
        if _marks(block) or _can_carry(block):
            return k, n
    return None


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


# -- usage as billed (docs/service.md, "Prompt-cache usage") ----------------------------------------------

#: The fields of a Messages API ``usage`` object that say what a request was billed.
USAGE_FIELDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")


def prompt_usage(usage: Any) -> PromptUsage | None:
    """A Messages API answer's ``usage`` as billed, or None (unknown: absent, or not counts).

    Anthropic's ``input_tokens`` is only the uncached part of the prompt: the prompt is it plus
    ``cache_read_input_tokens`` (read from the cache) and ``cache_creation_input_tokens`` (written to it,
    docs/method.md §14); ``output_tokens`` is the output.
    """
    if not isinstance(usage, Mapping):
        return None
    return usage_counts(None, usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens"),
                        usage.get("output_tokens"), uncached=usage.get("input_tokens"))


def merged_usage(so_far: Mapping[str, Any], update: Any) -> dict[str, Any]:
    """A streamed answer's usage after one more event's ``usage``: each of :data:`USAGE_FIELDS` the latest non-null
    value given (``message_start`` carries the input and cache figures, each ``message_delta`` the output so far and
    possibly the cumulative input and cache figures again); other fields are not kept."""
    out = dict(so_far)
    if isinstance(update, Mapping):
        for name in USAGE_FIELDS:
            if update.get(name) is not None:
                out[name] = update[name]
    return out



# -- the expand tool's rounds (docs/service.md, "The expand tool") ------------------------------


def expand_round(content: Sequence[Any], answers: Mapping[str, tuple[str, bool]]) -> list[dict[str, Any]]:
    """What one answered round of ``contextrender_expand`` appends to a Messages API request: the assistant turn as
    the upstream gave it (its ``content`` blocks; ``tool_use`` blocks the service did not answer left out, the
    model makes those calls again) and a user turn of ``tool_result`` blocks, one per answered call in order.
    ``answers``: per ``tool_use`` id, the result's text and whether it is an error."""
    blocks = [b for b in content
              if not (isinstance(b, Mapping) and b.get("type") == "tool_use" and b.get("id") not in answers)]
    results: list[dict[str, Any]] = []
    for cid, (text, error) in answers.items():
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": cid, "content": text}
        if error:
            block["is_error"] = True
        results.append(block)
    return [{"role": "assistant", "content": blocks}, {"role": "user", "content": results}]


def answer_content(data: Any) -> list[Any]:
    """A whole Messages API answer's ``content`` blocks (empty when it has none)."""
    content = data.get("content") if isinstance(data, Mapping) else None
    return list(content) if isinstance(content, list) else []

def tool_name(tool: Any) -> str | None:
    """The name of a ``tools`` entry (``{"name": ...}``)."""
    return tool.get("name") if isinstance(tool, dict) else None


#: The expand loop's pieces in this API (:class:`~contextrender.service.expansion.Wire`): rounds are appended to
#: ``messages``; a whole answer's and a stream's raw answer is its content blocks.
WIRE = Wire("messages", expand_tool.messages_tool, tool_name, answer_content, lambda asm: asm.content(), expand_round)


__all__ = ["WIRE", "MAX_BREAKPOINTS", "Converted", "Origin", "USAGE_FIELDS", "alternating", "answer_content",
           "assistant_message", "expand_round", "forwarded_messages",
           "keep_breakpoints", "merged_usage", "pairing_errors", "prompt_usage", "repair_pairing", "text_of", "to_openai",
           "tool_result_ids", "tool_use_ids"]
