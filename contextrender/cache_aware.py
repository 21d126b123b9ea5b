"""Cache-aware rendering: any policy's render, changed only when it must be (docs/method.md §15).

A provider bills the part of a prompt it finds in its prompt cache at a fraction of the input price,
and only a byte-identical prefix is found (docs/method.md §14). A policy that re-selects what to show at
every call changes its history early and pays the full (Anthropic: the write) price for everything after
the change, at every call. :class:`CacheAware` wraps any policy so that:

1. **What is shown stays as it was while the history fits.** The render for invocation t is the render
   made for the previous invocation with every message that arrived since appended in full, as long as
   that fits B. Its prefix is the previous request's, byte for byte, so the provider reads it from the
   cache and bills only the appended messages as new.
2. **When it must change, it changes once, with headroom.** When the appended render would exceed B,
   the wrapped policy renders afresh under B − h, and the following calls append to that render until it
   fills B again. The headroom h trades the write a re-render costs against the context it leaves unused
   (:func:`headroom`): from the profile's prices (what a re-written token costs beyond a cached one,
   relative to a plain input token) and the session's observed growth per call; never a constant.
3. Without a prompt cache (profile ``none``) there is nothing to keep warm: the policy renders as it
   always does.

The state — the latest render of each (session, budget) — is kept in memory (bounded); a session the
process has not rendered yet (after a restart, or evicted) starts with a fresh render. A repeated render
for the same invocation (a client retrying a request) answers from the state before it, so it is the
same render again.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contextrender.billing import PROFILE_MODELS, PricesUnavailable, prices, rules
from contextrender.events import Usage
from contextrender.graph import EXPAND_TOOL, Session
from contextrender.render import ContextPolicy, Rendered, Scope, check_budget, first_user, require_budget


def write_premium(profile: str, model: str | None = None) -> float:
    """c: what re-writing a token costs beyond reading it from the cache, in plain input tokens,
    (write − read) / input at the model's prices — Anthropic's 1.25 − 0.1 = 1.15, gpt-4.1's 1 − 0.25 = 0.75.
    0 without a cache. Without litellm's cost map the write is taken at the input price and the read as
    free (c = 1), and the render says so once in its log."""
    if rules(profile).profile == "none":
        return 0.0
    try:
        p = prices(model or PROFILE_MODELS[profile])
    except PricesUnavailable:
        return 1.0
    if p.input <= 0:
        return 0.0
    write = p.cache_write if profile == "anthropic" else p.input  # OpenAI bills no write premium
    return max(0.0, (write - p.cache_read) / p.input)


def request_shares(profile: str, model: str | None = None) -> tuple[float, float]:
    """(read, write): what a cached read and a cache write of a token cost, in plain input tokens, at the model's
    prices — Anthropic's (0.1, 1.25), gpt-4.1's (0.25, 1: OpenAI writes at the input price). (1, 1) without a cache;
    without litellm's cost map a read is taken as free and a write at the input price, as :func:`write_premium`."""
    if rules(profile).profile == "none":
        return 1.0, 1.0
    try:
        p = prices(model or PROFILE_MODELS[profile])
    except PricesUnavailable:
        return 0.0, 1.0
    if p.input <= 0:
        return 1.0, 1.0
    write = p.cache_write if profile == "anthropic" else p.input
    return p.cache_read / p.input, write / p.input


def headroom(budget: int, growth: float, premium: float) -> int:
    """h, the room a re-render leaves for the calls after it to append into.

    A re-render re-writes about B − h tokens at ``premium`` times the input price beyond a cached read;
    with the history growing by ``growth`` tokens per call, the next re-render comes about h / growth calls
    later. Counting a budget token left unused as worth what a plain input token costs per call (the
    price at which the user bought B), the cost per call of the cycle is h/2 + c·(B − h)·growth/h, least at
    h² + c·g·h − c·g·B = 0 (the square-root rule of ordering in batches). A headroom that would not hold even
    one call's growth buys nothing: then h = 0. At most half of B, the share the verbatim trim keeps.
    """
    if premium <= 0 or growth <= 0 or budget <= 0:
        return 0
    cg = premium * growth
    h = (-cg + math.sqrt(cg * cg + 4.0 * cg * budget)) / 2.0
    h = min(h, budget / 2.0)
    return int(h) if h >= growth else 0


