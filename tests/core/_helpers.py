"""Transcript builders shared by the core tests (OpenAI chat format)."""

from __future__ import annotations

import json
from typing import Any

from contextrender import ContextGraph, Session


class Transcript:
    """Builds an agent transcript turn by turn; each assistant message is one invocation."""

    def __init__(self, task: str = "Complete the task.", system: str | None = "You are a careful agent.") -> None:
        self.messages: list[dict[str, Any]] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})
        self.messages.append({"role": "user", "content": task})
        self._calls = 0

    def user(self, text: str) -> Transcript:
        self.messages.append({"role": "user", "content": text})
        return self

    def say(self, text: str) -> Transcript:
        self.messages.append({"role": "assistant", "content": text})
        return self

    def turn(self, *calls: tuple[str, dict[str, Any] | str, str], content: str | None = None) -> list[str]:
        """One assistant message with ``calls`` (name, args, result); returns the call ids."""
        ids = []
        tool_calls = []
        for name, args, _ in calls:
            cid = f"call_{self._calls:03d}"
            self._calls += 1
            ids.append(cid)
            raw = args if isinstance(args, str) else json.dumps(args)
            tool_calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": raw}})
        self.messages.append({"role": "assistant", "content": content, "tool_calls": tool_calls})
        for cid, (_, _, result) in zip(ids, calls, strict=True):
            self.messages.append({"role": "tool", "tool_call_id": cid, "content": result})
        return ids

    def call(self, name: str, args: dict[str, Any] | str, result: str, content: str | None = None) -> str:
        return self.turn((name, args, result), content=content)[0]

    def into(self, graph: ContextGraph | None = None, sid: str = "s") -> Session:
        session = (graph or ContextGraph()).session(sid)
        session.sync(self.messages)
        return session


def result_seq(session: Session, call_id: str) -> int:
    return next(r.seq for r in session.results if r.call_id == call_id)


def filler(tag: str, words: int = 60) -> str:
    """A result with no qualifying values apart from ``tag`` (lowercase words only)."""
    return f"{tag}\n" + " ".join(["lorem ipsum dolor sit amet"] * (words // 5))


def history_recount(counter: Any, messages: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> int:
    """Independent Tok(H_t): drop the leading system messages and the current (last) user message."""
    msgs = list(messages)
    i = 0
    while i < len(msgs) and msgs[i]["role"] == "system":
        i += 1
    body = msgs[i:]
    users = [j for j, m in enumerate(body) if m["role"] == "user"]
    if users:
        body = body[: users[-1]] + body[users[-1] + 1:]
    return counter.messages(body)


def pairing_errors(messages: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> list[str]:
    """Every tool message must follow (over other tool messages only) an assistant message holding its id."""
    errors = []
    for i, m in enumerate(messages):
        if m["role"] != "tool":
            continue
        j = i - 1
        while j >= 0 and messages[j]["role"] == "tool":
            j -= 1
        owner = messages[j] if j >= 0 else None
        ids = {c["id"] for c in (owner or {}).get("tool_calls") or []}
        if owner is None or owner["role"] != "assistant" or m["tool_call_id"] not in ids:
            errors.append(f"tool message {i} ({m['tool_call_id']}) is not paired")
    return errors
