"""Anthropic's context editing (``clear_tool_uses``) as LangChain implements it, as a peer."""

from __future__ import annotations

from collections.abc import Sequence

from contextrender.baselines._common import StatelessPolicy
from contextrender.baselines.peers._shared import render_layout
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_int, text_message_tokens

#: LangChain's placeholder for a cleared tool output (``DEFAULT_TOOL_PLACEHOLDER``).
CLEARED = "[cleared]"


class ClearToolUses(StatelessPolicy):
    """Anthropic ``clear_tool_uses_20250919`` / LangChain ``ClearToolUsesEdit``: clear the oldest tool results.

    Upstream: Anthropic's context-editing API (server side, applied to each request) and
    LangChain v1's model-agnostic mirror of it, ``langchain_v1/langchain/agents/middleware/
    context_editing.py`` (``ClearToolUsesEdit``, applied to a copy of each model request).
    When the request exceeds ``trigger`` tokens, every tool message except the newest
    ``keep`` is a candidate (``keep`` 0: all); candidates are cleared oldest first — a tool
    message is skipped if its call is not in the nearest preceding assistant message or if
    its tool is in ``exclude_tools`` (excluded tools still count towards ``keep``, as
    LangChain slices before it checks them) — and, when ``clear_at_least`` > 0, clearing
    stops once that many tokens were freed. A cleared tool message gets the body
    ``[cleared]``; ``clear_tool_inputs`` False (default): the calls stay. Defaults: trigger
    100,000 input tokens, keep 3, clear_at_least 0, no excluded tools.

    Here: stateless, like upstream; the trigger is Tok(H_full) > B (the full history
    otherwise); ``clear_at_least`` is in tokens of the session's counter, as shipped (its
    default 0 clears every candidate, so nothing needs scaling); only ``clear_tool_inputs``
    False is supported. The placeholder is charged to B. If the edited history still exceeds
    B the shared fallback clears the oldest remaining results too, then drops the oldest
    turns (package docstring).
    """

    def __init__(self, *, keep: int = 3, clear_at_least: int = 0, exclude_tools: Sequence[str] = (),
                 name: str = "clear_tool_uses") -> None:
        self.name = name
        self.keep = check_int("keep", keep)
        self.clear_at_least = check_int("clear_at_least", clear_at_least)
        self.exclude_tools = frozenset(exclude_tools)

    @staticmethod
    def placeholder(session: Session, seq: int) -> str:
        return CLEARED

    def to_clear(self, session: Session) -> list[int]:
        """Result seqs the upstream rule clears on the current transcript (its trigger aside)."""
        candidates = [r.seq for r in session.results]
        if self.keep >= len(candidates):
            candidates = []
        elif self.keep:
            candidates = candidates[: -self.keep]
        cleared: list[int] = []
        freed = 0
        last_assistant: dict[int, int | None] = {}
        prev = None
        for s, m in enumerate(session.messages):
            last_assistant[s] = prev
            if m.role == "assistant":
                prev = s
        for s in candidates:
            r = session.result(s)
            if r.call_seq is None or last_assistant[s] != r.call_seq:
                continue
            if (session.message(s).name or r.tool_name) in self.exclude_tools:
                continue
            cleared.append(s)
            freed += session.ntok(s) - text_message_tokens(session.counter, CLEARED)
            if self.clear_at_least > 0 and freed >= self.clear_at_least:
                break
        return cleared

    def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
        """The upstream rule's cleared results, then the shared fallback."""
        bodies = {s: CLEARED for s in self.to_clear(session)}
        return render_layout(self.name, session, scope, budget, scope.history, bodies=bodies,
                             placeholder=self.placeholder)
