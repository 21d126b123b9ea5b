"""Budget accounting and rendering helpers shared by every context policy.

A policy turns a :class:`~contextrender.graph.Session` into the history the
model sees next: ``render(session, budget) -> Rendered``. The budget scope is
the same for all policies (docs/method.md §1, §A.4): the leading system prompt and the
current user message are outside B; everything else (the history H_t) is
charged to B with the one :class:`~contextrender.tokens.TokenCounter`.
:func:`check_budget` is the single budget check; a render above B raises.

Every render has the same two ends: :func:`start_render` (the budget
refused if it is not a positive integer, then the :class:`Scope`) and
:func:`seal` (the budget check on what was assembled, then the
:class:`Rendered`); :func:`fits` is the test of the full-history shortcut
(docs/method.md §5 step 2). The baselines' template (``baselines/_common.py``) and
ContextRender (``selector.py``) both use them. :func:`check_int`,
:func:`check_share` and :func:`check_positive` are the argument checks of the
policies' constructors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from contextrender.events import SYSTEM_ROLES, Message, Usage
from contextrender.graph import OMISSION_MARKER, Session
from contextrender.tokens import MESSAGE_OVERHEAD


class BudgetExceeded(AssertionError):
    """A budgeted policy rendered more than B tokens of history: a bug, never a silent overflow."""


@dataclass(frozen=True)
class Rendered:
    """What a policy hands the model: the prompt and what it cost to build.

    ``messages``: the full prompt in chronological order (system prompt,
    history, current user message), OpenAI format. ``tokens``: Tok(H_t), the
    part charged to B. ``visible``: seqs of tool results whose complete,
    original text is in ``messages`` (compacted or summarised forms do not
    count; docs/method.md §7). ``usage``: what the policy itself spent (summariser
    calls, embeddings) for the cost model. ``sources``: one entry per
    rendered message, the seq of the stored message it renders (its body may
    be a marker, a compacted form or a clipped task), or None for a message
    the policy inserted (a summary); :func:`assemble` produces it. Empty only
    for a ``Rendered`` built by hand without it (every policy here sets it).
    """

    messages: tuple[dict[str, Any], ...]
    tokens: int
    visible: frozenset[int]
    usage: Usage = field(default_factory=Usage)
    sources: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if self.sources and len(self.sources) != len(self.messages):
            raise ValueError(f"sources has {len(self.sources)} entries for {len(self.messages)} messages")


@runtime_checkable
class ContextPolicy(Protocol):
    """Every context method — ContextRender and each baseline — implements this."""

    name: str
    budgeted: bool  # False only for Full history, which may exceed B

    def render(self, session: Session, budget: int) -> Rendered: ...


def require_budget(budget: Any) -> int:
    """Refuse a budget that is not a positive integer, before anything is rendered."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget <= 0:
        raise ValueError(f"budget must be a positive integer number of tokens, got {budget!r}")
    return int(budget)


def check_budget(tokens: int, budget: int, policy: str) -> None:
    """The one budget check (docs/method.md §5 postcondition: Tok(H_t) ≤ B)."""
    if tokens > budget:
        raise BudgetExceeded(f"{policy} rendered {tokens} history tokens, budget is {budget}")


# -- constructor argument checks ---------------------------------------------------
# The messages name the argument and echo its value: they reach users through config files and overrides.


