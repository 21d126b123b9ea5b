"""The expand tool inside the proxy (docs/service.md, "The expand tool"): real clients — the openai SDK (Chat
Completions and Responses), the anthropic SDK — run an ordinary tool loop through the proxy, streamed and not,
against scripted upstreams whose model needs a value the render omitted and calls ``contextrender_expand`` in each
API's exact wire format. The client gets the model's final answer and never sees the tool; the session records
the expansion; every request sent upstream stays within B; the request after an expansion starts with the
previous one byte for byte; an upstream that calls the tool forever is stopped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contextrender import TokenCounter
from contextrender.expand import TOOL_NAME
from contextrender.service.expansion import EXPANSIONS_HEADER, MAX_ROUNDS, RERENDERS_HEADER
from contextrender.service.proxy import create_proxy_app

from .anthropic_upstream import ScriptedAnthropic
from .anthropic_upstream import history_tokens as messages_history_tokens
from .conftest import history_tokens, serve
from .expand_upstream import (
    CHAT_LOOKUP,
    FINAL,
    MESSAGES_LOOKUP,
    RESPONSES_LOOKUP,
    TURNS,
    ChatUpstream,
    chat_message,
    code_word,
    messages_content,
    messages_model,
    record_text,
    responses_script,
)
from .responses_upstream import ScriptedResponsesUpstream, request_history_tokens

openai = pytest.importorskip("openai", reason="the openai SDK: pip install openai")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK: pip install anthropic")

#: A budget at which each API's expand round fits beside the render, so the request answering it is the previous
#: one with the round appended; :func:`test_a_round_that_does_not_fit_renders_again_within_b` takes one at which
#: it does not.
B = 900
METHOD = "contextrender_plus"
TASK = "Look records r0 to r4 up, then tell me record 0's code word."


def _proxy(service: Any, upstream_url: str, budget: int = B) -> Any:
    return create_proxy_app(f"{upstream_url}/v1", service=service, budget=budget, method=METHOD)


def _sessions_expansions(service: Any) -> list[dict[str, Any]]:
    return [e for sid in service.sessions() for e in service.expansions(sid)]


def _no_expand_tool_seen(answers: list[Any]) -> None:
    dumped = json.dumps(answers, default=lambda o: getattr(o, "model_dump", lambda: str(o))())
    assert TOOL_NAME not in dumped


def _is_expand_call(x: Any) -> bool:
    """Whether a history element is the model's expand call, in any of the three APIs' shapes."""
    if not isinstance(x, dict):
        return False
    if x.get("type") == "function_call":  # Responses
        return x.get("name") == TOOL_NAME
    calls = [c.get("function", {}).get("name") for c in x.get("tool_calls") or []]  # Chat Completions
    uses = [b.get("name") for b in x.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_use"]
    return TOOL_NAME in calls + uses


def _continuations(requests: list[dict[str, Any]], key: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(request, the next request) where the next one answers an expand round of the first."""
    return [(prev, cur) for prev, cur in zip(requests, requests[1:], strict=False)
            if len(cur[key]) > len(prev[key]) and _is_expand_call(cur[key][len(prev[key])])]


def _prefix_kept(requests: list[dict[str, Any]], key: str, headers: Any) -> None:
    """Each request answering an expand round starts with the previous request's history, element for element, as
    the same bytes (and with the same tools): what the provider cached stays a prefix. (The round fitted beside the
    render: the proxy says it did not render again.)"""
    assert RERENDERS_HEADER not in headers
    pairs = _continuations(requests, key)
    assert pairs
    for prev, cur in pairs:
        head = cur[key][:len(prev[key])]
        assert json.dumps(head, ensure_ascii=False) == json.dumps(prev[key], ensure_ascii=False)
        assert cur["tools"] == prev["tools"]


# -- Chat Completions, the openai SDK ----------------------------------------------------------------


