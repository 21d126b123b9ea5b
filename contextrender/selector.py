"""ContextRender: budgeted selection of tool results (docs/method.md §5, paper Algorithm 1).

Before each model call, :class:`ContextRender` renders a history under B:

1. the session already holds every event, with TFA run on arrival (graph.py);
2. if Tok(H_full) ≤ B the full history is returned unchanged;
3. otherwise user and assistant messages are kept verbatim and charged first
   (every tool result starts as its omission marker);
4. greedy: repeatedly add the feasible result maximising
   R_t(r|S) = U_t(r) − 0.5·D(r,S), feasibility measured on the assembled history;
5. a result larger than B may enter as a compacted form (oversized fallback);
6. results are emitted with their tool calls in chronological order, and
   Tok(H_t) ≤ B is checked on the assembled messages.

Variant selectors (``contextrender_plus``, the hindsight ceiling) do not
subclass the phases: they pass extension points to the constructor —
``terms`` (extra usefulness terms), ``chooser`` (replaces step 4),
``filler`` (texts for omitted results in the budget left over),
``marker`` (what an omitted result's tool message says) and ``compacts``
(whether an oversized result is compacted at all). With none given the
selector is exactly the paper's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import numpy as np

from contextrender.compaction import Compactor
from contextrender.embed import LazyEmbedder, checked_output
from contextrender.events import Usage
from contextrender.expand import dropped_line as expand_dropped_line
from contextrender.expand import marker as expand_marker
from contextrender.expand import offered as expand_offered
from contextrender.expand import shortened_note
from contextrender.graph import ResultArrays, Session
from contextrender.render import (
    Rendered,
    Scope,
    Trim,
    assemble,
    check_share,
    first_user,
    fit_verbatim,
    fits,
    focus_text,
    marker_text,
    seal,
    start_render,
    task_text,
    text_message_tokens,
)
from contextrender.scoring import ScoringParams, Weights, matvec, query_vector, relevance, usefulness

#: ``ResultScore.form``: how a result appears in the render.
FULL, COMPACTED, OMITTED, NOT_RENDERED = "full", "compacted", "omitted", "not rendered"


@dataclass(frozen=True)
class ResultScore:
    """Why a result was or was not rendered at invocation t (every number behind the decision)."""

    seq: int
    tool_name: str
    tokens: int  # Tok of the full tool message
    age: int  # a_t(r) = t − k
    reuse_count: float  # c_t(r), Eq. 1
    relevance: float  # s_t(r)
    usefulness: float  # U_t(r) (plus any extra terms of a variant selector)
    candidate: bool  # False if its turn was trimmed to fit the verbatim messages
    pick: int | None  # greedy step at which it was selected (0 = first), None if omitted
    gain: float | None  # R_t(r|S) when it was picked
    compacted: bool  # rendered in compacted form (not visible in full)
    #: D(r,S) = max cos(emb r, emb r') over S (docs/method.md §5) at the step it was picked, or at the last step it
    #: was feasible and lost; None if it never competed (not a candidate, or it never fit).
    similarity: float | None = None
    #: "picked", "not a candidate" (its turn was trimmed), "did not fit" (never feasible while unpicked),
    #: or "outscored by <seq>" (the result picked at the last step at which this one still fit).
    reason: str = ""
    lost_to: int | None = None  # the seq in "outscored by <seq>"
    form: str = FULL  # full | compacted | omitted | not rendered | a filler's label (e.g. "stub")


@dataclass(frozen=True)
class Selection:
    """A render plus the scores behind it."""

    rendered: Rendered
    scores: tuple[ResultScore, ...]
    shortcut: bool  # True when the full history fit (docs/method.md §5 step 2)
    budget: int
    #: seq -> form of every result the render holds (full, compacted, omitted, a filler's label, a pinned form), also
    #: without ``explain``; empty for the full-history shortcut (every result in full)
    forms: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stage:
    """What Algorithm 1 knows about the candidates before the greedy (arrays in transcript order)."""

    scope: Scope
    results: list[int]  # result seqs
    arrays: ResultArrays
    embs: np.ndarray  # unit embeddings, one row per result
    usage: Usage
    ages: np.ndarray  # a_t(r)
    counts: np.ndarray  # c_t(r)
    rel: np.ndarray  # s_t(r)
    util: np.ndarray  # U_t(r)
    trim: Trim
    cand: np.ndarray  # results whose turn survived the verbatim trim
    delta: np.ndarray  # Tok change when a result replaces its marker (full or compacted)
    compacted: dict[int, str]  # index -> compacted text of oversized results
    marker_cost: np.ndarray  # Tok of each result's tool message as its marker
    base_tokens: int  # Tok(H_t(∅)): the kept verbatim messages, every candidate as its marker, pinned results as pinned
    #: index -> (body, form) of a result held as an earlier render showed it (body None: in full); never a candidate
    pinned: Mapping[int, tuple[str | None, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    """What a chooser picked: a mask over ``Stage.results`` and the picks in order as (index, R)."""

    chosen: np.ndarray
    picks: list[tuple[int, float]]
    total: float = 0.0
    #: per result: the index picked at the last step at which it was feasible and lost (−1: never), the
    #: D(r,S) it had then, and D(r,S) at its own pick — filled when the chooser traces (explanations).
    lost_to: np.ndarray | None = None
    lost_sim: np.ndarray | None = None
    pick_sim: np.ndarray | None = None
    #: index -> a lighter form the chooser charged for an unchosen result (e.g. "ids"); the filler places it
    reserved: Mapping[int, str] | None = None


class PinUnavailable(ValueError):
    """The forms asked to be held cannot be: the verbatim messages overflow B, so whole turns are trimmed and the
    earlier render's layout does not hold (docs/method.md §15)."""


