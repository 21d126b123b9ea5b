"""The expand tool under the agents people run (docs/service.md, "The expand tool"): the OpenAI Agents SDK, and
Claude Code and Codex, the real CLIs from npm, run a task through the proxy with ``contextrender_plus`` against scripted upstreams whose model
needs a value from the first tool result, which the budget has omitted by the end, and reads it back with
``contextrender_expand`` in the API's own wire format (Messages ``tool_use``; Responses ``function_call``). The CLI
prints the model's final answer, never sees the tool, and the session records the expansion; every request the
upstream got stays within B.

The CLIs are found as their own tests find them (tests/service/test_anthropic_claude_code.py, test_codex_cli.py);
without them these tests skip and say so.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from contextrender.expand import TOOL_NAME
from contextrender.graph import OMISSION_MARKER
from contextrender.service.proxy import create_proxy_app

from .anthropic_upstream import history_tokens, pairing_problems
from .conftest import serve
from .expand_upstream import FINAL, HANDLE, code_word, offered, record_text, responses_script
from .responses_upstream import ScriptedResponsesUpstream, items_of, message_item, request_history_tokens
from .responses_upstream import pairing_problems as responses_pairing
from .test_anthropic_claude_code import chain_model, run_chain
from .test_codex_cli import codex_bin, run_codex, shell_call

METHOD = "contextrender_plus"
CODE = "PERSIMMON"


def _handle_or_none(body: dict[str, Any]) -> str | None:
    found = HANDLE.findall(json.dumps(body, ensure_ascii=False))
    return found[0] if found and offered(body.get("tools")) else None


# -- Claude Code (Messages) ---------------------------------------------------------------------------

FILES = 5
B_CLAUDE = 1200


def first_part_tail(k: int, files: int) -> str:
    """The code word sits in the FIRST part: by the end, the budget has omitted it."""
    return f"CODEWORD={CODE}" if k == 0 else f"next: part_{k + 1}.txt" if k < files - 1 else "end of the chain"


def expanding_chain_model(folder: Path, files: int) -> Any:
    """Read every part with Bash (as :func:`chain_model`), then answer with the code word of part 0: seen in the
    request, say it; hidden behind a marker and the tool offered, read it back with the marker's handle."""
    reading = chain_model(folder, files)
    count = iter(range(10 ** 6))

    def model(body: dict[str, Any]) -> list[dict[str, Any]]:
        blocks = reading(body)
        if blocks[-1].get("type") == "tool_use" or "Bash" not in [t.get("name") for t in body.get("tools") or []]:
            return blocks
        found = re.search(r"CODEWORD=(\w+)", json.dumps(body["messages"]))
        if found:
            return [{"type": "text", "text": f"The code word is {found.group(1)}."}]
        h = _handle_or_none(body)
        if h is None:
            return [{"type": "text", "text": "The code word is missing."}]
        return [{"type": "text", "text": "Reading part 0 back."},
                {"type": "tool_use", "id": f"toolu_expand_{next(count)}", "name": TOOL_NAME,
                 "input": {"handle": h, "match": "CODEWORD"}}]

    return model


def test_claude_code_reads_an_omitted_result_back_through_the_proxy(tmp_path):
    run = run_chain(tmp_path, FILES, B_CLAUDE, model=expanding_chain_model, tail=first_part_tail, method=METHOD)
    assert run["out"]["result"] == f"The code word is {CODE}."  # the upstream's final answer reached the CLI
    assert TOOL_NAME not in run["stdout"]
    assert all(TOOL_NAME not in json.dumps(b) for b in run["client"])  # never in anything the CLI sent
    assert len(run["expansions"]) == 1 and run["expansions"][0]["narrowed"]
    upstream = [r["body"] for r in run["fake"].messages_requests()]
    assert any(OMISSION_MARKER[:-1] in json.dumps(b) for b in upstream)
    for body in upstream:
        assert history_tokens(body) <= B_CLAUDE
        assert pairing_problems(body["messages"]) == []


# -- Codex (Responses) --------------------------------------------------------------------------------

STEPS = 5
B_CODEX = 1200


