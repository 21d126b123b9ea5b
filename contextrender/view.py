"""See the dependency graph: one self-contained HTML page of a session (Figure 2 of the paper, for your run).

:func:`view_data` replays a transcript invocation by invocation through one or
two policies at a budget B — exactly as the agent would have seen it: the
policy renders before every assistant message from the messages before it —
and collects, for every invocation, each tool result's state (full,
compacted, omitted, stub, not rendered) with the scores behind it for the
ContextRender family (age a_t, reuse c_t, relevance s_t, usefulness U_t, the
similarity penalty D(r,S), the greedy pick, the reason). It adds the
transcript, the Tool-Flow Analysis reuse edges (docs/method.md §3: each use linked back
to the result it came from, labelled with the value) and the Later-Used
Result Recall events of docs/method.md §7 with, per policy, whether each was hit, and the tool calls that
needed a value only earlier tool results held, with, per policy, whether each was ready (call readiness:
every such value visible in the render before it; docs/method.md). For a stored session it adds the model
requests the proxy or ``wrap`` recorded, as the upstream billed them: the session's totals and each drawn
invocation's own figures (prompt, read from the prompt cache, written to it; docs/service.md).
:func:`render_html` turns that into one HTML file with everything inline —
data, styles, script; no network, no CDN.

A view draws a window of invocations (:class:`ViewWindow`; by default the
latest :data:`DEFAULT_VIEW_INVOCATIONS`), so its work and its page grow with
the window, not with the session: the messages before the window are fed to
the policies' graphs in one batch and never rendered, and the page holds the
messages from the turn before the window to its end plus the earlier tool
results some render in the window shows. The service and the CLI refuse a
window over :data:`MAX_VIEW_INVOCATIONS` and a page over :data:`MAX_VIEW_BYTES`.

    contextrender view SESSION --graph run.sqlite --budget 2000 --methods contextrender,prune --out view.html
    contextrender view traces.jsonl --episode TASK_ID --budget 2000 --last 20 --out view.html
    GET /sessions/{sid}/view?budget=2000&methods=contextrender,prune&from=100&to=140   (the server and the proxy)
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from contextrender.embed import HashingEmbedder
from contextrender.events import Message
from contextrender.graph import ContextGraph, RequestUsage, Session, UsageTotals
from contextrender.readiness import NeedIndex, RenderedText
from contextrender.recall import reuse_events
from contextrender.render import Rendered, Scope, marker_text

#: State codes in :attr:`ViewData.states` (one character per result per invocation).
STATE_CODES = {"full": "F", "ids": "I", "tabular": "T", "compacted": "C", "omitted": "O", "stub": "S",
               "not rendered": "N", "later": "-"}
#: Placeholders the peer policies write for a result they hide (contextrender.baselines.peers).
_PLACEHOLDERS = re.compile(r"^(<MASKED>|\(Tool result removed\)|\[cleared\]|\[Old tool result content cleared\]|"
                           r"Old environment output: \(\d+ lines omitted\)|\[omitted\])$")
#: Reason codes: the ResultScore reason of a ContextRender-family render, compressed for the page.
_REASONS = {"picked": "p", "not a candidate": "n", "did not fit": "f"}


@dataclass(frozen=True)
class ViewData:
    """Everything the page draws, JSON-ready (:meth:`to_json`)."""

    session: str
    budget: int
    policies: tuple[str, ...]
    messages: list[dict[str, Any]]
    results: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    invocations: list[dict[str, Any]]
    states: dict[str, list[str]]  # policy -> per invocation: one state code per result (results order)
    scores: dict[str, list[list[Any] | None]]  # policy -> per invocation: per result [age, c, s, U, D, pick, reason]
    tokens: dict[str, list[int]]  # policy -> per invocation: Tok(H_t) rendered
    recall: dict[str, Any]  # {"events": [[j, result_seq, age]], "hits": {policy: [0/1 per event]}}
    #: {"calls": [[assistant seq, call id, tool, [needed values], [their source seqs]]],
    #:  "missing": {policy: [[values the render before it hid] per needing call]}}
    readiness: dict[str, Any] | None = None
    #: {"from", "to": the invocations drawn, "invocations": how many the session has, "messages": its length,
    #:  "first_seq": the first message drawn, "earlier_results": results before it drawn since a render shows them}
    window: dict[str, Any] | None = None
    #: A stored session's model requests as the upstream billed them (docs/service.md, "Prompt-cache usage"):
    #: {"totals": UsageTotals.to_json(), "by_invocation": {t: [[n, api, prompt, cache_read, cache_write, output]]}}
    #: (the counts null when a request's answer carried no usage); None for a transcript without them
    cache: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session, "budget": self.budget, "policies": list(self.policies),
                "messages": self.messages, "results": self.results, "edges": self.edges,
                "invocations": self.invocations, "states": self.states, "scores": self.scores,
                "tokens": self.tokens, "recall": self.recall,
                "readiness": self.readiness or {"calls": [], "missing": {p: [] for p in self.policies}},
                "window": self.window, "state_codes": STATE_CODES, "cache": self.cache}


#: Invocations a view draws when the caller names none: the latest ones. Each drawn invocation costs one
#: render per policy on the history before it, so the view's work grows with the window, not the session.
DEFAULT_VIEW_INVOCATIONS = 30
#: Most invocations one view of the service or the CLI draws (a library caller may ask for more).
MAX_VIEW_INVOCATIONS = 200
#: Largest page (bytes of HTML) the service answers with and the CLI writes.
MAX_VIEW_BYTES = 32 * 1024 * 1024


class ViewLimitError(ValueError):
    """The window asked for is outside the session or a limit; the message names it and how to narrow it.

    ``too_large``: the page would exceed :data:`MAX_VIEW_BYTES` (the service answers 413; else 422).
    """

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


@dataclass(frozen=True)
class ViewWindow:
    """Which invocations a view draws: ``start``..``end`` (absolute t, both inclusive), or the ``last`` N.

    With neither, the latest :data:`DEFAULT_VIEW_INVOCATIONS` (all of a shorter session); ``end`` alone
    draws that many up to it, ``start`` alone from it to the latest invocation.
    """

    start: int | None = None
    end: int | None = None
    last: int | None = None

    @classmethod
    def everything(cls) -> ViewWindow:
        """Every invocation (for library callers and small sessions; no limit applies unless one is given)."""
        return cls(start=0)

    def resolve(self, total: int, limit: int | None = None) -> tuple[int, int]:
        """``(t0, t1)`` of invocations ``0..total-1``; :class:`ViewLimitError` outside them or over ``limit``."""
        for name, value, least in (("from", self.start, 0), ("to", self.end, 0), ("last", self.last, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ViewLimitError(f"'{name}' must be an integer ≥ {least}, got {value!r}")
        if self.last is not None and (self.start is not None or self.end is not None):
            raise ViewLimitError("give either 'last' or 'from'/'to', not both")
        top = total - 1
        if self.start is not None and self.start > top:
            raise ViewLimitError(f"'from' is {self.start}, but the session's invocations are 0..{top}")
        t1 = top if self.end is None else min(self.end, top)
        if self.last is not None:
            t0 = max(0, top - self.last + 1)
        elif self.start is None:
            t0 = max(0, t1 - DEFAULT_VIEW_INVOCATIONS + 1)
        else:
            t0 = self.start
        if t0 > t1:
            raise ViewLimitError(f"'from' ({t0}) is after 'to' ({t1})")
        if limit is not None and t1 - t0 + 1 > limit:
            raise ViewLimitError(f"a view draws at most {limit} invocations; this one asks for {t1 - t0 + 1} "
                                 f"({t0}..{t1} of 0..{top}): narrow it with from/to or last")
        return t0, t1


def _state_of(session: Session, seq: int, visible: frozenset[int], bodies: Mapping[int, str]) -> str:
    """A result's form in a render made by any policy (ContextRender's own forms are exact; see below)."""
    if seq in visible:
        return "full"
    if seq not in bodies:
        return "not rendered"
    body = bodies[seq]
    if body == marker_text(session, seq) or _PLACEHOLDERS.match(body.strip()):
        return "omitted"
    return "compacted"


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


@dataclass(frozen=True)
class _Frame:
    """One policy's render before one invocation, as much of it as the page can draw."""

    visible: frozenset[int]
    bodies: dict[int, str]  # result seq -> the body its tool message got in the render
    scores: dict[int, Any] | None  # result seq -> ResultScore (ContextRender family), None for other policies
    tokens: int

    def code(self, session: Session, seq: int, j: int) -> str:
        """The state code of result ``seq`` in this render, made before the message at ``j``."""
        if seq >= j:
            return STATE_CODES["later"]
        sc = self.scores.get(seq) if self.scores else None
        if sc is not None:
            form = "full" if seq in self.visible else sc.form
        else:
            form = _state_of(session, seq, self.visible, self.bodies)
        return STATE_CODES.get(form, "C")

    def row(self, seq: int, j: int) -> list[Any] | None:
        sc = self.scores.get(seq) if self.scores and seq < j else None
        if sc is None:
            return None
        return [sc.age, _round(sc.reuse_count), _round(sc.relevance), _round(sc.usefulness), _round(sc.similarity),
                sc.pick, _REASONS.get(sc.reason, sc.reason)]


