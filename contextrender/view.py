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
every such value visible in the render before it; docs/method.md).
:func:`render_html` turns that into one HTML file with everything inline —
data, styles, script; no network, no CDN.

    contextrender view SESSION --graph run.sqlite --budget 2000 --methods contextrender,prune --out view.html
    contextrender view traces.jsonl --episode TASK_ID --budget 2000 --out view.html
    GET /sessions/{sid}/view?budget=2000&methods=contextrender,prune      (the server and the proxy)
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from contextrender.embed import HashingEmbedder
from contextrender.events import Message
from contextrender.graph import ContextGraph, Session
from contextrender.readiness import NeedIndex, RenderedText
from contextrender.recall import reuse_events
from contextrender.render import Rendered, Scope, marker_text

#: State codes in :attr:`ViewData.states` (one character per result per invocation).
STATE_CODES = {"full": "F", "compacted": "C", "omitted": "O", "stub": "S", "tabular": "T", "not rendered": "N", "later": "-"}
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

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session, "budget": self.budget, "policies": list(self.policies),
                "messages": self.messages, "results": self.results, "edges": self.edges,
                "invocations": self.invocations, "states": self.states, "scores": self.scores,
                "tokens": self.tokens, "recall": self.recall,
                "readiness": self.readiness or {"calls": [], "missing": {p: [] for p in self.policies}},
                "state_codes": STATE_CODES}