@dataclass(frozen=True)
class _Plan:
    """One render, as the next call's appended render starts from it."""

    t: int  # the invocation it was made for
    n: int  # messages the session held
    messages: tuple[dict[str, Any], ...]
    sources: tuple[int | None, ...]
    visible: frozenset[int]
    tokens: int  # Tok(H_t) of the render
    current: int | None  # the current user message's seq (outside B) when it was made
    #: per rendered result: (its body, None when in full; its form), or None when the forms are unknown
    held: dict[int, tuple[str | None, str]] | None = None
    outside: int = 0  # Tok of the messages outside B (system prompt, current user message)
    _cum: list[int] | None = None  # Tok of its first k messages, for each k (filled on first use)

    def prefix_tokens(self, session: Session, k: int) -> int:
        """Tok of the first ``k`` messages of this render (each counted once per plan)."""
        if self._cum is None:
            cum, total = [0], 0
            for m, src in zip(self.messages, self.sources, strict=True):
                same = src is not None and src < len(session) and m.get("content") == session.message(src).content
                total += session.ntok(src) if same and src is not None else session.counter.message(m)
                cum.append(total)
            object.__setattr__(self, "_cum", cum)
        assert self._cum is not None
        return self._cum[min(k, len(self._cum) - 1)]


class CacheAware:
    """Wrap ``inner`` (any :class:`~contextrender.render.ContextPolicy`) so its renders keep a provider's prompt
    cache warm (module docstring; docs/method.md §15).

    Args:
        inner: the policy whose choices are rendered.
        profile: the billing profile whose prices decide the headroom (``anthropic``, ``openai``; ``none``
            renders as ``inner`` does).
        model: the model whose prices the profile uses (default :data:`PROFILE_MODELS`).
        max_sessions: sessions whose latest render is kept (least recently used dropped first).
    """

    def __init__(self, inner: ContextPolicy, *, profile: str = "anthropic", model: str | None = None,
                 max_sessions: int = 1024) -> None:
        self.inner = inner
        self.name = inner.name
        self.budgeted = inner.budgeted
        self.profile = rules(profile).profile
        self.premium = write_premium(self.profile, model)
        self.read_share, self.write_share = request_shares(self.profile, model)
        self.max_sessions = int(max_sessions)
        self._plans: OrderedDict[tuple[str, str, int, bool], tuple[_Plan | None, _Plan]] = OrderedDict()
        self._lock = threading.Lock()
        #: renders made afresh (the wrapped policy's), by appending, and by a late change, since construction
        self.fresh_renders = 0
        self.appended_renders = 0
        self.late_renders = 0
        # A selector that can hold results as an earlier render showed them changes late (docs/method.md §15)
        self._pins = _takes_pins(inner)

    def __getattr__(self, item: str) -> Any:
        # Everything else (select, scores, trim_prose_first, …) is the wrapped policy's.
        if item == "inner":
            raise AttributeError(item)
        return getattr(self.inner, item)

    # -- state --------------------------------------------------------------------------------------

    def _previous(self, key: tuple[str, str, int, bool], t: int) -> _Plan | None:
        with self._lock:
            held = self._plans.get(key)
            if held is None:
                return None
            self._plans.move_to_end(key)
        older, latest = held
        if latest.t < t:
            return latest
        return older if older is not None and older.t < t else None  # a repeated render of invocation t

    def _remember(self, key: tuple[str, str, int, bool], plan: _Plan) -> None:
        with self._lock:
            held = self._plans.get(key)
            prev = held[1] if held is not None and held[1].t < plan.t else (held[0] if held else None)
            self._plans[key] = (prev, plan)
            self._plans.move_to_end(key)
            while len(self._plans) > self.max_sessions:
                self._plans.popitem(last=False)

    # -- the render ---------------------------------------------------------------------------------

    def render(self, session: Session, budget: int) -> Rendered:
        """The render for the next invocation under ``budget``: the previous one appended to while it fits, else the
        wrapped policy's under B − h (module docstring)."""
        return self._render(session, budget, explain=False)[0]

    def select(self, session: Session, budget: int, *, explain: bool = True, profile: Any = None) -> Any:
        """As the wrapped selector's ``select`` (its scores when it rendered afresh; none for an appended render,
        which chose nothing)."""
        from contextrender.selector import Selection

        rendered, sel = self._render(session, budget, explain=explain, profile=profile)
        if sel is not None:
            return sel
        return Selection(rendered, (), Scope.of(session).full_tokens(session) <= budget, budget)

    def _render(self, session: Session, budget: int, *, explain: bool, profile: Any = None) -> tuple[Rendered, Any]:
        require_budget(budget)
        if not self.budgeted or self.premium <= 0:
            return self._inner(session, budget, explain, profile)
        # One chain of renders per session, budget and whether the tool is offered to this request: a render with
        # handles never continues one without them, nor the other way round (each is its own cached prefix).
        key = (session.graph.uid, session.id, int(budget), _recoverable(self.inner, session))
        t = session.next_invocation
        scope = Scope.of(session)
        prev = self._previous(key, t)
        if prev is not None:
            appended = self._appended(session, scope, prev, budget)
            fresh = None
            if appended is not None:
                forms = None if prev.held is None else {**{q: f for q, (_, f) in prev.held.items()}, **{
                    q: "full" for q in appended.visible if q >= prev.n}}
                if forms is not None and self._pins and not _recoverable(self.inner, session):
                    # Appending must not keep less than the method would now: a result the fresh render brings
                    # back (an older one the latest messages made relevant) forces the change (docs/method.md §15).
                    # Where the expand tool is offered, what a render left out is one expansion away: no change.
                    fresh = self.inner.pinning(session, budget, explain=False)({})  # type: ignore[attr-defined]
                    if not fresh.shortcut and not _covers(forms, _forms(fresh)):
                        appended = None
                if appended is not None:
                    self.appended_renders += 1
                    self._remember(key, self._plan(session, scope, t, appended, forms))
                    return appended, None
            if prev.held is not None and self._pins:
                late, fresh = self._late(session, budget, prev, profile, fresh)
                sel = late if late is not None else fresh
                if late is not None:
                    self.late_renders += 1
                else:
                    self.fresh_renders += 1
                self._remember(key, self._plan(session, scope, t, sel.rendered, _forms(sel)))
                return sel.rendered, sel
        rendered, sel = self._fresh(session, scope, budget, explain, profile)
        self.fresh_renders += 1
        self._remember(key, self._plan(session, scope, t, rendered, _forms(sel) if sel is not None else None))
        return rendered, sel

    def _late(self, session: Session, budget: int, prev: _Plan, profile: Any, fresh: Any = None) -> tuple[Any, Any]:
        """The change that costs least per call and loses no value (docs/method.md §15).

        Candidates hold the results ``prev`` rendered as it rendered them up to a cut (only those after it are
        chosen again), under B or under B − h (:func:`headroom`). A candidate qualifies when it keeps every value
        the fresh render keeps, result by result (:func:`_covers`). Of those and the fresh render, the one with the least
        write per call is taken: the tokens it re-sends from its first change on, at the profile's premium,
        spread over the calls its free room lets append before the next change (room / the session's growth
        per call). Returns (the late render or None when the fresh one wins, the fresh render)."""
        assert prev.held is not None
        at_b = self.inner.pinning(session, budget, explain=False)  # type: ignore[attr-defined]
        recoverable = _recoverable(self.inner, session)
        # What the model is reading back now (the answers of the expand calls since its last other turn) is shown in
        # full, by every candidate and the fresh render alike: shown weaker, it would be asked for again, and two
        # read-backs that push each other out would never end (docs/method.md §15, step 2).
        back: dict[int, tuple[str | None, str]] = dict.fromkeys(_reading_back(session), (None, "full")) \
            if recoverable else {}
        fresh = fresh if fresh is not None else (back and at_b(back)) or at_b({})
        assert fresh is not None
        if fresh.shortcut:
            return None, fresh
        growth = self._growth(session)
        h = headroom(budget, growth, self.premium)

        fresh_forms = _forms(fresh)
        scope = Scope.of(session)
        outside = session.tokens_of(scope.system) + (session.ntok(scope.current) if scope.current is not None else 0)

        def per_call(sel: Any) -> float:
            """In plain input tokens per call: what the change costs once — the re-sent tokens' premium and, where the
            tool is offered, the expansions a new result shown weaker than the method would show it is expected to
            cost (each one more request: the prompt read from the cache, the result written) — spread over the calls
            the free room lets append before the next change."""
            room = budget - sel.rendered.tokens
            once = self.premium * _rewritten(session, prev, sel.rendered)
            if recoverable:
                forms = _forms(sel)
                weaker = [q for q, f in fresh_forms.items() if q >= prev.n
                          and _KEEPS.get(forms.get(q, ""), 0) < _KEEPS.get(f, 0)]
                # A result the model has not seen yet is what it asked for last: shown weaker, it is read back.
                once += sum(self.read_share * (outside + sel.rendered.tokens) + self.write_share * session.ntok(q)
                            for q in weaker)
            return once / (1.0 + room / growth if growth > 0 else 1.0)

        held = sorted(q for q in prev.held if q < prev.n)
        # Every result keeps at least the form the fresh render gives it: what the method would show now is shown.
        # (Looser rules lost tasks: a full text held as its id form loses the words a later call takes from prose,
        # BFCL's "driver"; a result the previous render omitted that the latest messages made relevant again,
        # τ²-retail's item ids; letting a kept result keep only its weaker form moved a reread task; §15.)
        # Where the expand tool is offered, a value a render holds back is one expansion away, appended at the end
        # where it breaks no cached prefix: then every cut qualifies, so the latest one (under B and B − h) is
        # priced against the fresh render, the expected expansions included (§15, step 2).
        want = {q: "full" for q in back} if recoverable else fresh_forms
        best, best_cost = None, per_call(fresh)

        def consider(k: int, select: Any) -> Any:
            """The render holding the first k results under ``select``'s budget if it qualifies (kept when cheapest)."""
            nonlocal best, best_cost
            sel = select({**{q: prev.held[q] for q in held[:k]}, **back})  # type: ignore[index]
            if sel is None or not _covers(_forms(sel), want):
                return None
            cost = per_call(sel)
            if cost < best_cost:
                best, best_cost = sel, cost
            return sel

        # The latest cut first: when only what arrived must be chosen again, that is the least it can re-send. Less
        # room never keeps more, so under B − h a cut is tried only where it qualified under B with more than B − h.
        k = len(held)
        sel = consider(k, at_b)
        if sel is None and held:
            # Else the latest cut that still qualifies: an earlier cut frees more, so search by halving.
            lo, hi = 0, len(held)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                got = consider(mid, at_b)
                lo, hi, sel = (mid, hi, got) if got is not None else (lo, mid, sel)
            k = lo
        if sel is not None and k and h and sel.rendered.tokens > budget - h:
            consider(k, self.inner.pinning(session, budget - h, explain=False))  # type: ignore[attr-defined]
        return best, fresh

    def _growth(self, session: Session) -> float:
        """The session's history growth per call so far: its tokens beyond the task message per invocation."""
        scope = Scope.of(session)
        fu = first_user(session)
        task = session.ntok(fu[0]) if fu is not None and fu[0] != scope.current else 0
        return max(0.0, (scope.full_tokens(session) - task) / max(1, session.next_invocation))

    def _inner(self, session: Session, budget: int, explain: bool, profile: Any) -> tuple[Rendered, Any]:
        select = getattr(self.inner, "select", None)
        if callable(select):
            sel = select(session, budget, explain=explain, profile=profile)
            return sel.rendered, sel
        return self.inner.render(session, budget), None

    @staticmethod
    def _plan(session: Session, scope: Scope, t: int, r: Rendered, forms: Mapping[int, str] | None) -> _Plan:
        held = None
        if forms is not None:  # each rendered result's body: what its tool message carried, None when in full
            bodies = {src: m.get("content") for m, src in zip(r.messages, r.sources, strict=True)
                      if src is not None and session.is_result(src)}
            held = {q: (None if bodies[q] == session.message(q).content else str(bodies[q]), form)
                    for q, form in forms.items() if q in bodies}
        outside = session.tokens_of(scope.system) + (session.ntok(scope.current) if scope.current is not None else 0)
        return _Plan(t, len(session), r.messages, r.sources, r.visible, r.tokens, scope.current, held, outside)

    @staticmethod
    def _appended(session: Session, scope: Scope, prev: _Plan, budget: int) -> Rendered | None:
        """The previous render with every message since appended in full, if that fits B (else None)."""
        if len(session) < prev.n or not prev.sources or len(prev.sources) != len(prev.messages):
            return None
        current = scope.current
        tokens = prev.tokens
        if prev.current is not None and prev.current != current:
            tokens += session.ntok(prev.current)  # the previous user message is history now
        new = range(prev.n, len(session))
        tokens += sum(session.ntok(s) for s in new if s != current)
        if tokens > budget:
            return None
        added = [session.message(s).to_openai() for s in new]
        results = [s for s in new if session.is_result(s)]
        return Rendered(prev.messages + tuple(added), tokens, prev.visible | frozenset(results), Usage(),
                        prev.sources + tuple(new))

    def _fresh(self, session: Session, scope: Scope, budget: int, explain: bool,
               profile: Any) -> tuple[Rendered, Any]:
        """The wrapped policy's render under B − h (h: :func:`headroom`), or under B when the history fits."""
        full = scope.full_tokens(session)
        if full <= budget:
            return self._inner(session, budget, explain, profile)
        # A selector that changes late picks its room when it changes (_late); the first over-budget render is
        # the wrapped policy's own.
        h = 0 if self._pins else headroom(budget, self._growth(session), self.premium)
        rendered, sel = self._inner(session, max(1, budget - h), explain, profile)
        check_budget(rendered.tokens, budget, self.name)
        return rendered, sel


