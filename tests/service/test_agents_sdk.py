"""Real agent frameworks on the Responses API through the proxy, against the scripted upstream on 127.0.0.1:
the OpenAI Agents SDK (``openai-agents``) with its default model settings, and LangChain's ``ChatOpenAI``
with ``use_responses_api=True``. Each runs a multi-step function-tool task; every request the upstream got
must hold the history within B with calls and outputs paired."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contextrender.graph import OMISSION_MARKER
from contextrender.service.proxy import create_proxy_app

from .conftest import serve
from .responses_upstream import (
    ScriptedResponsesUpstream,
    items_of,
    pairing_problems,
    record_text,
    request_history_tokens,
)

B = 1500
INSTRUCTIONS = "You follow chains of records with the lookup tool, one record at a time."


@pytest.fixture
def proxied(service):
    fake = ScriptedResponsesUpstream()
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
        yield url, fake, service


def check(fake: ScriptedResponsesUpstream, steps: int) -> list[dict[str, Any]]:
    bodies = [rec["body"] for rec in fake.requests]
    assert len(bodies) == steps + 1
    for body in bodies:
        assert request_history_tokens(body) <= B
        assert pairing_problems(items_of(body)) == []
    last = bodies[-1]["input"]
    assert sum(i.get("type") == "function_call_output" for i in last) == steps  # markers keep their calls
    assert any(OMISSION_MARKER in str(i.get("output")) for i in last if i.get("type") == "function_call_output")
    return bodies


def test_openai_agents_sdk_default_settings(proxied):
    agents = pytest.importorskip("agents", reason="pip install openai-agents (the dev extra)")
    from openai import AsyncOpenAI

    url, fake, service = proxied
    steps = 7
    seen: list[str] = []

    @agents.function_tool
    def lookup(record: str) -> str:
        """Look a record up; the result names the next record."""
        seen.append(record)
        return record_text(record, len(seen), "g")

    agent = agents.Agent(name="chains", instructions=INSTRUCTIONS, tools=[lookup])
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-agents", max_retries=0)
    # The SDK's own default provider and model settings (the Responses API), only pointed at the proxy.
    config = agents.RunConfig(model_provider=agents.OpenAIProvider(openai_client=client), tracing_disabled=True)

    async def run() -> Any:
        try:
            return await agents.Runner.run(agent, f"Follow the chain from REC_start; steps={steps}.", max_turns=20,
                                           run_config=config)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert result.final_output == f"Done: the chain ends at REC_g_{steps} after {steps} steps."
    assert seen == ["REC_start", *[f"REC_g_{k}" for k in range(1, steps)]]
    bodies = check(fake, steps)
    assert all(b["instructions"] == INSTRUCTIONS and b["tools"][0]["name"] == "lookup" for b in bodies)
    sid = fake.requests[-1]["headers"].get("x-contextrender-session")
    assert sid is None  # ours never go upstream
    (session,) = service.sessions()
    stored = list(service.transcript(session).messages)
    assert sum(m["role"] == "assistant" for m in stored) == steps + 1 and stored[-1]["content"] == result.final_output


def test_langchain_chat_openai_responses_api(proxied):
    lc = pytest.importorskip("langchain_openai", reason="pip install langchain-openai (the dev extra)")
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    url, fake, service = proxied
    steps = 6
    seen: list[str] = []

    @tool
    def lookup(record: str) -> str:
        """Look a record up; the result names the next record."""
        seen.append(record)
        return record_text(record, len(seen), "l")

    llm = lc.ChatOpenAI(model="fake-model", base_url=f"{url}/v1", api_key="sk-lc", max_retries=0,
                        use_responses_api=True).bind_tools([lookup])
    messages: list[Any] = [SystemMessage(INSTRUCTIONS), HumanMessage(f"Follow the chain from REC_start; steps={steps}.")]
    for _ in range(steps + 3):
        ai = llm.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            break
        for call in ai.tool_calls:
            messages.append(ToolMessage(lookup.invoke(call["args"]), tool_call_id=call["id"]))
    assert ai.text == f"Done: the chain ends at REC_l_{steps} after {steps} steps."
    assert seen == ["REC_start", *[f"REC_l_{k}" for k in range(1, steps)]]
    check(fake, steps)
    (session,) = service.sessions()  # LangChain resends the recorded answers as they were: one session, no fork
    stored = list(service.transcript(session).messages)
    assert sum(m["role"] == "assistant" for m in stored) == steps + 1
