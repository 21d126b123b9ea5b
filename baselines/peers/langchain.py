"""LangChain's ``trim_messages`` (strategy "last") as a peer."""

from __future__ import annotations

from contextrender.baselines._common import StatelessPolicy
from contextrender.baselines.peers._shared import render_layout
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, marker_text


class LangChainTrim(StatelessPolicy):
    """LangChain ``trim_messages(strategy="last")``: the newest whole messages that fit the token budget.

    Upstream (``langchain_core/messages/utils.py``, ``_last_max_tokens``): the longest run
    of newest messages whose token count is at most ``max_tokens``; with ``allow_partial``
    False (the default) no message is cut; ``start_on`` (default None) drops messages from
    the front of the kept run until it starts on the given type (LangChain's docs use
    ``"human"``); ``include_system`` (default False) keeps a leading system message. Stateless,
    applied to each call.

    Here: ``max_tokens`` is B and the counter is the session's; the run is over the history
    (H_t) — the system prompt and the current user message are outside B and always
    rendered (so include_system is in effect True, and the current user message counts 0
    towards the run). ``start_on_human`` True sets ``start_on="human"`` (the current user
    message qualifies). Deviation forced by the pairing rule: a tool message at the front of
    the run whose call fell outside it is dropped too (upstream keeps it, which providers
    reject). The rule runs only when Tok(H_full) > B; its result always fits B, so the shared
    fallback never acts. Partial messages (``allow_partial`` True) are not supported.
    """

    def __init__(self, *, start_on_human: bool = False, name: str = "langchain_trim") -> None:
        self.name = name
        self.start_on_human = bool(start_on_human)

    def kept(self, session: Session, scope: Scope, budget: int) -> list[int]:
        """History seqs of the kept run (before the pairing rule), in order."""
        order = sorted({*scope.history, *([scope.current] if scope.current is not None else [])})
        run: list[int] = []
        total = 0
        for s in reversed(order):
            cost = 0 if s == scope.current else session.ntok(s)
            if total + cost > budget:
                break
            run.append(s)
            total += cost
        run.reverse()
        if self.start_on_human:
            while run and session.message(run[0]).role != "user":
                run.pop(0)
        return [s for s in run if s != scope.current]

    def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
        """The kept run, paired (it always fits B)."""
        return render_layout(self.name, session, scope, budget, self.kept(session, scope, budget),
                             placeholder=marker_text)
