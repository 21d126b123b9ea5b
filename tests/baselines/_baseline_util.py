"""Small transcript builders and test doubles for the baseline tests."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from contextrender import ContextGraph, ExtractiveCompactor, Session, Usage
from contextrender.render import Rendered, Scope


class Transcript:
    """An agent transcript built turn by turn; each assistant message is one invocation."""

    def __init__(self, task: str = "Complete the task.", system: str | None = "You are a careful agent.") -> None:
        self.messages: list[dict[str, Any]] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})
        self.messages.append({"role": "user", "content": task})
        self._n = 0

    def call(self, result: str, *, name: str = "lookup", args: dict[str, Any] | None = None,
             say: str | None = None) -> int:
        """One invocation with one tool call; returns the result's seq."""
        cid = f"call_{self._n:03d}"
        self._n += 1
        self.messages.append({"role": "assistant", "content": say, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args or {})}}]})
        self.messages.append({"role": "tool", "tool_call_id": cid, "content": result})
        return len(self.messages) - 1

    def say(self, text: str) -> int:
        self.messages.append({"role": "assistant", "content": text})
        return len(self.messages) - 1

    def user(self, text: str) -> int:
        self.messages.append({"role": "user", "content": text})
        return len(self.messages) - 1

    def session(self, graph: ContextGraph | None = None, sid: str = "s") -> Session:
        s = (graph or ContextGraph()).session(sid)
        s.sync(self.messages)
        return s


def text_of(tag: str, words: int) -> str:
    """A result about ``tag``: the tag line, then filler words (no qualifying values)."""
    return f"{tag}\n" + " ".join(["note"] * words)


def delta(session: Session, seq: int) -> int:
    r = session.result(seq)
    return r.ntok - r.marker_ntok


def base_tokens(session: Session) -> int:
    """Tok(H_t) with every result as its marker (the verbatim messages fit in these tests)."""
    scope = Scope.of(session)
    return sum(session.result(s).marker_ntok if session.is_result(s) else session.ntok(s) for s in scope.history)


def history_recount(session: Session, rendered: Rendered) -> int:
    """Independent Tok(H_t): drop the leading system messages and the current user message
    (found by equality; summary messages are user-role too, with other text)."""
    msgs = list(rendered.messages)
    i = 0
    while i < len(msgs) and msgs[i]["role"] == "system":
        i += 1
    body = msgs[i:]
    scope = Scope.of(session)
    if scope.current is not None:
        cur = session.message(scope.current).to_openai()
        j = max(k for k, m in enumerate(body) if m == cur)
        body = body[:j] + body[j + 1:]
    return session.counter.messages(body)


def pairing_errors(messages: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[str]:
    """Every tool message follows (over tool messages only) the assistant message holding its call,
    and every rendered call has its tool message."""
    errors = []
    pending: set[str] = set()
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            if m["tool_call_id"] not in pending:
                errors.append(f"tool message {i} ({m['tool_call_id']}) is not paired")
            pending.discard(m["tool_call_id"])
            continue
        if pending:
            errors.append(f"calls {sorted(pending)} have no result before message {i}")
        pending = {c["id"] for c in m.get("tool_calls") or []} if m["role"] == "assistant" else set()
    return errors


class KeywordEmbedder:
    """Embeds text as counts of a few keywords (plus a constant axis): cosine similarities are
    hand-computable. Usage counts one embedding token per word."""

    name = "keywords"

    def __init__(self, keywords: tuple[str, ...] = ("apple", "banana", "cherry", "durian")) -> None:
        self.keywords = keywords
        self.dim = len(keywords) + 1
        self.max_chars = 8000
        self.calls: list[list[str]] = []

    def embed_documents(self, texts: list[str]) -> tuple[np.ndarray, Usage]:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            words = t.lower().split()
            for j, k in enumerate(self.keywords):
                out[i, j] = sum(w.strip(".,:;") == k for w in words)
            out[i, -1] = 0.1
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out, Usage(embedding=sum(len(t.split()) for t in texts))

    def embed_query(self, text: str) -> tuple[np.ndarray, Usage]:
        v, u = self.embed_documents([text])
        return v[0], u


class RecordingCompactor:
    """The offline compactor, recording every call (text, cap, instructions)."""

    def __init__(self, reply: str | None = None) -> None:
        self.inner = ExtractiveCompactor()
        self.name = "recording"
        self.reply = reply  # a fixed output instead of the extractive one
        self.calls: list[tuple[str, int, str | None]] = []
        self.usages: list[Usage] = []

    def compact(self, text: str, max_tokens: int, *, instructions: str | None = None) -> tuple[str, Usage]:
        self.calls.append((text, max_tokens, instructions))
        out, usage = self.inner.compact(text, max_tokens, instructions=instructions)
        if self.reply is not None:
            out = self.reply
            usage = Usage(input=usage.input, output=self.inner.counter.text(out), calls=1)
        self.usages.append(usage)
        return out, usage