def _chat_answer(client: Any, messages: list[dict[str, Any]], stream: bool) -> tuple[dict[str, Any], Any]:
    kw = {"model": "gpt-test", "messages": messages, "tools": [CHAT_LOOKUP]}
    if not stream:
        raw = client.chat.completions.with_raw_response.create(**kw)
        return chat_message(raw.parse(), False), raw.headers
    with client.chat.completions.with_streaming_response.create(stream=True, **kw) as raw:
        return chat_message(list(raw.parse()), True), raw.headers


def _chat_loop(client: Any, stream: bool) -> tuple[list[dict[str, Any]], list[Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Use the tools."},
                                      {"role": "user", "content": TASK}]
    answers, headers = [], []
    for _ in range(TURNS + 3):
        msg, h = _chat_answer(client, messages, stream)
        answers.append(msg)
        headers.append(h)
        messages.append(msg)
        if not msg.get("tool_calls"):
            break
        for c in msg["tool_calls"]:
            k = int(json.loads(c["function"]["arguments"])["record"][1:])
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": record_text(k)})
    return answers, headers


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_completions_expand_is_answered_inside_the_proxy(service, stream):
    up = ChatUpstream()
    with serve(up.app) as up_url, serve(_proxy(service, up_url)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        answers, headers = _chat_loop(client, stream)
    assert answers[-1]["content"] == FINAL + code_word(0) + "."  # the upstream's final answer reached the client
    assert len(answers) == TURNS + 1
    _no_expand_tool_seen(answers)
    assert headers[-1][EXPANSIONS_HEADER] == "1"
    got = _sessions_expansions(service)
    assert len(got) == 1 and got[0]["narrowed"]
    counter = TokenCounter()
    for body in up.requests:  # every request, the expand rounds included, within B
        assert history_tokens(body["messages"], counter) <= B
    assert any(TOOL_NAME in json.dumps(b.get("tools")) for b in up.requests)
    _prefix_kept(up.requests, "messages", headers[-1])


def test_a_round_that_does_not_fit_renders_again_within_b(service):
    """At B = 700 the render leaves less room than the expand round takes: the proxy renders the history again at
    B minus the round (and says so), the request answering the round stays within B, and the answer is the same."""
    budget = 700
    up = ChatUpstream()
    with serve(up.app) as up_url, serve(_proxy(service, up_url, budget)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        answers, headers = _chat_loop(client, stream=False)
    assert answers[-1]["content"] == FINAL + code_word(0) + "."
    assert headers[-1][EXPANSIONS_HEADER] == "1" and headers[-1][RERENDERS_HEADER] == "1"
    counter = TokenCounter()
    sizes = [history_tokens(body["messages"], counter) for body in up.requests]
    assert max(sizes) <= budget
    *_, prev, cur = up.requests
    assert _is_expand_call(cur["messages"][-2])  # the round (call, result) is the last thing the model reads
    assert cur["messages"][:-2] != prev["messages"]  # after a new render of the history, not the previous request


def test_chat_completions_an_upstream_calling_expand_forever_is_stopped(service):
    up = ChatUpstream(forever=True)
    with serve(up.app) as up_url, serve(_proxy(service, up_url)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0, timeout=20)
        messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        error = None
        for _ in range(TURNS + 3):
            try:
                msg, _ = _chat_answer(client, messages, stream=False)
            except openai.APIStatusError as e:
                error = e
                break
            messages.append(msg)
            for c in msg.get("tool_calls") or []:
                k = int(json.loads(c["function"]["arguments"])["record"][1:])
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": record_text(k)})
    assert error is not None and error.status_code == 502
    assert TOOL_NAME in str(error.message) and str(MAX_ROUNDS) in str(error.message)
    rounds = _continuations(up.requests, "messages")
    assert len(rounds) == MAX_ROUNDS + 1  # the rounds answered, and the one told the cap was reached
    assert "cap of" in json.dumps(rounds[-1][1]["messages"][-1])
    for body in up.requests:
        assert history_tokens(body["messages"]) <= B


# -- Responses, the openai SDK ------------------------------------------------------------------------


def _responses_loop(client: Any, stream: bool) -> tuple[list[Any], list[Any]]:
    items: list[Any] = [{"role": "user", "content": TASK}]
    outputs, headers = [], []
    for _ in range(TURNS + 3):
        kw = {"model": "gpt-test", "input": items, "tools": [RESPONSES_LOOKUP], "store": False}
        if stream:
            with client.responses.with_streaming_response.create(stream=True, **kw) as raw:
                headers.append(raw.headers)
                final = [ev.response for ev in raw.parse() if ev.type == "response.completed"]
            out = [o.model_dump(exclude_none=True) for o in final[0].output]
        else:
            raw = client.responses.with_raw_response.create(**kw)
            headers.append(raw.headers)
            out = [o.model_dump(exclude_none=True) for o in raw.parse().output]
        outputs.append(out)
        items += out
        calls = [o for o in out if o["type"] == "function_call"]
        if not calls:
            break
        for c in calls:
            k = int(json.loads(c["arguments"])["record"][1:])
            items.append({"type": "function_call_output", "call_id": c["call_id"], "output": record_text(k)})
    return outputs, headers


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_expand_is_answered_inside_the_proxy(service, stream):
    up = ScriptedResponsesUpstream(script=responses_script())
    with serve(up.app) as up_url, serve(_proxy(service, up_url)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        outputs, headers = _responses_loop(client, stream)
    last = outputs[-1]
    assert last[0]["type"] == "message" and last[0]["content"][0]["text"] == FINAL + code_word(0) + "."
    _no_expand_tool_seen(outputs)
    assert headers[-1][EXPANSIONS_HEADER] == "1"
    assert len(_sessions_expansions(service)) == 1
    bodies = [r["body"] for r in up.requests]
    for body in bodies:
        assert request_history_tokens(body) <= B
    _prefix_kept(bodies, "input", headers[-1])


# -- Messages, the anthropic SDK ---------------------------------------------------------------------


def _messages_loop(client: Any, stream: bool) -> tuple[list[Any], list[Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    answers, headers = [], []
    for _ in range(TURNS + 3):
        kw = {"model": "claude-test", "max_tokens": 256, "system": "Use the tools.", "messages": history,
              "tools": [MESSAGES_LOOKUP]}
        if stream:
            with client.messages.with_streaming_response.create(stream=True, **kw) as raw:
                headers.append(raw.headers)
                content = messages_content(list(raw.parse()), stream=True)
        else:
            raw = client.messages.with_raw_response.create(**kw)
            headers.append(raw.headers)
            content = messages_content(raw.parse(), stream=False)
        answers.append(content)
        history.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        if not uses:
            break
        history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"], "content": record_text(int(b["input"]["record"][1:]))}
            for b in uses]})
    return answers, headers


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_expand_is_answered_inside_the_proxy(service, stream):
    up = ScriptedAnthropic(model=messages_model())
    with serve(up.app) as up_url, serve(_proxy(service, up_url)) as url:
        client = anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0)
        answers, headers = _messages_loop(client, stream)
    assert answers[-1] == [{"type": "text", "text": FINAL + code_word(0) + "."}]
    _no_expand_tool_seen(answers)
    assert headers[-1][EXPANSIONS_HEADER] == "1"
    assert len(_sessions_expansions(service)) == 1
    bodies = [r["body"] for r in up.messages_requests()]
    for body in bodies:  # the scripted upstream refused (400) any request whose tool_use/tool_result did not pair
        assert messages_history_tokens(body) <= B
    _prefix_kept(bodies, "messages", headers[-1])


def test_a_method_without_handles_never_offers_the_tool(service):
    """The paper's methods keep their renders: ContextRender's markers carry no handle, the tool is never added,
    and the model (which needs an omitted value) answers without it."""
    up = ChatUpstream()
    with serve(up.app) as up_url, serve(create_proxy_app(f"{up_url}/v1", service=service, budget=B,
                                                         method="contextrender")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        answers, _ = _chat_loop(client, stream=False)
    assert answers[-1]["content"] == "I cannot see record 0's code word."
    assert not any(TOOL_NAME in json.dumps(b) for b in up.requests)
    assert _sessions_expansions(service) == []
