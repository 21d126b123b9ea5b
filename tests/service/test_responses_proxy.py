"""The proxy's ``POST /v1/responses`` over real loopback HTTP: the real ``openai`` SDK's ``client.responses.create``
against a scripted Responses API upstream (tests/service/responses_upstream.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import pytest

from contextrender.graph import OMISSION_MARKER
from contextrender.service.proxy import create_proxy_app

from .conftest import FakeUpstream, serve
from .responses_upstream import (
    ScriptedResponsesUpstream,
    as_chat,
    default_script,
    history_tokens,
    items_of,
    pairing_problems,
    record_text,
    regrouped,
    request_history_tokens,
    sse_bytes,
    sse_events,
)

B = 1500
INSTRUCTIONS = "You are a careful agent. Follow the records with the tools."
LOOKUP = {"type": "function", "name": "lookup", "description": "Look a record up.",
          "parameters": {"type": "object", "properties": {"record": {"type": "string"}, "part": {"type": "integer"}},
                         "required": ["record"]}}
NOTE = {"type": "function", "name": "note", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture
def upstream():
    fake = ScriptedResponsesUpstream()
    with serve(fake.app) as url:
        yield fake, url


@pytest.fixture
def proxy(service, upstream):
    fake, up_url = upstream
    app = create_proxy_app(f"{up_url}/v1", service=service, budget=B)
    with serve(app) as url:
        yield url, fake, service


def client(url: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-client", max_retries=0, **kw)


def tool_outputs(output: list[Any], tag: str) -> list[dict[str, Any]]:
    """The agent runs each function call of a response: a large result naming the next record."""
    outs = []
    for item in output:
        if item.type == "function_call":
            args = json.loads(item.arguments)
            step = int(item.call_id.split("_")[1])
            text = record_text(args["record"], step, tag) if item.name == "lookup" else f"noted {args}"
            outs.append({"type": "function_call_output", "call_id": item.call_id, "output": text})
    return outs


def run_agent(url: str, task: str, *, stream: bool = False, tools: list[dict[str, Any]] | None = None,
              headers: dict[str, str] | None = None, tag: str = "t", max_turns: int = 20
              ) -> tuple[list[Any], list[Any]]:
    """An agent loop on the real SDK through the proxy; returns its full input history and the responses."""
    history: list[Any] = [{"role": "user", "content": task}]
    responses = []
    c = client(url, default_headers=headers or {})
    for _ in range(max_turns):
        kw: dict[str, Any] = {"model": "fake-model", "instructions": INSTRUCTIONS, "input": history,
                              "tools": tools or [LOOKUP], "store": False, "temperature": 0.0}
        if stream:
            events = list(c.responses.create(stream=True, **kw))
            assert events[-1].type == "response.completed"
            resp = events[-1].response
        else:
            resp = c.responses.create(**kw)
        responses.append(resp)
        history += [item.model_dump(mode="json", exclude_none=True) for item in resp.output]
        outs = tool_outputs(resp.output, tag)
        if not outs:
            return history, responses
        history += outs
    raise AssertionError("the scripted agent did not finish")


def assert_within_budget_and_paired(fake: ScriptedResponsesUpstream) -> None:
    assert fake.requests
    for rec in fake.requests:
        body = rec["body"]
        assert request_history_tokens(body) <= B, request_history_tokens(body)
        assert pairing_problems(items_of(body)) == []


def test_sdk_multi_step_function_calls_render_under_budget(proxy):
    url, fake, service = proxy
    history, responses = run_agent(url, "Follow the chain from REC_start; steps=8.", tag="a",
                                   headers={"X-ContextRender-Session": "resp1"})
    assert responses[-1].output_text == "Done: the chain ends at REC_a_8 after 8 steps."
    assert len(fake.requests) == 9
    assert_within_budget_and_paired(fake)
    # The client's own history is above B, so the render omitted something from what went upstream.
    assert request_history_tokens({"input": history, "instructions": INSTRUCTIONS}) > B
    last = fake.requests[-1]["body"]
    assert any(OMISSION_MARKER in str(i.get("output")) for i in last["input"] if i.get("type") == "function_call_output")
    for rec in fake.requests:
        body = rec["body"]
        # everything but input goes upstream as sent; the client's key too, and none of ours
        assert body["instructions"] == INSTRUCTIONS and body["tools"] == [LOOKUP] and body["store"] is False
        assert body["temperature"] == 0.0 and "stream" not in body
        assert rec["headers"]["authorization"] == "Bearer sk-client"
        assert not any(k.startswith("x-contextrender") for k in rec["headers"])
        assert body["input"][0] == {"role": "user", "content": "Follow the chain from REC_start; steps=8."}
        # kept items are the client's own: reasoning (with its encrypted content) and calls as sent
        sent = [json.dumps(i, sort_keys=True) for i in history]
        for item in body["input"]:
            if item.get("type") in ("reasoning", "function_call"):
                assert json.dumps(item, sort_keys=True) in sent
        assert any(i.get("type") == "reasoning" for i in body["input"][1:]) or body is fake.requests[0]["body"]
    # The graph holds the conversation once: instructions, task, one assistant message per response, the outputs.
    stored = list(service.transcript("resp1").messages)
    assert [m["role"] for m in stored[:2]] == ["system", "user"] and stored[0]["content"] == INSTRUCTIONS
    assert sum(m["role"] == "assistant" for m in stored) == len(responses)
    assert sum(m["role"] == "tool" for m in stored) == 8
    assert stored[-1] == {"role": "assistant", "content": responses[-1].output_text}
    calls = [c["id"] for m in stored if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert calls == [f"call_{n}_0" for n in range(1, 9)]


def test_headers_say_what_was_done(proxy):
    url, fake, _ = proxy
    with httpx.Client(timeout=30) as h:
        r = h.post(f"{url}/v1/responses", json={"model": "m", "input": "Follow REC_start; steps=2.",
                                                "tools": [LOOKUP]})
    assert r.status_code == 200, r.text
    assert r.headers["x-contextrender-budget"] == str(B) and r.headers["x-request-id"] == "req-1"
    assert r.headers["x-contextrender-session"].startswith("auto-") and int(r.headers["x-contextrender-tokens"]) == 0
    assert "x-contextrender-managed" not in r.headers
    # a string input goes upstream as the same string
    assert fake.requests[0]["body"]["input"] == "Follow REC_start; steps=2."
    assert r.json()["output"][1]["type"] == "function_call"


def test_streamed_events_are_relayed_as_they_come_and_recorded(proxy):
    url, fake, service = proxy
    history, responses = run_agent(url, "Stream the chain from REC_start; steps=6.", stream=True, tag="s",
                                   tools=[LOOKUP, NOTE], headers={"X-ContextRender-Session": "st1"})
    assert responses[-1].output_text.startswith("Done: the chain ends at REC_s_6")
    assert_within_budget_and_paired(fake)
    assert all(rec["body"]["stream"] is True for rec in fake.requests)
    stored = list(service.transcript("st1").messages)
    asst = [m for m in stored if m["role"] == "assistant"]
    assert len(asst) == len(responses) == 7
    for resp, m in zip(responses, asst, strict=True):
        calls = [{"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.arguments}}
                 for i in resp.output if i.type == "function_call"]
        assert m.get("tool_calls", []) == calls and (m["content"] or "") == resp.output_text
    assert all(len(m["tool_calls"]) == 2 for m in asst[:-1])
    # Byte for byte: what the upstream sent is what the client got.
    body = {"model": "m", "input": "Another: REC_start; steps=1.", "tools": [LOOKUP], "stream": True}
    with httpx.Client(timeout=30) as h, h.stream("POST", f"{url}/v1/responses", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw())
    assert raw == fake.requests[-1]["sent"]


def run_agent_interleaved(url: str, task: str, *, stream: bool, session: str, tools: list[dict[str, Any]],
                          tag: str) -> tuple[list[Any], list[Any], list[str | None]]:
    """An agent that sends each call back followed at once by its output (``call A, output A, call B, output B``,
    as Codex does); returns its history, the responses and the session header of every answer."""
    sessions: list[str | None] = []
    http = httpx.Client(timeout=30, event_hooks={"response": [
        lambda r: sessions.append(r.headers.get("x-contextrender-session"))]})
    c = client(url, http_client=http, default_headers={"X-ContextRender-Session": session})
    history: list[Any] = [{"role": "user", "content": task}]
    responses = []
    for _ in range(20):
        kw: dict[str, Any] = {"model": "fake-model", "instructions": INSTRUCTIONS, "input": history,
                              "tools": tools, "store": False}
        if stream:
            events = list(c.responses.create(stream=True, **kw))
            resp = events[-1].response
        else:
            resp = c.responses.create(**kw)
        responses.append(resp)
        outs = {o["call_id"]: o for o in tool_outputs(resp.output, tag)}
        for item in resp.output:
            history.append(item.model_dump(mode="json", exclude_none=True))
            if item.type == "function_call":
                history.append(outs[item.call_id])
        if not outs:
            http.close()
            return history, responses, sessions
    raise AssertionError("the scripted agent did not finish")


@pytest.mark.parametrize("tools,reasoning,stream", [
    ([LOOKUP, NOTE], True, False),   # reasoning, call A, output A, call B, output B (Codex)
    ([LOOKUP, NOTE], False, True),   # nothing but calls and outputs: only the recorded answers tell the turns
    ([LOOKUP], False, False),        # one call per turn: the same shape on the wire, consecutive turns
])
def test_interleaved_calls_and_outputs_never_fork(service, tools, reasoning, stream):
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        return [i for i in default_script(body, n) if reasoning or i["type"] != "reasoning"]

    fake = ScriptedResponsesUpstream(script)
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
        history, responses, sessions = run_agent_interleaved(
            url, "Follow the chain from REC_start; steps=8.", stream=stream, session="il1", tools=tools, tag="i")
    assert responses[-1].output_text == "Done: the chain ends at REC_i_8 after 8 steps."
    # One session all along: no fork (il1~1, il1~2, ...), the header never changes.
    assert sessions == ["il1"] * len(responses) and service.sessions() == ["il1"]
    # The graph holds each message once: one assistant message per response (both calls), then its outputs.
    stored = list(service.transcript("il1").messages)
    per_turn = ["assistant"] + ["tool"] * len(tools)
    assert [m["role"] for m in stored] == ["system", "user", *per_turn * 8, "assistant"]
    asst = [m for m in stored if m["role"] == "assistant"]
    for resp, m in zip(responses, asst, strict=True):
        assert [c["id"] for c in m.get("tool_calls") or []] == [i.call_id for i in resp.output
                                                                if i.type == "function_call"]
    assert [m["tool_call_id"] for m in stored if m["role"] == "tool"] == [
        i.call_id for r in responses for i in r.output if i.type == "function_call"]
    # Every request within B (measured with each turn's calls together, as the graph holds them), paired,
    # every output right after its call as the client sent it, kept items the client's own in its order.
    turns = {i.call_id: n for n, r in enumerate(responses) for i in r.output if i.type == "function_call"}
    sent = [json.dumps(i, sort_keys=True) for i in history]
    for rec in fake.requests:
        items = items_of(rec["body"])
        assert history_tokens(as_chat(regrouped(items, turns), INSTRUCTIONS)) <= B
        assert pairing_problems(items) == []
        for k, item in enumerate(items):
            if item.get("type") == "function_call_output":
                assert items[k - 1]["type"] == "function_call" and items[k - 1]["call_id"] == item["call_id"]
        kept = [sent.index(json.dumps(i, sort_keys=True)) for i in items if json.dumps(i, sort_keys=True) in sent]
        assert kept == sorted(kept)
    last = fake.requests[-1]["body"]["input"]
    assert any(OMISSION_MARKER in str(i.get("output")) for i in last if i.get("type") == "function_call_output")


def test_stream_assembled_from_items_when_completed_lists_none(service):
    """Some servers end with a response.completed whose output is empty: the items streamed before it count."""
    fake = ScriptedResponsesUpstream()

    def emptied(body: dict[str, Any], rid: str, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events = sse_events(body, rid, output)
        events[-1]["response"]["output"] = []
        return events

    fake.events = emptied
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=B)) as url:
        r = httpx.post(f"{url}/v1/responses", timeout=30, headers={"X-ContextRender-Session": "empty1"},
                       json={"model": "m", "input": "REC_start; steps=1.", "tools": [LOOKUP], "stream": True})
    assert r.status_code == 200 and '"output": []' in r.text
    stored = list(service.transcript("empty1").messages)
    assert stored[-1]["role"] == "assistant"
    assert stored[-1]["tool_calls"][0]["id"] == "call_1_0"
    assert json.loads(stored[-1]["tool_calls"][0]["function"]["arguments"]) == {"record": "REC_start", "part": 0}


@pytest.mark.parametrize("field,value", [("previous_response_id", "resp_123"), ("conversation", "conv_9")])
def test_stateful_requests_refused_by_default(proxy, field, value):
    url, fake, service = proxy
    with pytest.raises(openai.BadRequestError) as err:
        client(url).responses.create(model="m", input=[{"role": "user", "content": "go on"}], **{field: value})
    body = err.value.body
    assert isinstance(body, dict)
    assert field in body["message"] and "--stateful-responses passthrough" in body["message"]
    assert body["param"] == field and body["type"] == "invalid_request_error"
    assert err.value.status_code == 400
    r = httpx.post(f"{url}/v1/responses", json={"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]})
    assert r.status_code == 400 and "item_reference" in r.json()["error"]["message"]
    assert fake.requests == [] and service.sessions() == []


def test_stateful_requests_passed_through_unmanaged_when_asked(service, upstream, caplog):
    fake, up_url = upstream
    app = create_proxy_app(f"{up_url}/v1", service=service, budget=B, stateful_responses="passthrough")
    body = {"model": "m", "previous_response_id": "resp_1", "tools": [LOOKUP],
            "input": [{"type": "function_call_output", "call_id": "call_x", "output": record_text("REC_a", 1)}]}
    with caplog.at_level(logging.WARNING, logger="contextrender.service.proxy"), serve(app) as url:
        with httpx.Client(timeout=30) as h:
            r1 = h.post(f"{url}/v1/responses", json=body)
            with h.stream("POST", f"{url}/v1/responses", json={**body, "stream": True}) as r2:
                raw = b"".join(r2.iter_raw())
    assert r1.status_code == 200 and r1.headers["x-contextrender-managed"] == "false"
    assert "x-contextrender-session" not in r1.headers
    assert r2.status_code == 200 and r2.headers["x-contextrender-managed"] == "false"
    assert raw == fake.requests[1]["sent"] and b"response.completed" in raw
    assert fake.requests[0]["body"] == body  # as sent, not rendered
    warnings = [r for r in caplog.records if "previous_response_id" in r.getMessage()]
    assert len(warnings) == 1 and "unmanaged" in warnings[0].getMessage()
    assert service.sessions() == []
    with pytest.raises(ValueError, match="stateful_responses"):
        create_proxy_app(f"{up_url}/v1", service=service, stateful_responses="maybe")


def test_other_chat_like_endpoints_are_never_passed_silently(service, fake_upstream, caplog):
    fake, up_url = fake_upstream
    app = create_proxy_app(f"{up_url}/v1", service=service, budget=B)
    with caplog.at_level(logging.WARNING, logger="contextrender.service.proxy"), serve(app) as url:
        with httpx.Client(timeout=30) as h:
            legacy = [h.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi"}) for _ in range(2)]
            emb = h.post(f"{url}/v1/embeddings", json={"model": "m", "input": "hi"})
            # the rendered route spelled with a trailing slash is rendered, not passed through
            chat = h.post(f"{url}/v1/chat/completions/", json={"model": "m", "messages": [
                {"role": "user", "content": "Follow REC_start."}]})
    for r in (*legacy, emb):
        assert r.status_code == 200 and r.headers["x-contextrender-managed"] == "false"
    assert [o["path"] for o in fake.other] == ["/v1/completions", "/v1/completions", "/v1/embeddings"]
    warned = [r.getMessage() for r in caplog.records if "/v1/completions" in r.getMessage()]
    assert len(warned) == 1 and "not held under B" in warned[0]
    assert not any("embeddings" in r.getMessage() for r in caplog.records)
    assert chat.status_code == 200 and "x-contextrender-managed" not in chat.headers
    assert chat.headers["x-contextrender-session"].startswith("auto-") and len(fake.requests) == 1


def test_bad_requests_name_what_is_wrong(proxy):
    url, fake, service = proxy
    post = f"{url}/v1/responses"
    with httpx.Client(timeout=30) as h:
        r = h.post(post, json={"model": "m"})
        assert r.status_code == 400 and "'input'" in r.json()["error"]["message"]
        r = h.post(post, json={"model": "m", "input": [{"role": "wizard", "content": "x"}]})
        assert r.status_code == 400 and "input[0]" in r.json()["error"]["message"]
        r = h.post(post, json={"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})
        assert r.status_code == 400 and "call_id" in r.json()["error"]["message"]
        r = h.post(post, json={"model": "m", "input": "x", "instructions": ["not", "a", "string"]})
        assert r.status_code == 400 and "'instructions'" in r.json()["error"]["message"]
        r = h.post(post, content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400
        r = h.post(post, content=b"input=x", headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415
    assert fake.requests == [] and service.sessions() == []


def test_upstream_error_passes_through(proxy):
    url, _, _ = proxy
    for stream in (False, True):
        r = httpx.post(f"{url}/v1/responses", json={"model": "fail-429", "input": "hi", "stream": stream}, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        assert r.json()["error"]["message"] == "slow down"


def remembering_script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """A model that remembers what the render may hide: response n looks up the record result n-1 named."""
    record = "REC_start" if n == 1 else f"REC_r_{n - 1}"
    return [{"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}_0", "name": "lookup",
             "arguments": json.dumps({"record": record}), "status": "completed"}]


@pytest.mark.parametrize("budget,ready", [(200, False), (6000, True)])
def test_readiness_header_and_session_api(service, budget, ready):
    """Each call after the first needs the id the previous result named: under a budget too small for any
    result the render hid it, under a roomy one it did not (X-ContextRender-Ready, GET .../readiness)."""
    fake = ScriptedResponsesUpstream(remembering_script)
    with serve(fake.app) as up, serve(create_proxy_app(f"{up}/v1", service=service, budget=budget,
                                                       method="prune")) as url:
        history: list[Any] = [{"role": "user", "content": "Follow the records."}]
        seen = []
        with httpx.Client(timeout=30) as h:
            for n in range(1, 5):
                r = h.post(f"{url}/v1/responses", headers={"X-ContextRender-Session": f"ready-{budget}"},
                           json={"model": "m", "input": history, "tools": [LOOKUP]})
                assert r.status_code == 200, r.text
                seen.append(r.headers.get("x-contextrender-ready"))
                call = r.json()["output"][0]
                history += [call, {"type": "function_call_output", "call_id": call["call_id"],
                                   "output": record_text(json.loads(call["arguments"])["record"], n, "r")}]
            got = h.get(f"{url}/sessions/ready-{budget}/readiness").json()
    assert seen == [None, None, "1/1" if ready else "0/1", "2/2" if ready else "0/2"]
    assert got["needing_calls"] == 3 and got["ready_calls"] == (3 if ready else 0)
    assert_within_budget_and_paired_at(fake, budget)


def assert_within_budget_and_paired_at(fake: ScriptedResponsesUpstream, budget: int) -> None:
    for rec in fake.requests:
        assert request_history_tokens(rec["body"]) <= budget
        assert pairing_problems(items_of(rec["body"])) == []


def test_sse_fixture_is_what_the_sdk_reads():
    """The scripted upstream's SSE is the API's: the SDK's own stream parser accepts every event."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    body = {"model": "m", "tools": [LOOKUP], "input": "REC_start; steps=1."}
    from .responses_upstream import default_script

    raw = b"".join(sse_bytes(sse_events(body, "resp_x", default_script(body, 1))))
    adapter = TypeAdapter(ResponseStreamEvent)
    kinds = [adapter.validate_python(json.loads(line[6:])).type for line in raw.decode().splitlines()
             if line.startswith("data: ")]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    from openai.types.responses import Response

    from .responses_upstream import response_object

    assert Response.model_validate(response_object(body, "resp_x", default_script(body, 1))).output[1].type == \
        "function_call"
    assert "response.function_call_arguments.delta" in kinds and "response.output_item.done" in kinds


def test_chat_completions_still_served(service, fake_upstream):
    """The chat route is unchanged by the Responses route beside it."""
    fake, up_url = fake_upstream
    assert isinstance(fake, FakeUpstream)
    with serve(create_proxy_app(f"{up_url}/v1", service=service, budget=B)) as url:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                       json={"model": "m", "messages": [{"role": "user", "content": "Follow REC_start."}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"]


def test_cli_flag_reaches_the_proxy():
    from contextrender.cli import build_parser

    args = build_parser().parse_args(["proxy", "--upstream", "http://127.0.0.1:9/v1", "--stateful-responses",
                                      "passthrough"])
    assert args.stateful_responses == "passthrough"
    assert build_parser().parse_args(["proxy", "--upstream", "http://127.0.0.1:9/v1"]).stateful_responses == "refuse"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["proxy", "--upstream", "u", "--stateful-responses", "sometimes"])
