"""Call readiness: could the agent still make its next call with what the policy rendered?

Recall (docs/method.md §7) asks whether a render kept the *results* later turns reuse, and it never counts
digit-only tokens, so it cannot see a render that hides the item id the very next call needs. Call
readiness asks the question the offline oracle fails a task on, of any recorded run:

* A tool call **needs** a value when the value is a scalar argument of the call — a string of at
  least :data:`MIN_CHARS` characters, or a number written with at least that many characters
  (booleans and nulls never) — that occurred earlier in the transcript **only inside tool results**:
  at least one earlier tool result contains it, and no earlier system, user or assistant message
  (text or tool-call arguments) does. A value the user or the agent already wrote down came from
  elsewhere; only a value the agent can have from a tool result alone is at the policy's mercy.
* The call is **ready** when every value it needs occurs somewhere in the messages the policy
  rendered for that invocation — in full, in a summary, a tabular form, a stub, anywhere.
* "Occurs" is a whole-token match: the value is not preceded or followed by a character of
  ``[A-Za-z0-9_]``, so ``roommate_1`` does not occur in ``roommate_12``. Numbers compare by value,
  as the oracle does: ``$5,000`` and ``5000.0`` show 5000, ``2120.0`` does not show 120, and the
  string ``"5000"`` is a string (it does not occur in ``$5,000``).
* A need's **source** is the first earlier tool result containing the value; its **age** is
  j − k for the call's invocation j and the invocation k whose call produced the source (recall's
  convention, so both bin alike: ≤3, 4–10, 11–25, >25). A call is binned by its oldest need.

Reported per method: **call readiness** (% of needing calls ready), **trace readiness** (% of traces
whose every needing call is ready — a trace with none counts as ready, as the oracle passes it),
both by age, and how many calls and traces needed something. docs/method.md ("Call readiness")
states the rule; the oracle (``experiments/runtime/oracle.py``) applies it to the calls it makes.

Everything here is incremental: :class:`NeedIndex` takes a transcript one message at a time, and the
cost of a call's needs is proportional to its own arguments and the postings of their tokens, never
to the whole history.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextrender.events import Message
from contextrender.recall import AGE_BINS, age_bin

#: A value must be written with at least this many characters to be needed (the oracle's rule).
MIN_CHARS = 4

#: Runs of the whole-token class: a value's boundaries are characters outside it.
_RUN = re.compile(r"[A-Za-z0-9_]+")
#: Numbers as written in text: "5,000", "12.5", "-3"; not the "120" inside "2120.0" or "v1.2.3".
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|\.\d)")


def numbers_in(text: str) -> set[float]:
    """Numbers written in ``text`` as whole tokens, by value ("$5,000" → 5000.0; "2120.0" is not 120)."""
    out: set[float] = set()
    for m in _NUMBER.finditer(text):
        try:
            out.add(float(m.group().replace(",", "")))
        except ValueError:
            pass
    return out


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def occurs(value: Any, text: str, numbers: set[float] | None = None) -> bool:
    """``value`` occurs in ``text`` as a whole token; numbers compare by value (``numbers``: those of
    ``text``, when the caller has them already)."""
    if is_number(value):
        return float(value) in (numbers if numbers is not None else numbers_in(text))
    return _whole(str(value)).search(text) is not None


def _whole(value: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9_])" + re.escape(value) + r"(?![A-Za-z0-9_])")


def scalars(obj: Any) -> list[Any]:
    """Every scalar inside nested dicts and lists (the values an argument carries)."""
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in scalars(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in scalars(v)]
    return [obj]


def checked_values(arguments: str) -> list[Any]:
    """The scalar argument values of a call that can be needed: strings of ≥ :data:`MIN_CHARS`
    characters and finite numbers written with that many, each once, in order. Arguments that are
    not a JSON object or array have none (a call the provider would refuse needs nothing)."""
    try:
        obj = json.loads(arguments) if arguments.strip() else {}
    except (TypeError, ValueError):
        return []
    out: list[Any] = []
    seen: set[tuple[bool, str]] = set()
    for v in scalars(obj):
        if v is None or isinstance(v, bool):
            continue
        if is_number(v) and not math.isfinite(float(v)):
            continue
        s = str(v)
        key = (is_number(v), s)
        if len(s) >= MIN_CHARS and key not in seen and (is_number(v) or _RUN.search(s)):
            seen.add(key)
            out.append(v)
    return out


def message_text(msg: Message | Mapping[str, Any]) -> str:
    """What a message shows: its text, then each tool call's name and decoded arguments."""
    m = msg if isinstance(msg, Message) else Message.from_openai(dict(msg))
    return m.text()