def _frame(policy: Any, session: Session, budget: int, parsed: Sequence[Message], lo: int) -> tuple[_Frame, Rendered]:
    """Render ``session`` with ``policy``; keep the scores of results the page may draw (from ``lo`` on, or
    shown by this render): every score of every render would make the page grow with the session."""
    if callable(getattr(policy, "select", None)):
        sel = policy.select(session, budget)
        rendered, all_scores = sel.rendered, sel.scores
    else:
        rendered, all_scores = policy.render(session, budget), None
    bodies = {src: m.get("content") or "" for m, src in zip(rendered.messages, rendered.sources, strict=True)
              if src is not None and src < len(parsed) and parsed[src].role == "tool"}
    scores = None
    if all_scores:
        scores = {sc.seq: sc for sc in all_scores if sc.seq >= lo or sc.seq in bodies or sc.seq in rendered.visible}
    return _Frame(rendered.visible, bodies, scores, rendered.tokens), rendered


class _Replay:
    """The transcript fed once, in order, to one fresh graph per policy and to the call-need index.

    Messages before the window go in as one batch (nothing is rendered for them); inside it, each
    policy renders before every assistant message from the messages before it — exactly what the
    agent would have been shown.
    """

    def __init__(self, parsed: Sequence[Message], policies: Mapping[str, Any], budget: int) -> None:
        self.parsed, self.policies, self.budget = parsed, policies, budget
        self.sessions = {name: ContextGraph().session(f"view-{i}") for i, name in enumerate(policies)}
        self.ref = next(iter(self.sessions.values()))  # messages only: every session holds the same ones
        self.needs = NeedIndex()
        self.frames: dict[str, list[_Frame]] = {n: [] for n in policies}
        self.invocations: list[dict[str, Any]] = []
        self.need_calls: list[list[Any]] = []
        self.missing: dict[str, list[list[str]]] = {n: [] for n in policies}

    def add_upto(self, j: int) -> None:
        """Add the messages before ``j`` that are not in yet (one transaction per graph)."""
        todo = self.parsed[len(self.ref):j]
        if todo:
            for s in self.sessions.values():
                s.extend(todo)
            self.needs.extend(todo)

    def snapshot(self, t: int, j: int, lo: int) -> None:
        """Render every policy on messages[:j] (the context before the assistant message at seq j)."""
        self.add_upto(j)
        full = Scope.of(self.ref).full_tokens(self.ref)
        self.invocations.append({"t": t, "seq": j, "full_tokens": full, "over_budget": full > self.budget})
        calls = [c for c in self.needs.needs(self.parsed[j]) if c.needs] if j < len(self.parsed) else []
        self.need_calls.extend([j, c.call_id, c.name, [n.value for n in c.needs], [n.source for n in c.needs]]
                               for c in calls)
        for name, policy in self.policies.items():
            frame, rendered = _frame(policy, self.sessions[name], self.budget, self.parsed, lo)
            self.frames[name].append(frame)
            if calls:
                shown = RenderedText.of(rendered.messages)
                self.missing[name].extend(list(shown.missing(c)) for c in calls)


