"""Omitted, not lost: the ``contextrender_expand`` tool (docs/method.md §16).

The graph keeps every result a render leaves out. When the tool is offered in a session, a render that
omits a result leaves a marker carrying a *handle* (:func:`marker`), and the model can read the result back
by calling ``contextrender_expand`` with it — the whole text, or only the part it names (a JSON key path, or
words to match). What comes back is clipped to the room it is given, with a note saying what was cut and how
to ask for less.

Handles are 9 decimal digits (a fixed 3 tokens under cl100k/o200k, which group digits by three): an HMAC of
the result's seq under a random per-session key (:meth:`~contextrender.graph.Session.expand_key`, made when
the tool is first offered and kept in the graph file). They are stable within a session, across restarts,
and unguessable from another session; a handle this session did not issue is a tool error, never another
session's data.

An expansion is an event of the graph: its values count as reuse of the result they came from
(:meth:`~contextrender.graph.Session.record_expansion`), so Tool-Flow Analysis learns from what the model
asked for.

Two ways to run it:

* **Client mode** (a user's own loop, LangChain, the Agents SDK): :class:`ExpandTool` gives the tool's
  schema in each API's shape and a handler; the loop appends the call and its result like any tool's.
* **In the service** (the proxy and ``wrap``) the tool is added to what the model sees and answered there;
  the client never sees it (docs/service.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from contextrender.graph import EXPAND_TOOL, OMISSION_MARKER, Session
from contextrender.tokens import MESSAGE_OVERHEAD

#: The tool's name as the model sees it.
TOOL_NAME = EXPAND_TOOL
HANDLE_DIGITS = 9
_HANDLE = re.compile(rf"^\d{{{HANDLE_DIGITS}}}$")
#: a handle as a marker shows it: what a caller (the offline oracle, a test) reads back from a rendered message
MARKER_HANDLE = re.compile(rf'{TOOL_NAME}\("(\d{{{HANDLE_DIGITS}}})"\)')
#: How the line that names the results of dropped turns begins (:func:`dropped_line`), and a handle inside it.
DROPPED_HEAD = f"[earlier turns omitted; {TOOL_NAME} reads back their results:"
_DROPPED_LINE = re.compile(re.escape(DROPPED_HEAD) + r"[^\]]*\]")
_QUOTED_HANDLE = re.compile(rf'"(\d{{{HANDLE_DIGITS}}})"')
_TOOL_WORD = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
#: Share of B an expansion may fill in client mode when the caller names no room (project choice: the render
#: after it must still hold the task, the newest turns and the expansion itself).
DEFAULT_SHARE = 0.5
#: Below this many tokens an expansion cannot say anything useful: the room is refused instead.
MIN_TOKENS = 32
#: Keys (or list rows) a clip note names, at most.
NOTE_KEYS = 12
#: Words a ``match`` narrowing takes, at most (each request's work is bounded).
MAX_MATCH_WORDS = 32
#: Parts of a ``key`` path, at most.
MAX_KEY_PARTS = 16

#: Short on purpose: the definition is sent with every request (read from the prompt cache, still billed), so each
#: token of it is paid once per call; the markers themselves show the call to make (docs/method.md §16).
DESCRIPTION = ("Read back an omitted or shortened tool result by its marker's handle. For only a part: key (JSON "
               "path, e.g. orders.0.items) or match (words, ids).")
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"handle": {"type": "string"}, "key": {"type": "string"}, "match": {"type": "string"}},
    "required": ["handle"],
}


class ExpandError(ValueError):
    """The call cannot be answered (unknown handle, bad arguments, a key that is not there): its text is the tool's
    error result, naming what to do."""


# -- handles ------------------------------------------------------------------------------------------

_HANDLES: weakref.WeakKeyDictionary[Session, dict[str, int]] = weakref.WeakKeyDictionary()


def offer(session: Session) -> None:
    """Offer the tool in ``session``: its renders' markers carry handles from now on (the key is made once)."""
    session.expand_key(create=True)


def gives_handles(policy: Any) -> bool:
    """Whether ``policy``'s markers can carry handles: its ``expand`` option (on in contextrender_plus; the
    paper's methods have none; a wrapper such as the cache-aware render answers for the policy it wraps)."""
    return getattr(policy, "expand", False) is True


#: Set while a render is made for a request that does not offer the tool (:func:`withheld`).
_WITHHELD: ContextVar[bool] = ContextVar("contextrender_expand_withheld", default=False)