def codex_expanding_script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Run ``STEPS`` shell commands, each printing a large record whose code word sits between filler; then
    answer with record 0's code word, read back through its handle when the render omitted it."""
    items = items_of(body)
    done = sum(1 for i in items if i.get("type") == "function_call_output" and str(i.get("call_id", "")).startswith(
        "call_sh_"))
    if done < STEPS:
        # the word is put together by the shell, so the call's own arguments (which a render keeps) do not hold it
        word = f"$(echo {CODE[:4]}){CODE[4:]}" if done == 0 else f"FILLER{done}"
        command = (f"echo record r{done}; printf 'w%s ' $(seq 0 119); echo; echo CODEWORD={word}; "
                   "printf 'v%s ' $(seq 0 119)")
        return [{**shell_call(body, n, command), "call_id": f"call_sh_{n}"}]
    found = re.search(rf"CODEWORD=({CODE})", json.dumps(body, ensure_ascii=False))
    if found:
        return [message_item(f"msg_{n}", f"Record 0's code word is {found.group(1)}.")]
    h = _handle_or_none(body)
    if h is None:
        return [message_item(f"msg_{n}", "Record 0's code word is missing.")]
    return [{"type": "function_call", "id": f"fc_{n}", "call_id": f"call_expand_{n}", "name": TOOL_NAME,
             "arguments": json.dumps({"handle": h, "match": "CODEWORD"}), "status": "completed"}]


def test_codex_reads_an_omitted_result_back_through_the_proxy(service, tmp_path):
    binary = codex_bin()
    fake = ScriptedResponsesUpstream(codex_expanding_script)
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B_CODEX,
                                                       method=METHOD)) as url:
        proc = run_codex(binary, url, tmp_path,
                         f"Print records r0 to r{STEPS - 1} with shell commands, then tell me record 0's code word.",
                         'http_headers={"X-ContextRender-Session"="codex-expand"}')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Record 0's code word is {CODE}." in proc.stdout
    assert TOOL_NAME not in proc.stdout + proc.stderr
    expansions = service.expansions("codex-expand")
    assert len(expansions) == 1 and expansions[0]["narrowed"]
    bodies = [r["body"] for r in fake.requests]
    assert any(TOOL_NAME in json.dumps(b.get("tools")) for b in bodies)
    for body in bodies:
        assert request_history_tokens(body) <= B_CODEX
        assert responses_pairing(items_of(body)) == []
    stored = service.transcript("codex-expand").messages
    assert not any(TOOL_NAME in json.dumps(m) for m in stored)  # what the CLI sent back never held the tool


# -- the OpenAI Agents SDK (Responses) ----------------------------------------------------------------


def test_openai_agents_sdk_never_sees_the_expand_tool(service):
    """The SDK's own tool loop with a function tool; the scripted model (tests/service/expand_upstream.py) looks
    records r0 to r4 up, then reads record 0's code word back through the proxy."""
    agents = pytest.importorskip("agents", reason="pip install openai-agents (the dev extra)")
    from openai import AsyncOpenAI

    budget = 900
    fake = ScriptedResponsesUpstream(script=responses_script())
    looked_up: list[str] = []

    @agents.function_tool
    def lookup(record: str) -> str:
        """Look a record up."""
        looked_up.append(record)
        return record_text(int(record[1:]))

    agent = agents.Agent(name="records", instructions="Use the tools.", tools=[lookup])
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=budget,
                                                       method=METHOD)) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-agents", max_retries=0)
        config = agents.RunConfig(model_provider=agents.OpenAIProvider(openai_client=client), tracing_disabled=True)

        async def run() -> Any:
            try:
                return await agents.Runner.run(agent, "Look records r0 to r4 up, then tell me record 0's code word.",
                                               max_turns=20, run_config=config)
            finally:
                await client.close()

        result = asyncio.run(run())
    assert result.final_output == FINAL + code_word(0) + "."
    assert looked_up == [f"r{k}" for k in range(5)]  # the SDK ran its own calls, each once
    assert TOOL_NAME not in json.dumps([i.raw_item for i in result.new_items], default=str)
    expansions = [e for sid in service.sessions() for e in service.expansions(sid)]
    assert len(expansions) == 1 and expansions[0]["narrowed"]
    bodies = [r["body"] for r in fake.requests]
    for body in bodies:
        assert request_history_tokens(body) <= budget
        assert responses_pairing(items_of(body)) == []