class UsageSource(Protocol):
    """Where a view reads a stored session's billed requests (a :class:`~contextrender.graph.Session` is one)."""

    def prompt_usage_totals(self) -> UsageTotals: ...

    def prompt_usage_rows(self, *, last: int | None = None, at_from: int | None = None,
                          at_to: int | None = None) -> list[RequestUsage]: ...


def _cache(usage: UsageSource, snaps: Sequence[int], t0: int, t1: int) -> dict[str, Any]:
    """The page's prompt-cache data: the session's totals, and the requests that answered the drawn invocations
    (a request answered invocation t when its answer goes to the seq of t's assistant message; read for the window
    only)."""
    at_inv = {snaps[t]: t for t in range(t0, t1 + 1)}
    by_inv: dict[str, list[list[Any]]] = {}
    for r in usage.prompt_usage_rows(at_from=snaps[t0], at_to=snaps[t1]):
        if r.at in at_inv:
            u = r.usage
            figures = [None] * 4 if u is None else [u.prompt, u.cache_read, u.cache_write, u.output]
            by_inv.setdefault(str(at_inv[r.at]), []).append([r.n, r.api, *figures])
    return {"totals": usage.prompt_usage_totals().to_json(), "by_invocation": by_inv}


def view_data(messages: Sequence[Mapping[str, Any] | Message], policies: Mapping[str, Any], budget: int, *,
              session_id: str = "session", window: ViewWindow | None = None, max_invocations: int | None = None,
              max_bytes: int | None = None, usage: UsageSource | None = None) -> ViewData:
    """Replay ``messages`` through ``policies`` (name → policy) at ``budget``; see the module docstring.

    Args:
        messages: the full transcript (OpenAI-format dicts or :class:`Message`).
        policies: one or two policies by display name (built with the registry or directly).
        budget: B in tokens.
        session_id: the name shown on the page.
        window: the invocations to draw (default: the latest :data:`DEFAULT_VIEW_INVOCATIONS`).
        max_invocations: refuse a window of more invocations (:class:`ViewLimitError`).
        max_bytes: refuse, before replaying anything, a window whose messages alone hold more characters.
        usage: the stored session the transcript is, for its billed requests (:attr:`ViewData.cache`).

    Returns:
        The page's data: the window's invocations, the messages from the turn before it to its end, and
        the earlier tool results that a render in the window shows (the rest of the past is left out).
    """
    parsed = [Message.from_openai(m, f"message {i}") for i, m in enumerate(messages)]
    snaps = [i for i, m in enumerate(parsed) if m.role == "assistant"] + [len(parsed)]
    t0, t1 = (window or ViewWindow()).resolve(len(snaps), max_invocations)
    lo = snaps[t0 - 1] if t0 > 0 else 0
    hi = min(snaps[t1], len(parsed) - 1)
    chars = sum(len(parsed[i].content) for i in range(lo, hi + 1))
    if max_bytes is not None and chars > max_bytes:
        raise ViewLimitError(f"invocations {t0}..{t1} span messages holding {chars} characters, over the "
                             f"view's {max_bytes}-byte limit: narrow the window with from/to or last",
                             too_large=True)
    replay = _Replay(parsed, policies, budget)
    for t in range(t0, t1 + 1):
        replay.snapshot(t, snaps[t], lo)
    replay.add_upto(hi + 1)
    page = _page(replay, session_id, (t0, t1, len(snaps)), lo, hi)
    return page if usage is None else replace(page, cache=_cache(usage, snaps, t0, t1))


