"""Later-Used Result Recall (docs/method.md §7, paper §B.4).

On a recorded Full-history transcript, :func:`reuse_events` finds the events
(j, r): assistant turn j contains an eligible token whose first appearance in
the whole transcript is inside tool result r. :func:`recall` scores a policy by
the share of events whose result was visible — complete original text — in the
context rendered immediately before turn j.

Indices: j counts assistant messages (invocations) from 0; a result is named by
its ``seq`` (transcript index), as everywhere in the project; a result from a
tool call made by invocation k has age j − k at turn j.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextrender.events import Message

#: docs/method.md §7: tokens are maximal runs of this class.
_TOKEN = re.compile(r"[A-Za-z0-9_]+")
MIN_TOKEN_LEN = 6  # docs/method.md §7: ≥ 6 characters

#: docs/method.md §7 age bins: ≤3, 4–10, 11–25, >25 turns.
AGE_BINS: tuple[str, ...] = ("le3", "4_10", "11_25", "gt25")


def age_bin(age: int) -> str:
    if age <= 3:
        return "le3"
    if age <= 10:
        return "4_10"
    if age <= 25:
        return "11_25"
    return "gt25"


def eligible(token: str) -> bool:
    """docs/method.md §7: ≥ 6 chars and an uppercase letter or underscore (Titlecase words allowed, unlike TFA)."""
    return len(token) >= MIN_TOKEN_LEN and any(c == "_" or "A" <= c <= "Z" for c in token)


def eligible_tokens(text: str) -> set[str]:
    return {t for t in _TOKEN.findall(text) if eligible(t)}


def turn_text(msg: Message) -> str:
    """An assistant turn's text (docs/method.md §7): content, then each tool call's function name
    and raw arguments string exactly as emitted (JSON keys included, nothing decoded)."""
    parts = [msg.content]
    for call in msg.tool_calls:
        parts.append(call.name)
        parts.append(call.arguments)
    return "\n".join(parts)


@dataclass(frozen=True, order=True)
class Event:
    """Assistant turn ``j`` used a token first seen in the result at transcript index ``result_seq``."""

    j: int
    result_seq: int
    age: int  # j − k, k = invocation whose tool call produced the result


class FirstAppearance:
    """docs/method.md §7 attribution as a transcript grows, one message at a time: each eligible token's first
    appearance over every message in order — the tool result it first appeared in, or None when a system,
    user or assistant message showed it first."""

    def __init__(self) -> None:
        self.first_in: dict[str, int | None] = {}

    def add(self, seq: int, msg: Message) -> dict[str, int]:
        """Index message ``seq``; for an assistant message, return its eligible tokens that first appeared in
        a tool result, with that result's seq (what the turn reuses)."""
        if msg.role == "assistant":
            used: dict[str, int] = {}
            for tok in eligible_tokens(turn_text(msg)):
                src = self.first_in.setdefault(tok, None)
                if src is not None:
                    used[tok] = src
            return used
        source = seq if msg.role == "tool" else None
        for tok in eligible_tokens(msg.content):
            self.first_in.setdefault(tok, source)
        return {}


def reuse_events(messages: Sequence[Message | dict[str, Any]]) -> list[Event]:
    """All distinct (j, r) events of a transcript, sorted by (j, r).

    First appearance is taken over every message in order (system prompt, user
    messages, assistant content and tool calls, tool results), so a token first
    seen in the task input or in an earlier assistant message — including the
    arguments of the very call that returned r — is linked to no result.
    """
    seen = FirstAppearance()
    call_invocation: dict[str, int] = {}  # tool-call id -> invocation that made it (latest, if ids repeat)
    result_invocation: dict[int, int] = {}
    pairs: set[tuple[int, int]] = set()
    j = 0  # invocation index of the next assistant message
    for seq, raw in enumerate(messages):
        msg = Message.from_openai(raw, f"message {seq}")
        if msg.role == "tool":
            assert msg.tool_call_id is not None
            if msg.tool_call_id not in call_invocation:
                raise ValueError(f"message {seq}: tool result for call id {msg.tool_call_id!r}, "
                                 "which no earlier assistant message made")
            result_invocation[seq] = call_invocation[msg.tool_call_id]
        for src in seen.add(seq, msg).values():
            pairs.add((j, src))
        if msg.role == "assistant":
            for call in msg.tool_calls:
                call_invocation[call.id] = j
            j += 1
    return sorted(Event(jj, r, jj - result_invocation[r]) for jj, r in pairs)


def _pct(hits: int, n: int) -> float | None:
    return 100.0 * hits / n if n else None


@dataclass(frozen=True)
class RecallStats:
    """Event and hit counts, overall and per age bin; add stats to pool traces (micro-average)."""

    events: int = 0
    hits: int = 0
    events_by_age: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(AGE_BINS, 0))
    hits_by_age: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(AGE_BINS, 0))

    @property
    def pct(self) -> float | None:
        """Recall = 100·|{(j,r) ∈ E : r ∈ V_j}| / |E|; None without events."""
        return _pct(self.hits, self.events)

    @property
    def pct_by_age(self) -> dict[str, float | None]:
        """Recall per age bin; None for a bin with no events."""
        return {b: _pct(self.hits_by_age[b], self.events_by_age[b]) for b in AGE_BINS}

    def __add__(self, other: RecallStats) -> RecallStats:
        return RecallStats(self.events + other.events, self.hits + other.hits,
                           {b: self.events_by_age[b] + other.events_by_age[b] for b in AGE_BINS},
                           {b: self.hits_by_age[b] + other.hits_by_age[b] for b in AGE_BINS})


def count_events(events: Iterable[Event]) -> RecallStats:
    """Event counts overall and by age bin (``hits`` stay 0)."""
    n = dict.fromkeys(AGE_BINS, 0)
    for e in set(events):
        n[age_bin(e.age)] += 1
    return RecallStats(sum(n.values()), 0, n, dict.fromkeys(AGE_BINS, 0))


def recall(events: Iterable[Event], visible_by_turn: Mapping[int, Iterable[int]]) -> RecallStats:
    """Score events against the results visible before each turn (docs/method.md §7).

    ``visible_by_turn[j]``: seqs of results whose complete original text was in
    the context rendered immediately before assistant turn j. Every turn with
    an event must be present: a missing render is an error, not a miss.
    """
    visible = {j: frozenset(v) for j, v in visible_by_turn.items()}
    n = dict.fromkeys(AGE_BINS, 0)
    h = dict.fromkeys(AGE_BINS, 0)
    for e in set(events):
        if e.j not in visible:
            raise KeyError(f"no render recorded before assistant turn {e.j}")
        b = age_bin(e.age)
        n[b] += 1
        if e.result_seq in visible[e.j]:
            h[b] += 1
    return RecallStats(sum(n.values()), sum(h.values()), n, h)


__all__ = ["AGE_BINS", "Event", "FirstAppearance", "RecallStats", "age_bin", "count_events", "eligible", "eligible_tokens", "recall",
           "reuse_events", "turn_text"]
