"""The proxy's Anthropic Messages API (POST /v1/messages): the real anthropic SDK and LangChain's ChatAnthropic
through the proxy over loopback HTTP, against a scripted Messages API upstream."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextrender import HashingEmbedder
from contextrender.graph import OMISSION_MARKER
from contextrender.service import anthropic_messages
from contextrender.service.guard import AccessPolicy
from contextrender.service.proxy import create_proxy_app
from contextrender.service.sessions import ContextService

from .anthropic_upstream import (
    LOOKUP,
    OTHER,
    ScriptedAnthropic,
    history_tokens,
    pairing_problems,
    tool_result_text,
)
from .conftest import serve

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK: pip install anthropic")

B = 1500
SYSTEM = [{"type": "text", "text": "You are a careful agent. Use the tools."},
          {"type": "text", "text": "Records live in the registry.", "cache_control": {"type": "ephemeral"}}]


@pytest.fixture
def upstream():
    fake = ScriptedAnthropic()
    with serve(fake.app) as url:
        yield fake, url


@pytest.fixture
def proxy(service, upstream):
    fake, up_url = upstream
    with serve(create_proxy_app(f"{up_url}/v1", service=service, budget=B)) as url:
        yield url, fake, service


def sdk(url: str, key: str = "sk-ant-client", **kw: Any) -> Any:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, **kw)


def results_for(msg: Any, tag: str, turn: int, cache_last: bool = False) -> dict[str, Any]:
    """The user turn answering every tool_use of ``msg`` (an SDK Message)."""
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": b.id, "content": tool_result_text(tag, turn, k, b.input["record"])}
        for k, b in enumerate(b for b in msg.content if b.type == "tool_use")]
    if cache_last:
        blocks[-1]["cache_control"] = {"type": "ephemeral"}
    return {"role": "user", "content": blocks}


def upstream_key(headers: dict[str, str]) -> str | None:
    """The API key a request carried (the SDK sends it as a bearer token or in x-api-key)."""
    auth = headers.get("authorization", "")
    return headers.get("x-api-key") or (auth[7:] if auth.startswith("Bearer ") else None)


def run_agent(client: Any, task: str, *, stream: str = "", tools: list[dict[str, Any]] | None = None,
              thinking: bool = False, headers: dict[str, str] | None = None,
              tag: str = "t") -> tuple[list[dict[str, Any]], list[Any]]:
    """An ordinary tool loop with the SDK until the model stops calling tools; returns the history and each
    answer (the SDK's Message). ``stream``: "" (plain), "create" (stream=True) or "helper" (messages.stream)."""
    history: list[dict[str, Any]] = [{"role": "user", "content": task}]
    answers = []
    kw: dict[str, Any] = {"model": "claude-test", "max_tokens": 512, "system": SYSTEM, "tools": tools or [LOOKUP],
                          "extra_headers": headers or {}}
    if thinking:
        kw["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    for turn in range(20):
        if stream == "helper":
            with client.messages.stream(messages=history, **kw) as s:
                msg = s.get_final_message()
        elif stream == "create":
            events = list(client.messages.create(messages=history, stream=True, **kw))
            msg = _assemble(events)
        else:
            msg = client.messages.create(messages=history, **kw)
        answers.append(msg)
        history.append({"role": "assistant", "content": msg.content})  # the SDK's blocks, as agents append them
        if msg.stop_reason != "tool_use":
            return history, answers
        # one breakpoint on the newest turn, moved along as Claude Code moves its own (the API takes 4 at most)
        history = [{**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]}
                   if m["role"] == "user" and isinstance(m["content"], list) else m for m in history]
        history.append(results_for(msg, tag, turn, cache_last=True))
    raise AssertionError("the scripted model never finished")


def _assemble(events: list[Any]) -> Any:
    """The caller's own assembly of raw stream events into a Message (independent of the proxy's)."""
    start = next(e for e in events if e.type == "message_start").message
    blocks: dict[int, dict[str, Any]] = {}
    json_parts: dict[int, str] = {}
    stop = None
    for e in events:
        if e.type == "content_block_start":
            blocks[e.index] = e.content_block.model_dump(exclude_none=True)
        elif e.type == "content_block_delta":
            d = e.delta
            if d.type == "text_delta":
                blocks[e.index]["text"] += d.text
            elif d.type == "input_json_delta":
                json_parts[e.index] = json_parts.get(e.index, "") + d.partial_json
            elif d.type == "thinking_delta":
                blocks[e.index]["thinking"] += d.thinking
            elif d.type == "signature_delta":
                blocks[e.index]["signature"] += d.signature
        elif e.type == "message_delta":
            stop = e.delta.stop_reason
    for i, raw in json_parts.items():
        blocks[i]["input"] = json.loads(raw)
    return anthropic.types.Message.model_validate(
        {**start.model_dump(), "content": [blocks[i] for i in sorted(blocks)], "stop_reason": stop})


def assert_within_budget_and_paired(fake: ScriptedAnthropic, budget: int = B) -> list[dict[str, Any]]:
    reqs = fake.messages_requests()
    assert reqs
    for rec in reqs:
        assert history_tokens(rec["body"]) <= budget
        assert pairing_problems(rec["body"]["messages"]) == []
    return reqs


def as_sent(history: list[Any]) -> list[Any]:
    """The history as the SDK serialises it into a request body."""
    return json.loads(json.dumps(history, default=lambda o: o.model_dump(mode="json", exclude_unset=True)))


@pytest.mark.parametrize("stream", ["", "create", "helper"])
def test_sdk_tool_loop_renders_under_budget(proxy, stream):
    url, fake, service = proxy
    client = sdk(url)
    history, answers = run_agent(client, "Follow REC_start to its owner. steps=8", stream=stream,
                                 headers={"X-ContextRender-Session": f"loop{stream}"}, tools=[LOOKUP, OTHER])
    reqs = assert_within_budget_and_paired(fake)
    assert len(reqs) == 9 and answers[-1].content[-1].text.startswith("DONE REC_t_7_")
    full = as_sent(history[:-1])
    assert history_tokens({"system": SYSTEM, "messages": full}) > B  # the render had work to do
    last = reqs[-1]["body"]
    assert any(OMISSION_MARKER in json.dumps(m) for m in last["messages"])
    for rec in reqs:
        body = rec["body"]
        # everything but messages goes as sent; system and the task message stay; the key goes upstream
        assert body["system"] == SYSTEM and [t["name"] for t in body["tools"]] == ["lookup", "other"]
        assert body["messages"][0] == {"role": "user", "content": "Follow REC_start to its owner. steps=8"}
        assert upstream_key(rec["headers"]) == "sk-ant-client"
        assert not any(k.startswith("x-contextrender") for k in rec["headers"])
        assert bool(body.get("stream")) == bool(stream)
    # the current turn (tool results with cache_control) goes exactly as the client sent it
    assert last["messages"][-1] == full[-1] and last["messages"][-1]["content"][-1]["cache_control"]
    # the graph holds the conversation once, the final answer recorded by the proxy
    stored = list(service.transcript(f"loop{stream}").messages)
    assert [m["role"] for m in stored] == ["system", "system", "user"] + ["assistant", "tool", "tool"] * 8 + [
        "assistant"]
    assert stored[-1]["content"] == answers[-1].content[-1].text


def test_streamed_bytes_relayed_unchanged_and_headers(proxy):
    url, fake, _ = proxy
    body = {"model": "m", "max_tokens": 64, "stream": True, "tools": [LOOKUP],
            "messages": [{"role": "user", "content": "Raw stream. steps=2"}]}
    with httpx.stream("POST", f"{url}/v1/messages?beta=true", json=body, timeout=30,
                      headers={"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-raw"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw())
        sid = r.headers["x-contextrender-session"]
    rec = fake.messages_requests()[-1]
    assert raw == rec["sent"] and b"event: ping" in raw and b"input_json_delta" in raw
    assert rec["query"] == {"beta": "true"} and sid.startswith("auto-")
    assert int(r.headers["x-contextrender-tokens"]) == 0 and r.headers["x-contextrender-budget"] == str(B)


def test_thinking_and_cache_control_preserved(proxy):
    """Thinking blocks (with their signatures), redacted thinking and cache_control go upstream exactly as the
    client sent them in every message the render keeps; the text the graph stores has none of them."""
    url, fake, service = proxy
    client = sdk(url)
    redacted = {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "EuYBCkQYAiJA=="},
        {"type": "text", "text": "Noted.", "cache_control": {"type": "ephemeral"}}]}
    task = {"role": "user", "content": [{"type": "text", "text": "Think, then follow REC_start. steps=3",
                                         "cache_control": {"type": "ephemeral"}}]}
    history: list[Any] = [task, redacted, {"role": "user", "content": "Go on."}]
    for turn in range(5):
        msg = client.messages.create(model="m", max_tokens=2048, system=SYSTEM, tools=[LOOKUP], messages=history,
                                     thinking={"type": "enabled", "budget_tokens": 1024},
                                     extra_headers={"X-ContextRender-Session": "think"})
        history.append({"role": "assistant", "content": msg.content})
        if msg.stop_reason != "tool_use":
            break
        history.append(results_for(msg, "th", turn))
    reqs = assert_within_budget_and_paired(fake)
    sent = as_sent(history)
    for rec in reqs:
        for m in rec["body"]["messages"]:
            thought = [b for b in m["content"] if isinstance(m["content"], list)
                       and b["type"] in ("thinking", "redacted_thinking")]
            if thought:  # an assistant message with thinking is always the client's own, byte for byte
                assert m in sent
        assert rec["body"]["messages"][0] == sent[0]  # cache_control on the task kept
    assert any(m == sent[1] for m in reqs[-1]["body"]["messages"])  # redacted thinking kept as sent
    stored = service.transcript("think").messages
    assert stored[3] == {"role": "assistant", "content": "Noted."}
    assert all("sig-" not in json.dumps(m) for m in stored)


