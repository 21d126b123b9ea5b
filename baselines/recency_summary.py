"""Recency + Summary (docs/method.md §6): recent complete results, older ones summarised.

At invocation t, when Tok(H_full) > B (or once a summary exists):

1. user and assistant messages are kept verbatim and charged first
   (:func:`~contextrender.render.fit_verbatim`, docs/method.md §5 project rule); every
   tool result starts as its omission marker, so calls stay paired;
2. a share of B is reserved for the summary message: ``summary_share`` of B
   (default 0.25), or less if the verbatim messages leave less room;
3. the recency window: results are visited newest → oldest and kept in full
   while they fit the rest of B. The window is contiguous — the visit stops at
   the first result that does not fit (unlike Prune, which skips and
   continues) — and never reaches back into already summarised results;
4. every result older than the window is evicted (shown as its marker). The
   newly evicted ones are merged into the summary: the compaction model
   receives the previous summary followed by their text (with the calls that
   produced them) and the same docs/method.md §6 summary prompt
   (:data:`~contextrender.compaction.SUMMARY_PROMPT`), capped to the
   reserved share. Summary and window together fit B.

Placement: the summary is a user-role message right after the system prompt,
labelled as a summary of older tool results (:data:`SUMMARY_LABEL`).
State (the summary and the eviction boundary) is a graph artifact keyed by
policy name, budget and compactor, so a reopened graph renders identically and
a repeated render never summarises twice. ``usage`` reports the compactor
tokens of the render that updated the summary.
"""

from __future__ import annotations

from contextrender.baselines._common import Covered, Stored, SummaryPolicy, delta, selection_bodies
from contextrender.compaction import Compactor
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, fit_verbatim

SUMMARY_LABEL = ("[Summary of older tool results, written by the compaction model. Their full text was "
                 "evicted to fit the context budget; their calls remain below, marked as omitted.]")


class RecencySummary(SummaryPolicy):
    """A contiguous window of recent results plus a rolling summary of evicted ones."""

    label = SUMMARY_LABEL
    share_may_be_one = False  # the rest of B holds the recency window

    def __init__(self, *, compactor: Compactor | None = None, summary_share: float = 0.25,
                 name: str = "recency_summary") -> None:
        super().__init__(compactor=compactor, summary_share=summary_share, name=name)

    def compose(self, session: Session, scope: Scope, budget: int, stored: Stored) -> Rendered:
        """Steps 1–4 of the module docstring."""
        key, state = stored  # here ``upto`` is the eviction boundary over result seqs
        usage = Usage()
        trim = fit_verbatim(session, scope, budget)
        reserve = min(int(self.summary_share * budget), budget - trim.base_tokens)
        if self.body_cap(session, reserve) <= 0:
            reserve = 0  # not even the label fits: no summary this time
        room = budget - trim.base_tokens - reserve

        # Step 3: the contiguous recency window.
        upto = state.upto if state else 0
        results = scope.history_results(session)
        kept = set(trim.kept)
        window: list[int] = []
        used = 0
        for s in reversed(results):
            if s < upto or s not in kept:
                break
            d = delta(session, s)
            if used + d > room:
                break
            window.append(s)
            used += d

        # Step 4: merge newly evicted results into the summary; the boundary moves to the window.
        boundary = min(window) if window else (results[-1] + 1 if results else upto)
        newly = [s for s in results if upto <= s < boundary]
        if newly and reserve > 0:
            state, usage = self.summarise(session, key, state, newly, self.body_cap(session, reserve),
                                          lambda text: Covered(boundary, (), text))

        msg, _ = self.summary(session, state, reserve)
        bodies = selection_bodies(session, trim, window)
        return self.emit(session, scope, budget, trim.kept, visible=window, usage=usage, bodies=bodies, summary=msg)
