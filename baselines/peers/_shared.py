"""What every peer policy shares: the budget fallback, pairing, events, scaling and persisted state.

See the package docstring (:mod:`contextrender.baselines.peers`) for the rules; this module holds
their one implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contextrender.baselines._common import STATE_KIND, finish, state_key
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_positive, first_user, fit_verbatim, text_message_tokens

#: Reference context window (tokens) for the budget-scaled form of a peer's token sizes: a size
#: s shipped in tokens becomes s·B/REFERENCE_CONTEXT, a share f of the window becomes f·B.
#: 200,000 tokens is the window of the Claude models opencode and Anthropic's context editing
#: ship for (and close to gpt-4.1's usable window at the default output reserve).
REFERENCE_CONTEXT = 200_000

#: A placeholder function: the text a cleared result of ``seq`` shows.
Placeholder = Callable[[Session, int], str]


def scaled(tokens: float, budget: int, *, reference_context: int, scale_to_budget: bool) -> int:
    """A shipped token size in this harness: ``tokens``·B/``reference_context`` if scaled, else as shipped."""
    check_positive("reference_context", reference_context)
    return int(tokens * budget / reference_context) if scale_to_budget else int(tokens)


def events(session: Session, seq: int) -> int:
    """How many events of an agent framework's event list message ``seq`` is.

    OpenHands (and inspect's tool-use count) make one action per tool call, with the
    assistant's text riding on the first as its thought; every other message is one event.
    """
    m = session.message(seq)
    return max(1, len(m.tool_calls)) if m.role == "assistant" else 1


def results_by_call(session: Session) -> dict[int, list[int]]:
    """Assistant seq → seqs of the tool results of its calls, in the order of the calls."""
    out: dict[int, list[int]] = {}
    for r in session.results:
        if r.call_seq is not None:
            out.setdefault(r.call_seq, []).append(r.seq)
    for call_seq, seqs in out.items():
        order = {c.id: i for i, c in enumerate(session.message(call_seq).tool_calls)}
        seqs.sort(key=lambda s: (order.get(session.result(s).call_id, len(order)), s))
    return out


def paired(session: Session, shown: Iterable[int]) -> list[int]:
    """The pairing rule: a rendered call keeps its tool messages, a tool message needs its call.

    Results of a rendered assistant message are added (a peer rule never cuts inside a unit,
    so this only closes units the rule left open); results whose call is not rendered are
    dropped. A result without any call (an orphan) is left as the rule put it, as every
    method of the harness does.
    """
    keep = set(shown)
    by_call = results_by_call(session)
    for s in list(keep):
        keep.update(by_call.get(s, ()))
    out = []
    for s in sorted(keep):
        if session.is_result(s):
            cs = session.result(s).call_seq
            if cs is not None and cs not in keep:
                continue
        out.append(s)
    return out


@dataclass(frozen=True)
class Inserted:
    """A message a peer inserts (a summary): placed right before seq ``key`` (-1: after the system prompt)."""

    key: int
    message: dict[str, Any]
    tokens: int


def layout_tokens(session: Session, shown: Iterable[int], bodies: Mapping[int, str]) -> int:
    """Tok of the history seqs ``shown``, each at its body's size (a replaced text) or in full."""
    c = session.counter
    return sum(text_message_tokens(c, bodies[s]) if s in bodies else session.ntok(s) for s in shown)


def enforce_budget(session: Session, scope: Scope, budget: int, shown: Iterable[int], bodies: Mapping[int, str],
                   summary: Inserted | None, placeholder: Placeholder
                   ) -> tuple[list[int], dict[int, str], Inserted | None]:
    """The shared fallback: bring a peer's layout within B when its own rule leaves it above.

    1. The oldest results still shown in full are replaced by the peer's placeholder, oldest
       first, one at a time, until the history fits (a result whose placeholder would not be
       shorter is left as it is).
    2. If every result is a placeholder and the history still exceeds B, the verbatim-overflow
       rule of every method (:func:`~contextrender.render.fit_verbatim`, docs/method.md §5) drops the
       oldest turns — a user message, or an assistant message with its results — never the
       task's first user message, and clips that message if it alone is too long. It runs on
       the whole history with B less the summary and less what placeholders cost beyond the
       project's marker; what it keeps is intersected with the peer's layout (both keep
       whole units, so pairs stay whole). A summary that leaves no room is dropped.

    Returns the history seqs to render, their bodies and the summary (or None).
    """
    shown = sorted(set(shown))
    in_layout = set(shown)
    bodies = {s: t for s, t in bodies.items() if s in in_layout}
    s_tok = summary.tokens if summary is not None else 0
    c = session.counter
    costs = {s: (text_message_tokens(c, bodies[s]) if s in bodies else session.ntok(s)) for s in shown}
    total = sum(costs.values()) + s_tok
    if total <= budget:
        return shown, bodies, summary
    for s in shown:  # step 1: oldest first
        if not session.is_result(s):
            continue
        text = placeholder(session, s)
        if bodies.get(s) == text:
            continue
        cost = text_message_tokens(c, text)
        if cost >= costs[s]:
            continue
        bodies[s] = text
        total += cost - costs[s]
        costs[s] = cost
        if total <= budget:
            return shown, bodies, summary
    # step 2: the verbatim-overflow rule
    excess = sum(max(0, costs[s] - session.result(s).marker_ntok) for s in shown if session.is_result(s))
    room = budget - s_tok - excess
    if summary is not None and room < 1:
        summary, room = None, budget - excess
    trim = fit_verbatim(session, scope, max(room, 1))
    kept = set(trim.kept)
    shown = [s for s in shown if s in kept]
    bodies = {s: t for s, t in bodies.items() if s in kept}
    fu = first_user(session)
    if trim.clipped_first_user is not None and fu is not None and fu[0] in kept:
        bodies[fu[0]] = trim.clipped_first_user
    return shown, bodies, summary


def render_layout(name: str, session: Session, scope: Scope, budget: int, shown: Iterable[int], *,
                  bodies: Mapping[int, str] | None = None, summary: Inserted | None = None,
                  placeholder: Placeholder, usage: Usage | None = None) -> Rendered:
    """Pairing, the shared fallback, assembly and the one budget check (docs/method.md §5 postcondition)."""
    shown = paired(session, shown)
    shown, out_bodies, summary = enforce_budget(session, scope, budget, shown, dict(bodies or {}), summary,
                                                placeholder)
    visible = [s for s in shown if session.is_result(s) and s not in out_bodies]
    inserts = {summary.key: [summary.message]} if summary is not None else None
    return finish(name, session, scope, budget, shown, visible=visible, usage=usage or Usage(),
                  bodies=out_bodies, inserts=inserts)


# -- persisted state of the stateful peers (graph artifacts, like the summary baselines) ------------


def load_state(session: Session, name: str, budget: int) -> dict[str, Any] | None:
    return session.latest_artifact(STATE_KIND, state_key(name, budget))


def save_state(session: Session, name: str, budget: int, payload: dict[str, Any]) -> None:
    session.put_artifact(STATE_KIND, state_key(name, budget), payload)


def truncate_middle(text: str, max_chars: int) -> str:
    """``text`` cut to about ``max_chars`` characters, keeping its head and tail (0: unchanged)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + "\n[... truncated ...]\n" + text[len(text) - half:]
