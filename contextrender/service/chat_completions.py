"""Chat Completions wire pieces of the expand tool (docs/service.md, "The expand tool").

The rest of the Chat Completions path is the project's own message format: the rendered history is forwarded as
it is (:func:`contextrender.service.streams.forwarded_messages`) and a streamed answer assembled by
:class:`~contextrender.service.streams.StreamAssembler`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contextrender import expand as expand_tool
from contextrender.service.expansion import Wire


def answer_message(data: Any) -> dict[str, Any]:
    """A whole chat completion's ``choices[0].message`` (empty when it has none)."""
    try:
        msg = data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {}
    return dict(msg) if isinstance(msg, Mapping) else {}


def expand_round(message: Mapping[str, Any], answers: Mapping[str, tuple[str, bool]]) -> list[dict[str, Any]]:
    """What one answered round of ``contextrender_expand`` appends to a request's ``messages``: the assistant
    message with the calls the service answered (its text kept; a call it did not answer is left out, the model
    makes it again), then a ``tool`` message per answered call in order. Only the fields a request takes are
    sent back (a response's ``refusal``, ``annotations`` or a provider's reasoning fields are not).
    ``answers``: per call id, the result's text and whether it is an error (the text says so)."""
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, Mapping) and c.get("id") in answers]
    sent = [{"id": c["id"], "type": "function",
             "function": {"name": (c.get("function") or {}).get("name"),
                          "arguments": (c.get("function") or {}).get("arguments") or "{}"}} for c in calls]
    out: list[dict[str, Any]] = [{"role": "assistant", "content": message.get("content"), "tool_calls": sent}]
    out += [{"role": "tool", "tool_call_id": cid, "content": text} for cid, (text, _) in answers.items()]
    return out


def tool_name(tool: Any) -> str | None:
    """The name of a ``tools`` entry (``{"type": "function", "function": {"name": ...}}``)."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn.get("name") if isinstance(fn, dict) else None


#: The expand loop's Chat Completions pieces (:class:`~contextrender.service.expansion.Wire`): rounds are appended to
#: ``messages``; a whole answer's and a stream's raw answer is the assistant message.
WIRE = Wire("messages", expand_tool.chat_tool, tool_name, answer_message, lambda asm: asm.message(), expand_round)

__all__ = ["WIRE", "answer_message", "expand_round", "tool_name"]
