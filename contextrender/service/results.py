"""What the session operations return: frozen records, each with ``to_json()``.

:class:`~contextrender.service.sessions.ContextService` returns these; ``to_json()`` is the
body the session API answers with (key order included, since diffs of saved answers see it),
so a caller in the same process reads typed fields and an HTTP client reads the same data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from contextrender.events import Usage
from contextrender.graph import RequestUsage, UsageTotals
from contextrender.selector import ResultScore
from contextrender.tfa import ReuseEdge
from contextrender.trace_line import trace_line


@dataclass(frozen=True)
class SessionInfo:
    """One session's counts: stored messages, tool results, the next invocation, Tok of the full history, and
    ``usage``: its answered model requests with the upstream's own billed figures summed (docs/service.md,
    "Prompt-cache usage")."""

    id: str
    messages: int
    results: int
    next_invocation: int
    full_tokens: int
    usage: UsageTotals = UsageTotals()

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"id": self.id, "messages": self.messages, "results": self.results,
                "next_invocation": self.next_invocation, "full_tokens": self.full_tokens,
                "usage": self.usage.to_json()}


@dataclass(frozen=True)
class UsageReport:
    """A session's answered model requests as the upstream billed them: the totals over all of them and the rows
    of the latest ones (``rows``, in order; ``UsageTotals.requests`` says how many there are in all)."""

    session: str
    totals: UsageTotals
    rows: tuple[RequestUsage, ...]

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"session": self.session, "totals": self.totals.to_json(), "rows": [r.to_json() for r in self.rows]}


@dataclass(frozen=True)
class CreateResult:
    """A session created or resumed: its counts and whether this call created it."""

    info: SessionInfo
    created: bool

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {**self.info.to_json(), "created": self.created}


@dataclass(frozen=True)
class AppendResult:
    """Messages appended: how many, at which seqs, and the session's length after."""

    session: str
    created: bool
    added: int
    seqs: tuple[int, ...]
    messages: int

    @property
    def forked(self) -> bool:
        """Always False: an append never forks (the field keeps the body's shape equal to a sync's)."""
        return False

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"session": self.session, "created": self.created, "added": self.added, "seqs": list(self.seqs),
                "forked": self.forked, "messages": self.messages}


@dataclass(frozen=True)
class SyncResult:
    """A full history synced: the session (a fork ``key~N`` when ``forked``), what was appended, its length."""

    session: str
    created: bool
    added: int
    forked: bool
    messages: int

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"messages": self.messages, "session": self.session, "created": self.created, "added": self.added,
                "forked": self.forked}


@dataclass(frozen=True)
class CallReadiness:
    """One tool call of the latest scored answer: the values it needed that only earlier tool results held,
    and those the render it answered did not show."""

    call: str
    call_id: str
    needed: tuple[str, ...]
    missing: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"call": self.call, "call_id": self.call_id, "needed": list(self.needed),
                "missing": list(self.missing)}


@dataclass(frozen=True)
class ReadinessSummary:
    """Call readiness of a session's answers so far (docs/method.md, "Call readiness").

    ``previous_answer``: the calls of the latest scored answer that needed a value.
    ``call_readiness``: % of ``needing_calls`` that were ``ready_calls``; None before any needed one.
    """

    previous_answer: tuple[CallReadiness, ...]
    calls: int
    needing_calls: int
    ready_calls: int
    call_readiness: float | None

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"previous_answer": [c.to_json() for c in self.previous_answer], "calls": self.calls,
                "needing_calls": self.needing_calls, "ready_calls": self.ready_calls,
                "call_readiness": self.call_readiness}


@dataclass(frozen=True)
class ReadinessReport:
    """:class:`ReadinessSummary` of one session, named."""

    session: str
    readiness: ReadinessSummary

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"session": self.session, **self.readiness.to_json()}


@dataclass(frozen=True)
class RenderResult:
    """A render, and the sync that preceded it when the call carried messages.

    ``messages``: the prompt to send. ``layout``: per rendered message, the seq of the stored message
    it renders, None for an inserted one (a summary). ``tokens``: Tok(H_t), charged to ``budget``.
    ``visible``: seqs of tool results shown in full. ``shortcut``: the full history fit (methods with
    per-result scores; None for others). ``stored``: the session's length. ``readiness``: the
    session's call readiness after this render. ``session``/``created``/``added``/``forked``: as in
    :class:`SyncResult` (``False``/``0`` when nothing was synced). ``prompt_usage``: the session's answered
    requests before this one, with the upstream's billed figures summed (what a streamed answer's
    ``X-ContextRender-Cache`` header says).
    """

    messages: tuple[dict[str, Any], ...]
    layout: tuple[int | None, ...]
    tokens: int
    readiness: ReadinessSummary
    budget: int
    method: str | None
    visible: tuple[int, ...]
    usage: Usage
    shortcut: bool | None
    full_tokens: int
    stored: int
    next_invocation: int
    session: str
    created: bool
    added: int
    forked: bool
    prompt_usage: UsageTotals = UsageTotals()
    expand: bool = False  # the render's markers carry expand handles (docs/service.md, "The expand tool")

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"messages": list(self.messages), "layout": list(self.layout), "tokens": self.tokens,
                "readiness": self.readiness.to_json(), "budget": self.budget, "method": self.method,
                "visible": list(self.visible), "usage": self.usage.to_dict(), "shortcut": self.shortcut,
                "full_tokens": self.full_tokens, "stored": self.stored, "next_invocation": self.next_invocation,
                "session": self.session, "created": self.created, "added": self.added, "forked": self.forked,
                "prompt_usage": self.prompt_usage.to_json(), "expand": self.expand}


@dataclass(frozen=True)
class ScoresResult:
    """The per-result scores behind a ContextRender-family render (none when ``shortcut``)."""

    session: str
    method: str | None
    budget: int
    shortcut: bool
    tokens: int
    next_invocation: int
    scores: tuple[ResultScore, ...]

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"session": self.session, "method": self.method, "budget": self.budget, "shortcut": self.shortcut,
                "tokens": self.tokens, "next_invocation": self.next_invocation,
                "scores": [asdict(r) for r in self.scores]}


@dataclass(frozen=True)
class EdgesResult:
    """A session's TFA reuse edges and c_t(r) per used result (``reuse``, keyed by result seq, in seq order)."""

    session: str
    edges: tuple[ReuseEdge, ...]
    reuse: Mapping[int, float]

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"session": self.session,
                "edges": [{"source": e.source, "op_seq": e.op_seq, "part": e.part, "value": e.value}
                          for e in self.edges],
                "reuse": {str(k): v for k, v in self.reuse.items()}}


@dataclass(frozen=True)
class Transcript:
    """A session's stored messages, in OpenAI format."""

    session: str
    messages: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return {"session": self.session, "messages": list(self.messages)}


@dataclass(frozen=True)
class ExportResult:
    """A session as one replay-trace episode; ``to_json()`` is the trace line (:mod:`contextrender.trace_line`)."""

    task_id: str
    messages: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        """This result as the session API answers it."""
        return trace_line(self.task_id, self.messages)


__all__ = ["AppendResult", "CallReadiness", "CreateResult", "EdgesResult", "ExportResult", "ReadinessReport",
           "ReadinessSummary", "RenderResult", "ScoresResult", "SessionInfo", "SyncResult", "Transcript", "UsageReport"]