def test_same_session_key_as_chat_completions(proxy):
    """The derived key is the chat path's: system prompt + first user message, whichever API sent them."""
    url, fake, service = proxy
    r = httpx.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 9, "system": "Sys prompt.",
                                               "messages": [{"role": "user", "content": "Same task."}]}, timeout=30)
    from contextrender.adapters._common import derive_session_key

    key = derive_session_key([{"role": "system", "content": "Sys prompt."}, {"role": "user", "content": "Same task."}])
    assert r.status_code == 200 and r.headers["x-contextrender-session"] == key
    assert r.json()["type"] == "message"


def test_readiness_header(proxy):
    url, fake, _ = proxy
    history: list[dict[str, Any]] = [{"role": "user", "content": "Ready? steps=4"}]
    ready = []
    with httpx.Client(timeout=30) as http:
        for turn in range(5):
            r = http.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 9, "tools": [LOOKUP],
                                                      "messages": history},
                          headers={"X-ContextRender-Budget": "6000", "X-ContextRender-Session": "ready"})
            assert r.status_code == 200, r.text
            ready.append(r.headers.get("x-contextrender-ready"))
            content = r.json()["content"]
            history.append({"role": "assistant", "content": content})
            calls = [b for b in content if b["type"] == "tool_use"]
            if not calls:
                break
            history.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b["id"],
                 "content": [{"type": "text", "text": tool_result_text("rd", turn, 0, b["input"]["record"])}]}
                for b in calls]})
    # each answer after the first needed the id the previous result named, and B=6000 showed it
    assert ready[:2] == [None, None] and ready[2:] == ["1/1", "2/2", "3/3"]