def check_int(name: str, value: Any, *, minimum: int = 0) -> int:
    """Refuse ``value`` unless it is an ``int`` (a bool is not) of at least ``minimum``; return it.

    The message says "an integer ≥ {minimum}", or "a positive integer" when
    ``minimum`` is 1.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        need = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise ValueError(f"{name} must be {need}, got {value!r}")
    return value


def check_share(name: str, value: float, *, allow_zero: bool = True, allow_one: bool = True) -> float:
    """Refuse a share outside [0, 1] — outside (0, 1] without ``allow_zero``, [0, 1) without ``allow_one`` —
    and return it. NaN is refused too (every comparison with it is false)."""
    above = 0.0 <= value if allow_zero else 0.0 < value
    below = value <= 1.0 if allow_one else value < 1.0
    if not (above and below):
        bounds = f"{'[' if allow_zero else '('}0, 1{']' if allow_one else ')'}"
        raise ValueError(f"{name} must be in {bounds}, got {value}")
    return value


_Number = TypeVar("_Number", int, float)


def check_positive(name: str, value: _Number, *, allow_zero: bool = False) -> _Number:
    """Refuse ``value`` unless it is > 0 (≥ 0 with ``allow_zero``); return it. Any number type is accepted."""
    if (value < 0) if allow_zero else (value <= 0):
        raise ValueError(f"{name} must be {'≥ 0' if allow_zero else 'positive'}, got {value}")
    return value


@dataclass(frozen=True)
class Scope:
    """Which messages are charged to B (docs/method.md §1, §A.4).

    ``system``: the leading system messages (the system prompt). ``current``:
    the latest user message (None before any). ``history``: every other
    message, in order — H_t.
    """

    system: tuple[int, ...]
    current: int | None
    history: tuple[int, ...]

    @staticmethod
    def of(session: Session) -> Scope:
        msgs = session.messages
        n_sys = 0
        while n_sys < len(msgs) and msgs[n_sys].role in SYSTEM_ROLES:
            n_sys += 1
        current = next((i for i in range(len(msgs) - 1, n_sys - 1, -1) if msgs[i].role == "user"), None)
        history = (tuple(range(n_sys, len(msgs))) if current is None
                   else tuple(range(n_sys, current)) + tuple(range(current + 1, len(msgs))))
        return Scope(tuple(range(n_sys)), current, history)

    def history_results(self, session: Session) -> list[int]:
        # Tool messages are never in the system prefix nor the current user message.
        return session.result_arrays().seqs.tolist()

    def full_tokens(self, session: Session) -> int:
        """Tok(H_full): every history message at full size."""
        outside = session.tokens_of(self.system) + (session.ntok(self.current) if self.current is not None else 0)
        return session.total_tokens - outside


#: docs/method.md §4: x, the task text in q_t, is the first user message clipped to this many characters.
TASK_CHARS = 2000

#: Where a block an agent client wraps around what it adds to a user message opens (docs/method.md §5, "The
#: task"): a line opening a tag, ``<name>`` or ``<name attr=...>``, perhaps titled by one Markdown heading line
#: before it (Codex's "# AGENTS.md instructions for <dir>"); the block runs to the first line that closes the
#: same tag. Codex's ``<environment_context>`` and ``<user_instructions>``, Claude Code's ``<system-reminder>``
#: are such blocks; they are recognised by this shape alone, no tag or tool is named.
_OPEN = r"[ \t]*(?:#{1,6}[ \t][^\n]*\n\s*)?<(?P<tag>%s)(?:[ \t][^<>\n]*)?>"
_TAG = r"[A-Za-z][\w.:-]*"
_OPENS = re.compile(_OPEN % _TAG)
_LAST_CLOSE = re.compile(r"</(?P<tag>" + _TAG + r")>[ \t]*\Z")


def _line_start(text: str, pos: int) -> int:
    """The start of the first line at or after ``pos`` with anything but whitespace on it."""
    nl = text.rfind("\n", pos, len(text) - len(text[pos:].lstrip()))
    return pos if nl < 0 else nl + 1


def _wrapped_ends(text: str) -> tuple[int, int]:
    """Where the run of wrapped blocks before the user's words ends and the run after them starts (each run
    scanned from its end of the text, so the cost is linear in the text for a few blocks)."""
    if "</" not in text:
        return 0, len(text)
    head = 0
    while (m := _OPENS.match(text, _line_start(text, head))) is not None:
        close = re.compile("</" + re.escape(m["tag"]) + r">[ \t]*(?=\n|\Z)").search(text, m.end())
        if close is None:
            break
        head = close.end()
    tail = len(text.rstrip())
    while tail > head and (c := _LAST_CLOSE.search(text, head, tail)) is not None:
        opens = list(re.compile("^" + _OPEN % re.escape(c["tag"]), re.MULTILINE).finditer(text, head, c.start()))
        if not opens:
            break
        tail = len(text[:opens[-1].start()].rstrip())
    return head, max(head, tail)


def own_words(text: str) -> str:
    """``text`` without the wrapped blocks a client put before and after the user's words (docs/method.md §5),
    stripped of the whitespace between; ``text`` itself when it has none. Blocks inside the words stay."""
    head, tail = _wrapped_ends(text)
    return text if (head, tail) == (0, len(text)) else text[head:tail].strip()


def is_client_boilerplate(text: str) -> bool:
    """Whether ``text`` is nothing but wrapped blocks (docs/method.md §5): a message a client added, not the
    user's. An empty text is not (it holds no block)."""
    head, tail = _wrapped_ends(text)
    return head > 0 and not text[head:tail].strip()


def task_index(messages: Sequence[Message]) -> int | None:
    """The index of the task's message among ``messages`` (docs/method.md §5): the first user message that is
    not a client's wrapped blocks alone, else the first user message; None without one."""
    first = None
    for i, m in enumerate(messages):
        if m.role == "user":
            if not is_client_boilerplate(m.content):
                return i
            first = i if first is None else first
    return first