@dataclass(frozen=True)
class Need:
    """A value a call needs: as written, where it first came from, and how old that source was."""

    value: str
    number: bool
    source: int  # seq of the first earlier tool result containing it
    age: int  # j − k


@dataclass(frozen=True)
class CallNeeds:
    """The needs of one tool call of assistant turn ``j``."""

    j: int
    call_id: str
    name: str
    needs: tuple[Need, ...]

    @property
    def age(self) -> int | None:
        """Its oldest need's age (the bin a call is counted in); None when it needs nothing."""
        return max((n.age for n in self.needs), default=None)


class _Texts:
    """Whole-token postings over some messages: run → seqs holding it, number → seqs, and the texts."""

    def __init__(self) -> None:
        self.texts: dict[int, str] = {}
        self.runs: dict[str, list[int]] = {}
        self.numbers: dict[float, list[int]] = {}

    def add(self, seq: int, text: str) -> None:
        self.texts[seq] = text
        for r in set(_RUN.findall(text)):
            self.runs.setdefault(r, []).append(seq)
        for x in numbers_in(text):
            self.numbers.setdefault(x, []).append(seq)

    def first(self, value: Any) -> int | None:
        """The first seq whose text holds ``value`` as a whole token, or None."""
        if is_number(value):
            seqs = self.numbers.get(float(value))
            return seqs[0] if seqs else None
        s = str(value)
        runs = _RUN.findall(s)
        if not runs:
            return None
        if len(runs) == 1 and runs[0] == s:  # a single run: its postings are the answer
            seqs = self.runs.get(s)
            return seqs[0] if seqs else None
        # Several runs, or punctuation around one: candidates hold every run; the regex decides.
        postings = [self.runs.get(r) for r in set(runs)]
        if any(p is None for p in postings):
            return None
        rarest = min(postings, key=len)  # type: ignore[arg-type]
        pattern = _whole(s)
        for seq in rarest or ():
            if pattern.search(self.texts[seq]) is not None:
                return seq
        return None


class NeedIndex:
    """A transcript's tool results and other messages, fed in order, answering "what does a call need?".

    :meth:`needs` answers for an assistant message not yet added (its calls see only what came
    before it); :meth:`add` then appends it. Indices follow the transcript: ``seq`` is a message's
    position, invocation j counts assistant messages.
    """

    def __init__(self) -> None:
        self._results = _Texts()
        self._others = _Texts()
        self._n = 0
        self._j = 0
        self._call_inv: dict[str, int] = {}
        self._result_inv: dict[int, int] = {}

    def __len__(self) -> int:
        return self._n

    @property
    def invocation(self) -> int:
        """j of the next assistant message."""
        return self._j

    def add(self, msg: Message | Mapping[str, Any]) -> None:
        m = msg if isinstance(msg, Message) else Message.from_openai(dict(msg), f"message {self._n}")
        seq = self._n
        if m.role == "tool":
            self._result_inv[seq] = self._call_inv.get(str(m.tool_call_id), self._j - 1)
            self._results.add(seq, m.content)
        else:
            self._others.add(seq, m.text())
            if m.role == "assistant":
                for c in m.tool_calls:
                    self._call_inv[c.id] = self._j
                self._j += 1
        self._n += 1

    def extend(self, messages: Iterable[Message | Mapping[str, Any]]) -> None:
        for m in messages:
            self.add(m)

    def value_needs(self, value: Any) -> Need | None:
        """The need ``value`` makes at the next invocation, or None when a call using it needs nothing."""
        src = self._results.first(value)
        if src is None or self._others.first(value) is not None:
            return None
        return Need(str(value), is_number(value), src, self._j - self._result_inv[src])

    def needs(self, turn: Message | Mapping[str, Any]) -> list[CallNeeds]:
        """Per tool call of the assistant message ``turn`` (not yet added), what it needs."""
        m = turn if isinstance(turn, Message) else Message.from_openai(dict(turn), "turn")
        out = []
        for c in m.tool_calls:
            found = (self.value_needs(v) for v in checked_values(c.arguments))
            out.append(CallNeeds(self._j, c.id, c.name, tuple(n for n in found if n is not None)))
        return out