#: ``select(..., pinned=)``: seq -> (the body its tool message carries, its form); body None: in full.
Pins = Mapping[int, tuple[str | None, str]]


class ScoreTerm(Protocol):
    """An extra usefulness term (not the paper's): added to U_t(r) before the greedy."""

    def __call__(self, session: Session, st: Stage) -> np.ndarray: ...


class Chooser(Protocol):
    """Replaces step 4: which candidates to show in full (or compacted, for oversized ones)."""

    def __call__(self, session: Session, st: Stage, budget: int, diversity: float, trace: bool) -> Choice: ...


@dataclass(frozen=True)
class FillRoom:
    """What a body filler may use: the omitted candidates and the budget left after the chosen results."""

    session: Session
    stage: Stage
    chosen: np.ndarray
    budget: int
    current: int  # Tok(H_t) with the chosen results and every other candidate as its marker
    bodies: Mapping[int, str]  # the bodies so far (markers, compacted forms)
    compact: Callable[[int, int], tuple[str, Usage]]  # (seq, token cap) -> cached compacted text
    reserved: Mapping[int, str] = field(default_factory=dict)  # the chooser's Choice.reserved


class BodyFiller(Protocol):
    """Texts for omitted results in the leftover budget: seq -> (text, form label), and what it spent."""

    def __call__(self, room: FillRoom) -> tuple[dict[int, tuple[str, str]], Usage]: ...


class Profile:
    """Wall-clock spans of one ``select`` (for ``make bench``): ``spans[name]`` in seconds, summed."""

    def __init__(self) -> None:
        self.spans: dict[str, float] = {}

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spans[name] = self.spans.get(name, 0.0) + time.perf_counter() - t0


@contextmanager
def _span(profile: Profile | None, name: str) -> Iterator[None]:
    if profile is None:
        yield
        return
    with profile.span(name):
        yield