def offered(session: Session) -> bool:
    """Whether the tool is offered in ``session`` for the render being made: it was offered there
    (:func:`offer`), and the request being rendered does not withhold it (:func:`withheld`). A render then gives
    omitted results handles."""
    return session.expand_key() is not None and not _WITHHELD.get()


@contextmanager
def withheld() -> Iterator[None]:
    """Render, inside this block, as if the tool had never been offered: for a request that does not carry it (the
    service's render without ``offer_expand``: an assistant prefill, ``wrap(expand=False)``, a helper that hands the
    caller the live stream). Its markers carry no handles, and the cache-aware render holds back nothing on the
    strength of an expansion the model cannot make (docs/service.md, "The expand tool"). Per thread and task (a
    context variable)."""
    token = _WITHHELD.set(True)
    try:
        yield
    finally:
        _WITHHELD.reset(token)


def handle(session: Session, seq: int) -> str:
    """The handle of result ``seq`` in ``session`` (the tool must have been offered: :func:`offer`)."""
    key = session.expand_key()
    if key is None:
        raise ExpandError(f"session {session.id!r}: the expand tool was not offered here (expand.offer first)")
    digest = hmac.new(key, f"{seq}".encode(), hashlib.sha256).digest()
    return f"{int.from_bytes(digest[:8], 'big') % 10 ** HANDLE_DIGITS:0{HANDLE_DIGITS}d}"


def resolve(session: Session, h: str) -> int:
    """The seq of the result ``h`` names in this session; :class:`ExpandError` when this session issued no such
    handle (two results of one session sharing a handle, a one-in-10⁹ chance per pair, resolve to the older)."""
    if not isinstance(h, str) or not _HANDLE.match(h.strip()):
        raise ExpandError(f"handle must be the {HANDLE_DIGITS} digits a marker shows, got {str(h)[:40]!r}")
    h = h.strip()
    if session.expand_key() is None:
        raise ExpandError(f"no result has handle {h} in this session")
    table = _HANDLES.setdefault(session, {})
    results = session.results
    done = table.get("", 0)  # results whose handles are in the table (results only grow)
    if h not in table and done < len(results):
        for r in results[done:]:
            table.setdefault(handle(session, r.seq), r.seq)
        table[""] = len(results)
    seq = table.get(h)
    if seq is None:
        raise ExpandError(f"no result has handle {h} in this session")
    return seq


_ORIGINS: weakref.WeakKeyDictionary[Session, dict[int, int]] = weakref.WeakKeyDictionary()


def origin(session: Session, seq: int) -> int:
    """The result whose text result ``seq`` holds: for the answer of a ``contextrender_expand`` call in the
    session (a loop of one's own appends it like any tool's), the result its call's handle names; else ``seq``.

    An omitted answer's marker points there (:func:`marker`), so a model never expands a copy: a copy was clipped
    or narrowed, the original holds all of it, and its key paths are the original's.
    """
    table = _ORIGINS.setdefault(session, {})
    if seq in table:
        return table[seq]
    found = seq
    r = session.result(seq)
    if r.tool_name == TOOL_NAME and r.call_seq is not None:
        call = next((c for c in session.message(r.call_seq).tool_calls if c.id == r.call_id), None)
        try:
            h = str(arguments_of(call.arguments).get("handle", "")) if call is not None else ""
            found = resolve(session, h) if h else seq
        except ExpandError:  # a call that was refused: its answer is an error, a result of its own
            found = seq
    table[seq] = found
    return found


def marker(session: Session, seq: int) -> str:
    """What an omitted result's tool message says when the tool is offered: the marker and how to get it back
    (an expansion's answer: the handle of the result it copies, :func:`origin`)."""
    return f'{OMISSION_MARKER[:-1]}; {TOOL_NAME}("{handle(session, origin(session, seq))}")]'


def shortened_note(session: Session, seq: int) -> str:
    """The line a shortened form (ids, a table, a compaction) ends with when the tool is offered."""
    return f'[shortened; full text: {TOOL_NAME}("{handle(session, origin(session, seq))}")]'


