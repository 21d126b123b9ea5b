"""The expand tool under ``wrap`` (docs/service.md, "The expand tool"): the real openai SDK, wrapped, runs an
ordinary tool loop against a scripted Chat Completions upstream whose model needs a value the render omitted and
calls ``contextrender_expand``. The wrapper answers the call itself and calls the client again: the caller gets
the model's final answer and never sees the tool; the graph records the expansion; every request the client sent
stays within B, and the one answering the round starts with the previous one; an upstream that calls the tool
forever is stopped with an error naming the cap."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import contextrender
from contextrender.expand import TOOL_NAME
from contextrender.service.expansion import MAX_ROUNDS, Stop

from .conftest import history_tokens, serve
from .expand_upstream import CHAT_LOOKUP, FINAL, TURNS, ChatUpstream, chat_message, code_word, record_text

openai = pytest.importorskip("openai", reason="the openai SDK: pip install openai")

B = 900
TASK = "Look records r0 to r4 up, then tell me record 0's code word."


def _add_results(messages: list[dict[str, Any]], msg: dict[str, Any]) -> bool:
    """Append the model's answer and its lookups' results to ``messages``; False when the answer is final."""
    messages.append(msg)
    for c in msg.get("tool_calls") or []:
        k = int(json.loads(c["function"]["arguments"])["record"][1:])
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": record_text(k)})
    return bool(msg.get("tool_calls"))


async def _async_tool_loop(ask: Any) -> list[dict[str, Any]]:
    """An agent's loop over ``ask`` (messages -> the assistant message, awaited) until the model answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    answers = []
    for _ in range(TURNS + 3):
        msg = await ask(messages)
        answers.append(msg)
        if not _add_results(messages, msg):
            break
    return answers