def _shown_before(replay: _Replay, lo: int) -> set[int]:
    """Results before ``lo`` that some render of the window shows (in full or in another form)."""
    out: set[int] = set()
    for frames in replay.frames.values():
        for frame, inv in zip(frames, replay.invocations, strict=True):
            for seq in {*frame.visible, *frame.bodies}:
                if seq < lo and seq not in out and frame.code(replay.ref, seq, inv["seq"]) not in "ON-":
                    out.add(seq)
    return out


def _page(replay: _Replay, session_id: str, span: tuple[int, int, int], lo: int, hi: int) -> ViewData:
    """The page's data of a finished replay: the messages ``lo..hi`` and the earlier results shown."""
    t0, t1, total = span
    ref, parsed, names = replay.ref, replay.parsed, list(replay.policies)
    earlier = _shown_before(replay, lo)
    seqs = sorted(earlier | set(range(lo, hi + 1)))
    result_seqs = [s for s in seqs if parsed[s].role == "tool"]
    position = {s: k for k, s in enumerate(result_seqs)}
    js = [inv["seq"] for inv in replay.invocations]
    states = {n: ["".join(f.code(ref, s, j) for s in result_seqs) for f, j in zip(fs, js, strict=True)]
              for n, fs in replay.frames.items()}
    scores = {n: [[f.row(s, j) for s in result_seqs] if f.scores else None for f, j in zip(fs, js, strict=True)]
              for n, fs in replay.frames.items()}
    out_messages = [{"seq": i, "role": parsed[i].role, "text": parsed[i].content, "chars": len(parsed[i].content),
                     "tokens": ref.ntok(i), "invocation": ref.invocation_of(i), "tool_call_id": parsed[i].tool_call_id,
                     "calls": [{"id": c.id, "name": c.name, "args": c.arguments} for c in parsed[i].tool_calls]}
                    for i in seqs]
    results = [{"seq": r.seq, "tool": r.tool_name, "call_id": r.call_id, "call_seq": r.call_seq,
                "invocation": r.invocation, "tokens": r.ntok, "index": position[r.seq]}
               for r in (ref.result(s) for s in result_seqs)]
    kept = set(seqs)
    edges = [{"source": e.source, "op": e.op_seq, "part": e.part, "value": e.value} for e in ref.reuse_edges()
             if e.source in kept and e.op_seq in kept]
    events = [e for e in reuse_events(parsed[:hi + 1]) if t0 <= e.j <= t1 and e.result_seq in position]
    hits = {n: [int(e.result_seq in replay.frames[n][e.j - t0].visible) for e in events] for n in names}
    window = {"from": t0, "to": t1, "invocations": total, "messages": len(parsed), "first_seq": lo,
              "earlier_results": len(earlier)}
    return ViewData(session_id, int(replay.budget), tuple(names), out_messages, results, edges, replay.invocations,
                    states, scores, {n: [f.tokens for f in fs] for n, fs in replay.frames.items()},
                    {"events": [[e.j, e.result_seq, e.age] for e in events], "hits": hits},
                    {"calls": replay.need_calls, "missing": replay.missing}, window)


