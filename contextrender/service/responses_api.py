"""The OpenAI Responses API over the graph's OpenAI chat format, both ways (docs/service.md, "Responses API").

The graph stores OpenAI chat messages (:mod:`contextrender.events`); a Responses API request's
``instructions`` and ``input`` are another shape of the same conversation. :func:`to_openai` converts them:

- ``instructions`` (a string) → the leading system message; it goes upstream as sent, never through the render;
- ``input`` as a string → one user message;
- a ``message`` item → a message of its role (system, developer, user or assistant) whose text is the
  text of its text parts (``input_text``, ``output_text``, a ``refusal``'s words), joined by newlines;
  images, files and audio carry no text, as on the chat path;
- a run of assistant-side items (what a response's output holds: assistant messages, tool calls,
  reasoning, server-side tool calls such as ``web_search_call``, compaction items) → one assistant
  message, so an answer recorded from a response and the same items sent back by the client are the
  same stored message. Only messages and tool calls carry text into it; each tool call
  (``function_call``, ``custom_tool_call``, and the built-in tools the client runs: ``shell_call``,
  ``local_shell_call``, ``apply_patch_call``, ``computer_call``) is a tool call with its ``call_id``;
  its arguments are the function's ``arguments``, the custom tool's ``input``, or the built-in call's
  action as JSON. A client may send a turn's calls back each followed by its output (``call A, output A,
  call B, output B``, as Codex does): calls with nothing but outputs of the earlier ones between them are
  still one assistant message when a stored answer made them together (``answered_together``), the outputs
  becoming the tool messages after it; on the wire that shape is also consecutive one-call turns, which stay
  apart;
- a tool output item (``function_call_output`` and the others' ``*_output``) → a tool message
  answering its ``call_id``, whose text is the output's (a string, or its text parts);
- the other items the client supplies (``item_reference``, ``mcp_approval_response``, outputs of tools
  it does not call itself …) are *opaque*: they carry no text into the graph and travel with the item
  after them, or, at the end, with the one before.

:func:`forwarded_input` turns a render of that history back into Responses input items: every kept
message's items are the client's own objects, sent as they came (ids, statuses, encrypted reasoning
untouched); an omitted result's item gets the render's text as its ``output``; a clipped task keeps its
non-text parts and its first text part carries the clipped text; the items of a turn sent interleaved go
back in the client's order (each output right after its call); an inserted message (a summary) is an
input message; an assistant message whose calls the render dropped loses those calls and the reasoning
that led to them. The result always pairs (:func:`repair_pairing`): every tool output follows a call
with its ``call_id`` and every call is answered by a later output.

A request that relies on state kept by the upstream (``previous_response_id``, ``conversation``,
``item_reference`` items) holds a history this side never sees, so it cannot be rendered:
:func:`stateful_fields` names what makes it so.

Nothing here knows about HTTP or the graph; request data is only read, never evaluated.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
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

#: Tool call item types the client answers, and the type of the output item that answers each.
CALL_OUTPUT: Mapping[str, str] = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "shell_call": "shell_call_output",
    "local_shell_call": "local_shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
}
OUTPUT_TYPES = frozenset(CALL_OUTPUT.values())
#: Message roles of the Responses API (``developer`` is kept as its own role; the graph knows it).
ROLES = frozenset({"system", "developer", "user", "assistant"})
#: Content part types whose ``text`` is the text the model reads.
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
#: Item types the client supplies that carry no text into the graph (besides any ``*_output`` or ``*_response``).
CLIENT_OPAQUE = frozenset({"item_reference", "additional_tools", "compaction_trigger"})
#: Fields of a built-in call that are bookkeeping, not what the call asks for.
_CALL_META = frozenset({"type", "id", "call_id", "status", "caller", "environment"})


@dataclass(frozen=True)
class Origin:
    """Where a converted message came from: its ``kind`` (SYSTEM, USER, ASSISTANT, RESULT), the input items
    it was converted from (``own``; empty for ``instructions``, ``(-1,)`` for a string ``input``) and the
    opaque items that travel with it (``attached``), all as indices into the request's ``input`` list."""

    kind: str
    own: tuple[int, ...]
    attached: tuple[int, ...] = ()
    #: For a model turn whose calls the client sent interleaved with their outputs (``call A, output A, call B,
    #: output B``): the first item of the turn's assistant message, shared by it and its tool messages, so
    #: :func:`forwarded_input` puts their items back in the client's order. None otherwise.
    turn: int | None = None


