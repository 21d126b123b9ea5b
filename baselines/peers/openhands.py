"""OpenHands condensers as peers: observation masking, LLM summarizing, amortized forgetting.

Upstream: All-Hands-AI/OpenHands, ``openhands/memory/condenser/impl/``. OpenHands condenses a
list of *events*; here an event is one message, except that an assistant message with k tool
calls is k events (OpenHands makes one action per tool call and attaches the assistant's text
to the first as its thought). The leading system prompt is an event too (OpenHands' event 0,
the system message action) and so is the current user message.

Shared with every peer (package docstring): the trigger "the history exceeds B" replaces the
upstream one (an event count), the budget scope is the harness's (the system prompt and the
current user message are outside B and always rendered), and the shared fallback enforces B
when the upstream rule leaves the history above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any, ClassVar

from contextrender.baselines._common import (
    Covered,
    StatelessPolicy,
    Stored,
    SummaryPolicy,
    advance,
    load_covered,
    save_covered,
    state_key,
    uncovered,
)
from contextrender.baselines.peers._shared import (
    Inserted,
    events,
    layout_tokens,
    render_layout,
    results_by_call,
    truncate_middle,
)
from contextrender.compaction import Compactor
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_int, marker_text

#: OpenHands' placeholder for a masked observation (``observation_masking_condenser.py``).
MASKED = "<MASKED>"

#: First line of the summary event (OpenHands' summary event carries only the model's text; the label
#: says what the text is, as every summary message of the harness does).
SUMMARY_LABEL = "[Condensed history: a summary of earlier events, written by the compaction model]"

#: The summarizing prompt, in this project's words, asking for the sections OpenHands' prompt names
#: (USER_CONTEXT, TASK_TRACKING with exact task ids, COMPLETED, PENDING, CURRENT_STATE, and for code
#: CODE_STATE, TESTS, CHANGES, DEPS, VERSION_CONTROL_STATUS). ``{max_tokens}`` is the cap.
SUMMARY_PROMPT = """You keep the running state summary of an agent. The input holds the previous summary
(if there is one) and the events that are being removed from the agent's context. Write one
updated summary in these sections, each short and relevant to the task:
USER_CONTEXT: the user's requirements, goals and clarifications
TASK_TRACKING: active tasks with their exact ids and statuses (when the events track tasks)
COMPLETED: what is done, with brief results
PENDING: what still has to be done
CURRENT_STATE: variables, data and other state the agent relies on
For code tasks add CODE_STATE (file paths, function signatures, data structures), TESTS (failing
cases, error messages, outputs), CHANGES (edits made), DEPS (dependencies, imports, external
calls) and VERSION_CONTROL_STATUS (branch, commits, PR).
Copy ids, file paths and numbers exactly. Use at most {max_tokens} tokens."""


def _event_starts(session: Session) -> tuple[list[int], int]:
    """Index of each message's first event in the transcript's event list, and the number of events."""
    counts = [events(session, s) for s in range(len(session))]
    ends = list(accumulate(counts))
    return [e - c for e, c in zip(ends, counts, strict=True)], (ends[-1] if ends else 0)


class OpenHandsMasking(StatelessPolicy):
    """OpenHands ``ObservationMaskingCondenser``: observations older than the attention window are masked.

    Upstream (``observation_masking_condenser.py``): every observation whose index in the
    event list is below ``len(events) - attention_window`` is replaced by an
    ``AgentCondensationObservation('<MASKED>')``; actions (the tool calls) and all other
    events stay. Stateless: applied to each view. Default ``attention_window`` 5, the class
    default (OpenHands' config class defaults it to 100).

    Here: an observation is a tool result; a masked one keeps its tool message with the body
    ``<MASKED>`` (so its call stays paired), charged to B. Events as in the module docstring,
    counted over the whole transcript. Deviations forced by the shared scope: the rule runs
    only when Tok(H_full) > B (the full history otherwise); if the masked history still
    exceeds B, the shared fallback masks the oldest remaining results, then drops the oldest
    turns (package docstring).
    """

    def __init__(self, *, attention_window: int = 5, name: str = "openhands_masking") -> None:
        self.name = name
        self.attention_window = check_int("attention_window", attention_window)

    @staticmethod
    def placeholder(session: Session, seq: int) -> str:
        return MASKED

    def masked(self, session: Session) -> list[int]:
        """Seqs of the results the upstream rule masks."""
        starts, n = _event_starts(session)
        return [r.seq for r in session.results if starts[r.seq] < n - self.attention_window]

    def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
        """The upstream rule's masked results, then the shared fallback."""
        bodies = {s: MASKED for s in self.masked(session)}
        return render_layout(self.name, session, scope, budget, scope.history, bodies=bodies,
                             placeholder=self.placeholder)


class _Condenser(SummaryPolicy):
    """OpenHands' rolling condensers: keep a head and the newest half of the view, forget the middle.

    The forgotten events stay forgotten (state, like OpenHands' condensation actions); the next
    condensation works on the condensed view plus what came since.
    """

    summarize: ClassVar[bool] = True
    label = SUMMARY_LABEL
    #: Upper bound on condensations in one render (each halves the view; OpenHands condenses again
    #: at the next step while the view is still too large).
    MAX_CONDENSATIONS: ClassVar[int] = 64

    def __init__(self, *, compactor: Compactor | None, keep_first: int, summary_share: float,
                 max_event_chars: int, head_includes_system: bool, name: str) -> None:
        super().__init__(compactor=compactor, summary_share=summary_share, name=name)
        self.keep_first = check_int("keep_first", keep_first)
        self.max_event_chars = check_int("max_event_chars", max_event_chars)
        self.head_includes_system = bool(head_includes_system)

    # -- the head and the view -------------------------------------------------------------

    def head(self, session: Session, scope: Scope) -> tuple[set[int], int, int]:
        """The kept head: its history seqs (the first ``keep_first`` events, whole units), its event
        count and its last seq (system prompt and current user message included; -1 if empty)."""
        start = 0 if self.head_includes_system else len(scope.system)
        taken: list[int] = []
        count = 0
        for s in range(start, len(session)):
            if count >= self.keep_first:
                break
            taken.append(s)
            count += events(session, s)
        by_call = results_by_call(session)
        head = set(taken)
        for s in taken:  # a call in the head keeps its results (OpenHands could split them)
            head.update(by_call.get(s, ()))
        outside = {*scope.system, scope.current}
        return {s for s in head if s not in outside}, count, max(head, default=-1)

    def window(self, session: Session, scope: Scope, state: Covered | None, head: set[int]) -> list[int]:
        """Uncovered history after the head; a result whose call was forgotten is not rendered alone."""
        out = []
        for s in uncovered(scope, state):
            if s in head:
                continue
            if session.is_result(s):
                cs = session.result(s).call_seq
                if cs is not None and cs not in head and state is not None and state.covers(cs):
                    continue
            out.append(s)
        return out

    def summary_insert(self, session: Session, scope: Scope, budget: int, state: Covered | None, head_end: int,
                       window: Sequence[int]) -> Inserted | None:
        """The summary event, right after the kept head (``head_end``: its last seq)."""
        msg, tok = self.summary(session, state, int(self.summary_share * budget))
        if msg is None:
            return None
        after = [s for s in (*window, *([scope.current] if scope.current is not None else [])) if s > head_end]
        return Inserted(min(after) if after else len(session), msg, tok)

    # -- one condensation ----------------------------------------------------------------------

    def forget_from(self, session: Session, scope: Scope, state: Covered | None, head: set[int], head_events: int,
                    window: list[int]) -> int:
        """The first seq the condensation keeps (len(session): forget everything after the head).

        The view's events are the system prompt, the head, the summary event (after the
        first summarizing condensation), the window and the current user message. Upstream
        keeps ``max_size // 2 - len(head)`` events from the tail (one fewer for the summary
        event when summarizing); with the trigger in tokens, max_size is the view's event
        count. A tail that would start inside a multi-call assistant message, or on a result
        whose call is forgotten, starts after it instead.
        """
        view = sorted({*scope.system, *head, *window, *([scope.current] if scope.current is not None else [])})
        n = sum(events(session, s) for s in view) + (1 if self.summarize and state is not None else 0)
        tail_events = max(0, n // 2 - head_events - (1 if self.summarize else 0))
        after = [s for s in view if s not in head and s not in scope.system]
        tail: list[int] = []
        used = 0
        for s in reversed(after):
            e = events(session, s)
            if used + e > tail_events:
                break
            tail.append(s)
            used += e
        tail.reverse()
        while tail and self._orphaned(session, tail[0], head):
            tail.pop(0)
        return tail[0] if tail else len(session)

    @staticmethod
    def _orphaned(session: Session, seq: int, head: set[int]) -> bool:
        """A result at the start of the tail whose call is not kept (it is forgotten with its call)."""
        if not session.is_result(seq):
            return False
        cs = session.result(seq).call_seq
        return cs is not None and cs not in head

    def condense(self, session: Session, scope: Scope, budget: int, key: str, state: Covered | None,
                 head: set[int], head_events: int) -> tuple[Covered | None, Usage, bool]:
        """One condensation; returns the new state, its usage and whether anything was forgotten."""
        window = self.window(session, scope, state, head)
        upto = self.forget_from(session, scope, state, head, head_events, window)
        to_forget = [s for s in window if s < upto and s != scope.current]
        if not to_forget:
            return state, Usage(), False
        if not self.summarize:
            new = advance(scope, state, window, upto, "")
            save_covered(session, key, new, Usage())
            return new, Usage(), True
        cap = self.body_cap(session, int(self.summary_share * budget))
        if cap <= 0:  # not even the labelled summary fits: no condensation (the fallback applies)
            return state, Usage(), False
        bodies = {s: truncate_middle(session.message(s).content, self.max_event_chars) for s in to_forget}
        prev = state
        new, usage = self.summarise(session, key, prev, to_forget, cap,
                                    lambda text: advance(scope, prev, window, upto, text),
                                    bodies=bodies, instructions=SUMMARY_PROMPT)
        return new, usage, True

    def view_tokens(self, session: Session, scope: Scope, budget: int, state: Covered | None,
                    head: set[int]) -> int:
        window = self.window(session, scope, state, head)
        _, s_tok = self.summary(session, state, int(self.summary_share * budget))
        return layout_tokens(session, [*head, *window], {}) + s_tok

    def compose(self, session: Session, scope: Scope, budget: int, stored: Stored) -> Rendered:
        """Condense while the view exceeds B (each condensation halves it), then the shared fallback."""
        key, state = stored
        head, head_events, head_end = self.head(session, scope)
        usage = Usage()
        for _ in range(self.MAX_CONDENSATIONS):
            if self.view_tokens(session, scope, budget, state, head) <= budget:
                break
            state, u, progressed = self.condense(session, scope, budget, key, state, head, head_events)
            usage = usage + u
            if not progressed:
                break
        window = self.window(session, scope, state, head)
        ins = self.summary_insert(session, scope, budget, state, head_end, window)
        return render_layout(self.name, session, scope, budget, [*head, *window], summary=ins,
                             placeholder=marker_text, usage=usage)


class OpenHandsSummary(_Condenser):
    """OpenHands ``LLMSummarizingCondenser``: keep the head and the newest half, summarise the middle.

    Upstream (``llm_summarizing_condenser.py``): when the view has more than ``max_size``
    events, keep the first ``keep_first`` events and the newest ``max_size // 2 - keep_first
    - 1`` events; the events in between, with the previous summary, go to the LLM (each event's
    text truncated to ``max_event_length`` characters) and come back as one summary event
    placed right after the kept head (``summary_offset = keep_first``); forgotten events stay
    forgotten. Defaults: max_size 100, keep_first 1 (the app's default pipeline: 120 and 4),
    max_event_length 10,000.

    Here: the trigger is the view (head + summary + the rest) exceeding B; "max_size" in the
    tail size is the view's event count at that point, so the tail is the newest half of the
    view's events. The condensation repeats within one render while the view still exceeds B
    (OpenHands condenses again at its next step). The summary goes through the compaction
    model layer (extractive offline, LLM live) with :data:`SUMMARY_PROMPT` (the sections of
    OpenHands' prompt, in this project's words), capped at ``summary_share`` of B (a project
    choice: OpenHands has no token cap), as a labelled user-role message right after the head.
    ``keep_first`` counts events from the system prompt, as upstream (``head_includes_system``;
    with the default 1 the head is the system prompt alone and the task message may be
    summarised — it stays rendered while it is the current user message, which is outside
    B). A head or tail never splits an assistant message from its results. If the condensed
    view still exceeds B, the shared fallback applies (the project's omission marker, then
    the oldest turns). State: the summary and what it covers, a graph artifact.
    """

    summarize = True

    def __init__(self, *, compactor: Compactor | None = None, keep_first: int = 1, summary_share: float = 0.5,
                 max_event_chars: int = 10_000, head_includes_system: bool = True,
                 name: str = "openhands_summary") -> None:
        super().__init__(compactor=compactor, keep_first=keep_first, summary_share=summary_share,
                         max_event_chars=max_event_chars, head_includes_system=head_includes_system, name=name)

    def key_parts(self) -> tuple[str, ...]:
        return (f"keep_first={self.keep_first}", f"system={int(self.head_includes_system)}")


class OpenHandsForgetting(_Condenser):
    """OpenHands ``AmortizedForgettingCondenser``: keep the head and the newest half, drop the middle.

    Upstream (``amortized_forgetting_condenser.py``; ``recent_events_condenser.py`` is the
    same idea without amortisation): when the view has more than ``max_size`` events, keep
    the first ``keep_first`` events and the newest ``max_size // 2 - keep_first`` events and
    forget the rest, with no summary; forgotten events stay forgotten. Defaults: max_size
    100, keep_first 1 (see :class:`OpenHandsSummary` for the app's values).

    Here: as :class:`OpenHandsSummary` without the summary (trigger: the view exceeds B;
    tail: the newest half of the view's events; head counted from the system prompt; units
    kept whole; repeated within a render while the view exceeds B; then the shared
    fallback). State: the forgotten range, a graph artifact.
    """

    summarize = False

    def __init__(self, *, keep_first: int = 1, head_includes_system: bool = True,
                 name: str = "openhands_forgetting") -> None:
        super().__init__(compactor=None, keep_first=keep_first, summary_share=0.5, max_event_chars=0,
                         head_includes_system=head_includes_system, name=name)

    def load(self, session: Session, budget: int) -> tuple[str, Covered | None]:
        key = state_key(self.name, budget, f"keep_first={self.keep_first}",
                        f"system={int(self.head_includes_system)}")
        return key, load_covered(session, key)

    def summary(self, session: Session, state: Covered | None, max_tokens: int) -> tuple[dict[str, Any] | None, int]:
        return None, 0