def dropped_line(session: Session, seqs: Iterable[int]) -> str:
    """The user-role line a render puts where whole turns were dropped (the verbatim trim, docs/method.md §5) when the
    tool is offered: each result those turns held, by its tool's name, with its handle — a dropped turn leaves no
    marker of its own. Empty when they held no result. A tool name that is not a plain word is left out (the handle
    alone stays): what a client sent is text here, never markup."""
    by_tool: dict[str, list[str]] = {}
    seen: set[str] = set()
    for seq in seqs:
        if not session.is_result(seq):
            continue  # an expansion's answer is a copy; its original is listed where it was dropped
        h = handle(session, origin(session, seq))
        if h in seen:
            continue
        seen.add(h)
        name = session.result(seq).tool_name
        by_tool.setdefault(name if _TOOL_WORD.match(name or "") else "", []).append(f'"{h}"')
    if not by_tool:
        return ""
    parts = "; ".join(f"{name} {', '.join(hs)}".strip() for name, hs in by_tool.items())
    return f"{DROPPED_HEAD} {parts}]"


def handles_in(text: str) -> list[str]:
    """The handles a rendered message's text shows: in markers and shortened forms, and in the line naming the results
    of dropped turns (:func:`dropped_line`)."""
    out = MARKER_HANDLE.findall(text)
    for m in _DROPPED_LINE.finditer(text):
        out.extend(_QUOTED_HANDLE.findall(m.group(0)))
    return out


def marked_results(session: Session, messages: Any) -> frozenset[int]:
    """The results a render of ``session`` leaves one expansion away: those whose handle a marker or a shortened
    form in ``messages`` (OpenAI-format, as rendered) shows. Empty where the tool was not offered."""
    if not offered(session):
        return frozenset()
    out = set()
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, str):
            continue
        for h in handles_in(content):
            try:
                out.add(resolve(session, h))
            except ExpandError:  # a handle the model or a client wrote: not one this render gave
                continue
    return frozenset(out)


# -- the tool's schema, in each API's shape --------------------------------------------------------------

def chat_tool() -> dict[str, Any]:
    """The tool as a Chat Completions ``tools`` entry."""
    return {"type": "function", "function": {"name": TOOL_NAME, "description": DESCRIPTION,
                                             "parameters": PARAMETERS}}


def responses_tool() -> dict[str, Any]:
    """The tool as a Responses API ``tools`` entry."""
    return {"type": "function", "name": TOOL_NAME, "description": DESCRIPTION, "parameters": PARAMETERS,
            "strict": False}


def messages_tool() -> dict[str, Any]:
    """The tool as an Anthropic Messages API ``tools`` entry."""
    return {"name": TOOL_NAME, "description": DESCRIPTION, "input_schema": PARAMETERS}


# -- answering a call ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Expansion:
    """One answered call: what goes back to the model, and what the graph records."""

    handle: str
    seq: int  # the result it read back
    text: str  # the tool result's content
    tokens: int  # Tok of the tool message carrying ``text``
    narrowed: str | None  # "key=…" / "match=…", or None for the whole result
    clipped: bool
    total_tokens: int  # Tok of what the narrowing selected, before any clipping

    def to_json(self) -> dict[str, Any]:
        return {"handle": self.handle, "seq": self.seq, "tokens": self.tokens, "narrowed": self.narrowed,
                "clipped": self.clipped, "total_tokens": self.total_tokens}


def arguments_of(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The call's arguments as a dict (a JSON string from Chat Completions and Responses, a dict from Messages)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise ExpandError("arguments missing: pass {\"handle\": \"<9 digits>\"}")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ExpandError(f"arguments are not JSON ({e.msg} at column {e.colno}): pass "
                              "{\"handle\": \"<9 digits>\"}") from None
    if not isinstance(raw, Mapping):
        raise ExpandError("arguments must be a JSON object such as {\"handle\": \"<9 digits>\"}")
    unknown = sorted(set(raw) - set(PARAMETERS["properties"]))
    if unknown:
        raise ExpandError(f"unknown argument(s) {', '.join(map(repr, unknown[:5]))}: the tool takes handle, key, match")
    for k in ("key", "match"):
        if raw.get(k) is not None and not isinstance(raw[k], str):
            raise ExpandError(f"{k} must be a string")
    return dict(raw)