def first_user(session: Session) -> tuple[int, Message] | None:
    """The task's user message and its seq (docs/method.md §4's x before clipping), or None before any.

    The first user message, unless it is only an agent client's wrapped blocks (:func:`task_index`,
    docs/method.md §5). It is also the one message the verbatim trim never drops and the only one
    it may shorten or clip (docs/method.md §5 project choice, :func:`fit_verbatim`).
    """
    i = task_index(session.messages)
    return None if i is None else (i, session.messages[i])


def task_text(msg: Message, chars: int = TASK_CHARS) -> str:
    """x (docs/method.md §4): the task message's own words (:func:`own_words`; all of it when it has none), their
    first ``chars`` characters."""
    return (own_words(msg.content) or msg.content)[:chars]


def latest_assistant(session: Session, kept: Iterable[int]) -> int | None:
    """The seq of the latest assistant message among ``kept`` (rendered history seqs), or None.

    A sequence (``Trim.kept``, ``Scope.history``) must be in transcript order
    and is scanned from its end; any other iterable (a set) is sorted first.
    """
    msgs = session.messages
    order = kept if isinstance(kept, Sequence) else sorted(kept)
    return next((s for s in reversed(order) if msgs[s].role == "assistant"), None)


def focus_text(session: Session, scope: Scope, kept: Iterable[int]) -> str | None:
    """f_t (docs/method.md §4): the latest visible user message + the latest visible assistant message.

    The latest visible user message is the current one (``scope.current``,
    always rendered); the assistant message is the latest one still rendered
    (``kept``: the history seqs the render shows, so after a verbatim trim an
    older one than the transcript's latest may be the latest visible). Each is
    its text with its tool calls (:meth:`~contextrender.events.Message.text`);
    the two are joined by a newline. None when there is neither message (the
    text may still be "" when they are empty: the selector embeds it then,
    Semantic Retrieval does not). Semantic Retrieval's retrieval input
    (docs/method.md §6) is the same text.
    """
    msgs = session.messages
    parts = []
    if scope.current is not None:
        parts.append(msgs[scope.current].text())
    last = latest_assistant(session, kept)
    if last is not None:
        parts.append(msgs[last].text())
    return "\n".join(parts) if parts else None


# A tool result in a layout is shown in full (FULL), as its omission marker
# (MARKER), or as replacement text (a str: compacted form). Messages absent from
# the layout are not rendered at all.
FULL = "full"
MARKER = "marker"


class Assembled(NamedTuple):
    """A prompt in chronological order and, per message, the stored seq it renders (None: inserted)."""

    messages: list[dict[str, Any]]
    sources: list[int | None]


def assemble(session: Session, scope: Scope, shown: Iterable[int],
             bodies: Mapping[int, str] | None = None,
             inserts: Mapping[int, list[dict[str, Any]]] | None = None) -> Assembled:
    """Build the prompt in chronological order, recording where each message came from.

    ``shown``: history seqs to render; tool results among them are rendered in
    full unless ``bodies`` maps them to replacement text (a marker or a
    compacted form). ``inserts``: extra messages (summaries) placed before the
    given seq; key -1 places them right after the system prompt. Returns the
    messages and their sources (:attr:`Rendered.sources`): the stored seq of
    each message, None for inserted ones.
    """
    bodies = bodies or {}
    inserts = inserts or {}
    keep = set(shown)
    if scope.current is not None:
        keep.add(scope.current)
    out: list[dict[str, Any]] = [session.message(s).to_openai() for s in scope.system]
    sources: list[int | None] = list(scope.system)

    def insert(seq: int) -> None:
        extra = inserts.get(seq, [])
        out.extend(extra)
        sources.extend([None] * len(extra))

    insert(-1)
    n_sys = len(scope.system)
    for seq in sorted(keep | {k for k in inserts if k >= n_sys}):
        insert(seq)
        if seq not in keep:
            continue
        msg = session.message(seq).to_openai()
        if seq in bodies:
            msg["content"] = bodies[seq]
        out.append(msg)
        sources.append(seq)
    return Assembled(out, sources)


# -- the two ends of every render --------------------------------------------------


def start_render(session: Session, budget: Any) -> Scope:
    """The preamble of every render: refuse a budget that is not a positive integer, then the budget scope.

    The budget is checked before the session is read, so a bad one fails the
    same way for every policy whatever the history holds. ``budget`` itself
    is left as the caller passed it (a NumPy integer stays one).
    """
    require_budget(budget)
    return Scope.of(session)


