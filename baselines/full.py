"""Full history (docs/method.md §6): no context management.

Every message is passed unchanged, even when the history exceeds B — the
upper reference for task success and the cost normaliser (docs/method.md §7). It is the
only policy with ``budgeted = False``; ``tokens`` still reports Tok(H_t) in
the common scope so renders above B can be counted.
"""

from __future__ import annotations

from contextrender.baselines._common import StatelessPolicy, full_history
from contextrender.graph import Session
from contextrender.render import Rendered, Scope


class FullHistory(StatelessPolicy):
    """Pass the whole history; never checks the budget."""

    budgeted = False
    full_when_fits = False  # the whole history is the render whether it fits or not: no test needed

    def __init__(self, *, name: str = "full") -> None:
        self.name = name

    def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
        """Every message, unchanged."""
        return full_history(self.name, session, scope, budget, budgeted=False)