def method_view(messages: Sequence[Mapping[str, Any] | Message], methods: Sequence[str], budget: int, *,
                session_id: str = "session", embedder: Any = None, compactor: Any = "extractive",
                window: ViewWindow | None = None, max_invocations: int | None = None,
                max_bytes: int | None = None, usage: UsageSource | None = None) -> ViewData:
    """The view of a transcript under registry methods, each a fresh policy replayed on its own graph copy.

    Args:
        messages: the transcript (a stored session's ``openai_messages()``, a trace episode's messages).
        methods: one or two registry method names.
        budget: B in tokens.
        session_id: the name shown on the page.
        embedder: the embedder the methods use (default: the hashing embedder, which needs nothing).
        compactor: a compactor or its name (``extractive`` offline).
        window, max_invocations, max_bytes, usage: as :func:`view_data` takes them.

    Returns:
        The page's data.
    """
    from contextrender.compaction import make_compactor
    from contextrender.registry import build_policy, method_config

    emb = embedder or HashingEmbedder()
    comp = make_compactor(compactor) if isinstance(compactor, str) else compactor
    policies = {m: build_policy(method_config(m), embedder=emb, compactor=comp) for m in methods}
    return view_data(messages, policies, budget, session_id=session_id, window=window,
                     max_invocations=max_invocations, max_bytes=max_bytes, usage=usage)


def render_html(data: ViewData, *, title: str | None = None) -> str:
    """One self-contained HTML page (inline data, styles and script; nothing fetched)."""
    assets = resources.files("contextrender") / "view_assets"
    css = (assets / "view.css").read_text(encoding="utf-8")
    js = (assets / "view.js").read_text(encoding="utf-8")
    # </script> inside the data cannot end the data block: JSON escapes of '<', '>' and '&'.
    blob = json.dumps(data.to_json(), ensure_ascii=False, separators=(",", ":"))
    blob = blob.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    heading = html.escape(title or f"ContextRender view — {data.session} at B = {data.budget}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            f"script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{heading}</title><style>{css}</style></head>\n<body>\n"
            f"<header><h1>{heading}</h1><div id=\"controls\"></div></header>\n"
            f"<main><section id=\"timeline\"></section><aside id=\"details\"><p class=\"hint\">Click a tool "
            f"result for its scores at the selected invocation.</p></aside></main>\n"
            f"<script type=\"application/json\" id=\"cr-data\">{blob}</script>\n"
            f"<script>{js}</script>\n</body></html>\n")


#: Headless Chromium without any network use (the page fetches nothing; this keeps Chromium itself quiet).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium() -> str | None:
    """The Chromium binary (Debian's ``chromium`` package), or None."""
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def browser(page: str | Path, *, fragment: str = "", dump_dom: bool = False, screenshot: str | Path | None = None,
            size: tuple[int, int] = (1400, 760), timeout: float = 120.0) -> str:
    """Open ``page`` in headless Chromium with JavaScript on; return the DOM after the scripts ran
    (``dump_dom``) or write a PNG (``screenshot``).

    Raises:
        FileNotFoundError: Chromium is not installed (``apt-get install chromium``).
    """
    import subprocess
    import tempfile

    exe = chromium()
    if exe is None:
        raise FileNotFoundError("Chromium is not installed (Debian: apt-get install -y chromium)")
    url = Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else "")
    with tempfile.TemporaryDirectory(prefix="cr-chromium-") as profile:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000",
               f"--window-size={size[0]},{size[1]}"]
        if screenshot is not None:
            cmd.append(f"--screenshot={Path(screenshot).resolve()}")
        if dump_dom:
            cmd.append("--dump-dom")
        proc = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr[-500:]}")
    return proc.stdout


__all__ = ["CHROMIUM_FLAGS", "DEFAULT_VIEW_INVOCATIONS", "MAX_VIEW_BYTES", "MAX_VIEW_INVOCATIONS", "STATE_CODES",
           "UsageSource", "ViewData", "ViewLimitError", "ViewWindow", "browser", "chromium", "method_view", "render_html",
           "view_data"]