def fits(session: Session, scope: Scope, budget: int) -> bool:
    """Whether Tok(H_full) ≤ B: the test of the full-history shortcut (docs/method.md §5 step 2)."""
    return scope.full_tokens(session) <= budget


def seal(name: str, budget: int, assembled: Assembled, tokens: int, visible: Iterable[int], usage: Usage, *,
         budgeted: bool = True) -> Rendered:
    """The end of every render: the budget check on what was assembled, then the :class:`Rendered`.

    ``tokens`` is Tok(H_t) counted on the assembled history (each policy
    counts it its own way, never from a running total); :func:`check_budget`
    raises if it exceeds B unless the policy is not ``budgeted`` (Full
    history). ``visible``: the seqs of the results shown in full.
    """
    if budgeted:
        check_budget(tokens, budget, name)
    return Rendered(tuple(assembled.messages), tokens, frozenset(visible), usage, tuple(assembled.sources))


def marker_text(session: Session, seq: int) -> str:
    """What omitted result ``seq`` leaves in its tool message: the fixed marker (docs/method.md §5, project choice)."""
    return OMISSION_MARKER


def text_message_tokens(counter: Any, text: str) -> int:
    """Tok of one message carrying ``text`` (summary messages, compacted results)."""
    return MESSAGE_OVERHEAD + counter.text(text)


@dataclass(frozen=True)
class Trim:
    """Result of fitting the verbatim messages into B (docs/method.md §5, project choice)."""

    kept: tuple[int, ...]  # history seqs still rendered
    base_tokens: int  # Tok with every kept result as its marker
    clipped_first_user: str | None = None  # the task message's body when shortened (§5 "The task") or clipped
    #: (where, text, Tok): the line naming the dropped turns' results, placed before that seq (docs/method.md §16);
    #: its Tok is in ``base_tokens``
    dropped_note: tuple[int, str, int] | None = None

    def inserts(self) -> dict[int, list[dict[str, Any]]]:
        """:func:`assemble`'s ``inserts`` for the dropped-turns line (none without it)."""
        if self.dropped_note is None:
            return {}
        at, text, _ = self.dropped_note
        return {at: [{"role": "user", "content": text}]}


#: Once the verbatim messages overflow B, trim them to this share of B (project choice, docs/method.md §5).
TRIM_TARGET_SHARE = 0.5


