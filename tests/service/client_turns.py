"""Two turns of a real agent CLI (Codex, Claude Code) through the proxy against a scripted upstream on 127.0.0.1,
with a long typed task: what each CLI sent (recorded where the proxy receives it) and what went upstream.

Each turn the scripted model runs one shell command (a file of the work folder) and then answers, so the
second turn's requests hold the CLI's own wrapped blocks (Codex's ``<environment_context>`` and AGENTS.md
message, Claude Code's ``<system-reminder>`` blocks and CLAUDE.md), the typed task, the first turn's calls and
answers, and the follow-up.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from contextrender import HashingEmbedder
from contextrender.service.proxy import create_proxy_app
from contextrender.service.sessions import ContextService

from .anthropic_upstream import PAD, ScriptedAnthropic
from .conftest import serve
from .responses_upstream import ScriptedResponsesUpstream, items_of, message_item

#: The typed task's first sentence: every render must show it (docs/method.md §5, "The task").
TASK_HEAD = "Task T-417: read part_0.txt in this folder and report the code word it holds."
#: A long task as a user types or pastes it (about 600 tokens).
TASK = TASK_HEAD + "\n\n" + "\n".join(
    f"Requirement {i}: the report keeps section {i} in the order given, quotes figure {i} verbatim and "
    f"names the file it came from." for i in range(1, 21))
FOLLOW_UP = "Now tell me again which file held the code word."
#: The project's AGENTS.md / CLAUDE.md (about 1,000 tokens), which each CLI wraps into the first user message.
RULES = "# Project rules\n\n" + "\n".join(
    f"- Rule {i}: before answering, run check {i} of the test suite and report its outcome in one line."
    for i in range(1, 46)) + "\n"


class Recording:
    """An ASGI wrapper recording the JSON body of each POST to ``path`` before the wrapped app reads it."""

    def __init__(self, app: Any, path: str) -> None:
        self.app, self.path = app, path
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
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


def _work(tmp_path: Path, rules_file: str) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / rules_file).write_text(RULES)
    (work / "part_0.txt").write_text(f"part 0. {PAD}\nCODEWORD=PERSIMMON\n")
    return work


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    return proc


# -- Codex ------------------------------------------------------------------------------------------------


def _codex_model(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """One shell command per turn (``cat part_0.txt``), then an answer."""
    items = items_of(body)
    last_user = max((k for k, i in enumerate(items) if i.get("role") == "user"), default=-1)
    if any(i.get("type") == "function_call_output" for i in items[last_user + 1:]):
        return [message_item(f"msg_{n}", "The code word is PERSIMMON, in part_0.txt.")]
    tools = {t.get("name") for t in body.get("tools") or [] if t.get("type") == "function"}
    name, args = (("exec_command", {"cmd": "cat part_0.txt"}) if "exec_command" in tools
                  else ("shell", {"command": ["bash", "-lc", "cat part_0.txt"]}))
    return [{"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
             "arguments": json.dumps(args), "status": "completed"}]


def codex_two_turns(codex: str, tmp_path: Path, budget: int, method: str = "contextrender") -> dict[str, Any]:
    """``codex exec`` with :data:`TASK`, then ``codex exec resume --last`` with :data:`FOLLOW_UP`."""
    work, home = _work(tmp_path, "AGENTS.md"), tmp_path / "codex-home"
    home.mkdir()
    fake = ScriptedResponsesUpstream(_codex_model)
    service = ContextService(str(tmp_path / "codex.sqlite"), embedder=HashingEmbedder(dim=256), default_budget=budget)
    try:
        with serve(fake.app) as up:
            client = Recording(create_proxy_app(f"{up}/v1", service=service, budget=budget, method=method),
                               "/v1/responses")
            with serve(client) as url:
                provider = (f'{{name="contextrender", base_url="{url}/v1", wire_api="responses", '
                            f'env_key="CR_TEST_KEY"}}')
                env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
                env.update(CODEX_HOME=str(home), CR_TEST_KEY="sk-dummy-codex", NO_COLOR="1")
                common = ["--skip-git-repo-check", "--ignore-user-config", "--dangerously-bypass-approvals-and-sandbox",
                          "-m", "fake-model", "-c", "model_provider=contextrender",
                          "-c", f"model_providers.contextrender={provider}"]
                _run([codex, "exec", *common, "--color", "never", "-C", str(work), TASK], env, work)
                _run([codex, "exec", "resume", "--last", *common, FOLLOW_UP], env, work)
    finally:
        service.close()
    return {"client": client.bodies, "upstream": [r["body"] for r in fake.requests], "root": str(tmp_path)}


# -- Claude Code ------------------------------------------------------------------------------------------


def _claude_model(body: dict[str, Any]) -> list[dict[str, Any]]:
    """One Bash command per turn (``cat part_0.txt``), then an answer; side requests without Bash get "ok"."""
    if "Bash" not in [t.get("name") for t in body.get("tools") or []]:
        return [{"type": "text", "text": "ok"}]
    last = body["messages"][-1]["content"]
    if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
        return [{"type": "text", "text": "The code word is PERSIMMON, in part_0.txt."}]
    n = sum(m["role"] == "assistant" for m in body["messages"])
    return [{"type": "tool_use", "id": f"toolu_t_{n}", "name": "Bash",
             "input": {"command": "cat part_0.txt", "description": "Read part 0"}}]


def claude_two_turns(claude: str, tmp_path: Path, budget: int, method: str = "contextrender") -> dict[str, Any]:
    """``claude -p`` with :data:`TASK`, then ``claude -p --continue`` with :data:`FOLLOW_UP`."""
    work, home = _work(tmp_path, "CLAUDE.md"), tmp_path / "home"
    home.mkdir()
    fake = ScriptedAnthropic(_claude_model)
    service = ContextService(str(tmp_path / "cc.sqlite"), embedder=HashingEmbedder(dim=256), default_budget=budget)
    try:
        with serve(fake.app) as up:
            client = Recording(create_proxy_app(f"{up}/v1", service=service, budget=budget, method=method),
                               "/v1/messages")
            with serve(client) as url:
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                       "CLAUDE_CONFIG_DIR": str(home / ".claude"), "ANTHROPIC_BASE_URL": url,
                       "ANTHROPIC_API_KEY": "sk-ant-dummy-0123456789", "DISABLE_AUTOUPDATER": "1",
                       "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
                       "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
                for extra, prompt in (([], TASK), (["--continue"], FOLLOW_UP)):
                    _run([claude, "-p", *extra, prompt, "--output-format", "json", "--allowedTools", "Bash",
                          "--model", "claude-sonnet-4-5"], env, work)
    finally:
        service.close()
    main = [r["body"] for r in fake.messages_requests()
            if "Bash" in [t.get("name") for t in r["body"].get("tools") or []]]
    return {"client": client.bodies, "upstream": main, "root": str(tmp_path)}


# -- what the tests check ---------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(str(b.get("text", "")) for b in content or [] if isinstance(b, dict))


def user_texts(body: dict[str, Any]) -> list[str]:
    """The text of each user message of a Messages API or Responses API request body."""
    if "messages" in body:
        return [_text(m.get("content")) for m in body["messages"] if m.get("role") == "user"]
    return [_text(i.get("content")) for i in items_of(body) if i.get("role") == "user"]


def adjacent_same_role(messages: list[dict[str, Any]]) -> list[int]:
    """The indices k at which message k has the role of message k − 1 (the Messages API alternates them)."""
    return [k for k in range(1, len(messages)) if messages[k].get("role") == messages[k - 1].get("role")]
