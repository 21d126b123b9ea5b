"""Prune (docs/method.md §6): keep the newest complete tool results that fit.

1. If Tok(H_full) ≤ B the full history is returned unchanged (the same
   shortcut as docs/method.md §5 step 2).
2. Otherwise user and assistant messages are kept verbatim and charged first
   (:func:`~contextrender.render.fit_verbatim`, docs/method.md §5 project rule); every
   tool result starts as its omission marker, so its call stays paired.
3. Results are visited newest → oldest; each one whose full text still fits B
   (measured on the assembled history) is kept. One that does not fit is
   skipped and the visit continues with older, possibly smaller, results.
"""

from __future__ import annotations

from contextrender.baselines._common import StatelessPolicy, fill, finish, selection_bodies, trim_candidates
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, fit_verbatim


class Prune(StatelessPolicy):
    """Newest-first greedy over complete results, skip-and-continue."""

    def __init__(self, *, name: str = "prune") -> None:
        self.name = name

    def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
        """Steps 2–3 of the module docstring (step 1 is the template's shortcut)."""
        trim = fit_verbatim(session, scope, budget)
        newest_first = list(reversed(trim_candidates(session, trim)))
        chosen, _ = fill(session, newest_first, trim.base_tokens, budget)
        bodies = selection_bodies(session, trim, chosen)
        return finish(self.name, session, scope, budget, trim.kept, visible=chosen, usage=Usage(), bodies=bodies)
