"""The offline ``oracle``: a context-bounded script follower, NOT an LLM.

It isolates the effect of the context policy. For each user turn it emits
that turn's reference calls in order, one invocation per call (or per group
of parallel calls, where the reference groups them), then a short closing
message. Before each call it checks every scalar argument value whose
string form has at least 4 characters: if the value already appeared anywhere
earlier in the transcript but is not visible in what the policy rendered for
this invocation (system prompt, tools, rendered history, current user
message), the oracle cannot know it and emits the call with a wrong value —
so the task fails exactly as a real agent's would. Values never seen before
(inferred by the agent from the task) are assumed known. "Appeared" and
"visible" mean a whole-token occurrence; numbers compare by value, so
"$5,000" shows 5000 and "2120.0" does not show 120.

A closing message may carry values too (τ²-bench checks that the agent told
the user, e.g., a refund total): ``Reference.closing_values`` lists them per
turn, and the same rule applies — a listed value that appeared earlier but is
not visible is replaced in the text by a wrong one. Without closing values
(BFCL) the closing text is emitted as it is.

**Modes.** ``strict`` (the default, Table 1's) is the rule above: a hidden value makes a wrong call.
``reread`` models what a real agent usually does instead: before a call (or closing message) that
needs a hidden value, the oracle re-issues an earlier read-only call whose result held it — same
tool, same arguments, as an invocation of its own, charged like any other and counted against the
benchmark's step limits — so the value is in the transcript again, and proceeds when the policy
shows it. "Read-only" is the benchmark's own notion (``OracleEpisode.read_only``, set by the
benchmark: τ²'s tool types, BFCL's state check on a copy of the environment); a call with side
effects is never repeated, nor one whose own arguments are hidden. Each such call is tried once per
position in the script; when none is left, the value is emitted wrong as in ``strict``. Re-reads per
episode are recorded (``OracleEpisode.rereads``).
``expand`` models an agent offered the expand tool (docs/method.md §16): before a call (or closing message)
that needs a hidden value, the oracle calls ``contextrender_expand`` with a handle it can see in the render — the
marker of an omitted or shortened result that holds the value, or the line naming the results of turns the trim
dropped — narrowed to the JSON member that holds it (``key``), as an
agent that knows what it looks for would ask, then, if that does not bring it back, the whole result — and
proceeds when the policy shows the value. Each expansion is an invocation of its own, charged like any other and counted against
the benchmark's step limits (the episode answers it, as the service would). A value held by no visible handle
is emitted wrong as in ``strict``. Expansions per episode are recorded (``OracleEpisode.expansions``).

Usage is counted with the shared token counter as if the rendered input had
been sent and the call generated. Cached input tokens simulate provider prefix
caching (the unchanged message prefix since the previous call of the episode,
counted when it reaches 1,024 tokens, in 128-token steps), which gives ρ of
docs/method.md §7 a meaning offline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contextrender.events import Completion, Usage
from contextrender.expand import MAX_MATCH_WORDS, TOOL_NAME, ExpandError, handles_in, resolve
from contextrender.graph import Session
from contextrender.readiness import MIN_CHARS, numbers_in, occurs
from contextrender.tokens import TokenCounter

MIN_CHECKED_CHARS = MIN_CHARS
#: ``mode`` of the oracle: a hidden value makes a wrong call, or is first read again (module docstring).
MODES = ("strict", "reread", "expand")
WRONG_STRING = "UNKNOWN_VALUE"
CACHE_MIN_TOKENS = 1024
CACHE_STEP = 128
#: the call name ``hidden_log`` gives a closing message whose values were hidden
CLOSING = "<closing>"


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reference:
    """What a perfect agent does: per user turn, the calls in order, then ``closing`` text."""

    turns: tuple[tuple[ScriptedCall, ...], ...]
    closing: tuple[str, ...] = ()  # per-turn closing message; default "Done."
    # per turn: sizes of consecutive call groups emitted together in ONE invocation
    # (parallel tool calls); a missing or empty entry means one call per invocation
    groups: tuple[tuple[int, ...], ...] = ()
    # per turn: values the closing message states, checked like call arguments; a hidden one is
    # replaced where its str() occurs in the closing text as a whole token
    closing_values: tuple[tuple[Any, ...], ...] = ()

    def group_size(self, turn: int, emitted: int) -> int:
        """How many calls the invocation that starts at call ``emitted`` of ``turn`` emits."""
        start = 0
        for n in (self.groups[turn] if turn < len(self.groups) else ()):
            if start == emitted:
                return n
            start += n
        return 1

    def closing_for(self, turn: int) -> str:
        return self.closing[turn] if turn < len(self.closing) else "Done."

    def closing_values_for(self, turn: int) -> tuple[Any, ...]:
        return self.closing_values[turn] if turn < len(self.closing_values) else ()


def scalars(obj: Any) -> list[Any]:
    """Every scalar inside nested dicts/lists (the values an argument carries)."""
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in scalars(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in scalars(v)]
    return [obj]


def _numbers(text: str) -> set[float]:
    """Numbers written in ``text`` as whole tokens ("$5,000" -> 5000, "2120.0" is not 120): call readiness's rule."""
    return numbers_in(text)


