"""inspect_ai's compaction strategies as peers: CompactionEdit and CompactionTrim.

Upstream: UKGovernmentBEIS/inspect_ai, ``src/inspect_ai/model/_compaction/`` (``edit.py``,
``trim.py``, ``_compaction.py``) and ``src/inspect_ai/model/_trim.py``. inspect keeps a compacted
input: new messages are appended to it, and when it exceeds the threshold (default 0.9 of the
model's window) the strategy compacts it — then again, up to three more times, while it is still
above; the compacted input persists to later calls. Here that input is the peer's state (a graph
artifact), the threshold is B, and where upstream raises "Compaction insufficient" the shared
fallback of the package docstring enforces B instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contextrender.baselines._common import BasePolicy
from contextrender.baselines.peers._shared import layout_tokens, load_state, paired, render_layout, save_state
from contextrender.events import SYSTEM_ROLES
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_int, check_share, marker_text

#: inspect's placeholder for a cleared tool result (``TOOL_RESULT_REMOVED`` in ``edit.py``).
TOOL_RESULT_REMOVED = "(Tool result removed)"

#: inspect's compaction loop: the first compaction plus up to MAX_ITERATIONS more (``_compaction.py``).
MAX_ITERATIONS = 3


class InspectEdit(BasePolicy[set[int]]):
    """inspect_ai ``CompactionEdit``: clear old tool results, keep the newest ``keep_tool_uses``.

    Upstream (``edit.py``): every client tool use — a tool call with its tool message after
    it — is collected in order (assistant message, then call order); tool uses of
    ``exclude_tools`` are left out of the list (never cleared, not counted); all but the
    newest ``keep_tool_uses`` have their tool message replaced by ``(Tool result removed)``
    (``keep_tool_uses`` 0 clears all). ``keep_tool_inputs`` True (default): the calls stay.
    Defaults: keep_tool_uses 3, threshold 0.9 of the window. Thinking-block, memory-tool and
    citation clearing do not apply to the harness's messages.

    Here: the state is the set of cleared results; when the compacted history (cleared
    results as the placeholder, charged to B) exceeds B the rule runs again over all tool
    uses, so between compactions new results are appended in full, as upstream. Only
    ``keep_tool_inputs`` True is supported. Clearing again makes no progress (upstream then
    raises); the shared fallback applies instead (package docstring), for this render only.
    """

    def __init__(self, *, keep_tool_uses: int = 3, exclude_tools: Sequence[str] = (),
                 name: str = "inspect_edit") -> None:
        self.name = name
        self.keep_tool_uses = check_int("keep_tool_uses", keep_tool_uses)
        self.exclude_tools = frozenset(exclude_tools)

    @staticmethod
    def placeholder(session: Session, seq: int) -> str:
        return TOOL_RESULT_REMOVED

    def to_clear(self, session: Session) -> list[int]:
        """Result seqs the upstream rule clears on the current transcript."""
        by_call: dict[tuple[int, str], int] = {}
        for r in session.results:
            if r.call_seq is not None:
                by_call.setdefault((r.call_seq, r.call_id), r.seq)
        uses = []
        for s, m in enumerate(session.messages):
            if m.role != "assistant":
                continue
            for c in m.tool_calls:
                if c.name in self.exclude_tools:
                    continue
                seq = by_call.get((s, c.id))
                if seq is not None:
                    uses.append(seq)
        if self.keep_tool_uses == 0:
            return uses
        return uses[: -self.keep_tool_uses] if len(uses) > self.keep_tool_uses else []

    def prepare(self, session: Session, budget: int) -> set[int]:
        """The results cleared so far."""
        state = load_state(session, self.name, budget)
        return set(state["cleared"]) if state else set()

    def pristine(self, state: set[int]) -> bool:
        """Nothing cleared yet."""
        return not state

    def compose(self, session: Session, scope: Scope, budget: int, cleared: set[int]) -> Rendered:
        """Clear again once the compacted history exceeds B, then the shared fallback."""
        bodies = {s: TOOL_RESULT_REMOVED for s in cleared}
        if layout_tokens(session, scope.history, bodies) > budget:
            new = cleared | set(self.to_clear(session))
            if new != cleared:
                cleared = new
                save_state(session, self.name, budget, {"cleared": sorted(cleared)})
                bodies = {s: TOOL_RESULT_REMOVED for s in cleared}
        return render_layout(self.name, session, scope, budget, scope.history, bodies=bodies,
                             placeholder=self.placeholder)


class InspectTrim(BasePolicy[dict[str, Any] | None]):
    """inspect_ai ``CompactionTrim``: keep the system and input messages and the newest ``preserve`` share.

    Upstream (``trim.py`` → ``_trim.py`` ``trim_messages``): all system messages are kept;
    the input messages (those of the sample's input — without that tag, everything up to and
    including the first user message) are kept; of the remaining conversation messages the
    oldest ``int(len · (1 − preserve))`` are dropped; a tool message whose call was dropped
    is dropped too; a compaction output that ends with an assistant message loses it.
    Defaults: preserve 0.8, threshold 0.9 of the window.

    Here: the state is where the kept conversation starts (plus any trailing assistant
    message a trim removed); when the trimmed history exceeds B it is trimmed again — up to
    four times in one render, stopping early once it fits or when a trim makes no progress,
    as inspect's compaction loop does. System messages inside the history stay in place
    (inspect moves them to the front). The current user message is counted in the
    conversation but always rendered (it is outside B). If the trimmed history still
    exceeds B the shared fallback applies (the project's omission marker, then the oldest
    turns; package docstring), for this render only.
    """

    def __init__(self, *, preserve: float = 0.8, name: str = "inspect_trim") -> None:
        self.name = name
        self.preserve = check_share("preserve", preserve)

    @staticmethod
    def partition(session: Session, scope: Scope) -> tuple[list[int], list[int], list[int]]:
        """(system messages in the history, input messages, conversation messages), in order."""
        seqs = sorted({*scope.history, *([scope.current] if scope.current is not None else [])})
        system = [s for s in seqs if session.message(s).role in SYSTEM_ROLES]
        rest = [s for s in seqs if session.message(s).role not in SYSTEM_ROLES]
        first = next((i for i, s in enumerate(rest) if session.message(s).role == "user"), None)
        if first is None:
            return system, rest, []
        return system, rest[: first + 1], rest[first + 1:]

    @staticmethod
    def kept(session: Session, scope: Scope, system: list[int], inputs: list[int], conversation: list[int],
             dropped: set[int]) -> list[int]:
        """The history seqs of a trimmed view (pairs closed; the current user message is outside B)."""
        shown = paired(session, [*system, *inputs, *(s for s in conversation if s not in dropped)])
        return [s for s in shown if s != scope.current]

    def prepare(self, session: Session, budget: int) -> dict[str, Any] | None:
        """Where the kept conversation starts, what a trim dropped and when it last ran (None: never)."""
        return load_state(session, self.name, budget)

    def compose(self, session: Session, scope: Scope, budget: int, state: dict[str, Any] | None) -> Rendered:
        """The stored trim, trimmed again (up to four times) once it exceeds B, then the shared fallback."""
        system, inputs, conversation = self.partition(session, scope)
        start = state["start"] if state else 0
        dropped = set(state["dropped"]) if state else set()
        conv = [s for s in conversation if s >= start and s not in dropped]
        shown = self.kept(session, scope, system, inputs, conv, dropped)
        if layout_tokens(session, shown, {}) > budget and (state is None or state["at"] != len(session)):
            for _ in range(1 + MAX_ITERATIONS):
                cut = int(len(conv) * (1 - self.preserve))
                if cut == 0:
                    break  # no progress
                conv = conv[cut:]
                shown = self.kept(session, scope, system, inputs, conv, dropped)
                if layout_tokens(session, shown, {}) <= budget:
                    break
            if conv and session.message(conv[-1]).role == "assistant":
                dropped.add(conv[-1])
                conv = conv[:-1]
            start = conv[0] if conv else len(session)
            save_state(session, self.name, budget, {"start": start, "dropped": sorted(dropped), "at": len(session)})
            shown = self.kept(session, scope, system, inputs, conv, dropped)
        return render_layout(self.name, session, scope, budget, shown, placeholder=marker_text)
