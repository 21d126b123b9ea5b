"""Measures of the failure modes users report, for every method, in replay and in runs.

What users of other agent frameworks complain about in those projects' issue trackers: summaries
drop exact identifiers, agents re-read what a compaction hid, summarising costs a prompt-cache
miss, and trimming that splits a tool call from its result is rejected by providers. One
:class:`MeasureTracker` per (episode, method) watches every render and the assistant turn that
follows it — the same code in trace replay (:mod:`~contextrender.experiments.evaluation.replay`,
the recorded turn) and in runs (:class:`~contextrender.experiments.runtime.episode.Episode`, the
turn the model just produced) — and counts into a :class:`MeasureStats` (additive: pool
episodes by adding). Turn j is assistant message j of the transcript (invocation j); "rendered
before j" is the render the policy produced for invocation j, from the transcript before it.

**Identifier survival.** A *use* is a pair (j, v): assistant turn j (its content and each tool
call, as TFA scans an operation: :meth:`~contextrender.events.Message.text`) contains the value
v as a whole token under TFA's matching rules (:func:`~contextrender.tfa.match_tokens`), where
v is a qualifying value (:func:`~contextrender.tfa.extract_values`) of a tool result r earlier
in the transcript, and v's first whole-token appearance in the transcript (system prompt, user
messages, assistant content and calls, tool results, in order) is in r — its source, the first
result containing it, as TFA attributes; a value first seen in the task or in an assistant
message came from elsewhere and makes no use (recall's linking rule, docs/method.md §7). Each distinct
(j, v) counts once; its age is j − k for the invocation k whose call produced r. The use
*survives* when v occurs as a whole token (same rules) anywhere in the messages rendered
before j — in full, in a summary, a compacted form, a placeholder or an assistant message
that repeats it. Survival = 100·survived/uses, overall and by recall's age bins (≤3, 4–10,
11–25, >25). Unlike recall, a value that only a summary kept counts.

**Redundant re-reads.** A tool call of turn j *repeats* an earlier call when its name and
arguments (JSON parsed and re-dumped with sorted keys and no spaces; an unparsable string
stripped) equal those of a call of an earlier turn whose tool result is in the transcript. It
is a *re-read after hiding* when none of those earlier results is visible in full
(:attr:`~contextrender.render.Rendered.visible`) in the render before j. In a replay the calls
are the recorded agent's: the count is the recorded re-reads that the policy's render would
have left without their earlier result ("hidden, then re-read"); in a run they are the calls
the agent actually made. Reported as a count, per episode and per 100 tool calls; every
repeat (whatever was visible) is counted as well, for context.

**Prompt-cache prefix retention.** For invocation t > 0 of an episode: the tokens of the
longest run of leading messages of render t equal (as JSON with sorted keys) to the leading
messages of render t − 1, over the tokens of every message of render t, both counted with the
session's token counter message by message (:meth:`~contextrender.tokens.TokenCounter.message`,
as the offline oracle counts its cached prefix; tool schemas are not part of a render and are
left out, as are the oracle's 1,024-token minimum and 128-token steps). This is what a
provider's prefix cache can reuse, i.e. what drives ρ (docs/method.md §7). Reported as the mean share
over invocations (%), and token-weighted (Σ prefix / Σ input, %).

**Call readiness** (:mod:`contextrender.readiness`; docs/method.md, "Call readiness"): a tool call of
turn j *needs* a scalar argument value (a string of ≥ 4 characters, or a number written with ≥ 4)
that occurred earlier only inside tool results; it is *ready* when every value it needs occurs as a
whole token (numbers by value) anywhere in the render before j. Reported as call readiness (% of
needing calls ready), trace readiness (% of episodes whose every needing call was ready), both by the
age of the oldest need's source (recall's bins), with the counts. It is the offline oracle's failure
rule applied to the recorded calls; unlike recall it counts digit-only ids and any form of a value.

**Pairing validity**, asserted for every render: every tool message of the render directly
follows, over tool messages only, the assistant message holding its call, and every call of a
rendered assistant message whose result is in the transcript has its tool message there, as
provider APIs require. What the transcript itself does not pair (an orphan result — AppWorld's
text-mode outputs — or a call answered out of place) is not the policy's doing and is exempt.
A violation raises :class:`PairingError`: it is a bug, never a measure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextrender.events import Message
from contextrender.experiments.evaluation.recall import AGE_BINS, age_bin
from contextrender.readiness import ReadinessStats, ReadinessTracker, RenderedText
from contextrender.render import Rendered
from contextrender.tfa import extract_values, match_tokens
from contextrender.tokens import TokenCounter


class PairingError(AssertionError):
    """A render splits a tool call from its result (providers reject it with HTTP 400): a bug."""


# -- pairing --------------------------------------------------------------------------------


def pairing_errors(messages: Sequence[Mapping[str, Any]], *, called: Iterable[str] | None = None,
                   answered: Iterable[str] | None = None, exempt: Iterable[str] = ()) -> list[str]:
    """What breaks call/result pairing in a message list (empty: valid).

    The rule providers enforce: a tool message follows, over tool messages only, the assistant
    message holding its call, and every call of an assistant message has its tool message before
    the next non-tool message. ``called`` / ``answered``: the call ids the transcript made / has
    results for (None: every id; a call without a result yet needs none, a tool message of a call
    the transcript never made is an orphan there and left alone); ``exempt``: ids the transcript
    itself leaves unpaired.
    """
    called_ids = None if called is None else set(called)
    answered_ids = None if answered is None else set(answered)
    skip = set(exempt)
    errors: list[str] = []
    run: set[str] = set()  # calls of the assistant message whose tool run is open, still unanswered

    def close(i: int) -> None:
        missing = sorted(c for c in run if c not in skip and (answered_ids is None or c in answered_ids))
        if missing:
            errors.append(f"message {i}: call(s) {', '.join(missing)} have no tool message right after their "
                          "assistant message")

    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid in run:
                run.discard(cid)
            elif cid not in skip and (called_ids is None or cid in called_ids):
                errors.append(f"message {i}: tool message for call {cid!r} does not follow the assistant "
                              "message holding that call")
            continue
        close(i)
        run = {str(c.get("id")) for c in m.get("tool_calls") or ()} if role == "assistant" else set()
    close(len(messages))
    return errors


def check_pairing(messages: Sequence[Mapping[str, Any]], where: str, **kw: Any) -> None:
    """Raise :class:`PairingError` naming ``where`` if ``messages`` break pairing (see :func:`pairing_errors`)."""
    errors = pairing_errors(messages, **kw)
    if errors:
        raise PairingError(f"{where}: the render breaks tool call/result pairing: " + "; ".join(errors))


# -- calls ----------------------------------------------------------------------------------


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """(name, normalised arguments): JSON re-dumped with sorted keys and no spaces; else the stripped string."""
    try:
        args = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        args = arguments.strip()
    return name, args


# -- stats ----------------------------------------------------------------------------------


def _pct(a: float, n: float) -> float | None:
    return 100.0 * a / n if n else None


def _bins(d: Mapping[str, int] | None = None) -> dict[str, int]:
    return {b: int((d or {}).get(b, 0)) for b in AGE_BINS}


@dataclass
class MeasureStats:
    """Counts of the measures over some renders; add two to pool them (micro-average)."""

    episodes: int = 0
    renders: int = 0  # renders checked (pairing held for every one of them)
    id_uses_by_age: dict[str, int] = field(default_factory=_bins)
    id_survived_by_age: dict[str, int] = field(default_factory=_bins)
    tool_calls: int = 0
    repeat_calls: int = 0
    rereads: int = 0  # repeats whose earlier result was hidden (not visible in full) before the call
    prefix_invocations: int = 0  # invocations with a previous render in the episode
    prefix_share_sum: float = 0.0  # Σ per-invocation prefix share (0–1)
    prefix_tokens: int = 0
    prefix_input_tokens: int = 0
    readiness: ReadinessStats = field(default_factory=ReadinessStats)  # call and trace readiness
    # Where the expand tool is offered (a replay with ``expand``): needed values a render hid, those of them a
    # result the render marks with a handle holds (one expansion away), and the needing calls not ready whose
    # every hidden value is one expansion away.
    hidden_values: int = 0
    expandable_values: int = 0
    expandable_calls: int = 0

    @property
    def id_uses(self) -> int:
        return sum(self.id_uses_by_age.values())

    @property
    def id_survived(self) -> int:
        return sum(self.id_survived_by_age.values())

    def __add__(self, other: MeasureStats) -> MeasureStats:
        return MeasureStats(
            self.episodes + other.episodes, self.renders + other.renders,
            {b: self.id_uses_by_age[b] + other.id_uses_by_age[b] for b in AGE_BINS},
            {b: self.id_survived_by_age[b] + other.id_survived_by_age[b] for b in AGE_BINS},
            self.tool_calls + other.tool_calls, self.repeat_calls + other.repeat_calls, self.rereads + other.rereads,
            self.prefix_invocations + other.prefix_invocations, self.prefix_share_sum + other.prefix_share_sum,
            self.prefix_tokens + other.prefix_tokens, self.prefix_input_tokens + other.prefix_input_tokens,
            self.readiness + other.readiness, self.hidden_values + other.hidden_values,
            self.expandable_values + other.expandable_values, self.expandable_calls + other.expandable_calls)

    def to_dict(self) -> dict[str, Any]:
        """The raw counts (what a run record stores; :meth:`from_dict` reads them back)."""
        return {"episodes": self.episodes, "renders": self.renders, "id_uses_by_age": dict(self.id_uses_by_age),
                "id_survived_by_age": dict(self.id_survived_by_age), "tool_calls": self.tool_calls,
                "repeat_calls": self.repeat_calls, "rereads": self.rereads,
                "prefix_invocations": self.prefix_invocations, "prefix_share_sum": self.prefix_share_sum,
                "prefix_tokens": self.prefix_tokens, "prefix_input_tokens": self.prefix_input_tokens,
                "readiness": self.readiness.to_dict(), "hidden_values": self.hidden_values,
                "expandable_values": self.expandable_values, "expandable_calls": self.expandable_calls}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> MeasureStats:
        return MeasureStats(int(d.get("episodes", 0)), int(d.get("renders", 0)), _bins(d.get("id_uses_by_age")),
                            _bins(d.get("id_survived_by_age")), int(d.get("tool_calls", 0)),
                            int(d.get("repeat_calls", 0)), int(d.get("rereads", 0)),
                            int(d.get("prefix_invocations", 0)), float(d.get("prefix_share_sum", 0.0)),
                            int(d.get("prefix_tokens", 0)), int(d.get("prefix_input_tokens", 0)),
                            ReadinessStats.from_dict(d.get("readiness") or {}), int(d.get("hidden_values", 0)),
                            int(d.get("expandable_values", 0)), int(d.get("expandable_calls", 0)))

    def summary(self) -> dict[str, Any]:
        """The reported numbers (percentages 0–100; None where there is nothing to measure) and their counts."""
        return {
            "identifier_survival": _pct(self.id_survived, self.id_uses),
            "identifier_survival_by_age": {b: _pct(self.id_survived_by_age[b], self.id_uses_by_age[b])
                                           for b in AGE_BINS},
            "identifier_uses": self.id_uses,
            "identifier_uses_by_age": dict(self.id_uses_by_age),
            "rereads": self.rereads,
            "rereads_per_episode": self.rereads / self.episodes if self.episodes else None,
            "rereads_per_100_calls": _pct(self.rereads, self.tool_calls),
            "repeat_calls": self.repeat_calls,
            "tool_calls": self.tool_calls,
            "prefix_retention": _pct(self.prefix_share_sum, self.prefix_invocations),
            "prefix_retention_tokens": _pct(self.prefix_tokens, self.prefix_input_tokens),
            "prefix_invocations": self.prefix_invocations,
            "episodes": self.episodes,
            "pairing_checked_renders": self.renders,
            "readiness": self.readiness.summary(),
            "hidden_values": self.hidden_values,
            "one_expansion_away": self.expandable_values,
            "one_expansion_away_pct": _pct(self.expandable_values, self.hidden_values),
            "calls_ready_after_expansion": self.expandable_calls,
        }


@dataclass(frozen=True)
class TurnMeasures:
    """One invocation's measures (the per-invocation part of a run record's render stats)."""

    input_tokens: int  # Σ Tok of the rendered messages
    prefix_tokens: int | None  # of them, the prefix unchanged since the previous render (None: first render)
    id_uses: int = 0
    id_survived: int = 0
    calls: int = 0
    repeats: int = 0
    rereads: int = 0
    needing: int = 0  # calls that needed a value only tool results held (call readiness)
    ready: int = 0  # of them, with every needed value visible in the render


# -- the tracker ----------------------------------------------------------------------------


class MeasureTracker:
    """The measures of one method over one episode, fed render by render.

    Per invocation: :meth:`on_render` with the transcript before it (a session or a message
    list) and the render — it checks pairing (raising :class:`PairingError`) and measures prefix
    retention — then :meth:`on_turn` with the assistant message that followed, which measures
    identifier survival and re-reads against that render. The transcript must only grow.
    """

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.stats = MeasureStats(episodes=1)
        # transcript state, consumed incrementally
        self._n = 0
        self._j = 0  # assistant messages consumed = the invocation of the next turn
        self._first: dict[str, int | None] = {}  # token -> seq of the result it first appeared in, or None
        self._call_inv: dict[str, int] = {}  # call id -> invocation that made it (the latest, if ids repeat)
        self._result_inv: dict[int, int] = {}
        self._call_key: dict[str, tuple[str, str]] = {}
        self._results_by_key: dict[tuple[str, str], list[int]] = {}
        self._called: set[str] = set()
        self._answered: set[str] = set()
        self._exempt: set[str] = set()  # ids the transcript itself leaves unpaired
        self._run: set[str] = set()  # open tool run of the transcript scan
        # renders
        self._prev_keys: list[str] | None = None
        self._msg_memo: dict[str, tuple[int, frozenset[str] | None]] = {}
        self._pending: tuple[Rendered, list[str], TurnMeasures] | None = None
        self._history: Any = None
        self._text_memo: dict[str, str] = {}
        self._readiness = ReadinessTracker()
        self._marked: dict[int, RenderedText] = {}  # what each result the last render marks with a handle shows
        self._marked_texts: dict[int, RenderedText] = {}  # the same, of every result marked so far
        #: after :meth:`on_turn`: per result the render marked with a handle, the hidden needed values it holds
        #: (the expansions that turn's calls wait on), oldest result first
        self.expansions: dict[int, list[str]] = {}
        self.stats.readiness = self._readiness.stats  # an episode without a call is one ready trace

    # -- transcript ---------------------------------------------------------------------------

    def _catch_up(self, history: Any) -> None:
        n = len(history)
        if n < self._n:
            raise ValueError(f"the transcript shrank from {self._n} to {n} messages")
        get = history.message if hasattr(history, "message") else history.__getitem__
        for seq in range(self._n, n):
            self._feed(seq, Message.from_openai(get(seq), f"message {seq}"))
        self._n = n

    def _feed(self, seq: int, m: Message) -> None:
        # the transcript's own pairing, to exempt what it does not pair itself
        if m.role == "tool":
            cid = str(m.tool_call_id)
            if cid in self._run:
                self._run.discard(cid)
            else:
                self._exempt.add(cid)
        else:
            self._exempt.update(self._run)  # calls left without a result (or answered out of place)
            self._run = {c.id for c in m.tool_calls} if m.role == "assistant" else set()
        if m.role == "assistant":
            for tok in match_tokens(m.text()):
                self._first.setdefault(tok, None)
            for c in m.tool_calls:
                self._call_inv[c.id] = self._j
                self._call_key[c.id] = call_key(c.name, c.arguments)
                self._called.add(c.id)
            self._j += 1
        elif m.role == "tool":
            cid = str(m.tool_call_id)
            self._answered.add(cid)
            self._result_inv[seq] = self._call_inv.get(cid, self._j - 1)
            key = self._call_key.get(cid)
            if key is not None:
                self._results_by_key.setdefault(key, []).append(seq)
            for v in extract_values(m.content):
                self._first.setdefault(v, seq)
        else:
            for tok in match_tokens(m.content):
                self._first.setdefault(tok, None)

    # -- renders ------------------------------------------------------------------------------

    def _message(self, m: Mapping[str, Any], key: str, tokens: bool) -> tuple[int, frozenset[str] | None]:
        hit = self._msg_memo.get(key)
        if hit is None or (tokens and hit[1] is None):
            ntok = hit[0] if hit is not None else self.counter.message(dict(m))
            toks = frozenset(match_tokens(Message.from_openai(dict(m)).text())) if tokens else None
            hit = self._msg_memo[key] = (ntok, toks)
        return hit

    def on_render(self, history: Any, rendered: Rendered, where: str = "render",
                  marked: Iterable[int] = ()) -> TurnMeasures:
        """Check pairing and measure prefix retention for a render from ``history`` (the transcript before it).
        ``marked``: the results the render leaves one expansion away (:func:`contextrender.expand.marked_results`)."""
        if self._pending is not None:
            raise RuntimeError("on_render called twice without on_turn in between")
        self._catch_up(history)
        msgs = list(rendered.messages)
        check_pairing(msgs, where, called=self._called, answered=self._answered, exempt=self._exempt)
        keys = [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in msgs]
        ntoks = [self._message(m, k, False)[0] for m, k in zip(msgs, keys, strict=True)]
        total = sum(ntoks)
        prefix: int | None = None
        s = self.stats
        if self._prev_keys is not None:
            prefix = 0
            for a, b, n in zip(keys, self._prev_keys, ntoks, strict=False):
                if a != b:
                    break
                prefix += n
            s.prefix_invocations += 1
            s.prefix_share_sum += prefix / total if total else 1.0
            s.prefix_tokens += prefix
            s.prefix_input_tokens += total
        self._prev_keys = keys
        s.renders += 1
        tm = TurnMeasures(total, prefix)
        self._pending = (rendered, keys, tm)
        self._history = history
        get = history.message if hasattr(history, "message") else history.__getitem__
        for seq in marked:  # a result's text never changes: each is indexed once per episode
            if seq not in self._marked_texts:
                self._marked_texts[seq] = RenderedText([Message.from_openai(get(seq), f"message {seq}").content])
        self._marked = {seq: self._marked_texts[seq] for seq in sorted(marked)}
        self.expansions = {}
        return tm

    def on_turn(self, turn: Mapping[str, Any] | Message) -> TurnMeasures:
        """Measure identifier survival and re-reads of the assistant ``turn`` against the last render."""
        if self._pending is None:
            raise RuntimeError("on_turn without a render before it")
        rendered, keys, tm = self._pending
        self._pending = None
        msg = Message.from_openai(turn, "turn")
        s = self.stats
        j = self._j
        uses: dict[str, int] = {}
        for v in match_tokens(msg.text()):
            src = self._first.get(v)
            if src is not None:
                uses[v] = src
        survived = 0
        if uses:
            shown: set[str] = set()
            for m, k in zip(rendered.messages, keys, strict=True):
                toks = self._message(m, k, True)[1]
                assert toks is not None
                shown |= toks
            for v, src in uses.items():
                b = age_bin(j - self._result_inv[src])
                s.id_uses_by_age[b] += 1
                if v in shown:
                    s.id_survived_by_age[b] += 1
                    survived += 1
        repeats = rereads = 0
        visible = rendered.visible
        for c in msg.tool_calls:
            earlier = self._results_by_key.get(call_key(c.name, c.arguments))
            if earlier:
                repeats += 1
                if not any(r in visible for r in earlier):
                    rereads += 1
        s.tool_calls += len(msg.tool_calls)
        s.repeat_calls += repeats
        s.rereads += rereads
        needing = ready = 0
        if msg.tool_calls:
            texts = [self._texts(m, k) for m, k in zip(rendered.messages, keys, strict=True)]
            for call, missing in self._readiness.on_turn(self._history, RenderedText(texts), msg):
                if call.needs:
                    needing += 1
                    ready += int(not missing)
                if missing:
                    away = 0
                    for n in call.needs:
                        holder = next((q for q, text in self._marked.items() if text.shows(n)), None) \
                            if n.value in missing else None
                        if holder is not None:
                            away += 1
                            self.expansions.setdefault(holder, []).append(n.value)
                    s.hidden_values += len(missing)
                    s.expandable_values += away
                    s.expandable_calls += int(away == len(missing))
        s.readiness = self._readiness.stats
        return TurnMeasures(tm.input_tokens, tm.prefix_tokens, len(uses), survived, len(msg.tool_calls), repeats,
                            rereads, needing, ready)

    def _texts(self, m: Mapping[str, Any], key: str) -> str:
        text = self._text_memo.get(key)
        if text is None:
            text = self._text_memo[key] = Message.from_openai(dict(m)).text()
        return text


__all__ = ["MeasureStats", "MeasureTracker", "PairingError", "TurnMeasures", "call_key", "check_pairing",
           "pairing_errors"]