def _occurs(value: Any, text: str, numbers: set[float]) -> bool:
    """``value`` appears in ``text`` as a whole token; numbers compare by value, not spelling."""
    return occurs(value, text, numbers)


def _wrong(value: Any) -> Any:
    if isinstance(value, str):
        return WRONG_STRING
    if isinstance(value, (int, float)):
        return type(value)(0 if value != 0 else 1)
    return value


def _replace(obj: Any, hidden: set[str]) -> Any:
    if isinstance(obj, dict):
        return {k: _replace(v, hidden) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_replace(v, hidden) for v in obj]
    if not isinstance(obj, bool) and obj is not None and str(obj) in hidden:
        return _wrong(obj)
    return obj


def _path_to(content: str, value: Any) -> str | None:
    """The key path (dots; list items by index) of the innermost object or list in JSON ``content`` that holds
    ``value`` as one of its own members — the row an expand call's ``key`` asks for. None for text, or when no
    member holds it."""
    try:
        data = json.loads(content)
    except ValueError:
        return None
    want = str(value)

    def walk(node: Any, path: list[str]) -> list[str] | None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            if isinstance(v, (dict, list)):
                got = walk(v, [*path, str(k)])
                if got is not None:
                    return got
            elif v is not None and _occurs(want, str(v), _numbers(str(v))):
                return path
        return None

    got = walk(data, [])
    return ".".join(got) if got else None


def _message_text(m: dict[str, Any]) -> str:
    parts = [m.get("content") or ""] if isinstance(m.get("content"), str) else [json.dumps(m.get("content"))]
    for tc in m.get("tool_calls") or []:
        parts.append(tc["function"]["name"])
        parts.append(tc["function"].get("arguments") or "")
    return "\n".join(parts)