def greedy(util: np.ndarray, delta: np.ndarray, cand: np.ndarray, embs: np.ndarray, base: int, budget: int,
           diversity: float, *, density: bool = False, trace: bool = False) -> Choice:
    """docs/method.md §5 step 4: add the feasible result maximising R_t(r|S) = U_t(r) − diversity·D(r,S) until
    nothing fits.

    ``density=True`` ranks by R per token instead (an extension used by contextrender_plus; not the
    paper's rule): a result no larger than its marker costs nothing and is taken first.
    ``trace=True`` also records, for each result, who beat it at the last step it still fit.
    """
    n = len(util)
    chosen = np.zeros(n, dtype=bool)
    dmax = np.zeros(n, dtype=np.float64)  # D(r,S); D(r,∅) = 0, and max(0, ·) by starting at 0
    picks: list[tuple[int, float]] = []
    current = base
    total = 0.0
    cost = np.maximum(delta, 1).astype(np.float64)
    lost_to = np.full(n, -1, dtype=np.int64) if trace else None
    lost_sim = np.zeros(n, dtype=np.float64) if trace else None
    pick_sim = np.zeros(n, dtype=np.float64) if trace else None
    while True:
        # Recomputed each step: a result smaller than its marker lowers Tok and can reopen others.
        feasible = cand & ~chosen & (current + delta <= budget)
        if not feasible.any():
            break
        gain = util - diversity * dmax
        key = gain
        if density:
            key = np.where(gain > 0, np.where(delta <= 0, np.inf, gain / cost), gain * cost)
        # argmax returns the first maximum: transcript order, ties → older result.
        i = int(np.argmax(np.where(feasible, key, -np.inf)))
        if trace:
            assert lost_to is not None and lost_sim is not None and pick_sim is not None
            losers = feasible.copy()
            losers[i] = False
            lost_to[losers] = i
            lost_sim[losers] = dmax[losers]
            pick_sim[i] = dmax[i]
        chosen[i] = True
        current += int(delta[i])
        picks.append((i, float(gain[i])))
        total += float(gain[i])
        if diversity != 0.0:
            np.maximum(dmax, matvec(embs, embs[i]), out=dmax)
    return Choice(chosen, picks, total, lost_to, lost_sim, pick_sim)


def paper_greedy(session: Session, st: Stage, budget: int, diversity: float, trace: bool) -> Choice:
    """The paper's step 4 (docs/method.md §5): :func:`greedy` on R_t(r|S)."""
    return greedy(st.util, st.delta, st.cand, st.embs, st.base_tokens, budget, diversity, trace=trace)


