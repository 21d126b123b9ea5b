"""opencode's tool-output pruning as a peer."""

from __future__ import annotations

from collections.abc import Sequence

from contextrender.baselines._common import BasePolicy
from contextrender.baselines.peers._shared import (
    REFERENCE_CONTEXT,
    layout_tokens,
    load_state,
    render_layout,
    results_by_call,
    save_state,
    scaled,
)
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_int, check_positive

#: What opencode shows the model for a pruned tool output (``compaction.ts``, a compacted tool part).
PRUNED = "[Old tool result content cleared]"


class OpencodePrune(BasePolicy[set[int]]):
    """opencode ``SessionCompaction.prune``: clear old tool outputs beyond a protected recent amount.

    Upstream (``packages/opencode/src/session/compaction.ts``): walk the messages from the
    newest back, counting user messages; while fewer than 2 have been seen (the last two
    user turns) nothing is touched; stop at a summary message; within each message walk its
    tool parts newest first, skipping protected tools (``skill``) and stopping at the first
    output already pruned; sum each completed output's token estimate — the first
    PRUNE_PROTECT tokens are protected, every older output is a candidate; if the
    candidates add up to more than PRUNE_MINIMUM tokens they are all pruned (marked
    compacted, shown as ``[Old tool result content cleared]``; the calls stay). Pruned
    outputs stay pruned. Defaults: PRUNE_PROTECT 40,000, PRUNE_MINIMUM 20,000 tokens;
    opencode runs it when an agent loop ends (``compaction.prune`` in its config).

    Here: the state is the set of pruned results (a graph artifact); the walk runs when the
    history as opencode keeps it (pruned outputs as the placeholder, charged to B) exceeds B
    (the full history before that). Token estimates use the session's counter on the
    output text. Budget-scaled by default: protect = 40,000·B/200,000 = 0.2·B and minimum =
    20,000·B/200,000 = 0.1·B (``reference_context`` 200,000 tokens; ``scale_to_budget``
    False uses the shipped absolute values). ``skip_user_turns`` (2) is the number of last
    user turns never pruned — with a single task message nothing is ever pruned, as
    upstream. Whatever the rule leaves above B, the shared fallback clears (oldest first,
    same placeholder), then the oldest turns go (package docstring), for this render only.
    """

    def __init__(self, *, protect_tokens: int = 40_000, minimum_tokens: int = 20_000, skip_user_turns: int = 2,
                 reference_context: int = REFERENCE_CONTEXT, scale_to_budget: bool = True,
                 protected_tools: Sequence[str] = ("skill",), name: str = "opencode_prune") -> None:
        self.name = name
        self.protect_tokens = check_int("protect_tokens", protect_tokens)
        self.minimum_tokens = check_int("minimum_tokens", minimum_tokens)
        self.skip_user_turns = check_int("skip_user_turns", skip_user_turns)
        self.reference_context = check_positive("reference_context", reference_context)
        self.scale_to_budget = bool(scale_to_budget)
        self.protected_tools = frozenset(protected_tools)

    @staticmethod
    def placeholder(session: Session, seq: int) -> str:
        return PRUNED

    def thresholds(self, budget: int) -> tuple[int, int]:
        """(protect, minimum) in tokens at history budget ``budget``."""
        kw = {"reference_context": self.reference_context, "scale_to_budget": self.scale_to_budget}
        return scaled(self.protect_tokens, budget, **kw), scaled(self.minimum_tokens, budget, **kw)

    def to_prune(self, session: Session, budget: int, pruned: set[int]) -> list[int]:
        """Result seqs one prune pass clears (empty if the candidates do not exceed the minimum)."""
        protect, minimum = self.thresholds(budget)
        by_call = results_by_call(session)
        total = freed = 0
        candidates: list[int] = []
        turns = 0
        for seq in range(len(session) - 1, -1, -1):
            m = session.message(seq)
            if m.role == "user":
                turns += 1
            if turns < self.skip_user_turns or m.role != "assistant":
                continue
            for r in reversed(by_call.get(seq, [])):
                if session.result(r).tool_name in self.protected_tools:
                    continue
                if r in pruned:
                    return candidates if freed > minimum else []
                estimate = session.counter.text(session.message(r).content)
                total += estimate
                if total <= protect:
                    continue
                freed += estimate
                candidates.append(r)
        return candidates if freed > minimum else []

    def prepare(self, session: Session, budget: int) -> set[int]:
        """The results pruned so far."""
        state = load_state(session, self.name, budget)
        return set(state["pruned"]) if state else set()

    def pristine(self, state: set[int]) -> bool:
        """Nothing pruned yet."""
        return not state

    def compose(self, session: Session, scope: Scope, budget: int, pruned: set[int]) -> Rendered:
        """A prune pass once the history as opencode keeps it exceeds B, then the shared fallback."""
        if layout_tokens(session, scope.history, {s: PRUNED for s in pruned}) > budget:
            new = self.to_prune(session, budget, pruned)
            if new:
                pruned |= set(new)
                save_state(session, self.name, budget, {"pruned": sorted(pruned)})
        return render_layout(self.name, session, scope, budget, scope.history,
                             bodies={s: PRUNED for s in pruned}, placeholder=self.placeholder)