@dataclass(frozen=True)
class _Seen:
    """What the transcript holds before an invocation and what the policy rendered for it."""

    earlier: str
    earlier_n: set[float]
    visible: str
    visible_n: set[float]

    @staticmethod
    def of(session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> _Seen:
        earlier = "\n".join(m.text() for m in session.messages)
        visible = json.dumps(tools or [], ensure_ascii=False) + "\n" + "\n".join(_message_text(m) for m in messages)
        return _Seen(earlier, _numbers(earlier), visible, _numbers(visible))

    def hidden(self, values: Any) -> set[str]:
        """The values (as strings) the oracle cannot know: seen earlier, not visible now."""
        return {str(v) for v in values
                if not isinstance(v, bool) and v is not None and len(str(v)) >= MIN_CHECKED_CHARS
                and _occurs(v, self.earlier, self.earlier_n) and not _occurs(v, self.visible, self.visible_n)}


class OracleModel:
    """Factory: ``episode(task, session)`` binds the oracle to a task's ``reference``.

    ``mode``: ``strict`` (name ``oracle``) or ``reread`` (name ``oracle_reread``: its runs are their own
    jobs and rows, beside the strict ones).
    """

    #: Its usage is counted, not reported by a provider: records carry no provider cache figures for it.
    simulated = True

    def __init__(self, encoding: str = "o200k_base", mode: str = "strict") -> None:
        if mode not in MODES:
            raise ValueError(f"oracle mode must be one of {MODES}, got {mode!r}")
        self.counter = TokenCounter(encoding)
        self.mode = mode
        self.name = "oracle" if mode == "strict" else f"oracle_{mode}"
        #: the episode offers the expand tool (docs/method.md §16) to a model that reads omitted results back
        self.expands = mode == "expand"

    def episode(self, task: Any, session: Session) -> OracleEpisode:
        reference = getattr(task, "reference", None)
        if not isinstance(reference, Reference):
            raise TypeError(f"the oracle needs task.reference (a Reference); {type(task).__name__} has none")
        return OracleEpisode(reference, session, self.counter, name=self.name, mode=self.mode)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        raise RuntimeError("the oracle must be bound to a task first: model.episode(task, session)")


@dataclass
class OracleEpisode:
    #: as :attr:`OracleModel.simulated`
    simulated = True
    reference: Reference
    session: Session
    counter: TokenCounter
    name: str = "oracle"
    mode: str = "strict"
    #: the benchmark's notion of a read-only call, (tool name, arguments) -> bool; None: no call is
    #: known to be read-only, so ``reread`` cannot re-read anything
    read_only: Callable[[str, dict[str, Any]], bool] | None = None
    hidden_log: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)
    #: (invocation, tool re-issued, the hidden values it was re-issued for)
    reread_log: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)
    #: (invocation, the expand call's arguments as JSON, the hidden values it was made for)
    expand_log: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)
    _prev: list[str] = field(default_factory=list)
    _reread_ids: set[str] = field(default_factory=set)
    _tried: set[str] = field(default_factory=set)
    _tried_at: tuple[int, int, bool] | None = None

    @property
    def expands(self) -> bool:
        """Whether the episode offers this model the expand tool (``expand`` mode)."""
        return self.mode == "expand"

    @property
    def expansions(self) -> int:
        """Expand calls this episode made (``expand`` mode)."""
        return len(self.expand_log)

    @property
    def rereads(self) -> int:
        """Calls this episode re-issued to read a hidden value again (``reread`` mode)."""
        return len(self.reread_log)

    def episode(self, task: Any, session: Session) -> OracleEpisode:
        return self

    def _position(self) -> tuple[int, int]:
        """(user turn index, script calls already emitted in that turn), read from the full transcript;
        the oracle's own re-reads are not script calls."""
        msgs = self.session.messages
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
        turn = sum(1 for m in msgs if m.role == "user") - 1
        emitted = sum(1 for m in msgs[last_user + 1:] if m.role == "assistant"
                      for c in m.tool_calls if c.id not in self._reread_ids and c.name != TOOL_NAME)
        return max(turn, 0), emitted

    def _reread(self, hidden: dict[str, Any], seen: _Seen, at: tuple[int, int, bool]) -> ScriptedCall | None:
        """The earlier read-only call to re-issue for ``hidden``: its result holds the most of them (then
        the newest such call), its own arguments are known, and it was not tried yet at this position."""
        if self._tried_at != at:
            self._tried_at, self._tried = at, set()
        if self.read_only is None or not hidden:
            return None
        msgs = self.session.messages
        calls = {c.id: c for m in msgs if m.role == "assistant" for c in m.tool_calls}
        best: tuple[int, int, ScriptedCall, str] | None = None
        for seq, m in enumerate(msgs):
            call = calls.get(m.tool_call_id or "") if m.role == "tool" else None
            if call is None:
                continue
            numbers = _numbers(m.content)
            covered = sum(1 for v in hidden.values() if _occurs(v, m.content, numbers))
            if not covered:
                continue
            try:
                args = json.loads(call.arguments) if call.arguments.strip() else {}
            except ValueError:
                continue
            key = call.name + "\n" + json.dumps(args, sort_keys=True)
            if not isinstance(args, dict) or key in self._tried or seen.hidden(scalars(args)):
                continue
            if not self.read_only(call.name, args):
                continue
            if best is None or (covered, seq) > (best[0], best[1]):
                best = (covered, seq, ScriptedCall(call.name, args), key)
        if best is None:
            return None
        self._tried.add(best[3])
        return best[2]

    def _expand(self, hidden: dict[str, Any], messages: list[dict[str, Any]],
                 at: tuple[int, int, bool]) -> dict[str, str] | None:
        """The expand call to make for ``hidden``: a handle visible in the render whose result holds the most of them
        (then the newest), narrowed to the rows or members holding any of them when it holds several (``match``),
        else to the JSON member holding the first (``key``), or, when that was asked for at this position already,
        the whole result. None when no visible handle holds any."""
        if self._tried_at != at:
            self._tried_at, self._tried = at, set()
        if not hidden:
            return None
        # In markers and shortened forms, and in the user-role line naming the results of turns the trim dropped
        handles = {h for m in messages if m.get("role") in ("tool", "user") for h in handles_in(_message_text(m))}
        best: tuple[int, int, dict[str, str], str] | None = None
        for h in sorted(handles):
            try:
                seq = resolve(self.session, h)
            except ExpandError:
                continue
            content = self.session.message(seq).content
            numbers = _numbers(content)
            covered = [v for v in hidden.values() if _occurs(v, content, numbers)]
            if not covered:
                continue
            # As an agent that knows what it is looking for would: several values of one result in one call, the rows
            # or members holding any of them (``match``); one value, the member holding it (``key``); then, should
            # that not bring it back, the whole result.
            words = [str(v) for v in covered]
            many = 1 < len(words) <= MAX_MATCH_WORDS and not any(c.isspace() or c == "," for w in words for c in w)
            path = _path_to(content, covered[0])
            tries = (([{"handle": h, "match": " ".join(words)}] if many else [])
                     + ([{"handle": h, "key": path}] if path else []) + [{"handle": h}])
            args = next((a for a in tries if json.dumps(a) not in self._tried), None)
            if args is None:
                continue
            key = json.dumps(args)
            if best is None or (len(covered), seq) > (best[0], best[1]):
                best = (len(covered), seq, args, key)
        if best is None:
            return None
        self._tried.add(best[3])
        return best[2]

    def _emit_expand(self, args: dict[str, str], hidden: dict[str, Any] | set[str], messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None) -> Completion:
        t = self.session.next_invocation
        arguments = json.dumps(args)
        self.expand_log.append((t, arguments, tuple(sorted(hidden))))
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{t}_expand", "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}]}
        return Completion(message, self._usage(messages, tools, message))

    def _emit_reread(self, call: ScriptedCall, hidden: dict[str, Any] | set[str], messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None) -> Completion:
        t = self.session.next_invocation
        cid = f"call_{t}_reread"
        self._reread_ids.add(cid)
        self.reread_log.append((t, call.name, tuple(sorted(hidden))))
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}]}
        return Completion(message, self._usage(messages, tools, message))

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        turn, emitted = self._position()
        calls = self.reference.turns[turn] if turn < len(self.reference.turns) else ()
        t = self.session.next_invocation
        if emitted < len(calls):
            batch = calls[emitted:emitted + self.reference.group_size(turn, emitted)]
            seen = _Seen.of(self.session, messages, tools)
            if self.mode == "reread":
                wanted = {str(v): v for call in batch for v in scalars(call.arguments)
                          if str(v) in seen.hidden(scalars(call.arguments))}
                again = self._reread(wanted, seen, (turn, emitted, False))
                if again is not None:
                    return self._emit_reread(again, wanted, messages, tools)
            elif self.mode == "expand":
                wanted = {str(v): v for call in batch for v in scalars(call.arguments)
                          if str(v) in seen.hidden(scalars(call.arguments))}
                ask = self._expand(wanted, messages, (turn, emitted, False))
                if ask is not None:
                    return self._emit_expand(ask, wanted, messages, tools)
            tool_calls = []
            for i, call in enumerate(batch):
                hidden = seen.hidden(scalars(call.arguments))
                args = _replace(call.arguments, hidden) if hidden else call.arguments
                if hidden:
                    self.hidden_log.append((t, call.name, tuple(sorted(hidden))))
                tool_calls.append({"id": f"call_{t}_{emitted + i}", "type": "function",
                                   "function": {"name": call.name, "arguments": json.dumps(args, ensure_ascii=False)}})
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": tool_calls}
        else:
            text = self.reference.closing_for(turn)
            values = self.reference.closing_values_for(turn)
            seen = _Seen.of(self.session, messages, tools)
            hidden = seen.hidden(values) if values else set()
            if hidden and self.mode == "reread":
                again = self._reread({v: v for v in hidden}, seen, (turn, emitted, True))
                if again is not None:
                    return self._emit_reread(again, hidden, messages, tools)
            if hidden and self.mode == "expand":
                ask = self._expand({v: v for v in hidden}, messages, (turn, emitted, True))
                if ask is not None:
                    return self._emit_expand(ask, hidden, messages, tools)
            if hidden:
                self.hidden_log.append((t, CLOSING, tuple(sorted(hidden))))
                for v in sorted(hidden, key=len, reverse=True):
                    text = re.sub(r"(?<![A-Za-z0-9_])" + re.escape(v) + r"(?![A-Za-z0-9_])", WRONG_STRING, text)
            message = {"role": "assistant", "content": text}
        return Completion(message, self._usage(messages, tools, message))

    def _usage(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               out: dict[str, Any]) -> Usage:
        tool_tokens = self.counter.text(json.dumps(tools)) if tools else 0
        per_msg = [self.counter.message(m) for m in messages]
        keys = [json.dumps(m, sort_keys=True) for m in messages]
        prefix = tool_tokens
        for a, b, n in zip(keys, self._prev, per_msg, strict=False):
            if a != b:
                break
            prefix += n
        self._prev = keys
        cached = (prefix // CACHE_STEP) * CACHE_STEP if prefix >= CACHE_MIN_TOKENS else 0
        total = tool_tokens + sum(per_msg)
        return Usage(input=total, output=self.counter.message(out), cached=min(cached, total), calls=1)