def test_upstream_errors_relayed(proxy):
    url, fake, _ = proxy
    client = sdk(url)
    for stream in (False, True):
        with pytest.raises(anthropic.RateLimitError) as e:
            client.messages.create(model="fail-429", max_tokens=9, messages=[{"role": "user", "content": "hi"}],
                                   stream=stream)
        assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "7"
        assert e.value.body == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}


def test_proxy_errors_in_anthropic_shape(service, upstream):
    fake, up_url = upstream
    app = create_proxy_app(f"{up_url}/v1", service=service, max_body_bytes=64 * 1024)
    with serve(app) as url:
        client = sdk(url)
        post = f"{url}/v1/messages"
        cases = [
            (dict(content=b"{not json", headers={"content-type": "application/json"}), 400, "not valid JSON"),
            (dict(json={"model": "m"}), 400, "'messages'"),
            (dict(json={"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}),
             400, "tool_use_id"),
            (dict(json={"model": "m", "messages": [{"role": "system", "content": "x"}]}), 400, "'role'"),
            (dict(json={"model": "m", "system": 5, "messages": [{"role": "user", "content": "x"}]}), 400, "system"),
            (dict(json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                  headers={"X-ContextRender-Session": "bad id"}), 400, "X-ContextRender-Session"),
            (dict(json={"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}), 413, "limit"),
            (dict(content=b"{}", headers={"content-type": "text/plain"}), 415, "Content-Type"),
        ]
        for kw, status, text in cases:
            r = httpx.post(post, timeout=30, **kw)
            assert r.status_code == status, (kw, r.text)
            body = r.json()
            assert body["type"] == "error" and set(body) == {"type", "error"}, body
            assert text.lower() in body["error"]["message"].lower()
            assert body["error"]["type"] == ("request_too_large" if status == 413 else "invalid_request_error")
        with pytest.raises(anthropic.BadRequestError, match="tool_use_id"):
            client.messages.create(model="m", max_tokens=9, messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ""}]}])
    assert fake.messages_requests() == []  # nothing refused went upstream
    assert service.sessions() == []  # nor was stored
    # chat completions keep OpenAI's shape
    with serve(app) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m"}, timeout=30)
        assert r.status_code == 400 and "detail" in r.json()


def test_unexpected_errors_in_anthropic_shape(service, upstream, monkeypatch):
    """A 500 nobody planned for (the render raising) comes in Anthropic's shape on /v1/messages, naming only
    the error's type; chat completions keep OpenAI's."""
    fake, up_url = upstream

    def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("secret detail /home/someone/graph.sqlite")

    monkeypatch.setattr(service, "render", broken)
    with serve(create_proxy_app(f"{up_url}/v1", service=service, budget=B)) as url:
        for stream in (False, True):
            with pytest.raises(anthropic.InternalServerError) as e:
                sdk(url).messages.create(model="m", max_tokens=9, stream=stream,
                                         messages=[{"role": "user", "content": "hi"}])
            assert e.value.status_code == 500
            assert e.value.body == {"type": "error", "error": {
                "type": "api_error", "message": "internal error (RuntimeError); the service log has the details"}}
        raw = httpx.post(f"{url}/v1/messages?beta=true", timeout=30, json={
            "model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]})
        assert raw.status_code == 500 and set(raw.json()) == {"type", "error"} and "secret" not in raw.text
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 500 and chat.json()["error"]["code"] == 500 and "detail" in chat.json()
    assert fake.messages_requests() == []


def test_upstream_unreachable_is_anthropic_502(service):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        with serve(create_proxy_app(f"http://127.0.0.1:{port}/v1", service=service, connect_timeout=2)) as url:
            with pytest.raises(anthropic.InternalServerError) as e:
                sdk(url).messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": "hi"}])
    finally:
        s.close()
    assert e.value.status_code == 502 and e.value.body["error"]["type"] == "api_error"
    assert "unreachable: connection refused" in e.value.body["error"]["message"]
    assert f"127.0.0.1:{port}/v1/messages" in e.value.body["error"]["message"]


def test_upstream_unreachable_while_streaming_is_in_the_messages_shape(service):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        with serve(create_proxy_app(f"http://127.0.0.1:{port}/v1", service=service, connect_timeout=2)) as url:
            r = httpx.post(f"{url}/v1/messages", timeout=30, json={
                "model": "m", "max_tokens": 9, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    finally:
        s.close()
    assert r.status_code == 502 and r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"


def test_token_as_api_key_and_env_key_upstream(service, upstream, monkeypatch, caplog, tmp_path):
    """With an access token, an Anthropic SDK gives it as its API key; the proxy sends the operator's key in
    x-api-key instead, and neither key reaches the logs or the graph."""
    fake, up_url = upstream
    token, secret = "tok-0123456789abcdef", "sk-ant-api03-SECRET-0123456789"
    monkeypatch.setenv("CONTEXTRENDER_UPSTREAM_API_KEY", secret)
    access = AccessPolicy.for_bind("127.0.0.1", token=token)
    with caplog.at_level(logging.DEBUG), serve(create_proxy_app(f"{up_url}/v1", service=service,
                                                                access=access)) as url:
        with pytest.raises(anthropic.AuthenticationError) as e:
            sdk(url, key="wrong-key-0123456789").messages.create(model="m", max_tokens=9,
                                                                messages=[{"role": "user", "content": "hi"}])
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
        run_agent(sdk(url, key=token), "Keyed. steps=2", stream="helper")
        # Claude Code's way: the token in x-api-key
        r = httpx.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 9, "messages": [
            {"role": "user", "content": "x-api-key"}]}, headers={"x-api-key": token, "anthropic-version": "2023-06-01"},
            timeout=30)
        assert r.status_code == 200, r.text
        counted = sdk(url, key=token).messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    reqs = fake.messages_requests()
    assert len(reqs) == 4 and all(r["headers"]["x-api-key"] == secret for r in reqs)
    assert not any("authorization" in r["headers"] for r in reqs)
    assert all(token not in json.dumps(r["headers"]) for r in fake.requests)
    count_req = [r for r in fake.requests if r["path"].endswith("count_tokens")]
    assert counted.input_tokens > 0 and count_req[0]["headers"]["x-api-key"] == secret
    assert "count_tokens is passed through" in caplog.text
    assert secret not in caplog.text and token not in caplog.text
    graph = b"".join(p.read_bytes() for p in tmp_path.glob("graph.sqlite*"))
    assert secret.encode() not in graph and token.encode() not in graph


def test_langchain_chat_anthropic_through_the_proxy(proxy):
    lc = pytest.importorskip("langchain_anthropic", reason="pip install langchain-anthropic")
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

    url, fake, service = proxy
    model = lc.ChatAnthropic(model="claude-test", base_url=url, api_key="sk-ant-lc", max_retries=0,
                             max_tokens=256, default_headers={"X-ContextRender-Session": "lc"})
    bound = model.bind_tools([LOOKUP])
    messages: list[Any] = [SystemMessage("You are a careful agent."), HumanMessage("Follow REC_start. steps=7")]
    for turn in range(10):
        ai = bound.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            break
        for k, call in enumerate(ai.tool_calls):
            messages.append(ToolMessage(tool_result_text("lc", turn, k, call["args"]["record"]),
                                        tool_call_id=call["id"]))
    assert "DONE REC_lc_6_0" in str(messages[-1].content)
    reqs = assert_within_budget_and_paired(fake)
    assert len(reqs) == 8
    assert any(OMISSION_MARKER in json.dumps(r["body"]["messages"]) for r in reqs)
    # one session throughout: LangChain's re-sent answers matched what the proxy recorded
    assert service.sessions() == ["lc"] and len(service.transcript("lc").messages) == 2 + 7 * 2 + 1


def test_repair_drops_only_broken_pairs():
    ok_user = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "A"},
                                           {"type": "text", "text": "and"}]}
    asst = {"role": "assistant", "content": [{"type": "text", "text": "t"},
                                             {"type": "tool_use", "id": "a", "name": "f", "input": {}},
                                             {"type": "tool_use", "id": "b", "name": "f", "input": {}}]}
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "z", "content": "Z"}]}
    msgs = [{"role": "user", "content": "task"}, asst, ok_user, orphan]
    assert pairing_problems(msgs) != []
    fixed = anthropic_messages.repair_pairing(msgs)
    assert pairing_problems(fixed) == [] and anthropic_messages.pairing_errors(fixed) == []
    assert fixed[0] is msgs[0] and fixed[2] is ok_user and len(fixed) == 3  # the orphan-only message went
    assert [b.get("id") for b in fixed[1]["content"]] == [None, "a"]  # unanswered "b" dropped, "a" kept
    assert anthropic_messages.repair_pairing(fixed)[1] is fixed[1]


