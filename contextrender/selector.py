"""ContextRender: budgeted selection of tool results (spec §5, paper Algorithm 1).

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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .compaction import Compactor
from .embed import make_embedder
from .events import Usage
from .graph import Session
from .render import Rendered, Scope, assemble, check_budget, fit_verbatim, marker_text, text_message_tokens
from .scoring import ScoringParams, Weights, matvec, query_vector, relevance, usefulness


@dataclass(frozen=True)
class ResultScore:
    """Why a result was or was not rendered at invocation t."""

    seq: int
    tool_name: str
    tokens: int  # Tok of the full tool message
    age: int  # a_t(r) = t − k
    reuse_count: float  # c_t(r), Eq. 1
    relevance: float  # s_t(r)
    usefulness: float  # U_t(r)
    candidate: bool  # False if its turn was trimmed to fit the verbatim messages
    pick: int | None  # greedy step at which it was selected (0 = first), None if omitted
    gain: float | None  # R_t(r|S) when it was picked
    compacted: bool  # rendered in compacted form (not visible in full)


@dataclass(frozen=True)
class Selection:
    """A render plus the scores behind it."""

    rendered: Rendered
    scores: tuple[ResultScore, ...]
    shortcut: bool  # True when the full history fit (spec §5 step 2)
    budget: int


class ContextRender:
    """The paper's selector. Ablations are the same class with other :class:`Weights`.

    ``embedder`` defaults to the local sentence-transformers model;
    ``compactor`` enables the oversized-result fallback (spec §5 step 5) —
    without one, a result larger than B is never rendered in full or compacted.
    """

    budgeted = True

    def __init__(self, *, weights: Weights | Mapping[str, float] | None = None, lam: float = 0.3,
                 gamma: float = 0.2, diversity: float = 0.5, task_chars: int = 2000,
                 params: ScoringParams | None = None, embedder: Any = None,
                 compactor: Compactor | None = None, oversized_share: float = 0.25,
                 name: str = "contextrender") -> None:
        if params is None:
            w = Weights(**dict(weights)) if isinstance(weights, Mapping) else (weights or Weights())
            params = ScoringParams(weights=w, lam=lam, gamma=gamma, diversity=diversity, task_chars=task_chars)
        self.params = params
        self.name = name
        self._embedder = embedder
        self.compactor = compactor
        # Project choice (spec silent): a compacted oversized result may use at most this share of B.
        self.oversized_share = oversized_share
        self._task_emb: dict[str, np.ndarray] = {}

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            self._embedder = make_embedder("local")
        return self._embedder

    def render(self, session: Session, budget: int) -> Rendered:
        return self.select(session, budget, explain=False).rendered

    # -- the algorithm ---------------------------------------------------------

    def select(self, session: Session, budget: int, *, explain: bool = True) -> Selection:
        """Run Algorithm 1; with ``explain`` also return every result's scores."""
        p = self.params
        scope = Scope.of(session)
        results = scope.history_results(session)
        usage = Usage()
        # spec §2: every result's embedding is computed once, when it first reaches the selector.
        embs, u = session.result_embeddings(self.embedder, results)
        usage += u

        full = scope.full_tokens(session)
        if full <= budget:  # spec §5 step 2: the full history, unchanged
            msgs = assemble(session, scope, scope.history)
            return Selection(Rendered(tuple(msgs), full, frozenset(results), usage), (), True, budget)

        arrays = session.result_arrays()
        n = len(results)
        ages = (session.next_invocation - arrays.invocation).astype(np.float64)  # a_t(r) = t − k
        counts = np.zeros(n, dtype=np.float64)  # c_t(r), Eq. 1
        reuse = session.flow.reuse_scores()
        if reuse:
            keys = np.fromiter(reuse.keys(), dtype=np.int64, count=len(reuse))
            counts[np.searchsorted(arrays.seqs, keys)] = np.fromiter(reuse.values(), dtype=np.float64,
                                                                     count=len(reuse))
        trim = fit_verbatim(session, scope, budget)  # spec §5 step 3
        if len(trim.kept) == len(scope.history):
            cand = np.ones(n, dtype=bool)
        else:
            cand = np.isin(arrays.seqs, np.fromiter(trim.kept, dtype=np.int64, count=len(trim.kept)))
        rel = np.zeros(n)
        if p.weights.relevance != 0.0 and n:
            q, u = self._query(session, scope, trim.kept)
            usage += u
            rel = relevance(embs, q)
        util = usefulness(ages, counts, rel, p)

        full_cost = arrays.ntok
        body_cost = full_cost.copy()
        compacted: dict[int, str] = {}
        if self.compactor is not None:  # spec §5 step 5: oversized-result fallback
            cap = max(1, int(self.oversized_share * budget))
            for i in np.flatnonzero(cand & (full_cost > budget)).tolist():
                text, u = self._compacted(session, results[i], cap)
                usage += u
                compacted[i] = text
                body_cost[i] = text_message_tokens(session.counter, text)
        delta = body_cost - arrays.marker_ntok  # what adding r changes in Tok(H_t(S))

        # spec §5 step 4: greedy on R_t(r|S) = U_t(r) − 0.5·D(r,S).
        chosen = np.zeros(n, dtype=bool)
        dmax = np.zeros(n, dtype=np.float64)  # D(r,S); D(r,∅) = 0, and max(0, ·) by starting at 0
        picks: list[tuple[int, float]] = []
        current = trim.base_tokens
        while True:
            # Recomputed each step: a result smaller than its marker lowers Tok and can reopen others.
            feasible = cand & ~chosen & (current + delta <= budget)
            if not feasible.any():
                break
            gain = np.where(feasible, util - p.diversity * dmax, -np.inf)
            # argmax returns the first maximum: transcript order, ties → older result.
            i = int(np.argmax(gain))
            chosen[i] = True
            current += int(delta[i])
            picks.append((i, float(gain[i])))
            if p.diversity != 0.0:
                np.maximum(dmax, matvec(embs, embs[i]), out=dmax)

        # spec §5 step 6: chronological output, omitted results leave their marker.
        bodies: dict[int, str] = {results[i]: marker_text(session, results[i])
                                  for i in np.flatnonzero(cand & ~chosen).tolist()}
        for i, text in compacted.items():
            if chosen[i]:
                bodies[results[i]] = text
        if trim.clipped_first_user is not None:
            first_user = next(i for i, m in enumerate(session.messages) if m.role == "user")
            bodies[first_user] = trim.clipped_first_user
        msgs = assemble(session, scope, trim.kept, bodies)
        markers = set(results[i] for i in np.flatnonzero(cand & ~chosen).tolist())
        tokens = _history_tokens(session, trim.kept, bodies, markers)
        check_budget(tokens, budget, self.name)
        full_shown = chosen.copy()
        full_shown[list(compacted)] = False
        visible = frozenset(arrays.seqs[full_shown].tolist())

        scores: tuple[ResultScore, ...] = ()
        if explain:
            order = {i: (k, g) for k, (i, g) in enumerate(picks)}
            scores = tuple(
                ResultScore(seq=s, tool_name=session.result(s).tool_name, tokens=int(full_cost[i]),
                            age=int(ages[i]), reuse_count=float(counts[i]), relevance=float(rel[i]),
                            usefulness=float(util[i]), candidate=bool(cand[i]),
                            pick=order[i][0] if i in order else None, gain=order[i][1] if i in order else None,
                            compacted=i in compacted and bool(chosen[i]))
                for i, s in enumerate(results))
        return Selection(Rendered(tuple(msgs), tokens, visible, usage), scores, False, budget)

    # -- helpers ---------------------------------------------------------------

    def _query(self, session: Session, scope: Scope, kept: tuple[int, ...]) -> tuple[np.ndarray, Usage]:
        """q_t (spec §4): x = first user message (≤ 2,000 chars); f_t = latest visible
        user message + latest visible assistant message (text and tool calls)."""
        usage = Usage()
        msgs = session.messages
        first_user = next((m for m in msgs if m.role == "user"), None)
        if first_user is None:
            return np.zeros(self.embedder.dim), usage
        x = first_user.content[: self.params.task_chars]
        task = self._task_emb.get(x)  # keyed by the text itself: sessions in other graphs may share ids
        if task is None:  # x never changes within a session: embedded once
            task, usage = self.embedder.embed_query(x)
            self._task_emb[x] = task
        parts = []
        if scope.current is not None:
            parts.append(msgs[scope.current].text())
        last_asst = next((s for s in reversed(kept) if msgs[s].role == "assistant"), None)
        focus = None
        if last_asst is not None:
            parts.append(msgs[last_asst].text())
        if parts:
            focus, u = self.embedder.embed_query("\n".join(parts))
            usage += u
        return query_vector(task, focus, self.params), usage

    def _compacted(self, session: Session, seq: int, cap: int) -> tuple[str, Usage]:
        """Compact an oversized result once and keep it in the graph (the original stays)."""
        assert self.compactor is not None
        key = f"{seq}:{cap}:{self.compactor.name}"
        hit = session.latest_artifact("compaction", key)
        if hit is not None:
            return hit["text"], Usage()
        text, usage = self.compactor.compact(session.message(seq).content, cap)
        session.put_artifact("compaction", key, {"text": text, "usage": usage.to_dict()})
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
