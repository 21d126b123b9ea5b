"""Helpers shared by every baseline (docs/method.md §1, §5, §6).

All baselines use the same budget scope (:class:`~contextrender.render.Scope`:
the leading system prompt and the current user message are outside B), the
session's one token counter, the one budget check
(:func:`~contextrender.render.check_budget`) and the same project rules as
ContextRender (docs/method.md §5):

- an omitted tool result keeps its tool call and shows the omission marker,
  whose tokens are charged to B;
- when the verbatim user/assistant messages alone exceed B,
  :func:`~contextrender.render.fit_verbatim` decides what gives.

Every baseline and peer is a :class:`BasePolicy`: its :meth:`~BasePolicy.render`
is the one skeleton (the budget refused if it is not a positive integer, the
scope, the stored state, the full history while it fits B and nothing was
changed yet), and the policy's own step, :meth:`~BasePolicy.compose`, ends in
:func:`finish` — the budget check on the assembled prompt.

Stateful baselines (summaries) keep their state only in graph artifacts,
keyed by policy name and budget, so a reopened graph renders identically;
:class:`SummaryPolicy` is the base of the three summary policies (Compact,
Recency + Summary, ACON) and holds that state handling in one place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from contextrender.compaction import Compactor, ExtractiveCompactor
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import (
    Assembled,
    Rendered,
    Scope,
    Trim,
    assemble,
    check_share,
    first_user,
    fit_verbatim,
    fits,
    marker_text,
    seal,
    start_render,
    text_message_tokens,
)

#: Artifact kind of every baseline's persisted state.
STATE_KIND = "baseline_state"


# -- assembling and counting -------------------------------------------------------


def build(session: Session, scope: Scope, shown: Iterable[int], *, bodies: Mapping[int, str] | None = None,
          inserts: Mapping[int, list[dict[str, Any]]] | None = None) -> tuple[Assembled, int]:
    """Assemble the prompt and recount Tok(H_t) on the assembled messages.

    H_t is everything but the leading system messages and the current user
    message (told apart by the sources :func:`assemble` records); summary
    messages a policy inserts are history and are charged. Returns the
    assembled prompt (messages and their sources) and Tok(H_t).
    """
    assembled = assemble(session, scope, set(shown), bodies, inserts or {})
    outside = {*scope.system, scope.current}
    history = [m for m, src in zip(assembled.messages, assembled.sources, strict=True)
               if src is None or src not in outside]
    return assembled, session.counter.messages(history)


def finish(name: str, session: Session, scope: Scope, budget: int, shown: Iterable[int], *,
           visible: Iterable[int], usage: Usage, bodies: Mapping[int, str] | None = None,
           inserts: Mapping[int, list[dict[str, Any]]] | None = None, budgeted: bool = True) -> Rendered:
    """Assemble, recount and :func:`~contextrender.render.seal`: the budget check (docs/method.md §5 postcondition)."""
    assembled, tokens = build(session, scope, shown, bodies=bodies, inserts=inserts)
    return seal(name, budget, assembled, tokens, visible, usage, budgeted=budgeted)


def full_history(name: str, session: Session, scope: Scope, budget: int, usage: Usage | None = None,
                 budgeted: bool = True) -> Rendered:
    """The full history unchanged (every policy's shortcut when Tok(H_full) ≤ B)."""
    return finish(name, session, scope, budget, scope.history, visible=scope.history_results(session),
                  usage=usage or Usage(), budgeted=budgeted)


# -- the render skeleton ------------------------------------------------------------

#: What a policy reads from the graph before it renders (None for a stateless one).
StateT = TypeVar("StateT")


class BasePolicy(Generic[StateT]):
    """The skeleton every baseline and peer renders with (a :class:`~contextrender.render.ContextPolicy`).

    :meth:`render` is the template, the same for all of them:

    1. the budget is refused unless it is a positive integer, and the scope is
       taken (:func:`~contextrender.render.start_render`);
    2. the policy's stored state is read (:meth:`prepare`);
    3. while Tok(H_full) ≤ B and the state has changed nothing yet
       (:meth:`pristine`), the full history is returned unchanged
       (:func:`full_history`, docs/method.md §5 step 2) — unless the class turns the
       shortcut off (:attr:`full_when_fits`);
    4. otherwise the policy's own step, :meth:`compose`, which ends in
       :func:`finish` (directly or through a helper built on it): the prompt is
       assembled, Tok(H_t) recounted on it and checked against B.

    A subclass sets ``name`` (in ``__init__``) and implements :meth:`compose`;
    a stateful one also :meth:`prepare`, and :meth:`pristine` when its empty
    state is not None (an empty set, say). A stateless one derives from
    :class:`StatelessPolicy`.
    """

    name: str
    budgeted: bool = True
    #: Whether step 3 applies. Off for a policy whose own rule must see every render (Full history shows
    #: everything anyway; ACON compresses large observations even while the history fits B).
    full_when_fits: ClassVar[bool] = True

    def render(self, session: Session, budget: int) -> Rendered:
        """The history the model sees next, under ``budget`` (the steps in the class docstring)."""
        scope = start_render(session, budget)
        state = self.prepare(session, budget)
        if self.full_when_fits and self.pristine(state) and fits(session, scope, budget):
            return full_history(self.name, session, scope, budget, budgeted=self.budgeted)
        return self.compose(session, scope, budget, state)

    def prepare(self, session: Session, budget: int) -> StateT:
        """The state the policy stored for ``budget`` (step 2)."""
        raise NotImplementedError

    def pristine(self, state: StateT) -> bool:
        """Whether ``state`` has changed nothing yet, so the full history may stand in (default: it is None)."""
        return state is None

    def compose(self, session: Session, scope: Scope, budget: int, state: StateT) -> Rendered:
        """The policy's own render (step 4); it must end in :func:`finish`, the budget check."""
        raise NotImplementedError


class StatelessPolicy(BasePolicy[None]):
    """A :class:`BasePolicy` that stores nothing: every render depends only on the session and B."""

    def prepare(self, session: Session, budget: int) -> None:
        return None


# -- selection helpers --------------------------------------------------------------


def delta(session: Session, seq: int) -> int:
    """What showing result ``seq`` in full adds to a history where it is a marker."""
    r = session.result(seq)
    return r.ntok - r.marker_ntok


def trim_candidates(session: Session, trim: Trim) -> list[int]:
    """Results still rendered after :func:`fit_verbatim` (each at least as its marker), in order."""
    return [s for s in trim.kept if session.is_result(s)]


def fill(session: Session, order: Sequence[int], current: int, limit: int,
         chosen: list[int] | None = None) -> tuple[list[int], int]:
    """Visit ``order``; show each result in full if the history still fits ``limit``.

    One that does not fit is skipped and the next one is tried (no early stop).
    Returns the chosen seqs (in visiting order) and the new history size.
    """
    chosen = list(chosen or [])
    taken = set(chosen)
    for s in order:
        if s in taken:
            continue
        d = delta(session, s)
        if current + d <= limit:
            chosen.append(s)
            taken.add(s)
            current += d
    return chosen, current


def selection_bodies(session: Session, trim: Trim, full: Iterable[int],
                     replaced: Mapping[int, str] | None = None) -> dict[int, str]:
    """Bodies for a layout over ``trim``: markers for candidates not in ``full``
    (unless ``replaced`` gives another text) and the clipped task message, if any."""
    full = set(full)
    replaced = replaced or {}
    bodies: dict[int, str] = {}
    for s in trim_candidates(session, trim):
        if s in replaced:
            bodies[s] = replaced[s]
        elif s not in full:
            bodies[s] = marker_text(session, s)
    if trim.clipped_first_user is not None:
        fu = first_user(session)
        assert fu is not None
        bodies[fu[0]] = trim.clipped_first_user
    return bodies


# -- summaries ---------------------------------------------------------------------


def default_compactor(compactor: Compactor | None) -> Compactor:
    return compactor if compactor is not None else ExtractiveCompactor()


def transcript_text(session: Session, seqs: Iterable[int], bodies: Mapping[int, str] | None = None) -> str:
    """Messages as plain text for a compaction model (tool calls with their arguments)."""
    bodies = bodies or {}
    out: list[str] = []
    for s in seqs:
        m = session.message(s)
        content = bodies.get(s, m.content)
        if m.role == "tool":
            if session.is_result(s):
                r = session.result(s)
                out.append(f"[tool result of {r.tool_name} (call {r.call_id})]\n{content}")
            else:
                out.append(f"[tool result]\n{content}")
            continue
        if content:
            out.append(f"[{m.role}]\n{content}")
        for c in m.tool_calls:
            out.append(f"[{m.role} tool call {c.name} (call {c.id})]\n{c.arguments}")
    return "\n\n".join(out)


def summary_block(previous: str | None, label: str = "Summary so far") -> str:
    """Header placing a previous summary before newly compressed content."""
    return f"[{label}]\n{previous}\n\n" if previous else ""


def cap_text(session: Session, text: str, max_tokens: int) -> str:
    """Enforce a token cap with the session's counter (the compactor may count differently)."""
    c = session.counter
    return text if c.text(text) <= max_tokens else c.truncate(text, max(max_tokens, 0))


def summary_cost(session: Session, label: str) -> int:
    """Tok of a summary message that holds only its label line."""
    return text_message_tokens(session.counter, label + "\n")


def summary_message(session: Session, label: str, text: str, max_tokens: int) -> tuple[dict[str, Any] | None, int]:
    """A user-role summary message of at most ``max_tokens`` tokens, and its Tok.

    Returns ``(None, 0)`` when there is nothing to say or when not even the
    label fits (a summary without its label would be unattributed text).
    """
    if not text or max_tokens <= summary_cost(session, label):
        return None, 0
    body = cap_text(session, text, max_tokens - summary_cost(session, label))
    content = label + "\n" + body
    return {"role": "user", "content": content}, text_message_tokens(session.counter, content)


def compact(session: Session, compactor: Compactor, text: str, cap: int,
            instructions: str | None = None) -> tuple[str, Usage]:
    """One compaction call, with the cap enforced by the session's counter."""
    out, usage = compactor.compact(text, cap, instructions=instructions)
    return cap_text(session, out, cap), usage


# -- persisted state (artifacts) ---------------------------------------------------


def state_key(name: str, budget: int, *parts: str) -> str:
    """Artifacts of a stateful policy are keyed by its name and the budget."""
    return "|".join([name, f"B={budget}", *parts])


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Covered:
    """History a summary stands for: seqs < ``upto`` except those in ``exclude``.

    ``exclude`` holds the user message that was current (outside B) when the
    summary was written; once a newer user message arrives it is history again
    and is rendered verbatim until the next compaction covers it.
    """

    upto: int
    exclude: tuple[int, ...]
    summary: str

    def covers(self, seq: int) -> bool:
        return seq < self.upto and seq not in self.exclude

    def to_dict(self) -> dict[str, Any]:
        return {"upto": self.upto, "exclude": list(self.exclude), "summary": self.summary}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Covered:
        return Covered(int(d["upto"]), tuple(int(s) for s in d["exclude"]), str(d["summary"]))


def load_covered(session: Session, key: str) -> Covered | None:
    d = session.latest_artifact(STATE_KIND, key)
    return Covered.from_dict(d) if d is not None else None


def save_covered(session: Session, key: str, state: Covered, usage: Usage) -> None:
    session.put_artifact(STATE_KIND, key, {**state.to_dict(), "usage": usage.to_dict()})


def advance(scope: Scope, state: Covered | None, window: Sequence[int], keep_from: int, summary: str) -> Covered:
    """The state after a new summary that stands for the old one plus ``window`` seqs before ``keep_from``.

    Seqs the old summary covered stay covered; window seqs from ``keep_from`` on
    stay rendered; the current user message is never covered.
    """
    upto = max(keep_from, state.upto if state else 0)
    exclude = {s for s in window if keep_from <= s < upto}
    if scope.current is not None and scope.current < upto:
        exclude.add(scope.current)
    return Covered(upto, tuple(sorted(exclude)), summary)


def uncovered(scope: Scope, state: Covered | None) -> list[int]:
    """History seqs a summary does not stand for (rendered themselves)."""
    if state is None:
        return list(scope.history)
    return [s for s in scope.history if not state.covers(s)]


def dangling(session: Session, seqs: Iterable[int], state: Covered | None) -> bool:
    """True if a result among ``seqs`` belongs to a tool call a summary already covers.

    Rendering it would split a call/result pair; the caller folds it into the
    summary instead. Agent loops deliver results before the next model call,
    so this only happens with unusual transcripts.
    """
    if state is None:
        return False
    for s in seqs:
        if session.is_result(s):
            cs = session.result(s).call_seq
            if cs is not None and state.covers(cs):
                return True
    return False


def window_layout(session: Session, scope: Scope, window: Sequence[int], room: int,
                  replaced: Mapping[int, str] | None = None) -> tuple[list[int], dict[int, str], list[int]]:
    """Render ``window`` (uncovered history) within ``room`` tokens.

    Everything is shown as is (results in full or as their ``replaced`` text)
    when it fits. Otherwise the docs/method.md §5 project rules apply inside the window:
    :func:`fit_verbatim` keeps the user/assistant messages (dropping the oldest
    turns if they alone overflow) and results are shown newest first while
    they fit, the rest as markers. Returns (shown seqs, bodies, visible seqs).
    """
    replaced = dict(replaced or {})
    # A result whose call a summary stands for is not rendered alone (pairs never split).
    in_window = set(window)
    window = [s for s in window if not session.is_result(s) or session.result(s).call_seq is None
              or session.result(s).call_seq in in_window]
    results = [s for s in window if session.is_result(s)]

    def cost(s: int) -> int:
        if s in replaced:
            return text_message_tokens(session.counter, replaced[s])
        return session.ntok(s)

    if sum(cost(s) for s in window) <= room:
        visible = [s for s in results if s not in replaced]
        return list(window), dict(replaced), visible
    sub = Scope(scope.system, scope.current, tuple(window))
    trim = fit_verbatim(session, sub, max(room, 0))
    current = trim.base_tokens
    chosen: list[int] = []
    for s in reversed(trim_candidates(session, trim)):  # newest → oldest, skip and continue
        d = cost(s) - session.result(s).marker_ntok
        if current + d <= room:
            chosen.append(s)
            current += d
    bodies = selection_bodies(session, trim, chosen, {s: t for s, t in replaced.items() if s in chosen})
    visible = [s for s in chosen if s not in replaced]
    return list(trim.kept), bodies, visible


# -- the summary-policy base ---------------------------------------------------------


class Stored(NamedTuple):
    """A summary policy's state at a budget: its artifact key and what its summary covers (None: none yet)."""

    key: str
    covered: Covered | None


class SummaryPolicy(BasePolicy[Stored]):
    """Base of the summary policies: Compact, Recency + Summary and ACON (docs/method.md §6).

    A summary policy shows part of the history as one user-role summary
    message right after the system prompt — its :attr:`label` line, then the
    compaction model's text — and the rest itself. Shared, and kept here:

    - **persisted state**: the summary and the history it stands for
      (:class:`Covered`) are a graph artifact keyed by policy name, budget,
      compactor and :meth:`key_parts` (:meth:`load`), so a reopened graph
      resumes with the same summary and a repeated render at the same
      invocation never compacts twice;
    - **covered boundaries and re-compaction**: :meth:`summarise` sends the
      previous summary followed by the newly covered messages to the
      compaction model and stores the next state, which the subclass derives
      from the new summary text (:func:`advance` for Compact and ACON, an
      eviction boundary for Recency + Summary); :meth:`compress_window` is the
      whole compress-the-window-once-it-overflows step of Compact and ACON;
    - **usage**: a render reports what its own compaction calls cost (nothing
      when it reuses the stored summary); the artifact keeps the cost of the
      call that wrote it;
    - **budget fitting**: the summary message, label included, is at most a
      given number of tokens (:meth:`summary`; :meth:`body_cap` is what is
      left for the compaction model's text) and is charged to B;
    - the full-history shortcut (:class:`BasePolicy`: until the first summary,
      :meth:`prepare` and :meth:`pristine`) and the final assembly and budget
      check (:meth:`emit`).

    A subclass sets :attr:`label`, implements :meth:`~BasePolicy.compose` —
    when to compact, what to cover and how to show the rest — and may
    override :meth:`parse` (what is kept of the model's output) and
    :meth:`key_parts`.
    """

    #: First line of the summary message: says what the text is and what it replaces.
    label: ClassVar[str] = "[Summary]"
    #: Whether ``summary_share`` may be 1 (it may not when the rest of B must hold a window).
    share_may_be_one: ClassVar[bool] = True

    def __init__(self, *, compactor: Compactor | None, summary_share: float, name: str) -> None:
        check_share("summary_share", summary_share, allow_zero=False, allow_one=self.share_may_be_one)
        self.name = name
        self.compactor = default_compactor(compactor)
        self.summary_share = summary_share

    # -- state -------------------------------------------------------------------------

    def key_parts(self) -> tuple[str, ...]:
        """Extra parts of the state key (e.g. a digest of the prompts), after the compactor's name."""
        return ()

    def load(self, session: Session, budget: int) -> tuple[str, Covered | None]:
        """The state key for ``budget`` and the stored state (None before the first summary)."""
        key = state_key(self.name, budget, self.compactor.name, *self.key_parts())
        return key, load_covered(session, key)

    def prepare(self, session: Session, budget: int) -> Stored:
        """The state key and the stored state (:meth:`load`)."""
        return Stored(*self.load(session, budget))

    def pristine(self, state: Stored) -> bool:
        """Nothing has been summarised yet: the full history stands in while it fits B."""
        return state.covered is None

    # -- the summary message ---------------------------------------------------------------

    def summary(self, session: Session, state: Covered | None, max_tokens: int) -> tuple[dict[str, Any] | None, int]:
        """The summary message of ``state`` within ``max_tokens`` (label included) and its Tok; (None, 0) if none."""
        return summary_message(session, self.label, state.summary, max_tokens) if state else (None, 0)

    def body_cap(self, session: Session, max_tokens: int) -> int:
        """Tokens left for the summary text in a message of ``max_tokens`` (≤ 0: not even the label fits)."""
        return max_tokens - summary_cost(session, self.label)

    def parse(self, session: Session, output: str, cap: int) -> str:
        """What is kept of the compaction model's output (already capped to ``cap``): all of it."""
        return output

    def summarise(self, session: Session, key: str, state: Covered | None, seqs: Sequence[int], cap: int,
                  next_state: Callable[[str], Covered], *, bodies: Mapping[int, str] | None = None,
                  instructions: str | None = None) -> tuple[Covered, Usage]:
        """Compact the previous summary plus ``seqs`` into a summary of at most ``cap`` tokens; store
        and return the state ``next_state(summary)`` and the compaction's usage.

        ``bodies``: texts to use instead of stored contents (ACON's compressed
        observations). ``instructions``: the prompt template (default: the
        docs/method.md §6 summary prompt; see :func:`~contextrender.compaction.fill`).
        """
        text = summary_block(state.summary if state else None) + transcript_text(session, seqs, bodies)
        raw, usage = compact(session, self.compactor, text, cap, instructions=instructions)
        new = next_state(self.parse(session, raw, cap))
        save_covered(session, key, new, usage)
        return new, usage

    def compress_window(self, session: Session, scope: Scope, budget: int, key: str, state: Covered | None, *,
                        threshold: int, max_tokens: int, keep_from: Callable[[list[int], Covered | None], int],
                        usage: Usage, replaced: Mapping[int, str] | None = None,
                        instructions: str | None = None) -> Rendered:
        """Render the summary plus the history it does not cover; compress first if that is too long.

        The view — the summary message (at most ``max_tokens``) plus every
        uncovered message (``replaced`` ones at their replacement's size) — is
        compressed when it exceeds ``threshold``, or when a result's call is
        already covered (pairs never split): the seqs before
        ``keep_from(window, state)`` are folded, with the previous summary,
        into the next summary. Then :func:`window_layout` fits the uncovered
        history into what the summary leaves of B. ``usage`` is what the render
        spent before this step; the compaction's usage is added.
        """
        replaced = dict(replaced or {})
        window = uncovered(scope, state)
        _, s_tok = self.summary(session, state, max_tokens)

        def cost(s: int) -> int:
            return text_message_tokens(session.counter, replaced[s]) if s in replaced else session.ntok(s)

        if s_tok + sum(cost(s) for s in window) > threshold or dangling(session, window, state):
            start = keep_from(window, state)
            to_cover = [s for s in window if s < start]
            cap = self.body_cap(session, max_tokens)
            if to_cover and cap > 0:
                prev, covered_window = state, window
                state, u = self.summarise(session, key, prev, to_cover, cap,
                                          lambda text: advance(scope, prev, covered_window, start, text),
                                          bodies=replaced, instructions=instructions)
                usage = usage + u
                window = uncovered(scope, state)

        msg, s_tok = self.summary(session, state, max_tokens)
        shown, bodies, visible = window_layout(session, scope, window, budget - s_tok,
                                               {s: replaced[s] for s in window if s in replaced})
        return self.emit(session, scope, budget, shown, visible=visible, usage=usage, bodies=bodies, summary=msg)

    def emit(self, session: Session, scope: Scope, budget: int, shown: Iterable[int], *, visible: Iterable[int],
             usage: Usage, bodies: Mapping[int, str] | None, summary: dict[str, Any] | None) -> Rendered:
        """Assemble with the summary right after the system prompt, recount and check B (docs/method.md §5)."""
        return finish(self.name, session, scope, budget, shown, visible=visible, usage=usage, bodies=bodies,
                      inserts={-1: [summary]} if summary else None)