# -- the conversion, as a property -----------------------------------------------------------

_words = st.text(alphabet="abcdefgh REC_0123456789", min_size=0, max_size=60)


@st.composite
def conversations(draw: Any) -> tuple[Any, list[dict[str, Any]]]:
    """A random valid Messages API conversation: text and tool turns, results as strings or blocks,
    extra blocks beside results, thinking, cache_control; sizes that often exceed B."""
    system: Any = draw(st.one_of(st.none(), _words, st.lists(
        st.builds(lambda t: {"type": "text", "text": t}, _words), max_size=2)))
    msgs: list[dict[str, Any]] = [{"role": "user", "content": draw(_words) or "task"}]
    pending: list[str] = []
    for i in range(draw(st.integers(1, 12))):
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(_words), "signature": f"s{i}"})
        if draw(st.booleans()):
            blocks.append({"type": "text", "text": draw(_words)})
        pending = [f"toolu_{i}_{k}" for k in range(draw(st.integers(0, 3)))]
        blocks += [{"type": "tool_use", "id": c, "name": "lookup", "input": {"q": draw(_words)}} for c in pending]
        msgs.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "ok"}]})
        user: list[dict[str, Any]] = []
        for c in pending:
            size = draw(st.integers(0, 400))
            body = " ".join(f"v{j}" for j in range(size))
            content: Any = body if draw(st.booleans()) else [{"type": "text", "text": body}]
            block = {"type": "tool_result", "tool_use_id": c, "content": content}
            if draw(st.booleans()):
                block["cache_control"] = {"type": "ephemeral"}
            user.append(block)
        if not pending or draw(st.booleans()):
            user.append({"type": "text", "text": draw(_words) or "next"})
        msgs.append({"role": "user", "content": user if draw(st.booleans()) or pending else user[-1]["text"]})
    return system, msgs