def expand(session: Session, arguments: str | Mapping[str, Any] | None, *, max_tokens: int) -> Expansion:
    """Answer one ``contextrender_expand`` call in ``session`` within ``max_tokens`` (Tok of the tool message).

    Raises :class:`ExpandError` (its text is the tool's error result) for an unknown handle, bad arguments, a key
    path that is not there, a match that matches nothing, or a room below :data:`MIN_TOKENS`. Records nothing:
    :func:`record` does, once the answer is on its way.
    """
    args = arguments_of(arguments)
    seq = resolve(session, str(args.get("handle", "")))
    if max_tokens < MIN_TOKENS:
        raise ExpandError(f"no room left under the budget for an expansion ({max_tokens} tokens): answer with what "
                          "is shown")
    content = session.message(seq).content
    text, narrowed = _narrow(content, args.get("key"), args.get("match"))
    counter = session.counter
    total = MESSAGE_OVERHEAD + counter.text(text)
    clipped = total > max_tokens
    if clipped:
        text = _clip(counter, text, max_tokens, _shape(text if narrowed else content), narrowed is None)
    return Expansion(str(args["handle"]).strip(), seq, text, MESSAGE_OVERHEAD + counter.text(text), narrowed,
                     clipped, total)


def record(session: Session, expansion: Expansion, at: int) -> None:
    """Keep ``expansion`` in the graph: its values as reuse of the result (Tool-Flow Analysis) and the event itself
    (``explain`` and ``view`` list it). ``at``: the seq of the message that called the tool, or inside the service,
    the seq the answer goes to."""
    session.record_expansion(expansion.text, at)
    session.put_artifact("expansion", str(expansion.seq), {**expansion.to_json(), "at": at,
                                                           "invocation": session.next_invocation})


def expansions(session: Session) -> list[dict[str, Any]]:
    """The expansions recorded in ``session``, oldest first."""
    rows = session.graph._query("SELECT payload FROM artifacts WHERE session_id = ? AND kind = 'expansion' ORDER BY id",
                                (session.id,))
    return [json.loads(r[0]) for r in rows]


# -- narrowing and clipping ---------------------------------------------------------------------------------

def _words(match: str) -> list[str]:
    words = [w for w in re.split(r"[\s,]+", match.strip()) if w]
    if not words:
        raise ExpandError("match is empty: pass words or ids separated by spaces or commas")
    return words[:MAX_MATCH_WORDS]


def _hit(text: str, words: list[str]) -> bool:
    low = text.lower()
    return any(w.lower() in low for w in words)


def _narrow(content: str, key: str | None, match: str | None) -> tuple[str, str | None]:
    """The part of ``content`` the call names (module docstring), and how it was narrowed (None: all of it)."""
    if not key and not match:
        return content, None
    try:
        data: Any = json.loads(content)
        is_json = isinstance(data, (dict, list))
    except ValueError:
        data, is_json = None, False
    how = []
    if key:
        if not is_json:
            raise ExpandError("key needs a JSON result; this one is text: narrow it with match instead")
        data = _at_path(data, key)
        how.append(f"key={key}")
    if match:
        words = _words(match)
        how.append(f"match={' '.join(words)}")
        if is_json:
            got = _match_json(data, words)
            if got is _NOTHING:
                raise ExpandError(f"nothing in this result matches {' '.join(words)!r}: try other words, a key, or "
                                  "no narrowing")
            data = got
        else:
            lines = [ln for ln in content.splitlines() if _hit(ln, words)]
            if not lines:
                raise ExpandError(f"no line of this result matches {' '.join(words)!r}: try other words or no "
                                  "narrowing")
            return "\n".join(lines), "; ".join(how)
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return text, "; ".join(how)


def _at_path(data: Any, path: str) -> Any:
    parts = [p for p in re.split(r"[.\[\]]+", path.strip()) if p]
    if not parts or len(parts) > MAX_KEY_PARTS:
        raise ExpandError(f"key must be a path of 1 to {MAX_KEY_PARTS} parts separated by dots, got {path[:80]!r}")
    at: Any = data
    done: list[str] = []
    for part in parts:
        if isinstance(at, dict):
            if part not in at:
                raise ExpandError(f"no key {part!r} at {'.'.join(done) or 'the top'}; keys there: "
                                  f"{_keys(at)}")
            at = at[part]
        elif isinstance(at, list):
            if not part.lstrip("-").isdigit() or not -len(at) <= int(part) < len(at):
                raise ExpandError(f"{'.'.join(done) or 'the result'} is a list of {len(at)}: index it 0 to "
                                  f"{len(at) - 1}, got {part!r}")
            at = at[int(part)]
        else:
            raise ExpandError(f"{'.'.join(done)} is a value, not an object or list: stop the key there")
        done.append(part)
    return at


_NOTHING = object()


