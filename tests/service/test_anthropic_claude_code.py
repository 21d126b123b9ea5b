"""Claude Code (the real CLI, non-interactive) through the proxy's Messages API, against a scripted upstream.

What the CLI sends is recorded where the proxy receives it, and what the proxy forwards where the scripted
upstream receives it, so each request can be checked against the client's own (its cache breakpoints kept
valid: docs/service.md, "Cache breakpoints").

The CLI comes from ``CONTEXTRENDER_CLAUDE_CODE`` (a path to ``claude``) or the pinned local install:

    npm ci --prefix tests/clients/claude-code
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from contextrender import HashingEmbedder
from contextrender.graph import OMISSION_MARKER
from contextrender.service.proxy import create_proxy_app
from contextrender.service.sessions import ContextService

from .anthropic_breakpoints import (
    blocks,
    breakpoint_problems,
    canonical,
    located_breakpoints,
    shared_prefix_problems,
)
from .anthropic_upstream import PAD, ScriptedAnthropic, history_tokens, pairing_problems
from .conftest import serve

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "tests" / "clients" / "claude-code" / "node_modules" / ".bin" / "claude"
B = 1500
FILES = 4
_TURN = re.compile(r"^toolu_cc_(\d+)$")


def claude_cli() -> str:
    path = os.environ.get("CONTEXTRENDER_CLAUDE_CODE") or (str(LOCAL) if LOCAL.exists() else shutil.which("claude"))
    if not path or not os.access(path, os.X_OK):
        pytest.skip("Claude Code CLI not installed: npm ci --prefix tests/clients/claude-code "
                    "(or set CONTEXTRENDER_CLAUDE_CODE to a claude executable)")
    return path


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content)


def chain_model(folder: Path, files: int = FILES) -> Any:
    """Claude Code's model for the task: read part_0.txt … part_{files-1}.txt with Bash, one per turn (each
    names the next), then answer with the code word the last one holds. Requests without the Bash tool
    (the CLI's side requests, if any) get a short text."""
    def model(body: dict[str, Any]) -> list[dict[str, Any]]:
        if "Bash" not in [t.get("name") for t in body.get("tools") or []]:
            return [{"type": "text", "text": "ok"}]
        turn = 0
        for m in reversed(body["messages"]):
            if m["role"] == "assistant" and isinstance(m["content"], list):
                ids = [int(t.group(1)) + 1 for b in m["content"] if b.get("type") == "tool_use"
                       and (t := _TURN.match(b["id"]))]
                if ids:
                    turn = max(ids)
                    break
        if turn >= files:
            last = body["messages"][-1]["content"]
            found = re.search(r"CODEWORD=(\w+)", _text(last))
            return [{"type": "text", "text": f"The code word is {found.group(1) if found else 'missing'}."}]
        return [{"type": "text", "text": f"Reading part {turn}."},
                {"type": "tool_use", "id": f"toolu_cc_{turn}", "name": "Bash",
                 "input": {"command": f"cat {folder / f'part_{turn}.txt'}", "description": f"Read part {turn}"}}]

    return model


class ClientRequests:
    """The proxy's app, recording the body of each ``POST /v1/messages`` the client sent before the proxy
    reads it (an ASGI wrapper in the proxy's own server)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/messages":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recording() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self.bodies.append(json.loads(b"".join(chunks)))
            return message

        await self.app(scope, recording, send)


def chain_tail(k: int, files: int) -> str:
    """The last line of part ``k``: the next part's name, and in the last part the code word."""
    return "CODEWORD=PERSIMMON" if k == files - 1 else f"next: part_{k + 1}.txt"


def run_chain(tmp_path: Path, files: int, budget: int, *, model: Any = chain_model, tail: Any = chain_tail,
              method: str = "contextrender") -> dict[str, Any]:
    """Claude Code follows a chain of ``files`` files through the proxy at B = ``budget``: its answer, what it
    sent (``client``), what went upstream (``fake``), the sessions, the stored transcript and the expansions.
    ``model(folder, files)`` is the scripted model; ``tail(k, files)`` part k's last line."""
    cli = claude_cli()
    work = tmp_path / "work"
    work.mkdir()
    for k in range(files):
        (work / f"part_{k}.txt").write_text(f"part {k} of the chain. {PAD} {PAD}\n{tail(k, files)}\n")
    fake = ScriptedAnthropic(model(work, files))
    graph = tmp_path / "cc.sqlite"
    service = ContextService(str(graph), embedder=HashingEmbedder(dim=256), default_budget=budget)
    home = tmp_path / "home"
    home.mkdir()
    dummy_key = "sk-ant-dummy-0123456789"
    try:
        with serve(fake.app) as up:
            client = ClientRequests(create_proxy_app(f"{up}/v1", service=service, budget=budget, method=method))
            with serve(client) as url:
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                       "CLAUDE_CONFIG_DIR": str(home / ".claude"), "ANTHROPIC_BASE_URL": url,
                       "ANTHROPIC_API_KEY": dummy_key, "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
                       "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
                proc = subprocess.run(
                    [cli, "-p", "Follow the chain of files starting at part_0.txt in this folder and tell me the "
                                "code word. Use Bash.",
                     "--output-format", "json", "--allowedTools", "Bash", "--model", "claude-sonnet-4-5"],
                    env=env, cwd=work, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        sessions = service.sessions()
        stored = service.transcript(sessions[0]).messages if sessions else ()
        expansions = [e for sid in sessions for e in service.expansions(sid)]
    finally:
        service.close()
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert dummy_key.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("cc.sqlite*"))
    return {"out": json.loads(proc.stdout), "fake": fake, "client": client.bodies, "sessions": sessions,
            "stored": stored, "expansions": expansions, "stdout": proc.stdout}


def test_claude_code_multi_step_tool_task_under_budget(tmp_path):
    run = run_chain(tmp_path, FILES, B)
    out, fake, sessions, stored = run["out"], run["fake"], run["sessions"], run["stored"]
    assert out["is_error"] is False and out["result"] == "The code word is PERSIMMON."
    main = [r for r in fake.messages_requests() if any(t.get("name") == "Bash" for t in r["body"].get("tools") or [])]
    assert len(main) == FILES + 1
    for rec in fake.messages_requests():
        assert history_tokens(rec["body"]) <= B
        assert pairing_problems(rec["body"]["messages"]) == []
        assert rec["query"].get("beta") == "true"  # the CLI's beta route, passed on
    # the full chain was above B: the proxy omitted earlier file contents, and the model still finished
    assert any(OMISSION_MARKER in json.dumps(r["body"]["messages"]) for r in main)
    # one session: the CLI's re-sent answers matched what the proxy recorded, final answer included
    assert len([s for s in sessions if "~" not in s]) >= 1 and not any("~" in s for s in sessions)
    assert any(m["role"] == "assistant" and m["content"] == out["result"] for m in stored)


Pair = tuple[dict[str, Any], dict[str, Any]]  # (what the client sent, what went upstream)


def _pairs(client: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> list[Pair]:
    """Each forwarded request with the client's request it rendered: the CLI's requests go one after the other
    (``claude -p``), so in order; each ends with the client's latest message (its results maybe omitted)."""
    assert len(client) == len(forwarded)
    for mine, fwd in zip(client, forwarded, strict=True):
        ids = [[b.get("id") or b.get("tool_use_id") or b.get("text") for b in blocks(m["messages"][-1])]
               for m in (mine, fwd)]
        assert ids[0] == ids[1]
    return list(zip(client, forwarded, strict=True))


@pytest.mark.parametrize("budget, files", [(B, 6), (300, 6)])
def test_claude_code_cache_breakpoints_and_prefix_kept_under_budget(tmp_path, budget, files):
    """Below its history's size the render omits results (and at 300 drops whole old turns too). Every request
    that went upstream keeps the CLI's breakpoints valid — at most 4, each on a block present, the system's as
    sent, none moved or added but where the rule says — and every block is the client's own; consecutive
    requests share their prefix, key order and the breakpoints the CLI moves along aside, up to the first
    block the render changed in either, and an omitted result reads the same at every request."""
    run = run_chain(tmp_path, files, budget)
    assert run["out"]["result"] == "The code word is PERSIMMON."
    pairs = _pairs(run["client"], [r["body"] for r in run["fake"].messages_requests()])
    assert len(pairs) == len(run["client"]) >= files + 1
    stand_ins: dict[str, set[str]] = {}
    for mine, fwd in pairs:
        assert breakpoint_problems(mine, fwd) == []
        assert len(located_breakpoints(fwd)) <= 4 and history_tokens(fwd) <= budget
        sent = {b["tool_use_id"]: b for m in mine["messages"] for b in blocks(m)
                if isinstance(b, dict) and b.get("type") == "tool_result"}
        for m in fwd["messages"]:
            for b in blocks(m):
                if isinstance(b, dict) and b.get("type") == "tool_result" and b != sent[b["tool_use_id"]]:
                    stand_ins.setdefault(b["tool_use_id"], set()).add(b["content"])
    # what stands for a result not shown in full: the marker, or the method's compaction of it, the same text
    # at every request
    assert stand_ins and all(len(texts - {OMISSION_MARKER}) <= 1 for texts in stand_ins.values()), stand_ins
    main = [p for p in pairs if any(t.get("name") == "Bash" for t in p[0].get("tools") or [])]
    for earlier, later in zip(main, main[1:], strict=False):
        assert shared_prefix_problems(earlier, later) == []
    # the render changed what an earlier request had sent: a result shown as sent, then not (at B); whole old
    # turns left out (below: no result fits there, each is compacted or omitted from the start)
    def as_sent(pair: Pair) -> set[str]:
        mine = {canonical(b) for m in pair[0]["messages"] for b in blocks(m)}
        return {b["tool_use_id"] for m in pair[1]["messages"] for b in blocks(m)
                if isinstance(b, dict) and b.get("type") == "tool_result" and canonical(b) in mine}

    if budget == B:
        assert any(as_sent(main[k]) - as_sent(main[k + 1]) for k in range(len(main) - 1))
    else:
        assert any(len(f["messages"]) < len(c["messages"]) for c, f in main)
    # what the pinned CLI does (docs/service.md, "Cache breakpoints"): breakpoints on system blocks and one on
    # the newest message, which the render always keeps; so each stayed where the CLI put it (rule 1)
    for mine, fwd in main:
        last, now = len(mine["messages"]) - 1, len(fwd["messages"]) - 1
        places = [p for p, _ in located_breakpoints(mine)]
        assert all(p.startswith("system.") for p in places[:-1]) and places[-1].startswith(f"messages.{last}.")
        assert located_breakpoints(fwd) == [(p.replace(f"messages.{last}.", f"messages.{now}."), cc)
                                            for p, cc in located_breakpoints(mine)]


def test_claude_code_gets_an_unreachable_upstream_named_promptly(tmp_path):
    """A closed upstream port: Claude Code prints the proxy's error — the upstream URL and the cause — at once
    (x-should-retry: false for a refused connection) instead of backing off in silence."""
    import socket
    import time

    cli = claude_cli()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    service = ContextService(str(tmp_path / "cc.sqlite"), embedder=HashingEmbedder(dim=256), default_budget=2000)
    home = tmp_path / "home"
    home.mkdir()
    try:
        with serve(create_proxy_app(f"http://127.0.0.1:{port}/v1", service=service, budget=2000,
                                    connect_timeout=2)) as url:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                   "CLAUDE_CONFIG_DIR": str(home / ".claude"), "ANTHROPIC_BASE_URL": url,
                   "ANTHROPIC_API_KEY": "sk-ant-dummy-0123456789", "DISABLE_AUTOUPDATER": "1",
                   "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
            t0 = time.monotonic()
            proc = subprocess.run([cli, "-p", "say hi", "--output-format", "json", "--model", "claude-sonnet-4-5"],
                                  env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                                  stdin=subprocess.DEVNULL)
            took = time.monotonic() - t0
    finally:
        closed.close()
        service.close()
    out = json.loads(proc.stdout)
    assert proc.returncode != 0 and out["is_error"] and out["api_error_status"] == 502
    assert f"127.0.0.1:{port}/v1/messages unreachable: connection refused" in out["result"]
    assert took < 30, took
