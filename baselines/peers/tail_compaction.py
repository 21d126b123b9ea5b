"""opencode / Codex compaction as a peer: a summary of the head, then a recent tail."""

from __future__ import annotations

from contextrender.baselines._common import STATE_KIND, Covered, Stored, SummaryPolicy, advance, uncovered
from contextrender.baselines.peers._shared import (
    REFERENCE_CONTEXT,
    Inserted,
    layout_tokens,
    render_layout,
    scaled,
)
from contextrender.compaction import Compactor
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_positive, check_share, marker_text

SUMMARY_LABEL = ("[Summary of the conversation before the messages that follow, written by the compaction "
                 "model when the context was compacted]")

#: A hand-off summary prompt in this project's words (opencode and Codex both ask the model for a
#: summary another model can resume the task from). ``{max_tokens}`` is the cap.
SUMMARY_PROMPT = """The conversation below is being compacted: another model will continue the task from
your summary and the most recent messages only. Write that hand-off summary: the goal and the
user's requirements; what has been done and what was found, with exact file paths, identifiers,
numbers and error messages; the decisions taken; the next steps that remain.
Use at most {max_tokens} tokens."""

#: opencode cuts each tool output in the compaction input at this many characters (``compaction.ts``).
TOOL_OUTPUT_MAX_CHARS = 2_000