def _tool_loop(create: Any, stream: bool) -> list[dict[str, Any]]:
    """An agent's loop over ``create`` (the wrapped client's): look records up until the model answers."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Use the tools."},
                                      {"role": "user", "content": TASK}]
    answers = []
    for _ in range(TURNS + 3):
        got = create(model="gpt-test", messages=messages, tools=[CHAT_LOOKUP], stream=stream)
        msg = chat_message(list(got) if stream else got, stream)
        answers.append(msg)
        if not _add_results(messages, msg):
            break
    return answers


def _expand_round_follows(requests: list[dict[str, Any]]) -> None:
    """The request answering the round is the previous request with the round (the model's call, its result)
    appended: what the provider cached stays a prefix."""
    pairs = [(a, b) for a, b in zip(requests, requests[1:], strict=False)
             if len(b["messages"]) == len(a["messages"]) + 2
             and TOOL_NAME in json.dumps(b["messages"][len(a["messages"])].get("tool_calls"))]
    assert pairs
    for a, b in pairs:
        assert json.dumps(b["messages"][:len(a["messages"])]) == json.dumps(a["messages"])
        assert b["tools"] == a["tools"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_wrap_answers_expand_itself_and_the_caller_gets_the_final_answer(stream):
    up = ChatUpstream()
    with serve(up.app) as up_url:
        client = contextrender.wrap(openai.OpenAI(base_url=f"{up_url}/v1", api_key="sk-test", max_retries=0),
                                    budget=B, method="contextrender_plus", embedder=contextrender.HashingEmbedder())
        with client:
            answers = _tool_loop(client.chat.completions.create, stream)
            sid = client.contextrender.last.session
            expansions = client.contextrender.service.expansions(sid)
            requests = client.contextrender.usage(sid).requests
    assert answers[-1]["content"] == FINAL + code_word(0) + "."
    assert len(answers) == TURNS + 1  # the expand round is not one of the caller's calls
    assert TOOL_NAME not in json.dumps(answers)
    assert len(expansions) == 1 and expansions[0]["narrowed"]
    assert any(TOOL_NAME in json.dumps(b.get("tools")) for b in up.requests)
    assert requests == len(up.requests)  # every upstream request's usage is recorded, the round's included
    for body in up.requests:
        assert history_tokens(body["messages"]) <= B
    _expand_round_follows(up.requests)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_wrap_async_client_answers_expand_too(stream):
    up = ChatUpstream()

    async def main() -> list[dict[str, Any]]:
        client = contextrender.wrap(openai.AsyncOpenAI(base_url=f"{up_url}/v1", api_key="sk-test", max_retries=0),
                                    budget=B, method="contextrender_plus", embedder=contextrender.HashingEmbedder())

        async def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
            got = await client.chat.completions.create(model="gpt-test", messages=messages, tools=[CHAT_LOOKUP],
                                                       stream=stream)
            return chat_message([c async for c in got] if stream else got, stream)

        answers = await _async_tool_loop(ask)
        await client.close()
        return answers

    with serve(up.app) as up_url:
        answers = asyncio.run(main())
    assert answers[-1]["content"] == FINAL + code_word(0) + "."
    assert TOOL_NAME not in json.dumps(answers)
    assert any(TOOL_NAME in json.dumps(b["messages"]) for b in up.requests)  # an expand round did run


def test_wrap_offers_the_tool_to_a_call_without_tools():
    """A call with no ``tools`` (or the SDK's NOT_GIVEN) still gets the tool, and only it, and the loop runs."""
    up = ChatUpstream()
    with serve(up.app) as up_url:
        client = contextrender.wrap(openai.OpenAI(base_url=f"{up_url}/v1", api_key="sk-test", max_retries=0),
                                    budget=B, method="contextrender_plus", embedder=contextrender.HashingEmbedder())
        with client:
            for tools in (None, openai.NOT_GIVEN):
                kw = {} if tools is None else {"tools": tools}
                up.requests.clear()
                got = client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": TASK}],
                                                     **kw)
                assert got.choices[0].message.tool_calls[0].function.name == "lookup"
                assert [t["function"]["name"] for t in up.requests[-1]["tools"]] == [TOOL_NAME]


def test_wrap_without_expand_never_offers_the_tool():
    up = ChatUpstream()
    with serve(up.app) as up_url:
        client = contextrender.wrap(openai.OpenAI(base_url=f"{up_url}/v1", api_key="sk-test", max_retries=0),
                                    budget=B, method="contextrender_plus", embedder=contextrender.HashingEmbedder(),
                                    expand=False)
        with client:
            answers = _tool_loop(client.chat.completions.create, False)
    assert answers[-1]["content"] == "I cannot see record 0's code word."
    assert not any(TOOL_NAME in json.dumps(b) for b in up.requests)  # no tool, no handle in any marker


def test_wrap_stops_an_upstream_that_calls_expand_forever():
    up = ChatUpstream(forever=True)
    with serve(up.app) as up_url:
        client = contextrender.wrap(openai.OpenAI(base_url=f"{up_url}/v1", api_key="sk-test", max_retries=0),
                                    budget=B, method="contextrender_plus", embedder=contextrender.HashingEmbedder())
        with client, pytest.raises(Stop, match=str(MAX_ROUNDS)):
            _tool_loop(client.chat.completions.create, False)
    rounds = [b for b in up.requests if "cap of" in json.dumps(b["messages"][-1:])]
    assert len(rounds) == 1  # the round told the cap was reached, then the stop
    for body in up.requests:
        assert history_tokens(body["messages"]) <= B


def test_wrap_loop_continues_when_a_sync_looking_create_returns_an_awaitable():
    """A client whose ``create`` is a plain function returning a coroutine (a thin shim over an async SDK): the
    loop goes on asynchronously and the awaited answer is the upstream's final one."""
    up = ChatUpstream()

    class Shim:
        def __init__(self, inner: Any) -> None:
            self.chat = type("Chat", (), {})()
            self.chat.completions = type("Completions", (), {})()
            self.chat.completions.create = lambda **kw: inner.chat.completions.create(**kw)

    async def main() -> list[dict[str, Any]]:
        inner = openai.AsyncOpenAI(base_url=f"{up_url}/v1", api_key="sk-test", max_retries=0)
        client = contextrender.wrap(Shim(inner), budget=B, method="contextrender_plus",
                                    embedder=contextrender.HashingEmbedder())

        async def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
            got = client.chat.completions.create(model="gpt-test", messages=messages, tools=[CHAT_LOOKUP])
            return chat_message(await got, False)

        answers = await _async_tool_loop(ask)
        await inner.close()
        return answers

    with serve(up.app) as up_url:
        answers = asyncio.run(main())
    assert answers[-1]["content"] == FINAL + code_word(0) + "."
    assert any(TOOL_NAME in json.dumps(b["messages"]) for b in up.requests)  # an expand round did run
