"""Compact (LLM) (docs/method.md §6): when H > B, the compaction model compresses the history.

Behaviour, modelled on the auto-compaction of coding agents:

- While Tok(H_full) ≤ B the full history is returned unchanged.
- The first time H > B, the *entire* history H_t (everything but the system
  prompt and the current user message, which stay outside B) is sent to the
  compaction model with the docs/method.md §6 summary prompt
  (:data:`~contextrender.compaction.SUMMARY_PROMPT`) and replaced by one
  summary message.
- The summary is state: later turns are appended verbatim after it. When
  summary + those turns exceed B again, the previous summary and the turns
  since are compacted together into a new summary (re-compaction), and so on.
- Placement: the summary is a user-role message right after the system prompt,
  labelled as a summary of earlier history (:data:`SUMMARY_LABEL`); the
  current user message and the turns after the compaction follow in
  chronological order.
- Cap: the summary message (label included) is at most ``summary_share`` of B
  (default 0.5), so Tok(H_t) ≤ B holds right after a compaction and half of B
  is left for the turns that follow before the next one. The compactor is
  asked for that many tokens and its output is truncated if it overshoots.
- Persistence: the summary and what it covers are stored as a graph artifact
  keyed by policy name, budget and compactor; a reopened graph resumes with
  the same summary, and a repeated render at the same invocation never
  compacts twice. ``usage`` reports the compactor tokens of the render that
  ran the compaction (zero otherwise).
- A tool result whose call is already inside the summary is folded into the
  next summary at once rather than shown without its call.
- If B cannot hold even the labelled summary, nothing is compacted and the
  docs/method.md §5 project rules (markers, oldest turns dropped) apply instead.
"""

from __future__ import annotations

from contextrender.baselines._common import Stored, SummaryPolicy
from contextrender.compaction import Compactor
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import Rendered, Scope

SUMMARY_LABEL = ("[Summary of the earlier history of this task, written by the compaction model. "
                 "The messages and tool results it summarises are no longer shown.]")


class Compact(SummaryPolicy):
    """Whole-history compaction with a persisted, re-compacted summary."""

    label = SUMMARY_LABEL

    def __init__(self, *, compactor: Compactor | None = None, summary_share: float = 0.5,
                 name: str = "compact") -> None:
        super().__init__(compactor=compactor, summary_share=summary_share, name=name)

    def compose(self, session: Session, scope: Scope, budget: int, stored: Stored) -> Rendered:
        """Summary plus what it does not cover; everything is compacted once that exceeds B."""
        key, state = stored
        # docs/method.md §6: when summary + uncovered history exceed B, all of it is compacted (cover to the end).
        end = len(session)
        return self.compress_window(session, scope, budget, key, state, threshold=budget,
                                    max_tokens=int(self.summary_share * budget),
                                    keep_from=lambda _window, _state: end, usage=Usage())