def _match_json(data: Any, words: list[str]) -> Any:
    """The members of ``data`` containing one of ``words``: a list keeps its matching rows whole; an object keeps
    the members whose key matches, or whose value does (narrowed the same way); a value is kept when it matches."""
    if isinstance(data, list):
        rows = [row for row in data if _hit(json.dumps(row, ensure_ascii=False), words)]
        return rows if rows else _NOTHING
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if _hit(str(k), words):
                out[k] = v
                continue
            got = _match_json(v, words)
            if got is not _NOTHING:
                out[k] = got
        return out if out else _NOTHING
    return data if _hit(json.dumps(data, ensure_ascii=False), words) else _NOTHING


def _keys(obj: dict[str, Any]) -> str:
    ks = list(obj)
    more = f" and {len(ks) - NOTE_KEYS} more" if len(ks) > NOTE_KEYS else ""
    return ", ".join(ks[:NOTE_KEYS]) + more


def _shape(text: str) -> str:
    """How to ask for less of ``text``: its top-level keys, or its rows."""
    try:
        data = json.loads(text)
    except ValueError:
        return 'narrow it with "match" (words or ids: only the lines holding one come back)'
    if isinstance(data, dict):
        return f'narrow it with "key" (top-level keys: {_keys(data)}) or "match" (words or ids)'
    if isinstance(data, list):
        return f'narrow it with "key" (a row, 0 to {len(data) - 1}) or "match" (words or ids: the rows holding one)'
    return 'narrow it with "match"'


def _clip(counter: Any, text: str, max_tokens: int, how: str, whole: bool) -> str:
    """The longest head of ``text`` that, with the note saying what was cut and how to ask for less, fits
    ``max_tokens`` (Tok of the tool message)."""
    total = counter.text(text)

    def note(shown: int) -> str:
        what = "the result" if whole else "the part asked for"
        return f"\n[{TOOL_NAME}: {what} is {total} tokens, cut after {shown} to fit the budget; {how}]"

    room = max_tokens - MESSAGE_OVERHEAD - counter.text(note(total))
    if room <= 0:
        return note(0).lstrip("\n")
    lo, hi = 0, len(text)
    while hi - lo > 1:  # the longest prefix (in characters) whose tokens fit the room
        mid = (lo + hi) // 2
        if counter.text(text[:mid]) <= room:
            lo = mid
        else:
            hi = mid
    head = text[:lo]
    return head + note(counter.text(head))


# -- client mode --------------------------------------------------------------------------------------------

class ExpandTool:
    """The expand tool for a loop of one's own (docs/method.md §16, "Client mode").

    ``ExpandTool(session, budget)`` offers the tool in ``session`` (so renders of it carry handles); add
    :meth:`chat_tool` / :meth:`responses_tool` / :meth:`messages_tool` to the tools the model sees, and when it
    calls :data:`TOOL_NAME`, answer with :meth:`answer` (the tool result's text; an error is a text too, for the
    model to read) and append the call and the result to the history like any tool's. Each answer is recorded
    in the graph as reuse of the result it read back.

    Args:
        session: the graph session the renders come from.
        budget: B; an expansion fills at most ``share`` of it.
        share: the room an expansion may take, as a share of B (default :data:`DEFAULT_SHARE`).
    """

    name = TOOL_NAME

    def __init__(self, session: Session, budget: int, *, share: float = DEFAULT_SHARE) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must lie in (0, 1], got {share}")
        if budget <= 0:
            raise ValueError(f"budget must be positive, got {budget}")
        self.session = session
        self.budget = int(budget)
        self.share = float(share)
        offer(session)

    chat_tool = staticmethod(chat_tool)
    responses_tool = staticmethod(responses_tool)
    messages_tool = staticmethod(messages_tool)

    def answer(self, arguments: str | Mapping[str, Any] | None, *, at: int | None = None,
               max_tokens: int | None = None) -> tuple[str, bool]:
        """(the tool result's text, whether it is an error) for one call. ``at``: the seq of the assistant
        message holding the call (default: the latest message)."""
        room = int(self.budget * self.share) if max_tokens is None else int(max_tokens)
        try:
            got = expand(self.session, arguments, max_tokens=room)
        except ExpandError as e:
            return f"error: {e}", True
        record(self.session, got, len(self.session) - 1 if at is None else at)
        return got.text, False


__all__ = ["DEFAULT_SHARE", "TOOL_NAME", "ExpandError", "ExpandTool", "Expansion", "chat_tool", "dropped_line",
           "expand", "expansions", "gives_handles", "handle", "handles_in", "marked_results", "marker", "messages_tool",
           "offer", "offered", "origin", "record", "resolve", "responses_tool", "shortened_note", "withheld"]
