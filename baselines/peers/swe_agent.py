"""SWE-agent's ``last_n_observations`` history processor as a peer."""

from __future__ import annotations

from contextrender.baselines._common import StatelessPolicy
from contextrender.baselines.peers._shared import render_layout
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_int, first_user


def omitted_text(session: Session, seq: int) -> str:
    """SWE-agent's placeholder for an elided observation, with the real line count of its output."""
    return f"Old environment output: ({len(session.message(seq).content.splitlines())} lines omitted)"


class SweLastN(StatelessPolicy):
    """SWE-agent ``LastNObservations``: elide every observation but the last ``n``.

    Upstream (``sweagent/agent/history_processors.py``): the observations are the history
    entries of type observation — the first of them is the instance template (the task),
    which is never elided; with ``polling`` p the observations up to index
    ``(count // p)·p − n`` are elided (p = 1: all but the last ``n``). An elided
    observation's content becomes ``Old environment output: (N lines omitted)``, N being
    its number of lines. Applied to every query (stateless). ``n`` has no class default;
    5 is the value of SWE-agent's 0.7 config and of its paper. Tag-based exceptions do not
    apply here.

    Here: the observations are the task's first user message (the instance template) and
    the tool results; so all tool results but the last ``n`` (p = 1) show the placeholder,
    charged to B, and their calls stay. The rule runs only when Tok(H_full) > B (the full
    history otherwise); if the elided history still exceeds B the shared fallback elides
    the oldest remaining results too, then drops the oldest turns (package docstring).
    """

    def __init__(self, *, n: int = 5, polling: int = 1, name: str = "swe_last_n") -> None:
        self.name = name
        self.n = check_int("n", n, minimum=1)
        self.polling = check_int("polling", polling, minimum=1)

    placeholder = staticmethod(omitted_text)

    def elided(self, session: Session) -> list[int]:
        """Seqs of the results the upstream rule elides."""
        results = [r.seq for r in session.results]
        template = 1 if first_user(session) is not None else 0
        count = template + len(results)
        last_removed = max(0, (count // self.polling) * self.polling - self.n)
        # upstream elides observation indices [1, last_removed): index 0 is the instance template (the
        # task message here; without one, the first result takes its place and is never elided)
        return results[: max(0, last_removed - 1)] if template else results[1:last_removed]

    def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
        """The upstream rule's elided results, then the shared fallback."""
        bodies = {s: omitted_text(session, s) for s in self.elided(session)}
        return render_layout(self.name, session, scope, budget, scope.history, bodies=bodies,
                             placeholder=omitted_text)
