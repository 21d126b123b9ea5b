"""The expand tool under ``wrap`` for the Anthropic client (docs/service.md, "The expand tool"): the real anthropic
SDK, wrapped, runs a tool loop with ``messages.create`` against a scripted Messages upstream whose model needs a
value the render omitted and calls ``contextrender_expand``. The wrapper answers it and calls the client again; the
caller gets the final answer and never sees the tool; the graph records the expansion; every request stays within
B and pairs its tool blocks (the upstream refuses one that does not), and the one answering a round starts with
the previous one's messages; an upstream that calls the tool forever is stopped, naming the cap."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import contextrender
from contextrender.expand import TOOL_NAME
from contextrender.service.expansion import MAX_ROUNDS, Stop

from .anthropic_upstream import ScriptedAnthropic
from .anthropic_upstream import history_tokens as messages_history_tokens
from .conftest import serve
from .expand_upstream import FINAL, MESSAGES_LOOKUP, TURNS, code_word, messages_content, messages_model, record_text

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK: pip install anthropic")

B = 900
TASK = "Look records r0 to r4 up, then tell me record 0's code word."


def _add_results(history: list[dict[str, Any]], content: list[dict[str, Any]]) -> bool:
    """Append the answer and its lookups' results to ``history``; False when the answer is final."""
    history.append({"role": "assistant", "content": content})
    uses = [b for b in content if b["type"] == "tool_use"]
    if uses:
        history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"], "content": record_text(int(b["input"]["record"][1:]))}
            for b in uses]})
    return bool(uses)


def _wrapped(url: str, client_type: Any = None, **kw: Any) -> Any:
    client = (client_type or anthropic.Anthropic)(base_url=url, api_key="sk-ant-test", max_retries=0)
    return contextrender.wrap(client, budget=B, method="contextrender_plus", embedder=contextrender.HashingEmbedder(),
                              **kw)


def _ask(history: list[dict[str, Any]], stream: bool = False) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 256, "system": "Use the tools.", "messages": history,
            "tools": [MESSAGES_LOOKUP], "stream": stream}


def _round_follows(bodies: list[dict[str, Any]]) -> None:
    """A request answering a round is the previous request with the round appended (the cached prefix kept)."""
    pairs = [(a, b) for a, b in zip(bodies, bodies[1:], strict=False)
             if len(b["messages"]) == len(a["messages"]) + 2
             and TOOL_NAME in json.dumps(b["messages"][len(a["messages"])])]
    assert pairs
    for a, b in pairs:
        assert json.dumps(b["messages"][:len(a["messages"])]) == json.dumps(a["messages"])
        assert b["tools"] == a["tools"] and b["system"] == a["system"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_wrapped_messages_answer_expand_and_the_caller_gets_the_final_answer(stream):
    up = ScriptedAnthropic(model=messages_model())
    with serve(up.app) as url, _wrapped(url) as client:
        history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        answers = []
        for _ in range(TURNS + 3):
            answers.append(messages_content(client.messages.create(**_ask(history, stream)), stream))
            if not _add_results(history, answers[-1]):
                break
        sid = client.contextrender.last.session
        expansions = client.contextrender.service.expansions(sid)
        usage = client.contextrender.usage(sid)
    assert answers[-1] == [{"type": "text", "text": FINAL + code_word(0) + "."}]
    assert len(answers) == TURNS + 1 and TOOL_NAME not in json.dumps(answers)
    assert len(expansions) == 1 and expansions[0]["narrowed"]
    bodies = [r["body"] for r in up.messages_requests()]
    assert all(TOOL_NAME in json.dumps(b["tools"]) for b in bodies)  # offered from the first request on
    assert usage.requests == len(bodies)
    for body in bodies:  # the scripted upstream refused (400) any request whose tool_use/tool_result did not pair
        assert messages_history_tokens(body) <= B
    _round_follows(bodies)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_wrapped_async_messages_answer_expand_too(stream):
    up = ScriptedAnthropic(model=messages_model())

    async def main(url: str) -> list[list[dict[str, Any]]]:
        client = _wrapped(url, anthropic.AsyncAnthropic)
        history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        answers = []
        for _ in range(TURNS + 3):
            got = await client.messages.create(**_ask(history, stream))
            answers.append(messages_content([ev async for ev in got] if stream else got, stream))
            if not _add_results(history, answers[-1]):
                break
        await client.close()
        return answers

    with serve(up.app) as url:
        answers = asyncio.run(main(url))
    assert answers[-1] == [{"type": "text", "text": FINAL + code_word(0) + "."}]
    assert TOOL_NAME not in json.dumps(answers)
    assert any(TOOL_NAME in json.dumps(r["body"]["messages"]) for r in up.messages_requests())


def test_an_upstream_calling_expand_forever_is_stopped():
    up = ScriptedAnthropic(model=messages_model(forever=True))
    with serve(up.app) as url, _wrapped(url) as client:
        history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        with pytest.raises(Stop, match=f"{TOOL_NAME} after {MAX_ROUNDS} rounds"):
            for _ in range(TURNS + 3):
                _add_results(history, messages_content(client.messages.create(**_ask(history)), False))
    bodies = [r["body"] for r in up.messages_requests()]
    assert "cap of" in json.dumps(bodies[-1]["messages"][-1])
    for body in bodies:
        assert messages_history_tokens(body) <= B


def test_a_prefill_or_expand_false_sends_the_call_as_it_was():
    """An assistant prefill is continued by the model, not answered: no loop; ``wrap(expand=False)`` never offers
    the tool."""
    up = ScriptedAnthropic(model=messages_model())
    with serve(up.app) as url:
        with _wrapped(url, expand=False) as client:
            client.messages.create(**_ask([{"role": "user", "content": TASK}]))
        assert [t["name"] for t in up.messages_requests()[-1]["body"]["tools"]] == ["lookup"]
        with _wrapped(url) as client:
            client.messages.create(**_ask([{"role": "user", "content": TASK},
                                           {"role": "assistant", "content": "Looking r0 up"}]))
        assert [t["name"] for t in up.messages_requests()[-1]["body"]["tools"]] == ["lookup"]
        assert len(up.messages_requests()) == 2
