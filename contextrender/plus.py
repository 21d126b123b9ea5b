"""ContextRender+ — beyond the paper (NOT the paper's method; see results/plus/plus.md).

Same graph, same ``render(session, budget) -> Rendered`` interface and the same
budget scope and helpers as :class:`~contextrender.selector.ContextRender`
(Scope, fit_verbatim, assemble, check_budget, marker_text). Every change is a
constructor switch so it can be ablated; with every switch off the policy is
exactly ContextRender with the same λ, γ and weights (tests/plus checks this):

- ``packing``: budget-aware packing. Besides the paper's greedy on R_t(r|S),
  run the same greedy ordered by value per token (R / Δtokens); keep whichever
  selection has the larger total gain Σ R (the classic "density greedy or
  plain greedy" knapsack rule), so one large high-scoring result cannot crowd
  out several small useful ones unless it is worth more than all of them.
- ``stubs``: an omitted result leaves a compact stub — its marker plus its
  qualifying values (``session.result_values``, the TFA identifiers) — instead
  of the bare marker. Stubs are charged to B and are placed only in the budget
  left after full results are chosen (most useful first), so they never
  displace a full result. A stub is NOT a visible result (spec §7).
- ``lexical`` (W_lex): a fourth usefulness term W_lex·(1 − exp(−k)), k = number
  of the result's qualifying values that occur as whole tokens (TFA matching)
  in the current user message or the latest rendered assistant message.
- λ, γ and the weights are plain parameters; conf/method/contextrender_plus.yaml
  carries values fitted on a TRAINING split of traces (experiments/plus_eval.py).

Postcondition as in the paper: Tok(H_t) ≤ B, checked on what was assembled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .compaction import Compactor
from .events import Usage
from .graph import Session
from .render import Rendered, Scope, assemble, check_budget, fit_verbatim, marker_text, text_message_tokens
from .scoring import matvec, relevance, usefulness
from .selector import ContextRender, ResultScore, Selection
from .tfa import match_tokens


class ContextRenderPlus(ContextRender):
    """ContextRender with budget-aware packing, value stubs and lexical relevance (switches)."""

    def __init__(self, *, packing: bool = True, stubs: bool = True, lexical: float = 1.0,
                 stub_max_values: int = 12, embedder: Any = None, compactor: Compactor | None = None,
                 name: str = "contextrender_plus", **kwargs: Any) -> None:
        # embedder/compactor named explicitly: build_policy injects runtime objects by signature.
        super().__init__(name=name, embedder=embedder, compactor=compactor, **kwargs)
        self.packing = bool(packing)
        self.stubs = bool(stubs)
        self.lexical = float(lexical)
        self.stub_max_values = int(stub_max_values)
        self._values: dict[tuple[str, int], tuple[str, ...]] = {}

    # -- helpers -----------------------------------------------------------------

    def values_of(self, session: Session, seq: int) -> tuple[str, ...]:
        """Qualifying values of a result, in order of first occurrence in its text (cached; results never change)."""
        key = (session.id, seq)
        vals = self._values.get(key)
        if vals is None:
            content = session.message(seq).content
            vals = tuple(sorted(session.result_values(seq), key=lambda v: (content.find(v), v)))
            self._values[key] = vals
        return vals

    def stub_text(self, session: Session, seq: int) -> str:
        """The omission marker plus up to ``stub_max_values`` qualifying values."""
        marker = marker_text(session, seq)
        vals = self.values_of(session, seq)[: self.stub_max_values]
        if not vals:
            return marker
        return f"{marker[:-1]}; values: {', '.join(vals)}]"

    def _lexical(self, session: Session, scope: Scope, kept: tuple[int, ...], results: list[int],
                 cand: np.ndarray) -> np.ndarray:
        msgs = session.messages
        parts = []
        if scope.current is not None:
            parts.append(msgs[scope.current].text())
        last_asst = next((s for s in reversed(kept) if msgs[s].role == "assistant"), None)
        if last_asst is not None:
            parts.append(msgs[last_asst].text())
        out = np.zeros(len(results))
        if not parts:
            return out
        focus = match_tokens("\n".join(parts))
        if not focus:
            return out
        for i in np.flatnonzero(cand).tolist():
            k = sum(1 for v in self.values_of(session, results[i]) if v in focus)
            if k:
                out[i] = 1.0 - np.exp(-float(k))
        return out

    def _greedy(self, util: np.ndarray, delta: np.ndarray, cand: np.ndarray, embs: np.ndarray, base: int,
                budget: int, density: bool) -> tuple[np.ndarray, list[tuple[int, float]], float]:
        """The paper's greedy (density=False) or its value-per-token variant; returns (chosen, picks, Σ R)."""
        p = self.params
        n = len(util)
        chosen = np.zeros(n, dtype=bool)
        dmax = np.zeros(n, dtype=np.float64)
        picks: list[tuple[int, float]] = []
        current = base
        total = 0.0
        cost = np.maximum(delta, 1).astype(np.float64)
        while True:
            feasible = cand & ~chosen & (current + delta <= budget)
            if not feasible.any():
                break
            gain = util - p.diversity * dmax
            key = gain
            if density:
                # value per token; a result no larger than its marker costs nothing: take it first
                key = np.where(gain > 0, np.where(delta <= 0, np.inf, gain / cost), gain * cost)
            key = np.where(feasible, key, -np.inf)
            i = int(np.argmax(key))
            chosen[i] = True
            current += int(delta[i])
            picks.append((i, float(gain[i])))
            total += float(gain[i])
            if p.diversity != 0.0:
                np.maximum(dmax, matvec(embs, embs[i]), out=dmax)
        return chosen, picks, total

    # -- the algorithm -------------------------------------------------------------

    def select(self, session: Session, budget: int, *, explain: bool = True) -> Selection:
        if not (self.packing or self.stubs or self.lexical != 0.0):
            return super().select(session, budget, explain=explain)  # documented baseline: ContextRender
        p = self.params
        scope = Scope.of(session)
        results = scope.history_results(session)
        usage = Usage()
        embs, u = session.result_embeddings(self.embedder, results)
        usage += u

        full = scope.full_tokens(session)
        if full <= budget:  # spec §5 step 2
            msgs = assemble(session, scope, scope.history)
            return Selection(Rendered(tuple(msgs), full, frozenset(results), usage), (), True, budget)

        arrays = session.result_arrays()
        n = len(results)
        ages = (session.next_invocation - arrays.invocation).astype(np.float64)
        counts = np.zeros(n, dtype=np.float64)
        reuse = session.flow.reuse_scores()
        if reuse:
            keys = np.fromiter(reuse.keys(), dtype=np.int64, count=len(reuse))
            counts[np.searchsorted(arrays.seqs, keys)] = np.fromiter(reuse.values(), dtype=np.float64,
                                                                     count=len(reuse))
        trim = fit_verbatim(session, scope, budget)
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
        if self.lexical != 0.0 and n:
            util = util + self.lexical * self._lexical(session, scope, trim.kept, results, cand)

        full_cost = arrays.ntok
        body_cost = full_cost.copy()
        compacted: dict[int, str] = {}
        if self.compactor is not None:  # spec §5 step 5, as in ContextRender
            cap = max(1, int(self.oversized_share * budget))
            for i in np.flatnonzero(cand & (full_cost > budget)).tolist():
                text, u = self._compacted(session, results[i], cap)
                usage += u
                compacted[i] = text
                body_cost[i] = text_message_tokens(session.counter, text)
        delta = body_cost - arrays.marker_ntok

        chosen, picks, total = self._greedy(util, delta, cand, embs, trim.base_tokens, budget, density=False)
        if self.packing:
            c2, p2, t2 = self._greedy(util, delta, cand, embs, trim.base_tokens, budget, density=True)
            if t2 > total + 1e-12:
                chosen, picks, total = c2, p2, t2
        current = trim.base_tokens + int(delta[chosen].sum())

        omitted = np.flatnonzero(cand & ~chosen).tolist()
        bodies: dict[int, str] = {results[i]: marker_text(session, results[i]) for i in omitted}
        stubbed: set[int] = set()
        if self.stubs and omitted:
            # Stubs use only the budget left after the full results: most useful omitted result first.
            for i in sorted(omitted, key=lambda i: (-util[i], i)):
                seq = results[i]
                text = self.stub_text(session, seq)
                if text == bodies[seq]:
                    continue
                extra = text_message_tokens(session.counter, text) - int(arrays.marker_ntok[i])
                if current + extra <= budget:
                    bodies[seq] = text
                    current += extra
                    stubbed.add(seq)
        for i, text in compacted.items():
            if chosen[i]:
                bodies[results[i]] = text
        if trim.clipped_first_user is not None:
            first_user = next(i for i, m in enumerate(session.messages) if m.role == "user")
            bodies[first_user] = trim.clipped_first_user
        msgs = assemble(session, scope, trim.kept, bodies)
        tokens = _assembled_tokens(session, trim.kept, bodies)
        check_budget(tokens, budget, self.name)
        full_shown = chosen.copy()
        full_shown[list(compacted)] = False
        visible = frozenset(arrays.seqs[full_shown].tolist())  # stubs and compacted forms are not visible

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


def _assembled_tokens(session: Session, kept: tuple[int, ...], bodies: dict[int, str]) -> int:
    """Tok(H_t) recounted from what was assembled: replaced bodies (markers, stubs, compacted
    results, clipped task) counted afresh, everything else at its stored count."""
    counter = session.counter
    total = 0
    for s in kept:
        if s in bodies:
            total += text_message_tokens(counter, bodies[s])
        else:
            total += session.ntok(s)
    return total
