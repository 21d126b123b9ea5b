"""The expand tool under ``wrap`` for the Responses API (docs/service.md, "The expand tool"): the real openai SDK,
wrapped, runs a tool loop with ``responses.create`` against a scripted Responses upstream whose model needs a
value the render omitted and calls ``contextrender_expand``. The wrapper answers it and calls the client again;
the caller gets the final answer and never sees the tool; the graph records the expansion; every request stays
within B and the one answering a round starts with the previous one's input; an upstream that calls the tool
forever is stopped, naming the cap."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import contextrender
from contextrender.expand import TOOL_NAME
from contextrender.service.expansion import MAX_ROUNDS, Stop

from .conftest import billed, serve
from .expand_upstream import FINAL, RESPONSES_LOOKUP, TURNS, code_word, record_text, responses_script
from .responses_upstream import ScriptedResponsesUpstream, request_history_tokens

openai = pytest.importorskip("openai", reason="the openai SDK: pip install openai")

B = 900
TASK = "Look records r0 to r4 up, then tell me record 0's code word."


def _output(got: Any, stream: bool) -> list[dict[str, Any]]:
    """A response's output items as the caller got them (a stream's from its ``response.completed`` event)."""
    if stream:
        events = list(got)
        done = [ev.response for ev in events if ev.type == "response.completed"]
        assert len(done) == 1, [ev.type for ev in events]
        return [o.model_dump(exclude_none=True) for o in done[0].output]
    return [o.model_dump(exclude_none=True) for o in got.output]


def _add_results(items: list[Any], out: list[dict[str, Any]]) -> bool:
    """Append the model's output and its lookups' results to ``items``; False when the answer is final."""
    items += out
    calls = [o for o in out if o["type"] == "function_call"]
    for c in calls:
        k = int(json.loads(c["arguments"])["record"][1:])
        items.append({"type": "function_call_output", "call_id": c["call_id"], "output": record_text(k)})
    return bool(calls)


def _wrapped(url: str, client_type: Any = None) -> Any:
    client = (client_type or openai.OpenAI)(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
    return contextrender.wrap(client, budget=B, method="contextrender_plus", embedder=contextrender.HashingEmbedder())


def _round_follows(bodies: list[dict[str, Any]]) -> None:
    """A request answering a round is the previous request with the round appended (the cached prefix kept)."""
    pairs = [(a, b) for a, b in zip(bodies, bodies[1:], strict=False)
             if len(b["input"]) == len(a["input"]) + 2 and b["input"][len(a["input"])].get("name") == TOOL_NAME]
    assert pairs
    for a, b in pairs:
        assert json.dumps(b["input"][:len(a["input"])]) == json.dumps(a["input"])
        assert b["tools"] == a["tools"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_wrapped_responses_answer_expand_and_the_caller_gets_the_final_answer(stream):
    up = ScriptedResponsesUpstream(script=responses_script())
    with serve(up.app) as url, _wrapped(url) as client:
        items: list[Any] = [{"role": "user", "content": TASK}]
        outputs = []
        for _ in range(TURNS + 3):
            got = client.responses.create(model="gpt-test", instructions="Use the tools.", input=items,
                                          tools=[RESPONSES_LOOKUP], store=False, stream=stream)
            outputs.append(_output(got, stream))
            if not _add_results(items, outputs[-1]):
                break
        sid = client.contextrender.last.session
        expansions = client.contextrender.service.expansions(sid)
        usage = client.contextrender.usage(sid)
        last_usage = client.contextrender.last.usage
    last = outputs[-1]
    assert last[0]["type"] == "message" and last[0]["content"][0]["text"] == FINAL + code_word(0) + "."
    assert len(outputs) == TURNS + 1  # the expand round is not one of the caller's calls
    assert TOOL_NAME not in json.dumps(outputs)
    assert len(expansions) == 1 and expansions[0]["narrowed"]
    bodies = [r["body"] for r in up.requests]
    assert all(TOOL_NAME in json.dumps(b["tools"]) for b in bodies)  # offered from the first request on
    assert usage.requests == len(bodies)  # every upstream request's usage is recorded, the round's included
    assert last_usage is not None and last_usage.prompt == billed(len(bodies))[0]  # the caller's answer's, not a round's
    for body in bodies:
        assert request_history_tokens(body) <= B
    _round_follows(bodies)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_wrapped_async_responses_answer_expand_too(stream):
    up = ScriptedResponsesUpstream(script=responses_script())

    async def main(url: str) -> list[list[dict[str, Any]]]:
        client = _wrapped(url, openai.AsyncOpenAI)
        items: list[Any] = [{"role": "user", "content": TASK}]
        outputs = []
        for _ in range(TURNS + 3):
            got = await client.responses.create(model="gpt-test", input=items, tools=[RESPONSES_LOOKUP],
                                                store=False, stream=stream)
            if stream:
                done = [ev.response async for ev in got if ev.type == "response.completed"]
                out = [o.model_dump(exclude_none=True) for o in done[0].output]
            else:
                out = [o.model_dump(exclude_none=True) for o in got.output]
            outputs.append(out)
            if not _add_results(items, out):
                break
        await client.close()
        return outputs

    with serve(up.app) as url:
        outputs = asyncio.run(main(url))
    assert outputs[-1][0]["content"][0]["text"] == FINAL + code_word(0) + "."
    assert TOOL_NAME not in json.dumps(outputs)
    assert any(TOOL_NAME in json.dumps(r["body"]["input"]) for r in up.requests)  # an expand round did run


def test_a_string_input_is_sent_as_its_message_and_offered_the_tool():
    up = ScriptedResponsesUpstream(script=responses_script())
    with serve(up.app) as url, _wrapped(url) as client:
        got = client.responses.create(model="gpt-test", input=TASK, tools=[RESPONSES_LOOKUP], store=False)
    assert got.output[0].name == "lookup"
    body = up.requests[-1]["body"]
    assert body["input"] == [{"role": "user", "content": TASK}]
    assert [t["name"] for t in body["tools"]] == ["lookup", TOOL_NAME]


def test_an_upstream_calling_expand_forever_is_stopped():
    up = ScriptedResponsesUpstream(script=responses_script(forever=True))
    with serve(up.app) as url, _wrapped(url) as client:
        items: list[Any] = [{"role": "user", "content": TASK}]
        with pytest.raises(Stop, match=f"{TOOL_NAME} after {MAX_ROUNDS} rounds"):
            for _ in range(TURNS + 3):
                got = client.responses.create(model="gpt-test", input=items, tools=[RESPONSES_LOOKUP], store=False)
                _add_results(items, _output(got, False))
    rounds = [r["body"] for r in up.requests if any(it.get("name") == TOOL_NAME for it in r["body"]["input"])]
    assert len(rounds) >= MAX_ROUNDS + 1
    assert "cap of" in json.dumps(rounds[-1]["input"][-1])
    for r in up.requests:
        assert request_history_tokens(r["body"]) <= B


def test_wrap_without_expand_sends_the_responses_calls_as_they_were():
    up = ScriptedResponsesUpstream(script=responses_script())
    with serve(up.app) as url:
        client = contextrender.wrap(openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0), budget=B,
                                    method="contextrender_plus", embedder=contextrender.HashingEmbedder(), expand=False)
        with client:
            client.responses.create(model="gpt-test", input=TASK, tools=[RESPONSES_LOOKUP], store=False)
    body = up.requests[-1]["body"]
    assert body["input"] == TASK and [t["name"] for t in body["tools"]] == ["lookup"]