class ContextRender(LazyEmbedder):
    """The paper's selector. Ablations are the same class with other :class:`Weights`.

    Args:
        weights, lam, gamma, diversity, task_chars: the constants of docs/method.md §4–§5 (paper defaults), or
            ``params`` with all of them.
        embedder: any :class:`~contextrender.embed.Embedder`; default the local MiniLM model
            (:class:`~contextrender.embed.LocalEmbedder`: ``tokenizers`` and its weights).
        compactor: enables the oversized-result fallback (docs/method.md §5 step 5) — without one, a result
            larger than B is never rendered in full or compacted.
        oversized_share: a compacted oversized result may use at most this share of B.
        terms, chooser, filler, marker, compacts: extension points for variant selectors (module docstring);
            none of them is the paper's. ``compacts(session, seq, cap)`` False: the oversized result ``seq`` is
            not compacted (no compactor call; it is never shown in full either).
        trim_prose_first: on verbatim overflow, drop old assistant prose before the oldest units
            (:func:`~contextrender.render.fit_verbatim`); off (the project's docs/method.md §5 rule) unless a variant
            turns it on.
        name: the policy's name in records.
    """

    budgeted = True

    def __init__(self, *, weights: Weights | Mapping[str, float] | None = None, lam: float = 0.3,
                 gamma: float = 0.2, diversity: float = 0.5, task_chars: int = 2000,
                 params: ScoringParams | None = None, embedder: Any = None,
                 compactor: Compactor | None = None, oversized_share: float = 0.25,
                 terms: Sequence[ScoreTerm] = (), chooser: Chooser | None = None,
                 filler: BodyFiller | None = None, marker: Callable[[Session, int], str] | None = None,
                 compacts: Callable[[Session, int, int], bool] | None = None,
                 trim_prose_first: bool = False, expand: bool = False, name: str = "contextrender") -> None:
        if params is None:
            w = Weights(**dict(weights)) if isinstance(weights, Mapping) else (weights or Weights())
            params = ScoringParams(weights=w, lam=lam, gamma=gamma, diversity=diversity, task_chars=task_chars)
        self.params = params
        self.name = name
        self._embedder = embedder
        self.compactor = compactor
        # Project choice (spec silent): a compacted oversized result may use at most this share of B.
        self.oversized_share = check_share("oversized_share", oversized_share, allow_zero=False)
        self.terms = tuple(terms)
        self.chooser: Chooser = chooser or paper_greedy
        self.filler = filler
        self.marker = marker
        self.compacts = compacts
        # Verbatim overflow (docs/method.md §5 project rule): the oldest units first; True = old assistant prose first
        # (render.fit_verbatim's prose_first; contextrender_plus only — the paper's policy keeps the rule).
        self.trim_prose_first = bool(trim_prose_first)
        # docs/method.md §16: where the expand tool is offered, an omitted result's marker carries its handle.
        self.expand = bool(expand)
        self._task_emb: dict[str, np.ndarray] = {}

    def render(self, session: Session, budget: int) -> Rendered:
        """The history the model sees next, under ``budget`` (docs/method.md §5).

        Args:
            session: the graph session holding the agent's full history.
            budget: B, in tokens of the session's counter.

        Returns:
            The rendered messages, Tok(H_t), the visible results and what the render spent.
        """
        return self.select(session, budget, explain=False).rendered

    # -- the algorithm ---------------------------------------------------------

    def select(self, session: Session, budget: int, *, explain: bool = True,
               profile: Profile | None = None, pinned: Pins | None = None) -> Selection:
        """Run Algorithm 1.

        Args:
            session: the graph session.
            budget: B in tokens.
            explain: also return every result's :class:`ResultScore` (scores, similarity penalty,
                the reason it was or was not shown).
            profile: a :class:`Profile` that receives the time of each phase (``make bench``).
            pinned: results held in the form an earlier render gave them (seq -> (body, form); body None:
                in full): charged as they are, never candidates — the cache-aware render re-chooses only
                what follows them (docs/method.md §15). Not the paper's; raises :class:`PinUnavailable` when
                the verbatim messages overflow B.

        Returns:
            The :class:`Selection`: the render, the scores (when ``explain``), whether the full
            history fit.
        """
        with _span(profile, "score"):
            st = self._stage(session, budget, profile)
        if isinstance(st, Selection):
            return st
        if pinned:
            st = self._pin(session, st, budget, pinned)
        return self._select_from(session, budget, st, explain, profile)

    def pinning(self, session: Session, budget: int, *, explain: bool = True) -> Callable[[Pins], Selection | None]:
        """A :meth:`select` that takes only the results to hold (docs/method.md §15), the scores computed once for every
        set it is asked; it answers None for a set that cannot be held (:class:`PinUnavailable`), and the full
        history's selection for any set when that fits."""
        st = self._stage(session, budget, None)

        def select(pins: Pins) -> Selection | None:
            if isinstance(st, Selection):
                return st
            try:
                held = self._pin(session, st, budget, pins) if pins else st
            except PinUnavailable:
                return None
            return self._select_from(session, budget, held, explain, None)

        return select

    def _select_from(self, session: Session, budget: int, st: Stage, explain: bool,
                     profile: Profile | None) -> Selection:
        """Steps 4–6 from a stage: choose, fill the bodies, assemble and check."""
        with _span(profile, "choose"):
            choice = self.chooser(session, st, budget, self.params.diversity, explain)
        with _span(profile, "bodies"):
            bodies, forms, markers, usage = self._bodies(session, st, choice.chosen, budget, choice.reserved)
        with _span(profile, "finish"):
            return self._finish(session, budget, replace(st, usage=st.usage + usage), choice, bodies, forms,
                                markers, explain, profile)

    def _stage(self, session: Session, budget: int, profile: Profile | None) -> Stage | Selection:
        """The shared preamble (``start_render``), then steps 1–3 and 5 — or the full history when it fits."""
        p = self.params
        scope = start_render(session, budget)
        results = scope.history_results(session)
        usage = Usage()
        # docs/method.md §2: every result's embedding is computed once, when it first reaches the selector.
        with _span(profile, "embeddings"):
            embs, u = session.result_embeddings(self.embedder, results)
        usage += u

        if fits(session, scope, budget):  # docs/method.md §5 step 2: the full history, unchanged
            # Nothing was replaced, so Tok(H_t) is the stored Tok(H_full) the test compared with B: no recount.
            msgs, sources = assemble(session, scope, scope.history)
            rendered = Rendered(tuple(msgs), scope.full_tokens(session), frozenset(results), usage, tuple(sources))
            return Selection(rendered, (), True, budget)

        arrays = session.result_arrays()
        n = len(results)
        ages = (session.next_invocation - arrays.invocation).astype(np.float64)  # a_t(r) = t − k
        counts = np.zeros(n, dtype=np.float64)  # c_t(r), Eq. 1
        with _span(profile, "reuse"):
            reuse = session.flow.reuse_scores()
            if reuse:
                keys = np.fromiter(reuse.keys(), dtype=np.int64, count=len(reuse))
                counts[np.searchsorted(arrays.seqs, keys)] = np.fromiter(reuse.values(), dtype=np.float64,
                                                                         count=len(reuse))
        mark = self._marker(session)
        # The expand tool's markers are longer than the stored one: the trim counts them (docs/method.md §16).
        expand_cost = None if mark is not expand_marker else np.fromiter(
            (text_message_tokens(session.counter, mark(session, s)) for s in results), dtype=np.int64, count=n)
        with _span(profile, "trim"):
            # docs/method.md §5 step 3; §16: where the tool is offered, the results of dropped turns stay named
            trim = fit_verbatim(session, scope, budget, prose_first=self.trim_prose_first, marker_cost=expand_cost,
                                dropped_line=None if expand_cost is None else partial(expand_dropped_line, session))
        if len(trim.kept) == len(scope.history):
            cand = np.ones(n, dtype=bool)
        else:
            cand = np.isin(arrays.seqs, np.fromiter(trim.kept, dtype=np.int64, count=len(trim.kept)))
        rel = np.zeros(n)
        if p.weights.relevance != 0.0 and n:
            with _span(profile, "query"):
                q, u = self._query(session, scope, trim.kept)
            usage += u
            with _span(profile, "relevance"):
                rel = relevance(embs, q)
        with _span(profile, "usefulness"):
            util = usefulness(ages, counts, rel, p)

        # What an omitted result costs: the stored marker, or a variant's own marker text. The verbatim
        # trim above was decided with the stored markers (a variant's: the candidates do not change) or with the
        # expand tool's, which it counted already.
        marker_cost = arrays.marker_ntok if expand_cost is None else expand_cost
        base = trim.base_tokens
        if mark is not None and expand_cost is None:
            marker_cost = np.fromiter((text_message_tokens(session.counter, mark(session, s))
                                       for s in results), dtype=np.int64, count=n)
            base -= int(np.where(cand, arrays.marker_ntok - marker_cost, 0).sum())

        body_cost = arrays.ntok.copy()
        compacted: dict[int, str] = {}
        with _span(profile, "compaction"):
            if self.compactor is not None:  # docs/method.md §5 step 5: oversized-result fallback
                cap = max(1, int(self.oversized_share * budget))
                for i in np.flatnonzero(cand & (arrays.ntok > budget)).tolist():
                    if self.compacts is not None and not self.compacts(session, results[i], cap):
                        continue
                    text, u = self._compacted(session, results[i], cap)
                    usage += u
                    compacted[i] = text
                    body_cost[i] = text_message_tokens(session.counter, text)
        delta = body_cost - marker_cost  # what adding r changes in Tok(H_t(S))
        st = Stage(scope, results, arrays, embs, usage, ages, counts, rel, util, trim, cand, delta, compacted,
                   marker_cost, base)
        if self.terms and n:
            extra = np.zeros(n)
            for term in self.terms:
                extra = extra + term(session, st)
            st = replace(st, util=util + extra)
        return st

    def _pin(self, session: Session, st: Stage, budget: int, pinned: Pins) -> Stage:
        """``st`` with ``pinned`` held (docs/method.md §15): each held result leaves the candidates and is charged as it
        is held. Raises :class:`PinUnavailable` when the verbatim messages overflow B (whole turns are trimmed) or
        the held results and the verbatim messages exceed B. The scores and usefulness of the others are those of
        ``st``: no term of the selector reads which results are candidates."""
        if len(st.trim.kept) != len(st.scope.history):
            raise PinUnavailable(f"{self.name}: the verbatim messages overflow B={budget}; nothing is held")
        cand = st.cand.copy()
        base = st.base_tokens
        pins: dict[int, tuple[str | None, str]] = {}
        index = {int(seq): i for i, seq in enumerate(st.arrays.seqs.tolist())}
        for seq, (body, form) in pinned.items():
            k = index.get(int(seq))
            if k is None or not cand[k]:
                continue
            pins[k] = (body, form)
            cand[k] = False
            held = int(st.arrays.ntok[k]) if body is None else text_message_tokens(session.counter, body)
            base += held - int(st.marker_cost[k])
        if base > budget:
            raise PinUnavailable(f"{self.name}: the held results and the verbatim messages exceed B={budget}")
        return replace(st, cand=cand, base_tokens=base, pinned=pins)

    def _marker(self, session: Session) -> Callable[[Session, int], str] | None:
        """What an omitted result's tool message says, when it is not the stored marker: the expand tool's marker
        with the result's handle where the tool is offered (docs/method.md §16), else a variant's own marker."""
        if self.expand and expand_offered(session):
            return expand_marker
        return self.marker

    def _bodies(self, session: Session, st: Stage, chosen: np.ndarray, budget: int,
                reserved: Mapping[int, str] | None = None) -> tuple[dict[int, str], dict[int, str], set[int], Usage]:
        """Step 6: what replaces each result's text — its marker if omitted, its compacted form if
        oversized, a filler's text in the room left — and the clipped task message.

        Returns the bodies, the form of each replaced result, the seqs whose body is the stored marker
        (counted from the stored marker cost) and what a filler spent.
        """
        omitted = [st.results[i] for i in np.flatnonzero(st.cand & ~chosen).tolist()]
        mark = self._marker(session)
        bodies: dict[int, str] = {s: (mark or marker_text)(session, s) for s in omitted}
        forms: dict[int, str] = dict.fromkeys(omitted, OMITTED)
        for i, text in st.compacted.items():
            if chosen[i]:
                bodies[st.results[i]] = text
                forms[st.results[i]] = COMPACTED
        markers = set(omitted) if mark is None else set()
        for i, (body, form) in st.pinned.items():
            forms[st.results[i]] = form
            if body is not None:
                bodies[st.results[i]] = body  # counted afresh in _history_tokens
        usage = Usage()
        if self.filler is not None and omitted:
            current = st.base_tokens + int(st.delta[chosen].sum())
            filled, usage = self.filler(FillRoom(session, st, chosen, budget, current, bodies,
                                                 lambda seq, cap: self._compacted(session, seq, cap),
                                                 dict(reserved or {})))
            for seq, (text, form) in filled.items():
                bodies[seq] = text
                forms[seq] = form
                markers.discard(seq)  # counted afresh; a compacted form or stub is never visible
        if st.trim.clipped_first_user is not None:
            fu = first_user(session)
            assert fu is not None
            bodies[fu[0]] = st.trim.clipped_first_user
        return bodies, forms, markers, usage

    def _finish(self, session: Session, budget: int, st: Stage, choice: Choice, bodies: dict[int, str],
                forms: dict[int, str], markers: set[int], explain: bool, profile: Profile | None = None) -> Selection:
        """Step 6: chronological assembly, the budget check on what was assembled
        (:func:`~contextrender.render.seal`, as every policy ends), explanations."""
        with _span(profile, "assemble"):
            assembled = assemble(session, st.scope, st.trim.kept, bodies, st.trim.inserts())
        with _span(profile, "history_tokens"):
            tokens = _history_tokens(session, st.trim.kept, bodies, markers)
            if st.trim.dropped_note is not None:  # docs/method.md §16: the line naming the dropped turns' results
                tokens += st.trim.dropped_note[2]
        full_shown = choice.chosen.copy()
        full_shown[list(st.compacted)] = False  # a compacted form is not the result's full text
        for i, (body, _) in st.pinned.items():
            full_shown[i] = body is None
        with _span(profile, "check"):
            rendered = seal(self.name, budget, assembled, tokens, st.arrays.seqs[full_shown].tolist(), st.usage)
        scores = self._explain(session, st, choice, forms) if explain else ()
        shown = {st.results[i]: (COMPACTED if i in st.compacted else FULL) for i in np.flatnonzero(choice.chosen).tolist()}
        return Selection(rendered, scores, False, budget, {**forms, **shown})

    @staticmethod
    def _explain(session: Session, st: Stage, choice: Choice, forms: Mapping[int, str]) -> tuple[ResultScore, ...]:
        order = {i: (k, g) for k, (i, g) in enumerate(choice.picks)}
        out = []
        for i, s in enumerate(st.results):
            sim: float | None = None
            lost: int | None = None
            if i in st.pinned:
                reason, form = "pinned", st.pinned[i][1]
            elif not st.cand[i]:
                reason, form = "not a candidate", NOT_RENDERED
            elif i in order:
                reason, form = "picked", forms.get(s, FULL)
                sim = float(choice.pick_sim[i]) if choice.pick_sim is not None else None
            else:
                form = forms.get(s, OMITTED)
                if choice.lost_to is not None and choice.lost_to[i] >= 0:
                    lost = st.results[int(choice.lost_to[i])]
                    reason = f"outscored by {lost}"
                    assert choice.lost_sim is not None
                    sim = float(choice.lost_sim[i])
                else:
                    reason = "did not fit"
            out.append(ResultScore(
                seq=s, tool_name=session.result(s).tool_name, tokens=int(st.arrays.ntok[i]), age=int(st.ages[i]),
                reuse_count=float(st.counts[i]), relevance=float(st.rel[i]), usefulness=float(st.util[i]),
                candidate=bool(st.cand[i]), pick=order[i][0] if i in order else None,
                gain=order[i][1] if i in order else None, compacted=i in st.compacted and bool(choice.chosen[i]),
                similarity=sim, reason=reason, lost_to=lost, form=form))
        return tuple(out)

    # -- helpers ---------------------------------------------------------------

    def _query(self, session: Session, scope: Scope, kept: tuple[int, ...]) -> tuple[np.ndarray, Usage]:
        """q_t (docs/method.md §4): x = the task message's own words (≤ 2,000 chars, §5 "The task"); f_t = latest visible
        user message + latest visible assistant message (text and tool calls)."""
        usage = Usage()
        fu = first_user(session)
        if fu is None:
            return np.zeros(self.embedder.dim), usage
        x = task_text(fu[1], self.params.task_chars)
        task = self._task_emb.get(x)  # keyed by the text itself: sessions in other graphs may share ids
        if task is None:  # x never changes within a session: embedded once
            task, usage = checked_output(self.embedder.embed_query(x), self.embedder, "embed_query", None)
            self._task_emb[x] = task
        text = focus_text(session, scope, kept)
        focus = None
        if text is not None:
            focus, u = checked_output(self.embedder.embed_query(text), self.embedder, "embed_query", None)
            usage += u
        return query_vector(task, focus, self.params), usage

    def _compacted(self, session: Session, seq: int, cap: int) -> tuple[str, Usage]:
        """Compact a result once per (result, cap) and keep it in the graph (the original stays)."""
        if self.compactor is None:
            raise ValueError(f"{self.name}: compacting needs a compactor")
        key = f"{seq}:{cap}:{self.compactor.name}"
        hit = session.latest_artifact("compaction", key)
        if hit is not None:
            text, usage = hit["text"], Usage()
        else:
            text, usage = self.compactor.compact(session.message(seq).content, cap)
            session.put_artifact("compaction", key, {"text": text, "usage": usage.to_dict()})
        if self._marker(session) is expand_marker:  # docs/method.md §16: a compaction is lossy; it says how to get the rest
            text = f"{text}\n{shortened_note(session, seq)}"
        return text, usage


def _history_tokens(session: Session, kept: tuple[int, ...], bodies: dict[int, str], markers: set[int]) -> int:
    """Tok(H_t) of the assembled history, recounted from what was assembled.

    Independent of the greedy's running total: messages shown verbatim cost
    their stored count (the counter's value at insertion), markers their
    stored marker count, and every other replaced body (compacted result,
    clipped task) is counted afresh.
    """
    counter = session.counter
    total = 0
    for s in kept:
        if s in markers:
            total += session.result(s).marker_ntok
        elif s in bodies:
            total += text_message_tokens(counter, bodies[s])
        else:
            total += session.ntok(s)
    return total