#: What a form keeps of a result (docs/method.md §15): its text; all its values (a table); its ids and numbers; some
#: (a lossy summary); nothing.
_KEEPS = {"full": 4, "tabular": 3, "ids": 2, "compacted": 1, "stub": 1}


def _forms(sel: Any) -> dict[int, str]:
    """seq -> form of every result a selection rendered (:attr:`~contextrender.selector.Selection.forms`; the full
    history's shortcut shows every result in full)."""
    if sel.shortcut:
        return dict.fromkeys(sel.rendered.visible, "full")
    return {q: f for q, f in sel.forms.items() if f != "not rendered"}


def _covers(late: Mapping[int, str], want: Mapping[int, str]) -> bool:
    """Whether ``late`` keeps, for every result, at least the values ``want`` asks for (:data:`_KEEPS`)."""
    return all(_KEEPS.get(late.get(q, ""), 0) >= _KEEPS.get(f, 0) for q, f in want.items())


def _rewritten(session: Session, prev: _Plan, r: Rendered) -> int:
    """Tokens ``r`` sends from its first message that differs from ``prev``'s on: what the provider bills anew. The
    leading system messages and the current user message lie outside Tok(H_t); both renders hold the same ones, so
    the difference of their totals is the history's."""
    k = 0
    for a, b in zip(prev.messages, r.messages, strict=False):
        if a != b:
            break
        k += 1
    kept = prev.prefix_tokens(session, k)
    scope = Scope.of(session)
    outside = session.tokens_of(scope.system) + (session.ntok(scope.current) if scope.current is not None else 0)
    return max(0, r.tokens + outside - kept)


def _recoverable(policy: Any, session: Session) -> bool:
    """Whether what ``policy``'s render leaves out stays within the model's reach: the expand tool is offered in
    ``session`` and the policy's markers carry handles (docs/method.md §16), so an omitted or shortened result's
    marker names the handle that reads it back."""
    from contextrender.expand import gives_handles, offered

    return gives_handles(policy) and offered(session)


def _reading_back(session: Session) -> list[int]:
    """The answers of the ``contextrender_expand`` calls the model made since its last other turn (its last message
    that was not only expand calls): what it is reading back for the step it is on."""
    out = []
    for seq in range(len(session) - 1, -1, -1):
        m = session.message(seq)
        if m.role == "tool":
            if session.is_result(seq) and session.result(seq).tool_name == EXPAND_TOOL:
                out.append(seq)
            continue
        if m.role == "assistant" and m.tool_calls and all(c.name == EXPAND_TOOL for c in m.tool_calls):
            continue
        break
    return out[::-1]


def _takes_pins(policy: Any) -> bool:
    return callable(getattr(policy, "pinning", None))


__all__ = ["CacheAware", "headroom", "request_shares", "write_premium"]