def _state_of(session: Session, seq: int, rendered: Rendered, bodies: Mapping[int, str]) -> str:
    """A result's form in a render made by any policy (ContextRender's own forms are exact; see below)."""
    if seq in rendered.visible:
        return "full"
    if seq not in bodies:
        return "not rendered"
    body = bodies[seq]
    if body == marker_text(session, seq) or _PLACEHOLDERS.match(body.strip()):
        return "omitted"
    return "compacted"


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def view_data(messages: Sequence[Mapping[str, Any] | Message], policies: Mapping[str, Any], budget: int, *,
              session_id: str = "session") -> ViewData:
    """Replay ``messages`` through ``policies`` (name → policy) at ``budget``; see the module docstring.

    Args:
        messages: the full transcript (OpenAI-format dicts or :class:`Message`).
        policies: one or two policies by display name (built with the registry or directly).
        budget: B in tokens.
        session_id: the name shown on the page.

    Returns:
        The page's data.
    """
    parsed = [Message.from_openai(m, f"message {i}") for i, m in enumerate(messages)]
    graphs = {name: ContextGraph().session(f"view-{i}") for i, name in enumerate(policies)}
    ref = ContextGraph().session("view-ref")
    names = list(policies)
    states: dict[str, list[str]] = {n: [] for n in names}
    scores: dict[str, list[list[Any] | None]] = {n: [] for n in names}
    tokens: dict[str, list[int]] = {n: [] for n in names}
    invocations: list[dict[str, Any]] = []
    visible_before: dict[str, dict[int, frozenset[int]]] = {n: {} for n in names}
    result_seqs: list[int] = [i for i, m in enumerate(parsed) if m.role == "tool"]
    position = {s: k for k, s in enumerate(result_seqs)}
    needs = NeedIndex()  # the transcript before each assistant message: what its calls need
    need_calls: list[list[Any]] = []
    missing: dict[str, list[list[str]]] = {n: [] for n in names}

    def snapshot(j: int) -> None:
        """Render every policy on messages[:j] (the context before the assistant message at seq j)."""
        t = len(invocations)
        full = Scope.of(ref).full_tokens(ref)
        invocations.append({"t": t, "seq": j, "full_tokens": full, "over_budget": full > budget})
        for name, policy in policies.items():
            s = graphs[name]
            if callable(getattr(policy, "select", None)):
                sel = policy.select(s, budget)
                rendered = sel.rendered
                by_seq = {sc.seq: sc for sc in sel.scores}
            else:
                rendered, by_seq = policy.render(s, budget), {}
            bodies = {src: m.get("content") or "" for m, src in zip(rendered.messages, rendered.sources, strict=True)
                      if src is not None and src < len(parsed) and parsed[src].role == "tool"}
            codes = []
            row: list[Any] = []
            for seq in result_seqs:
                if seq >= j:
                    codes.append(STATE_CODES["later"])
                    row.append(None)
                    continue
                sc = by_seq.get(seq)
                if sc is not None:
                    form = "full" if seq in rendered.visible else ("not rendered" if sc.form == "not rendered"
                                                                   else sc.form)
                    row.append([sc.age, _round(sc.reuse_count), _round(sc.relevance), _round(sc.usefulness),
                                _round(sc.similarity), sc.pick, _REASONS.get(sc.reason, sc.reason)])
                else:
                    form = _state_of(s, seq, rendered, bodies)
                    row.append(None)
                codes.append(STATE_CODES.get(form, "C"))
            states[name].append("".join(codes))
            scores[name].append(row if by_seq else None)
            tokens[name].append(rendered.tokens)
            visible_before[name][t] = rendered.visible
            if j < len(parsed):
                shown: RenderedText | None = None
                for call in calls_at:
                    shown = shown or RenderedText.of(rendered.messages)
                    missing[name].append(list(shown.missing(call)))

    calls_at: list[Any] = []
    for j, msg in enumerate(parsed):
        if msg.role == "assistant":
            calls_at = [c for c in needs.needs(msg) if c.needs]
            need_calls.extend([j, c.call_id, c.name, [n.value for n in c.needs], [n.source for n in c.needs]]
                              for c in calls_at)
            snapshot(j)
        needs.add(msg)
        for s in (*graphs.values(), ref):
            s.add(msg)
    calls_at = []
    snapshot(len(parsed))  # the next invocation: what the policy would show now

    out_messages = []
    for i, m in enumerate(parsed):
        text = m.content
        out_messages.append({
            "seq": i, "role": m.role, "text": text, "chars": len(text), "tokens": ref.ntok(i),
            "invocation": ref.invocation_of(i), "tool_call_id": m.tool_call_id,
            "calls": [{"id": c.id, "name": c.name, "args": c.arguments} for c in m.tool_calls]})
    results = [{"seq": r.seq, "tool": r.tool_name, "call_id": r.call_id, "call_seq": r.call_seq,
                "invocation": r.invocation, "tokens": r.ntok, "index": position[r.seq]} for r in ref.results]
    edges = [{"source": e.source, "op": e.op_seq, "part": e.part, "value": e.value} for e in ref.reuse_edges()]
    events = reuse_events(list(parsed))
    hits = {n: [int(e.result_seq in visible_before[n].get(e.j, frozenset())) for e in events] for n in names}
    return ViewData(session_id, int(budget), tuple(names), out_messages, results, edges, invocations, states,
                    scores, tokens, {"events": [[e.j, e.result_seq, e.age] for e in events], "hits": hits},
                    {"calls": need_calls, "missing": missing})


def method_view(messages: Sequence[Mapping[str, Any] | Message], methods: Sequence[str], budget: int, *,
                session_id: str = "session", embedder: Any = None, compactor: Any = "extractive") -> ViewData:
    """The view of a transcript under registry methods, each a fresh policy replayed on its own graph copy.

    Args:
        messages: the transcript (a stored session's ``openai_messages()``, a trace episode's messages).
        methods: one or two registry method names.
        budget: B in tokens.
        session_id: the name shown on the page.
        embedder: the embedder the methods use (default: the hashing embedder, which needs nothing).
        compactor: a compactor or its name (``extractive`` offline).

    Returns:
        The page's data.
    """
    from contextrender.compaction import make_compactor
    from contextrender.registry import build_policy, method_config

    emb = embedder or HashingEmbedder()
    comp = make_compactor(compactor) if isinstance(compactor, str) else compactor
    policies = {m: build_policy(method_config(m), embedder=emb, compactor=comp) for m in methods}
    return view_data(messages, policies, budget, session_id=session_id)


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


__all__ = ["CHROMIUM_FLAGS", "STATE_CODES", "ViewData", "browser", "chromium", "method_view", "render_html",
           "view_data"]