class RenderedText:
    """What a render shows, as whole tokens and numbers: answers "is this value visible?"."""

    def __init__(self, texts: Iterable[str]) -> None:
        self._t = _Texts()
        for i, text in enumerate(texts):
            self._t.add(i, text)

    @staticmethod
    def of(messages: Sequence[Mapping[str, Any] | Message]) -> RenderedText:
        return RenderedText(message_text(m) for m in messages)

    def shows(self, need: Need | Any) -> bool:
        if isinstance(need, Need):
            value: Any = float(need.value) if need.number else need.value
        else:
            value = need
        return self._t.first(value) is not None

    def missing(self, call: CallNeeds) -> tuple[str, ...]:
        """The needed values of ``call`` the render does not show (empty: the call is ready)."""
        return tuple(n.value for n in call.needs if not self.shows(n))


def _bins() -> dict[str, int]:
    return dict.fromkeys(AGE_BINS, 0)


def _pct(a: int, n: int) -> float | None:
    return 100.0 * a / n if n else None


@dataclass
class ReadinessStats:
    """Counts behind call and trace readiness; add two to pool them (micro-average over calls)."""

    calls: int = 0  # tool calls seen
    needing_by_age: dict[str, int] = field(default_factory=_bins)  # calls that needed something, by oldest need
    ready_by_age: dict[str, int] = field(default_factory=_bins)
    traces: int = 0
    ready_traces: int = 0  # traces whose every needing call was ready (one without any counts)
    needing_traces: int = 0  # traces with at least one needing call
    #: per bin: traces with a needing call in that bin, and those whose calls in that bin were all ready
    traces_by_age: dict[str, int] = field(default_factory=_bins)
    ready_traces_by_age: dict[str, int] = field(default_factory=_bins)

    @property
    def needing(self) -> int:
        return sum(self.needing_by_age.values())

    @property
    def ready(self) -> int:
        return sum(self.ready_by_age.values())

    @property
    def call_pct(self) -> float | None:
        """Call readiness: % of the calls that needed something whose needs were all visible."""
        return _pct(self.ready, self.needing)

    @property
    def trace_pct(self) -> float | None:
        """Trace readiness: % of traces whose every needing call was ready."""
        return _pct(self.ready_traces, self.traces)

    def __add__(self, other: ReadinessStats) -> ReadinessStats:
        def add(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
            return {k: a[k] + b[k] for k in AGE_BINS}

        return ReadinessStats(self.calls + other.calls, add(self.needing_by_age, other.needing_by_age),
                              add(self.ready_by_age, other.ready_by_age), self.traces + other.traces,
                              self.ready_traces + other.ready_traces, self.needing_traces + other.needing_traces,
                              add(self.traces_by_age, other.traces_by_age),
                              add(self.ready_traces_by_age, other.ready_traces_by_age))

    def to_dict(self) -> dict[str, Any]:
        """The raw counts (what a run record stores; :meth:`from_dict` reads them back)."""
        return {"calls": self.calls, "needing_by_age": dict(self.needing_by_age),
                "ready_by_age": dict(self.ready_by_age), "traces": self.traces, "ready_traces": self.ready_traces,
                "needing_traces": self.needing_traces, "traces_by_age": dict(self.traces_by_age),
                "ready_traces_by_age": dict(self.ready_traces_by_age)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ReadinessStats:
        def bins(x: Any) -> dict[str, int]:
            return {b: int((x or {}).get(b, 0)) for b in AGE_BINS}

        return ReadinessStats(int(d.get("calls", 0)), bins(d.get("needing_by_age")), bins(d.get("ready_by_age")),
                              int(d.get("traces", 0)), int(d.get("ready_traces", 0)),
                              int(d.get("needing_traces", 0)), bins(d.get("traces_by_age")),
                              bins(d.get("ready_traces_by_age")))

    def summary(self) -> dict[str, Any]:
        """The reported figures (percentages 0–100; None where nothing was needed) and their counts."""
        return {
            "call_readiness": self.call_pct,
            "call_readiness_by_age": {b: _pct(self.ready_by_age[b], self.needing_by_age[b]) for b in AGE_BINS},
            "trace_readiness": self.trace_pct,
            "trace_readiness_by_age": {b: _pct(self.ready_traces_by_age[b], self.traces_by_age[b])
                                       for b in AGE_BINS},
            "calls": self.calls,
            "needing_calls": self.needing,
            "needing_calls_by_age": dict(self.needing_by_age),
            "ready_calls": self.ready,
            "traces": self.traces,
            "needing_traces": self.needing_traces,
            "ready_traces": self.ready_traces,
        }


class ReadinessTracker:
    """Call and trace readiness of one policy over one episode, fed render by render.

    Per invocation: :meth:`on_turn` with the transcript before it (a session or a message list),
    what the policy rendered for it and the assistant message that followed. :meth:`stats` then
    holds the episode's counts (``traces`` = 1). The transcript must only grow.
    """

    def __init__(self) -> None:
        self.index = NeedIndex()
        self._calls = 0
        self._needing = _bins()
        self._ready = _bins()
        self._bin_ok: dict[str, bool] = {}  # bins with a needing call: all of them ready so far?

    def index_for(self, history: Any) -> NeedIndex:
        """The need index caught up with ``history`` (to ask what a turn would need before rendering for it)."""
        self._catch_up(history)
        return self.index

    def _catch_up(self, history: Any) -> None:
        n = len(history)
        if n < len(self.index):
            raise ValueError(f"the transcript shrank from {len(self.index)} to {n} messages")
        get = history.message if hasattr(history, "message") else history.__getitem__
        for seq in range(len(self.index), n):
            self.index.add(get(seq))

    def on_turn(self, history: Any, rendered: Sequence[Mapping[str, Any]] | RenderedText,
                turn: Message | Mapping[str, Any]) -> list[tuple[CallNeeds, tuple[str, ...]]]:
        """Score ``turn``'s calls against ``rendered``; returns each call's needs and what was missing."""
        self._catch_up(history)
        calls = self.index.needs(turn)
        self._calls += len(calls)
        if not any(c.needs for c in calls):
            return [(c, ()) for c in calls]
        shown = rendered if isinstance(rendered, RenderedText) else RenderedText.of(rendered)
        out = []
        for c in calls:
            missing = shown.missing(c) if c.needs else ()
            if c.needs:
                b = age_bin(c.age or 0)
                self._needing[b] += 1
                self._ready[b] += int(not missing)
                self._bin_ok[b] = self._bin_ok.get(b, True) and not missing
            out.append((c, missing))
        return out

    @property
    def stats(self) -> ReadinessStats:
        needing = any(self._needing.values())
        ok = all(self._bin_ok.values())
        return ReadinessStats(self._calls, dict(self._needing), dict(self._ready), 1, int(ok), int(needing),
                              {b: int(b in self._bin_ok) for b in AGE_BINS},
                              {b: int(self._bin_ok.get(b, False)) for b in AGE_BINS})


def replay_readiness(messages: Sequence[Message | Mapping[str, Any]], policy: Any, budget: int,
                     ) -> tuple[ReadinessStats, list[tuple[CallNeeds, tuple[str, ...]]]]:
    """Call readiness of a recorded transcript under ``policy`` at ``budget``: the transcript is replayed into a
    fresh in-memory session and the policy renders before every assistant message that makes a needing call,
    from the messages before it. Returns the stats (one trace) and, per needing call, what the render hid.

    A policy that learns from the other sessions of its graph file (``contextrender_plus``) sees none here.
    """
    from contextrender.graph import ContextGraph

    tracker = ReadinessTracker()
    out: list[tuple[CallNeeds, tuple[str, ...]]] = []
    with ContextGraph() as graph:
        session = graph.session("readiness")
        for raw in messages:
            m = raw if isinstance(raw, Message) else Message.from_openai(dict(raw), f"message {len(session)}")
            if m.role == "assistant" and any(c.needs for c in tracker.index_for(session).needs(m)):
                rendered = policy.render(session, budget)
                out += [(c, miss) for c, miss in tracker.on_turn(session, rendered.messages, m) if c.needs]
            elif m.role == "assistant":
                tracker.on_turn(session, (), m)
            session.add(m)
    return tracker.stats, out


def transcript_needs(messages: Sequence[Message | Mapping[str, Any]]) -> dict[int, list[CallNeeds]]:
    """Every assistant turn's call needs over a whole transcript: j → one entry per tool call."""
    index = NeedIndex()
    out: dict[int, list[CallNeeds]] = {}
    for raw in messages:
        m = raw if isinstance(raw, Message) else Message.from_openai(dict(raw), f"message {len(index)}")
        if m.role == "assistant":
            out[index.invocation] = index.needs(m)
        index.add(m)
    return out


__all__ = ["MIN_CHARS", "CallNeeds", "Need", "NeedIndex", "ReadinessStats", "ReadinessTracker", "RenderedText",
           "checked_values", "is_number", "message_text", "numbers_in", "occurs", "replay_readiness", "scalars",
           "transcript_needs"]