@pytest.fixture(scope="module")
def prop_service():
    svc = ContextService(":memory:", embedder=HashingEmbedder(dim=64), default_budget=400, warm=False)
    yield svc
    svc.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=conversations(), budget=st.sampled_from([150, 400, 1200]),
       method=st.sampled_from(["contextrender", "prune", "cr_recency"]))
def test_forwarded_history_never_above_budget_and_always_paired(prop_service, conv, budget, method):
    system, msgs = conv
    converted = anthropic_messages.to_openai(system, msgs)
    sid = f"prop-{abs(hash(json.dumps(conv))) % 10**12}-{budget}-{method}"
    res = prop_service.render(sid, messages=list(converted.messages), budget=budget, method=method,
                              on_conflict="fork")
    fwd = anthropic_messages.forwarded_messages(msgs, converted, res)
    assert history_tokens({"system": system, "messages": fwd}) <= budget
    assert pairing_problems(fwd) == [] and anthropic_messages.pairing_errors(fwd) == []
    assert fwd[-1]["role"] == "user"  # the current turn is there, and the task, perhaps merged with a later user turn
    task = msgs[0]["content"] if isinstance(msgs[0]["content"], list) else [{"type": "text", "text": msgs[0]["content"]}]
    assert fwd[0] is msgs[0] or fwd[0]["content"][:len(task)] == task
    assert not [k for k in range(1, len(fwd)) if fwd[k]["role"] == fwd[k - 1]["role"] == "user"]  # never two at once
    assert_blocks_as_sent(msgs, fwd)


def assert_blocks_as_sent(msgs: list[dict[str, Any]], fwd: list[dict[str, Any]]) -> None:
    """Every forwarded thinking, tool_use or text block is the client's own object (or, for a block that took
    the breakpoint of one the render dropped, a copy with it: test_anthropic_breakpoints.py); a tool_result
    differs from the client's at most in its content (an omitted result's marker), cache_control kept."""
    originals = {id(b): b for o in msgs if isinstance(o["content"], list) for b in o["content"]}
    results = {b["tool_use_id"]: b for b in originals.values() if b["type"] == "tool_result"}

    def bare(b: dict[str, Any], *keys: str) -> dict[str, Any]:
        return {k: v for k, v in b.items() if k not in keys}

    for m in fwd:
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b["type"] == "tool_result":
                orig = results[b["tool_use_id"]]
                assert bare(b, "content", "cache_control") == bare(orig, "content", "cache_control")
                assert "cache_control" not in orig or b["cache_control"] == orig["cache_control"]
            elif "cache_control" in b and id(b) not in originals:
                assert b["type"] != "thinking" and bare(b, "cache_control") in list(originals.values())
            elif b["type"] != "text" or id(b) in originals:
                assert id(b) in originals and originals[id(b)] is b