@dataclass(frozen=True)
class Converted:
    """A Responses API conversation as OpenAI chat messages, and the origin of each."""

    messages: tuple[dict[str, Any], ...]
    origins: tuple[Origin, ...]


# -- reading items ---------------------------------------------------------------------------------


def _type(item: Any) -> str | None:
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"  # an "easy" input message: {"role": ..., "content": ...}
    return kind if isinstance(kind, str) else None


def _part_text(part: Mapping[str, Any]) -> str | None:
    kind = part.get("type")
    if kind in TEXT_PARTS and isinstance(part.get("text"), str):
        return str(part["text"])
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return str(part["refusal"])
    return None


def content_text(content: Any, where: str) -> str:
    """A message's (or an output's) text: a string as it is, a list of parts as the text of its text parts
    joined by newlines (a shell output's ``stdout`` and ``stderr`` count as text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidMessages(f"{where} must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise InvalidMessages(f"{where}[{j}] must be an object")
        text = _part_text(part)
        if text is not None:
            texts.append(text)
        else:  # shell output entries
            texts.extend(str(part[k]) for k in ("stdout", "stderr") if isinstance(part.get(k), str) and part[k])
    return "\n".join(texts)


def _call_id(item: Mapping[str, Any], kind: str, where: str) -> str:
    call_id = item.get("call_id")
    if call_id is None and kind == "local_shell_call_output":
        call_id = item.get("id")  # this output names its call in ``id``
    if not isinstance(call_id, str) or not call_id:
        raise InvalidMessages(f"{where}: a {kind} item needs a non-empty string 'call_id'")
    return call_id


def tool_call(item: Mapping[str, Any], where: str = "item") -> dict[str, Any]:
    """A tool call item as an OpenAI chat tool call."""
    kind = _type(item) or ""
    call_id = _call_id(item, kind, where)
    if kind in ("function_call", "custom_tool_call"):
        name = item.get("name")
        if not isinstance(name, str):
            raise InvalidMessages(f"{where}: a {kind} item needs a string 'name'")
        raw = item.get("arguments" if kind == "function_call" else "input")
        args = raw if isinstance(raw, str) else json.dumps({} if raw is None else raw, ensure_ascii=False)
    else:
        name = kind
        args = json.dumps({k: v for k, v in item.items() if k not in _CALL_META}, ensure_ascii=False,
                          sort_keys=True)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _message_text(item: Mapping[str, Any], where: str) -> str:
    return content_text(item.get("content"), f"{where}.content")


def assistant_message(items: Sequence[Any], where: str = "output") -> dict[str, Any]:
    """Assistant-side items (a response's ``output``) as one OpenAI assistant message: the text of its
    messages joined by newlines, each tool call a ``tool_calls`` entry; other items carry nothing."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, item in enumerate(items):
        kind = _type(item)
        if kind == "message" and isinstance(item, Mapping):
            text = _message_text(item, f"{where}[{j}]")
            if text:
                texts.append(text)
        elif kind in CALL_OUTPUT and isinstance(item, Mapping):
            calls.append(tool_call(item, f"{where}[{j}]"))
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _side(item: Any, where: str) -> str | None:
    """ASSISTANT, USER, SYSTEM or RESULT for an item that carries text into the graph, None for an opaque one."""
    kind = _type(item)
    if kind is None:
        raise InvalidMessages(f"{where} must be an object with a string 'type' (or a message's 'role')")
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise InvalidMessages(f"{where}: a message's 'role' must be one of {', '.join(sorted(ROLES))}, "
                                  f"got {role!r}")
        if role == ASSISTANT:
            return ASSISTANT
        return USER if role == USER else SYSTEM
    if kind in CALL_OUTPUT:
        return ASSISTANT
    if kind in OUTPUT_TYPES:
        return RESULT
    if kind in CLIENT_OPAQUE or kind.endswith(("_output", "_response")):
        return None
    return ASSISTANT  # the model's own output: reasoning, server-side tool calls, compaction …


def to_openai(instructions: Any, input_: Any,
              answered_together: Callable[[str], Collection[str]] | None = None) -> Converted:
    """A request's ``instructions`` and ``input`` as OpenAI chat messages (module docstring).

    ``answered_together(call_id)``: the call ids of the stored answer that made ``call_id`` (empty when no stored
    answer made it with others). A client may send a model turn's calls back each followed by its output
    (``call A, output A, call B, output B``, as Codex does); the stored answer holds both calls in one assistant
    message. A call that follows nothing but outputs of the calls before it is one model turn with them when
    that answer made them together: it joins their assistant message, and the outputs become the tool
    messages after it, in the order sent. Without this (or for calls no stored answer made together) such a
    call starts a new assistant message, as the same items from consecutive turns must (one call per turn
    looks the same on the wire).

    Raises:
        InvalidMessages: an item that is not the Responses API's (naming it); nothing is stored.
    """
    pairs: list[tuple[dict[str, Any], Origin]] = []
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidMessages("'instructions' must be a string")
    if instructions:
        pairs.append(({"role": "system", "content": instructions}, Origin(SYSTEM, ())))
    if isinstance(input_, str):
        pairs.append(({"role": "user", "content": input_}, Origin(USER, (-1,))))
        return Converted(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
    if not isinstance(input_, list):
        raise InvalidMessages("'input' must be a string or a list of input items")
    sides = [_side(item, f"input[{i}]") for i, item in enumerate(input_)]
    groups: list[tuple[str, list[int], list[int]]] = []  # (kind, own items, attached items)
    turn_of: dict[int, int] = {}  # group -> the assistant group of its interleaved turn
    waiting: list[int] = []  # opaque items waiting for the item they travel with
    # The latest assistant group, its call ids, and whether every group after it is an output of one of them.
    last: int | None = None
    calls: set[str] = set()
    answered_only = False
    for i, side in enumerate(sides):
        cid = _call_id(input_[i], _type(input_[i]) or "", f"input[{i}]") if side in (ASSISTANT, RESULT) and (
            _type(input_[i]) in CALL_OUTPUT or side == RESULT) else None
        if side is None:
            waiting.append(i)
            continue
        if side == ASSISTANT and groups and groups[-1][0] == ASSISTANT and not _breaks(sides, groups[-1], i):
            target: int | None = len(groups) - 1
        elif (side == ASSISTANT and cid is not None and last is not None and answered_only and cid not in calls
              and answered_together is not None and calls
              and cid in answered_together(_first_call(input_, groups[last][1]))):
            target = last  # the next call of an interleaved model turn
            for k in range(last, len(groups)):
                turn_of[k] = last
        else:
            target = None
        if target is not None:
            groups[target][1].append(i)
            groups[target][2].extend(waiting)
            if cid is not None:
                calls.add(cid)
        else:
            groups.append((side, [i], waiting))
            if side == ASSISTANT:
                last, calls, answered_only = len(groups) - 1, {cid} if cid is not None else set(), True
            else:
                answered_only = answered_only and side == RESULT and cid in calls
                if answered_only and last is not None and last in turn_of:
                    turn_of[len(groups) - 1] = last
        waiting = []
    if waiting:
        if not groups:
            raise InvalidMessages("'input' holds no message, tool call or tool output")
        groups[-1][2].extend(waiting)
    pairs += _group_messages(input_, groups, turn_of)
    return Converted(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


def _group_messages(input_: Sequence[Any], groups: Sequence[tuple[str, list[int], list[int]]],
                    turn_of: Mapping[int, int]) -> list[tuple[dict[str, Any], Origin]]:
    """Each group of input items as one chat message and where it came from."""
    pairs: list[tuple[dict[str, Any], Origin]] = []
    for g, (side, own, attached) in enumerate(groups):
        first = input_[own[0]]
        where = f"input[{own[0]}]"
        if side == ASSISTANT:
            msg = assistant_message([input_[i] for i in own], "input")
        elif side == RESULT:
            msg = {"role": "tool", "tool_call_id": _call_id(first, _type(first) or "", where),
                   "content": content_text(first.get("output"), f"{where}.output")}
        else:
            msg = {"role": first["role"], "content": _message_text(first, where)}
        turn = groups[turn_of[g]][1][0] if g in turn_of else None
        pairs.append((msg, Origin(side, tuple(own), tuple(sorted(attached)), turn)))
    return pairs


def _first_call(items: Sequence[Any], own: Sequence[int]) -> str:
    """The call id of the first call among ``items[own]`` (the caller knows there is one)."""
    return next(str(items[i]["call_id"]) for i in own if _type(items[i]) in CALL_OUTPUT)


def _breaks(sides: Sequence[str | None], group: tuple[str, list[int], list[int]], i: int) -> bool:
    """Whether item ``i`` starts a new assistant message: only a non-assistant item between them does."""
    return any(s not in (None, ASSISTANT) for s in sides[group[1][-1] + 1:i])


# -- server-side state -------------------------------------------------------------------------------


def stateful_fields(body: Mapping[str, Any]) -> list[str]:
    """What in a request makes the upstream supply history this side never sees (empty: none)."""
    out = [name for name in ("previous_response_id", "conversation") if body.get(name) is not None]
    items = body.get("input")
    if isinstance(items, list) and any(_type(item) == "item_reference" for item in items):
        out.append("input items of type 'item_reference'")
    return out


# -- a render back into input items ------------------------------------------------------------------


def _call_ids(msg: Mapping[str, Any]) -> list[Any]:
    return [c.get("id") for c in msg.get("tool_calls") or [] if isinstance(c, Mapping)]


def _with_text(content: Any, text: str, part_type: str) -> Any:
    """``content`` saying ``text``: a string becomes it; in a list of parts the first text part carries it
    and the other text parts go (non-text parts stay)."""
    if not isinstance(content, list):
        return text
    out: list[Any] = []
    placed = False
    for part in content:
        if not isinstance(part, Mapping) or _part_text(part) is None:
            out.append(part)
        elif not placed:
            placed = True
            if text:
                out.append({**part, "text": text} if part.get("type") in TEXT_PARTS
                           else {"type": part_type, "text": text})
    if text and not placed:
        out.insert(0, {"type": part_type, "text": text})
    return out


def _output_saying(item: Mapping[str, Any], text: str) -> dict[str, Any]:
    """A tool output item whose output says ``text`` instead (an omitted result's marker)."""
    output = item.get("output")
    if isinstance(output, list):
        if _type(item) == "shell_call_output":
            first = output[0] if output and isinstance(output[0], Mapping) else {}
            return {**item, "output": [{**first, "stdout": text, "stderr": ""}]}
        return {**item, "output": [{"type": "input_text", "text": text}]}
    return {**item, "output": text}


def _assistant_back(items: Sequence[Any], origin: Origin, rendered: Mapping[str, Any]) -> list[tuple[float, Any]]:
    """A changed assistant message's items, each with its index in ``items``: the calls the render kept, its
    text in the first message item, and each other item (reasoning, opaque) only if the next call or message
    item after it stays. A message item made for the text goes just before the message's first item."""
    keep_calls = set(_call_ids(rendered))
    text = rendered.get("content") or ""
    decided: dict[int, Any] = {}  # call and message items -> the item to send, or None
    placed = False
    for i in origin.own:
        item = items[i]
        kind = _type(item)
        if kind in CALL_OUTPUT:
            decided[i] = item if tool_call(item)["id"] in keep_calls else None
        elif kind == "message":
            if not placed and text:  # the first message item carries the render's text
                decided[i] = {**item, "content": _with_text(item.get("content"), text, "output_text")}
            else:
                decided[i] = None
            placed = True
    out: list[tuple[float, Any]] = []
    if text and not placed:
        out.append((origin.own[0] - 0.5, {"type": "message", "role": "assistant", "content": text}))
    order = sorted((*origin.own, *origin.attached))
    any_kept = any(v is not None for v in decided.values())
    for k, i in enumerate(order):
        if i in decided:
            if decided[i] is not None:
                out.append((i, decided[i]))
            continue
        nxt = next((j for j in order[k + 1:] if j in decided), None)
        if (decided[nxt] is not None) if nxt is not None else any_kept:
            out.append((i, items[i]))
    return out


def _inserted(rendered: Mapping[str, Any]) -> dict[str, Any] | None:
    text = rendered.get("content") or ""
    if not text:
        return None
    role = rendered.get("role")
    return {"type": "message", "role": role if role in ROLES else USER, "content": text}


def _items_back(input_: Sequence[Any], origin: Origin, mine: Mapping[str, Any],
                rendered: Mapping[str, Any]) -> list[tuple[float, Any]]:
    """The items a rendered message goes upstream as, each with its index in ``input_``."""
    changed = ((rendered.get("content") or "") != (mine.get("content") or "")
               or _call_ids(rendered) != _call_ids(mine))
    order = sorted((*origin.own, *origin.attached))
    if not changed:
        return [(i, input_[i]) for i in order]
    if origin.kind == ASSISTANT:
        return _assistant_back(input_, origin, rendered)
    own = input_[origin.own[0]]
    text = rendered.get("content") or ""
    if origin.kind == RESULT:
        new = _output_saying(own, text)
    else:
        new = {**own, "content": _with_text(own.get("content"), text, "input_text")}
    return [(i, new if i == origin.own[0] else input_[i]) for i in order]


def forwarded_input(input_: Any, converted: Converted, render: RenderResult) -> Any:
    """The render of ``converted`` (the conversion of ``input_``) as the Responses ``input`` to send.

    After a sync, stored seq i is converted message i (``render.layout`` indexes ``converted``). A string
    ``input`` stays a string (clipped if the render clipped it). Otherwise each rendered message becomes
    the items it came from — the client's own objects when the render left it as it was — and pairing is
    made valid (:func:`repair_pairing`).
    """
    if isinstance(input_, str):
        for msg, seq in zip(render.messages, render.layout, strict=True):
            if seq is not None and converted.origins[seq].own == (-1,):
                return msg.get("content") or ""
        return input_
    out: list[Any] = []
    turn: list[tuple[float, Any]] = []  # the items of an interleaved model turn, put back in the client's order
    turn_id: int | None = None
    for msg, seq in zip(render.messages, render.layout, strict=True):
        origin = converted.origins[seq] if seq is not None else None
        if turn and (origin is None or origin.turn != turn_id):
            out.extend(item for _, item in sorted(turn, key=lambda p: p[0]))
            turn = []
        if seq is None or origin is None:
            ins = _inserted(msg)
            if ins is not None:
                out.append(ins)
            continue
        turn_id = origin.turn
        if not origin.own:
            continue  # ``instructions`` go upstream as sent
        items = _items_back(input_, origin, converted.messages[seq], msg)
        if origin.turn is None:
            out.extend(item for _, item in items)
        else:
            turn.extend(items)
    out.extend(item for _, item in sorted(turn, key=lambda p: p[0]))
    return repair_pairing(out)


# -- pairing -----------------------------------------------------------------------------------------


def _pair_key(item: Any) -> tuple[str, str] | None:
    """("call", id) or ("output", id) for a paired item, else None."""
    kind = _type(item)
    if kind in CALL_OUTPUT:
        cid = item.get("call_id")
        return ("call", cid) if isinstance(cid, str) else None
    if kind in OUTPUT_TYPES:
        cid = item.get("call_id")
        if cid is None and kind == "local_shell_call_output":
            cid = item.get("id")
        return ("output", cid) if isinstance(cid, str) else None
    return None


def pairing_errors(items: Sequence[Any]) -> list[str]:
    """What the Responses API would refuse about tool pairing in ``items`` (empty when they pair): an output
    with no earlier call of its ``call_id``, a call with no later output."""
    errors = []
    keys = [_pair_key(item) for item in items]
    for k, key in enumerate(keys):
        if key is None:
            continue
        kind, cid = key
        if kind == "output" and ("call", cid) not in keys[:k]:
            errors.append(f"input[{k}]: output for call_id {cid!r} follows no call with that id")
        if kind == "call" and ("output", cid) not in keys[k + 1:]:
            errors.append(f"input[{k}]: call {cid!r} has no later output")
    return errors


def repair_pairing(items: Sequence[Any]) -> list[Any]:
    """``items`` without the outputs no earlier call asked for and the calls no later output answers (with
    the reasoning right before such a call). Items that stay are the same objects."""
    keys = [_pair_key(item) for item in items]
    drop: set[int] = set()
    for k, key in enumerate(keys):
        if key is None:
            continue
        kind, cid = key
        if kind == "output" and ("call", cid) not in keys[:k]:
            drop.add(k)
        elif kind == "call" and ("output", cid) not in keys[k + 1:]:
            drop.add(k)
            j = k - 1
            while j >= 0 and _type(items[j]) == "reasoning":
                drop.add(j)
                j -= 1
    return [item for k, item in enumerate(items) if k not in drop]


def prompt_usage(usage: Any) -> PromptUsage | None:
    """A response's ``usage`` as billed, or None (unknown: absent, or not counts).

    ``input_tokens`` counts every prompt token, the cached ones included; ``input_tokens_details.cached_tokens``
    were read from the prompt cache and ``input_tokens_details.cache_write_tokens`` written to it (docs/method.md
    §14); ``output_tokens`` is the output (docs/service.md, "Prompt-cache usage").
    """
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("input_tokens_details")
    details = details if isinstance(details, Mapping) else {}
    return usage_counts(usage.get("input_tokens"), details.get("cached_tokens"), details.get("cache_write_tokens"),
                        usage.get("output_tokens"))



# -- the expand tool's rounds (docs/service.md, "The expand tool") ------------------------------


def expand_round(output: Sequence[Any], answers: Mapping[str, tuple[str, bool]]) -> list[dict[str, Any]]:
    """What one answered round of ``contextrender_expand`` appends to a Responses API request's ``input``: the
    answer's output items as the upstream gave them (reasoning and message items kept; call items the service did
    not answer left out, the model makes those calls again), then a ``function_call_output`` per answered call in
    order. ``answers``: per ``call_id``, the result's text and whether it is an error (the text says so)."""
    items = [dict(it) for it in output
             if isinstance(it, Mapping) and not (_type(it) in CALL_OUTPUT and it.get("call_id") not in answers)]
    items += [{"type": "function_call_output", "call_id": cid, "output": text} for cid, (text, _) in answers.items()]
    return items


def answer_output(data: Any) -> list[Any]:
    """A whole Responses API answer's ``output`` items (empty when it has none)."""
    output = data.get("output") if isinstance(data, Mapping) else None
    return list(output) if isinstance(output, list) else []

def tool_name(tool: Any) -> str | None:
    """The name of a ``tools`` entry (``{"name": ...}``)."""
    return tool.get("name") if isinstance(tool, dict) else None


#: The expand loop's pieces in this API (:class:`~contextrender.service.expansion.Wire`): rounds are appended to
#: ``input``; a whole answer's and a stream's raw answer is its output items.
WIRE = Wire("input", expand_tool.responses_tool, tool_name, answer_output, lambda asm: asm.output(), expand_round)


__all__ = ["WIRE", "CALL_OUTPUT", "Converted", "OUTPUT_TYPES", "Origin", "answer_output", "assistant_message",
           "content_text", "expand_round", "forwarded_input", "pairing_errors", "prompt_usage", "repair_pairing", "stateful_fields", "to_openai",
           "tool_call"]
