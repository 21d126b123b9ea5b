"""Claude Code (the real CLI, non-interactive) through the proxy's Messages API, against a scripted upstream.

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


def chain_model(folder: Path) -> Any:
    """Claude Code's model for the task: read part_0.txt … part_{FILES-1}.txt with Bash, one per turn (each
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
        if turn >= FILES:
            last = body["messages"][-1]["content"]
            found = re.search(r"CODEWORD=(\w+)", _text(last))
            return [{"type": "text", "text": f"The code word is {found.group(1) if found else 'missing'}."}]
        return [{"type": "text", "text": f"Reading part {turn}."},
                {"type": "tool_use", "id": f"toolu_cc_{turn}", "name": "Bash",
                 "input": {"command": f"cat {folder / f'part_{turn}.txt'}", "description": f"Read part {turn}"}}]

    return model


def test_claude_code_multi_step_tool_task_under_budget(tmp_path):
    cli = claude_cli()
    work = tmp_path / "work"
    work.mkdir()
    for k in range(FILES):
        tail = "CODEWORD=PERSIMMON" if k == FILES - 1 else f"next: part_{k + 1}.txt"
        (work / f"part_{k}.txt").write_text(f"part {k} of the chain. {PAD} {PAD}\n{tail}\n")
    fake = ScriptedAnthropic(chain_model(work))
    graph = tmp_path / "cc.sqlite"
    service = ContextService(str(graph), embedder=HashingEmbedder(dim=256), default_budget=B)
    home = tmp_path / "home"
    home.mkdir()
    dummy_key = "sk-ant-dummy-0123456789"
    try:
        with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                   "CLAUDE_CONFIG_DIR": str(home / ".claude"), "ANTHROPIC_BASE_URL": url,
                   "ANTHROPIC_API_KEY": dummy_key, "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
                   "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
            proc = subprocess.run(
                [cli, "-p", "Follow the chain of files starting at part_0.txt in this folder and tell me the code "
                            "word. Use Bash.",
                 "--output-format", "json", "--allowedTools", "Bash", "--model", "claude-sonnet-4-5"],
                env=env, cwd=work, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        sessions = service.sessions()
        stored = service.transcript(sessions[0]).messages if sessions else ()
    finally:
        service.close()
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    out = json.loads(proc.stdout)
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
    assert dummy_key.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("cc.sqlite*"))