def _prose_first_order(session: Session, starts: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """Unit indices in drop order for ``prose_first``: prose-only assistant units oldest first (never the
    newest assistant message among them), then every other unit oldest first."""
    sizes = np.bincount(inverse, minlength=len(starts))
    assistant = [i for i, s in enumerate(starts.tolist()) if session.message(s).role == "assistant"]
    newest = assistant[-1] if assistant else -1
    prose = np.zeros(len(starts), dtype=bool)
    for i in assistant:
        msg = session.message(int(starts[i]))
        prose[i] = i != newest and sizes[i] == 1 and not msg.tool_calls
    idx = np.arange(len(starts))
    return np.concatenate([idx[prose], idx[~prose]])


def _wrapped_first(session: Session, starts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``order`` with the units that are a user message holding only a client's wrapped blocks moved to its
    front, in their order (docs/method.md §5, "The task"); ``order`` itself when there is none."""
    wrapped = np.array([session.message(int(starts[i])).role == "user"
                        and is_client_boilerplate(session.message(int(starts[i])).content) for i in order.tolist()],
                       dtype=bool)
    return order if not wrapped.any() else np.concatenate([order[wrapped], order[~wrapped]])


def fit_verbatim(session: Session, scope: Scope, budget: int,
                 target_share: float = TRIM_TARGET_SHARE, *, prose_first: bool = False,
                 marker_cost: np.ndarray | None = None,
                 dropped_line: Callable[[Sequence[int]], str] | None = None) -> Trim:
    """Charge user/assistant messages first; if they alone exceed B, drop the oldest turns.

    The paper does not say what gives when the verbatim messages exceed B
    (docs/method.md §5). Project choice: drop whole units oldest first — a user message,
    or an assistant message together with its tool results, so call/result
    pairs never split — and never the first user message of the task — until
    they take at most ``target_share``·B. Trimming just to B would leave no
    room for any tool result, so at long horizons every policy would show
    messages only; half of B keeps the recent turns and room for results.
    If the task message alone still exceeds B, its text is clipped so that
    the postcondition Tok(H_t) ≤ B holds (dropped only when B is smaller
    than one message's framing tokens).

    The task message is :func:`first_user`'s, and what an agent client wrapped
    around the user's words goes first (docs/method.md §5, "The task"): before any
    unit is dropped the task message loses its wrapped blocks (its body becomes
    :func:`own_words`), user messages that are only wrapped blocks are the first
    units dropped, and a clip cuts the user's words alone.

    ``prose_first`` (contextrender_plus's ``trim_prose_first``; off for every
    other policy): the same target, another order — first the assistant
    messages that are prose alone (no tool calls), oldest first, except the
    newest assistant message of the history (whatever it is: when the agent
    has acted since the user's last reply, the newest one is that call, and
    the prose before it is old prose too); only then the other units, oldest
    first. Dropping the oldest
    units first also drops the oldest tool calls, and their results stop
    being candidates; old assistant prose mostly restates what those results
    and the user already said.

    ``marker_cost``: Tok of each result's marker (in :meth:`~contextrender.graph.Session.result_arrays` order) when
    it is not the stored one (the expand tool's markers, docs/method.md §16); default the stored marker's.

    ``dropped_line`` (where the expand tool is offered, docs/method.md §16): given the seqs of the dropped messages,
    a line naming how to read their results back; it becomes one user-role message where the first dropped message
    was (:attr:`Trim.dropped_note`), charged to B, and is left out when it does not fit (or names nothing).
    """
    arrays = session.result_arrays()
    markers = arrays.marker_ntok if marker_cost is None else marker_cost
    # Verbatim messages plus every result as its marker, without a per-message loop.
    total = scope.full_tokens(session) - int(arrays.ntok.sum()) + int(markers.sum())
    if total <= budget:
        return Trim(scope.history, total)
    fu = first_user(session)
    first_seq = fu[0] if fu is not None else None
    cost_all, unit_all = session.verbatim_arrays()
    if marker_cost is not None and len(arrays.seqs):
        cost_all = cost_all.copy()
        cost_all[arrays.seqs] = marker_cost
    # The task's wrapped blocks go before anything else (docs/method.md §5, "The task"): it keeps its own words.
    words = own_words(fu[1].content) if fu is not None and first_seq in scope.history else None
    if fu is not None and words and words != fu[1].content:
        total += text_message_tokens(session.counter, words) - int(cost_all[first_seq])
        if total <= budget:
            return Trim(scope.history, total, words)
    else:
        words = None
    hist = np.fromiter(scope.history, dtype=np.int64, count=len(scope.history))
    cost, unit = cost_all[hist], unit_all[hist]
    # Units in transcript order (by their first message); drop the oldest until the rest fits,
    # skipping the task's first user message. A user message that is only a client's wrapped blocks goes first.
    starts, inverse = np.unique(unit, return_inverse=True)
    unit_cost = np.bincount(inverse, weights=cost, minlength=len(starts)).astype(np.int64)
    order = _prose_first_order(session, starts, inverse) if prose_first else np.arange(len(starts))
    order = _wrapped_first(session, starts, order)
    droppable = unit_cost[order]
    if first_seq is not None:
        droppable[starts[order] == first_seq] = 0
    target = int(budget * target_share)

    def drop_to(total: int) -> tuple[tuple[int, ...], int]:
        # Smallest k with total − Σ droppable[:k] ≤ target; k = len(starts) if even that is not enough.
        remaining = total - np.concatenate([[0], np.cumsum(droppable)])
        k = int(np.argmax(remaining <= target)) if (remaining <= target).any() else len(starts)
        drop_unit = np.zeros(len(starts), dtype=bool)
        drop_unit[order[:k]] = True
        if first_seq is not None:
            drop_unit[starts == first_seq] = False
        return tuple(hist[~drop_unit[inverse]].tolist()), int(remaining[k])

    kept, total = drop_to(total)
    clipped = words
    if dropped_line is not None:
        held = set(kept)
        gone = [s for s in scope.history if s not in held]
        line = dropped_line(gone) if gone else ""
        line_cost = text_message_tokens(session.counter, line) if line else 0
        if line and total + line_cost <= budget:
            # docs/method.md §16: one user-role line where the first dropped message was, charged to B
            return Trim(kept, total + line_cost, clipped, (gone[0], line, line_cost))
    if total > budget and first_seq is not None and first_seq in kept:
        counter = session.counter
        text = session.message(first_seq).content if words is None else words
        first_cost = text_message_tokens(counter, text) if words is not None else int(cost_all[first_seq])
        room = budget - (total - first_cost) - MESSAGE_OVERHEAD
        if room < 0:  # B smaller than one message's framing: even an empty task message cannot fit
            kept = tuple(s for s in kept if s != first_seq)
            return Trim(kept, total - first_cost)
        clipped = counter.truncate(text, room)
        total = total - first_cost + text_message_tokens(counter, clipped)
    return Trim(kept, total, clipped)
