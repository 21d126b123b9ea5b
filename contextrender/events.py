"""Message and usage types. The wire format is OpenAI chat messages.

A transcript is a list of OpenAI-format dicts (system, user, assistant with
optional ``tool_calls``, tool with ``tool_call_id``). :class:`Message` is the
validated, immutable form the graph stores; :func:`Message.from_openai` gives
a clear error for malformed input instead of failing later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "developer", "user", "assistant", "tool"]
#: ``developer`` is what current OpenAI SDKs send instead of ``system``; leading system and
#: developer messages together are the system prompt (outside B, docs/method.md §1).
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")
#: Roles that make up the system prompt when they lead the transcript.
SYSTEM_ROLES: frozenset[str] = frozenset({"system", "developer"})


class MessageError(ValueError):
    """A message does not follow the OpenAI chat format."""


@dataclass(frozen=True)
class ToolCall:
    """One function call emitted by the model (OpenAI ``tool_calls`` entry)."""

    id: str
    name: str
    arguments: str  # the raw JSON string, exactly as the model emitted it

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def text(self) -> str:
        """The call as text for matching and embedding.

        Arguments that parse as JSON are decoded so that escaped characters
        (``\\n`` inside a code string) do not glue onto the next identifier;
        the raw string is used otherwise.
        """
        return self.name + "\n" + decoded_arguments(self.arguments)


def decoded_arguments(arguments: str) -> str:
    """Keys and scalar values of a JSON argument string, one per line."""
    try:
        obj = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return arguments
    parts: list[str] = []

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                parts.append(str(k))
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
        elif o is not None:
            parts.append(o if isinstance(o, str) else json.dumps(o))

    walk(obj)
    return "\n".join(parts)


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts; only text parts carry text
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or "type" not in part:
                raise MessageError(f"{where}: content part {i} must be an object with a 'type'")
            if part["type"] == "text":
                texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise MessageError(f"{where}: 'content' must be a string, a list of parts or null, not {type(content).__name__}")


def _check_encodable(msg: Message, where: str) -> None:
    """Every text must be valid Unicode: a lone surrogate (JSON ``"\\ud800"``) cannot be stored as UTF-8."""
    fields: list[tuple[str, str | None]] = [("content", msg.content), ("tool_call_id", msg.tool_call_id),
                                           ("name", msg.name)]
    for i, c in enumerate(msg.tool_calls):
        fields += [(f"tool_calls[{i}].id", c.id), (f"tool_calls[{i}].function.name", c.name),
                   (f"tool_calls[{i}].function.arguments", c.arguments)]
    for label, text in fields:
        if text is None:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise MessageError(f"{where}: {label} is not valid Unicode (a lone surrogate at character "
                               f"{e.start})") from None


@dataclass(frozen=True)
class Message:
    """One validated chat message."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    @staticmethod
    def from_openai(d: Any, where: str = "message") -> Message:
        """Validate an OpenAI-format dict; raise :class:`MessageError` naming the problem."""
        if isinstance(d, Message):
            return d
        if not isinstance(d, dict):
            raise MessageError(f"{where}: expected an object, got {type(d).__name__}")
        role = d.get("role")
        if role == "function" or d.get("function_call") is not None:
            raise MessageError(f"{where}: the legacy function-calling format ('function' role, 'function_call') is "
                               "not supported; send assistant 'tool_calls' and 'tool' messages with 'tool_call_id'")
        if role not in ROLES:
            raise MessageError(f"{where}: 'role' must be one of {', '.join(ROLES)}, got {role!r}")
        content = _content_text(d.get("content"), where)
        calls: list[ToolCall] = []
        raw_calls = d.get("tool_calls") or []
        if raw_calls and role != "assistant":
            raise MessageError(f"{where}: only assistant messages may carry 'tool_calls'")
        if not isinstance(raw_calls, list):
            raise MessageError(f"{where}: 'tool_calls' must be a list")
        for i, tc in enumerate(raw_calls):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise MessageError(f"{where}: tool_calls[{i}] needs function.name")
            args = fn.get("arguments", "")
            if not isinstance(args, str):  # some clients send a dict; keep a canonical string
                args = json.dumps(args, ensure_ascii=False)
            call_id = tc.get("id")
            if not isinstance(call_id, str) or not call_id:
                raise MessageError(f"{where}: tool_calls[{i}] needs a non-empty string 'id'")
            calls.append(ToolCall(id=call_id, name=fn["name"], arguments=args))
        tool_call_id = d.get("tool_call_id")
        if role == "tool" and (not isinstance(tool_call_id, str) or not tool_call_id):
            raise MessageError(f"{where}: a tool message needs a non-empty string 'tool_call_id'")
        name = d.get("name")
        msg = Message(
            role=role,
            content=content,
            tool_calls=tuple(calls),
            tool_call_id=tool_call_id if role == "tool" else None,
            name=name if isinstance(name, str) else None,
        )
        _check_encodable(msg, where)
        return msg

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
            if not self.content:
                out["content"] = None
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    def text(self) -> str:
        """Content plus tool calls as text (used for embeddings and q_t)."""
        parts = [self.content] if self.content else []
        parts.extend(c.text() for c in self.tool_calls)
        return "\n".join(parts)


@dataclass(frozen=True)
class Usage:
    """Tokens spent. ``embedding`` tokens are priced separately (docs/method.md §7, Eq. 3).

    ``cached``: input tokens read from the provider's prompt cache; ``cache_write``: input tokens written to it
    (Anthropic's cache creation, billed at a premium; docs/method.md §14). Both are part of ``input``.
    """

    input: int = 0
    output: int = 0
    cached: int = 0
    embedding: int = 0
    calls: int = 0
    cache_write: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input + other.input,
            self.output + other.output,
            self.cached + other.cached,
            self.embedding + other.embedding,
            self.calls + other.calls,
            self.cache_write + other.cache_write,
        )

    def to_dict(self) -> dict[str, int]:
        out = {"input": self.input, "output": self.output, "cached": self.cached,
               "embedding": self.embedding, "calls": self.calls}
        if self.cache_write:  # only a provider that writes its cache (Anthropic) reports it; records stay as they were
            out["cache_write"] = self.cache_write
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Usage:
        return Usage(**{k: int(d.get(k, 0)) for k in ("input", "output", "cached", "embedding", "calls",
                                                          "cache_write")})


ZERO_USAGE = Usage()


@dataclass(frozen=True)
class Completion:
    """A model's answer: one assistant message and the usage of that call."""

    message: dict[str, Any]
    usage: Usage = field(default_factory=Usage)