class TailCompaction(SummaryPolicy):
    """opencode (default) or Codex (``codex`` True) compaction: summary of the head, then the recent tail.

    opencode (``packages/opencode/src/session/compaction.ts``, ``select`` and
    ``preserveRecentBudget``): the history splits into turns at user messages; walking the
    turns newest first, whole turns are kept while they fit the tail budget; the turn that
    does not fit is split at the earliest message after its user message from which the
    rest fits what is left; if no tail results, or the tail would be the whole history,
    everything is summarised. The head (with the previous summary, each tool output cut at
    2,000 characters) is summarised by the compaction model; the model then sees the summary
    and, after it, the tail. Tail budget: 25 % of the usable context, clamped to
    2,000–15,000 tokens. Auto compaction fires at the usable context (≈ 90 % of the window).

    Codex (``codex-rs/core/src/compact.rs``): the whole history is summarised; the compacted
    history keeps the initial context, then the most recent user messages (newest first,
    up to COMPACT_USER_MESSAGE_MAX_TOKENS 20,000 tokens), then the summary as a user message.

    Here: the trigger is the compacted view (summary + what follows) exceeding B; at most
    one compaction per invocation (a repeated render reuses it); state (summary and what it
    covers) is a graph artifact, and a later compaction folds the previous summary in (both
    peers do). The summary goes
    through the compaction model layer (extractive offline, LLM live) with
    :data:`SUMMARY_PROMPT`, capped at ``summary_share`` of B (a project choice: the peers
    leave its length to the model), as a labelled user-role message (opencode writes it as
    an assistant message after a synthetic user prompt; Codex as a user message with its
    own prefix). Budget-scaled sizes by default (``reference_context`` 200,000 tokens):
    tail = clamp(0.25·200,000, 2,000, 15,000)·B/200,000 = 0.075·B; Codex user messages up to
    20,000·B/200,000 = 0.1·B. With ``scale_to_budget`` False: tail = clamp(0.25·B, 2,000,
    15,000) (B as the usable context) and the Codex cap 20,000 tokens, as shipped. Scope
    deviations: the current user message is outside B — always rendered, costing nothing in
    the tail and not counted in the Codex cap; a tail never starts on a tool result (its call
    would be in the summary); a Codex user message that does not fit the remaining cap is
    dropped, not truncated (only the task message may be clipped in this harness). If the
    view still exceeds B the shared fallback applies (the project's omission marker, then
    the oldest turns; package docstring).
    """

    label = SUMMARY_LABEL
    share_may_be_one = False

    def __init__(self, *, compactor: Compactor | None = None, summary_share: float = 0.5, tail_share: float = 0.25,
                 tail_min_tokens: int = 2_000, tail_max_tokens: int = 15_000, codex: bool = False,
                 codex_user_tokens: int = 20_000, reference_context: int = REFERENCE_CONTEXT,
                 scale_to_budget: bool = True, name: str = "tail_compaction") -> None:
        super().__init__(compactor=compactor, summary_share=summary_share, name=name)
        self.tail_share = check_share("tail_share", tail_share)
        if not 0 <= tail_min_tokens <= tail_max_tokens:
            raise ValueError(f"need 0 ≤ tail_min_tokens ≤ tail_max_tokens, got {tail_min_tokens}, {tail_max_tokens}")
        self.reference_context = check_positive("reference_context", reference_context)
        self.tail_min_tokens = tail_min_tokens
        self.tail_max_tokens = tail_max_tokens
        self.codex = bool(codex)
        self.codex_user_tokens = codex_user_tokens
        self.scale_to_budget = bool(scale_to_budget)

    def key_parts(self) -> tuple[str, ...]:
        return ("codex",) if self.codex else ()

    # -- sizes ---------------------------------------------------------------------------------

    def tail_budget(self, budget: int) -> int:
        """opencode's preserve-recent budget at history budget ``budget``."""
        usable = self.reference_context if self.scale_to_budget else budget
        shipped = min(self.tail_max_tokens, max(self.tail_min_tokens, int(usable * self.tail_share)))
        return scaled(shipped, budget, reference_context=self.reference_context, scale_to_budget=self.scale_to_budget)

    def user_budget(self, budget: int) -> int:
        """Codex's cap on the recent user messages kept at history budget ``budget``."""
        return scaled(self.codex_user_tokens, budget, reference_context=self.reference_context,
                      scale_to_budget=self.scale_to_budget)

    # -- the view ------------------------------------------------------------------------------

    @staticmethod
    def window(session: Session, scope: Scope, state: Covered | None) -> list[int]:
        """Uncovered history; a result whose call is in the summary is not rendered alone."""
        out = []
        for s in uncovered(scope, state):
            if session.is_result(s) and state is not None:
                cs = session.result(s).call_seq
                if cs is not None and state.covers(cs):
                    continue
            out.append(s)
        return out

    def cost(self, session: Session, scope: Scope, seq: int) -> int:
        return 0 if seq == scope.current else session.ntok(seq)

    def tail_start(self, session: Session, scope: Scope, window: list[int], budget: int) -> int:
        """opencode's ``select``: the first seq of the kept tail (len(session): no tail)."""
        msgs = sorted({*window, *([scope.current] if scope.current is not None else [])})
        starts = [i for i, s in enumerate(msgs) if session.message(s).role == "user"]
        if msgs and not starts:
            # A solo run (τ² telecom ``no-user``) has no user message at all: its history is one turn.
            # (Before a first user message, an assistant greeting belongs to no turn and goes to the head.)
            starts = [0]
        turns = [(a, b) for a, b in zip(starts, [*starts[1:], len(msgs)], strict=True)]
        room = self.tail_budget(budget)
        total = 0
        keep: int | None = None
        for a, b in reversed(turns):
            size = sum(self.cost(session, scope, s) for s in msgs[a:b])
            if total + size <= room:
                total += size
                keep = a
                continue
            remaining = room - total
            if remaining > 0 and b - a > 1:
                for j in range(a + 1, b):
                    if session.message(msgs[j]).role == "tool":
                        continue
                    if sum(self.cost(session, scope, s) for s in msgs[j:b]) <= remaining:
                        keep = j
                        break
            break
        if keep is None or keep == 0:
            return len(session)
        return msgs[keep]

    def codex_users(self, session: Session, scope: Scope, window: list[int], budget: int) -> list[int]:
        """Codex's kept user messages: the newest history user messages within its cap."""
        remaining = self.user_budget(budget)
        kept: list[int] = []
        for s in reversed([s for s in window if session.message(s).role == "user"]):
            if remaining <= 0:
                break
            cost = session.ntok(s)
            if cost > remaining:
                break
            kept.append(s)
            remaining -= cost
        return sorted(kept)

    def summary_insert(self, session: Session, budget: int, state: Covered | None) -> Inserted | None:
        msg, tok = self.summary(session, state, int(self.summary_share * budget))
        if msg is None or state is None:
            return None
        return Inserted(state.upto, msg, tok)  # before the tail (opencode), after the kept users (Codex)

    def compose(self, session: Session, scope: Scope, budget: int, stored: Stored) -> Rendered:
        """Compact once per invocation when the view exceeds B, then the shared fallback."""
        key, state = stored
        usage = Usage()
        window = self.window(session, scope, state)
        ins = self.summary_insert(session, budget, state)
        at_key = key + "|at"
        if layout_tokens(session, window, {}) + (ins.tokens if ins else 0) > budget and \
                (session.latest_artifact(STATE_KIND, at_key) or {}).get("at") != len(session):
            session.put_artifact(STATE_KIND, at_key, {"at": len(session)})  # one compaction per invocation
            cap = self.body_cap(session, int(self.summary_share * budget))
            if self.codex:
                users = self.codex_users(session, scope, window, budget)
                upto = len(session)
                exclude = tuple(sorted({*users, *([scope.current] if scope.current is not None else [])}))
                to_cover = [s for s in window if s not in exclude]

                def next_state(text: str) -> Covered:
                    return Covered(upto, exclude, text)
                bodies = None
            else:
                upto = self.tail_start(session, scope, window, budget)
                to_cover = [s for s in window if s < upto and s != scope.current]
                prev, seen = state, window

                def next_state(text: str) -> Covered:
                    return advance(scope, prev, seen, upto, text)
                bodies = {s: self.cut_output(session.message(s).content) for s in to_cover if session.is_result(s)}
            if to_cover and cap > 0:
                state, usage = self.summarise(session, key, state, to_cover, cap, next_state, bodies=bodies,
                                              instructions=SUMMARY_PROMPT)
                window = self.window(session, scope, state)
                ins = self.summary_insert(session, budget, state)
        return render_layout(self.name, session, scope, budget, window, summary=ins, placeholder=marker_text,
                             usage=usage)

    @staticmethod
    def cut_output(text: str) -> str:
        """opencode's cut of a tool output in the compaction input."""
        return text if len(text) <= TOOL_OUTPUT_MAX_CHARS else text[:TOOL_OUTPUT_MAX_CHARS] + "\n[truncated]"
