"""The Codex CLI (``codex exec``, the real one from npm) through the proxy's ``/v1/responses``, against the
scripted Responses API upstream on 127.0.0.1: a multi-step task in which the model runs shell commands.
Every request the upstream got must hold the history within B with calls and outputs paired, and Codex
must print the final answer.

The CLI is found through ``CONTEXTRENDER_CODEX_BIN`` or ``tests/clients/codex/node_modules/.bin/codex``
(install it there with ``npm ci --prefix tests/clients/codex``); without it the test skips and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from contextrender.graph import OMISSION_MARKER
from contextrender.service.proxy import create_proxy_app

from .conftest import serve
from .responses_upstream import (
    ScriptedResponsesUpstream,
    items_of,
    message_item,
    pairing_problems,
    request_history_tokens,
)

REPO = Path(__file__).resolve().parents[2]
CLIENT_DIR = REPO / "tests" / "clients" / "codex"
INSTALL = "npm ci --prefix tests/clients/codex"
B = 1500
STEPS = 6
SESSION = "codex-run"


def codex_bin() -> str:
    found = os.environ.get("CONTEXTRENDER_CODEX_BIN") or str(CLIENT_DIR / "node_modules" / ".bin" / "codex")
    if not Path(found).exists():
        pytest.skip(f"the Codex CLI is not installed (looked for {found}): run `{INSTALL}` or set "
                    "CONTEXTRENDER_CODEX_BIN")
    if shutil.which("node") is None:
        pytest.skip(f"the Codex CLI needs Node.js (node not on PATH) to start: install it, then `{INSTALL}`")
    return found


def _texts(body: dict[str, Any], role: str) -> list[str]:
    out = []
    for item in items_of(body):
        if item.get("role") == role:
            content = item.get("content")
            out.append(content if isinstance(content, str) else
                       "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict)))
    return out


def shell_call(body: dict[str, Any], n: int, command: str) -> dict[str, Any]:
    """A call of whichever shell tool this Codex offers (its tool set changes between versions)."""
    tools = {t.get("name"): t for t in body.get("tools") or [] if t.get("type") == "function"}
    if "exec_command" in tools:
        name, args = "exec_command", {"cmd": command}
    elif "shell_command" in tools:
        name, args = "shell_command", {"command": command}
    elif "shell" in tools:
        name, args = "shell", {"command": ["bash", "-lc", command]}
    else:
        raise AssertionError(f"Codex offered no shell tool the script knows: {sorted(tools)}")
    return {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
            "arguments": json.dumps(args), "status": "completed"}


def codex_script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Follow a chain of records by running ``echo`` in Codex's shell: each command prints a large result
    naming the next record (read from the latest output the render showed); after STEPS of them, answer."""
    outputs = [str(i.get("output")) for i in items_of(body) if i.get("type") == "function_call_output"]
    last = next((o for o in reversed(outputs) if "step=" in o and OMISSION_MARKER not in o), "")
    step = int(last.split("step=")[1].split()[0]) if last else 0
    record = last.split("next=")[1].split()[0] if last else "REC_start"
    if step >= STEPS:
        return [message_item(f"msg_{n}", f"Done: the chain ends at {record} after {step} steps.")]
    # a short command, a large output (the filler comes from the shell, not from the call)
    command = f"echo record {record} owner user_c_{step + 1} step={step + 1} next=REC_c_{step + 1}; " \
              "printf 'w%s ' $(seq 0 119)"
    return [{"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"ENC-{n}"},
            shell_call(body, n, command)]


def run_codex(binary: str, url: str, tmp_path: Path, prompt: str, provider_extra: str = "") -> Any:
    """``codex exec`` of ``prompt`` in a fresh work folder and home, its model provider the proxy at ``url`` (its
    ``/v1``) with ``provider_extra`` (TOML fields) added: only what Codex needs, no key of the caller's, no colour."""
    work, home = tmp_path / "work", tmp_path / "codex-home"
    work.mkdir()
    home.mkdir()
    provider = (f'{{name="contextrender", base_url="{url}/v1", wire_api="responses", env_key="CR_TEST_KEY"'
                f'{", " + provider_extra if provider_extra else ""}}}')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(CODEX_HOME=str(home), CR_TEST_KEY="sk-dummy-codex", NO_COLOR="1")
    return subprocess.run(
        [binary, "exec", "--skip-git-repo-check", "--ephemeral", "--ignore-user-config",
         "--dangerously-bypass-approvals-and-sandbox", "--color", "never", "-C", str(work), "-m", "fake-model",
         "-c", "model_provider=contextrender", "-c", f"model_providers.contextrender={provider}", prompt],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_codex_exec_multi_step_shell_task_through_the_proxy(service, tmp_path):
    binary = codex_bin()
    fake = ScriptedResponsesUpstream(codex_script)
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
        proc = run_codex(binary, url, tmp_path,
                         f"Follow the chain of records from REC_start with shell commands; steps={STEPS}.",
                         f'http_headers={{"X-ContextRender-Session"="{SESSION}"}}')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Done: the chain ends at REC_c_{STEPS} after {STEPS} steps." in proc.stdout
    assert len(fake.requests) == STEPS + 1, [o["path"] for o in fake.other]
    for rec in fake.requests:
        body = rec["body"]
        assert request_history_tokens(body) <= B
        assert pairing_problems(items_of(body)) == []
        assert rec["headers"]["authorization"] == "Bearer sk-dummy-codex"
        assert "x-contextrender-session" not in rec["headers"]
    last = fake.requests[-1]["body"]
    outputs = [i for i in last["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == STEPS and any(OMISSION_MARKER in str(o["output"]) for o in outputs)
    # Codex's encrypted reasoning went back upstream as Codex sent it, for the calls the render kept
    assert any(i.get("type") == "reasoning" and i.get("encrypted_content", "").startswith("ENC-")
               for i in last["input"])
    stored = list(service.transcript(SESSION).messages)
    assert sum(m["role"] == "assistant" for m in stored) == STEPS + 1
    assert stored[-1]["content"] == f"Done: the chain ends at REC_c_{STEPS} after {STEPS} steps."
    assert any("steps=6" in t for t in _texts(last, "user"))


def test_codex_gets_an_unreachable_upstream_named_promptly(service, tmp_path):
    """A closed upstream port: Codex reports the proxy's error — the upstream URL and the cause. Codex retries a 5xx
    itself whatever the answer's x-should-retry says (about 25 s with its default retries, measured here); with the
    provider's retries off, as docs/service.md shows, it reports at once."""
    import socket
    import time

    binary = codex_bin()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    try:
        with serve(create_proxy_app(f"http://127.0.0.1:{port}/v1", service=service, budget=B,
                                    connect_timeout=2)) as url:
            t0 = time.monotonic()
            proc = run_codex(binary, url, tmp_path, "say hi", "request_max_retries=0, stream_max_retries=0")
            took = time.monotonic() - t0
    finally:
        closed.close()
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"127.0.0.1:{port}/v1/responses" in said and "connection refused" in said, said[-3000:]
    assert took < 30, took
