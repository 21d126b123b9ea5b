"""The OpenAI-compatible proxy over real loopback HTTP, against a fake upstream."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextrender.graph import OMISSION_MARKER
from contextrender.service.proxy import create_proxy_app
from contextrender.service.streams import StreamAssembler

from .conftest import SYSTEM, history_tokens, remembering_upstream, serve, sse_message, tool_result

REPO = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
TWO_TOOLS = TOOLS + [{"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}]


def run_episode(url: str, task: str, turns: int, *, stream: bool = False, session: str | None = None,
                tools: list[dict[str, Any]] = TOOLS, extra: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None, tag: str = "s") -> tuple[list[dict[str, Any]], list[Any]]:
    """A client agent loop through the proxy; returns its full history and the responses."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    h = dict(headers or {})
    if session:
        h["X-ContextRender-Session"] = session
    responses = []
    with httpx.Client(timeout=30) as client:
        for turn in range(turns):
            body = {"model": "fake-model", "messages": messages, "tools": tools, "tool_choice": "auto",
                    "temperature": 0.0, "user": tag, **(extra or {})}
            if stream:
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
                with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=h) as r:
                    assert r.status_code == 200, r.read()
                    raw = b"".join(r.iter_raw())
                responses.append((r, raw))
                msg = sse_message(raw)
            else:
                r = client.post(f"{url}/v1/chat/completions", json=body, headers=h)
                assert r.status_code == 200, r.text
                responses.append(r)
                msg = r.json()["choices"][0]["message"]
            messages.append(msg)
            for k, call in enumerate(msg.get("tool_calls") or []):
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": tool_result(tag, turn, k, call)})
    return messages, responses


@pytest.fixture
def proxy(service, fake_upstream):
    fake, up_url = fake_upstream
    app = create_proxy_app(f"{up_url}/v1", service=service, budget=1500)
    with serve(app) as url:
        yield url, fake, service


def assert_budget_respected(fake, budget: int) -> None:
    assert fake.requests
    for rec in fake.requests:
        assert history_tokens(rec["body"]["messages"]) <= budget


def test_non_streaming_episode_renders_under_budget(proxy):
    url, fake, service = proxy
    messages, responses = run_episode(url, "Trace record REC_start to its owner.", 8, session="ep1",
                                      extra={"seed": 42, "metadata": {"x": 1}}, headers={"Authorization": "Bearer sk-client"})
    assert_budget_respected(fake, 1500)
    # The full history exceeded B, so the upstream got markers instead of some results.
    assert history_tokens(messages) > 1500
    last = fake.requests[-1]["body"]
    assert any(OMISSION_MARKER in (m.get("content") or "") for m in last["messages"])
    # Everything but messages is forwarded unchanged.
    for rec in fake.requests:
        b = rec["body"]
        assert b["tools"] == TOOLS and b["tool_choice"] == "auto" and b["temperature"] == 0.0
        assert b["seed"] == 42 and b["metadata"] == {"x": 1} and "stream" not in b
        assert rec["headers"]["authorization"] == "Bearer sk-client"
        assert not any(k.startswith("x-contextrender") for k in rec["headers"])
        # system prompt and the task message are always there, first and in order
        assert b["messages"][0] == {"role": "system", "content": SYSTEM}
        assert b["messages"][1]["content"] == "Trace record REC_start to its owner."
    # The response body is the upstream's; headers say what the proxy did.
    r = responses[-1]
    assert r.json()["choices"][0]["message"] == messages[-2]  # last assistant (its tool result follows)
    assert r.headers["x-contextrender-session"] == "ep1" and r.headers["x-request-id"].startswith("req-")
    assert int(r.headers["x-contextrender-tokens"]) <= 1500
    # The graph holds the client's full history (the last tool result arrives with the next request).
    stored = list(service.transcript("ep1").messages)
    assert len(stored) == len(messages) - 1
    assert [m["role"] for m in stored] == [m["role"] for m in messages[:-1]]
    assert stored[-1]["tool_calls"] == messages[-2]["tool_calls"]


def test_streaming_relays_chunks_and_records_tool_calls(proxy):
    url, fake, service = proxy
    messages, responses = run_episode(url, "Stream: follow REC_start.", 6, stream=True, session="st1",
                                      tools=TWO_TOOLS, tag="st")
    assert_budget_respected(fake, 1500)
    # Chunks reach the client byte for byte.
    for rec, (_r, raw) in zip(fake.requests, responses, strict=True):
        assert raw == rec["sent"]
        assert rec["body"]["stream"] is True and rec["body"]["stream_options"] == {"include_usage": True}
    # The assembled assistant messages (two interleaved calls each) are in the graph, in order.
    stored = list(service.transcript("st1").messages)
    asst_client = [m for m in messages if m["role"] == "assistant"]
    asst_stored = [m for m in stored if m["role"] == "assistant"]
    assert len(asst_stored) == len(asst_client) == 6
    for a, b in zip(asst_client, asst_stored, strict=True):
        assert a["content"] == b["content"] and a["tool_calls"] == b["tool_calls"]
        assert len(b["tool_calls"]) == 2
    # TFA: the streamed calls used values from earlier results -> reuse edges to them.
    edges = service.edges("st1").edges
    asst_seqs = {i for i, m in enumerate(stored) if m["role"] == "assistant"}
    tool_seqs = {i for i, m in enumerate(stored) if m["role"] == "tool"}
    assert edges and all(e.op_seq in asst_seqs and e.source in tool_seqs for e in edges)
    assert any(e.part >= 0 for e in edges)  # from a tool call's arguments, not only the text


def test_stream_assembler_handles_split_lines_and_fragments():
    from .conftest import scripted_reply, sse_chunks

    msg = scripted_reply([{"role": "tool", "content": "x REC_a_1"}], 2, "z")
    raw = b"".join(sse_chunks(msg, "c1", True))
    asm = StreamAssembler()
    for i in range(0, len(raw), 5):  # lines cut anywhere
        asm.feed(raw[i:i + 5])
    asm.close()
    assert asm.done and asm.finish_reason == "tool_calls"
    assert asm.message() == msg


def test_derived_session_and_fork_on_altered_history(proxy, caplog):
    url, fake, service = proxy
    task = "Derived: follow REC_start."
    messages, responses = run_episode(url, task, 3)
    sid = responses[0].headers["x-contextrender-session"]
    assert sid.startswith("auto-") and all(r.headers["x-contextrender-session"] == sid for r in responses)
    # A client that alters a recorded assistant message: a fork, not an error.
    altered = json.loads(json.dumps(messages))
    altered[2]["content"] = "I changed my mind."
    with caplog.at_level(logging.WARNING, logger="contextrender.service.sessions"):
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": altered}, timeout=30)
    assert r.status_code == 200
    assert r.headers["x-contextrender-session"] == f"{sid}~1"
    assert "continuing as" in caplog.text
    # The original session is untouched and continues as before.
    r2 = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages}, timeout=30)
    assert r2.headers["x-contextrender-session"] == sid
    # Same derivation for the same system prompt + first user message, new one for another task.
    _, other = run_episode(url, "Another task entirely.", 1)
    assert other[0].headers["x-contextrender-session"] not in (sid, f"{sid}~1")


def test_upstream_error_passes_through(proxy):
    url, fake, _ = proxy
    body = {"model": "fail-429", "messages": [{"role": "user", "content": "hi"}]}
    for stream in (False, True):
        r = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": stream}, timeout=30)
        assert r.status_code == 429
        assert r.json() == {"error": {"message": "slow down", "type": "rate_limit_error"}}
        assert r.headers["retry-after"] == "7"


def test_bad_requests(service, fake_upstream):
    _, up_url = fake_upstream
    app = create_proxy_app(f"{up_url}/v1", service=service, max_body_bytes=64 * 1024)
    with serve(app) as url:
        post = f"{url}/v1/chat/completions"
        r = httpx.post(post, content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        assert httpx.post(post, json=[1, 2]).status_code == 400
        r = httpx.post(post, json={"model": "m"})
        assert r.status_code == 400 and "'messages'" in r.json()["error"]["message"]
        r = httpx.post(post, json={"model": "m", "messages": [{"role": "tool", "content": "x"}]})
        assert r.status_code == 400 and "tool_call_id" in r.json()["error"]["message"]
        r = httpx.post(post, json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                       headers={"X-ContextRender-Session": "bad id with spaces"})
        assert r.status_code == 400
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}
        assert httpx.post(post, json=big).status_code == 413

        def chunks():  # no Content-Length: the streamed-body limit
            yield b'{"model": "m", "messages": [{"role": "user", "content": "'
            for _ in range(20):
                yield b"y" * 10_000
            yield b'"}]}'

        r = httpx.post(post, content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_env_key_used_and_never_stored_or_logged(service, fake_upstream, monkeypatch, caplog, tmp_path):
    fake, up_url = fake_upstream
    secret = "sk-test-SECRET-0123456789"
    monkeypatch.setenv("CONTEXTRENDER_UPSTREAM_API_KEY", secret)
    app = create_proxy_app(f"{up_url}/v1", service=service, budget=1500)
    with caplog.at_level(logging.DEBUG), serve(app) as url:
        run_episode(url, "Key test: follow REC_start.", 3, session="keyed", stream=True)
        run_episode(url, "Key test 2.", 2, session="keyed2")
        models = httpx.get(f"{url}/v1/models").json()
    assert all(rec["headers"]["authorization"] == f"Bearer {secret}" for rec in fake.requests)
    assert models["auth"] == f"Bearer {secret}" and models["data"][0]["id"] == "fake-model"
    assert secret not in caplog.text
    graph_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("graph.sqlite*"))
    assert secret.encode() not in graph_bytes


def test_relayed_answers_carry_one_date_and_one_server_header(service, fake_upstream):
    fake, up_url = fake_upstream
    with serve(create_proxy_app(f"{up_url}/v1", service=service, budget=1500)) as url:
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        models = httpx.get(f"{url}/v1/models", timeout=30)
    for r in (chat, models):
        assert r.status_code == 200
        assert len(r.headers.get_list("date")) == 1 and len(r.headers.get_list("server")) == 1, r.headers


def test_model_list_says_it_is_not_managed(service, fake_upstream):
    """docs/service.md: every answer the proxy relays without rendering says X-ContextRender-Managed: false."""
    fake, up_url = fake_upstream
    with serve(create_proxy_app(f"{up_url}/v1", service=service, budget=1500)) as url:
        r = httpx.get(f"{url}/v1/models", timeout=30)
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "fake-model"
    assert r.headers["x-contextrender-managed"] == "false"
    assert chat.status_code == 200 and "x-contextrender-managed" not in chat.headers


def test_upstream_unreachable_is_502_naming_the_url_and_the_cause_promptly(service, caplog):
    """A closed upstream port: the error names the upstream URL and why, at WARNING, and tells the SDK not to
    retry, so a client with its default retries gets it at once (well within 5 s)."""
    import time

    import openai

    with socket_port() as port:
        app = create_proxy_app(f"http://127.0.0.1:{port}/v1?api-version=secret-q", service=service,
                               connect_timeout=2)
        with serve(app) as url, caplog.at_level(logging.WARNING, logger="contextrender.service.proxy"):
            r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": "hi"}]}, timeout=30)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="k")  # default max_retries=2
            t0 = time.monotonic()
            with pytest.raises(openai.InternalServerError) as e:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            took = time.monotonic() - t0
    msg = r.json()["error"]["message"]
    assert r.status_code == 502 and r.headers["x-should-retry"] == "false"
    assert f"http://127.0.0.1:{port}/v1/chat/completions" in msg and "connection refused" in msg
    assert "secret-q" not in msg
    assert e.value.status_code == 502 and took < 5, took
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any(f"127.0.0.1:{port}" in w and "refused" in w for w in warned), warned


def test_upstream_failures_name_their_cause():
    from contextrender.service.proxy import upstream_failure

    req = httpx.Request("POST", "https://user:pw@api.example.com/v1/chat/completions?key=sk-123")
    dns = httpx.ConnectError("[Errno -2] Name or service not known", request=req)
    tls = httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", request=req)
    slow = httpx.ReadTimeout("timed out", request=req)
    assert upstream_failure(dns) == (502, "upstream https://api.example.com/v1/chat/completions unreachable: its "
                                          "host name does not resolve (DNS) (ConnectError)", False)
    assert "TLS handshake failed" in upstream_failure(tls)[1] and not upstream_failure(tls)[2]
    status, message, retry = upstream_failure(slow)
    assert (status, retry) == (504, True) and "timed out waiting for its answer" in message
    assert all("sk-123" not in upstream_failure(x)[1] and "pw" not in upstream_failure(x)[1] for x in (dns, tls, slow))


class socket_port:
    """A loopback port with nothing listening on it."""

    def __enter__(self) -> int:
        import socket

        self._s = socket.socket()
        self._s.bind(("127.0.0.1", 0))
        return self._s.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self._s.close()


def test_recorded_session_exports_to_a_replayable_trace(proxy, tmp_path):
    url, fake, service = proxy
    messages, _ = run_episode(url, "Export: follow REC_start.", 6, session="exp1", stream=True)
    # The final tool results reach the graph with the client's next request; send it.
    httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages},
               headers={"X-ContextRender-Session": "exp1"}, timeout=30)
    line = httpx.get(f"{url}/sessions/exp1/export", params={"format": "jsonl"}).text
    assert line.endswith("\n") and line.count("\n") == 1
    trace = tmp_path / "trace.jsonl"
    trace.write_text(line)
    traces = pytest.importorskip("contextrender.experiments.evaluation.traces")
    (ep,) = list(traces.read_traces(trace))
    assert ep.task_id == "exp1" and len(ep.messages) == len(messages) + 1
    assert list(ep.messages[:len(messages)]) == [
        {**m, "content": m["content"]} if m["role"] != "assistant" else
        {"role": "assistant", "content": m["content"], "tool_calls": m["tool_calls"]} for m in messages]

    out = tmp_path / "recall.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "contextrender.experiments.evaluation.replay", f"traces={trace}", "budget=1500",
                           "methods=[contextrender,cr_recency]", f"output={out}", "embedding=hashing",
                           "progress=false", f"hydra.run.dir={tmp_path / 'hydra'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    cr = report["methods"]["contextrender"]
    assert report["traces"] == 1 and report["events"] > 0
    assert cr["renders"] == 7 and cr["over_budget_renders"] == 0 and cr["recall"] is not None


def test_kept_messages_are_forwarded_as_sent(proxy):
    url, fake, _ = proxy
    parts = [{"type": "text", "text": "Describe REC_start."},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    messages = [{"role": "system", "content": SYSTEM, "cache_control": {"type": "ephemeral"}},
                {"role": "user", "content": parts}]
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages}, timeout=30)
    assert r.status_code == 200
    assert fake.requests[-1]["body"]["messages"] == messages  # parts and extra fields intact
    # A method chosen per request by header; `full` passes everything, even above B.
    history, _ = run_episode(url, "Full: follow REC_start.", 7, session="full1")
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": history},
                   headers={"X-ContextRender-Session": "full1", "X-ContextRender-Method": "full"}, timeout=30)
    assert r.status_code == 200 and fake.requests[-1]["body"]["messages"] == history
    assert history_tokens(history) > 1500
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": history},
                   headers={"X-ContextRender-Method": "nope"}, timeout=30)
    assert r.status_code == 400 and "unknown method" in r.json()["error"]["message"]


@pytest.mark.parametrize("budget,ready", [(200, False), (6000, True)])
def test_call_readiness_of_each_answer_in_a_header_and_the_session_api(service, budget, ready):
    """Each call after the first needs the id the previous tool result named. Under a budget too small for any
    result the render hid it; under a roomy one it did not. The proxy says so in X-ContextRender-Ready (the
    session's answered calls: ready / needing a value only a tool result held), and GET
    /sessions/{sid}/readiness names what the latest answer's calls lacked."""
    with serve(remembering_upstream()) as up:
        app = create_proxy_app(f"{up}/v1", service=service, budget=budget, method="prune")
        with serve(app) as url, httpx.Client(timeout=30) as client:
            messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": "Follow the records."}]
            headers = []
            for turn in range(4):
                r = client.post(f"{url}/v1/chat/completions", headers={"X-ContextRender-Session": f"ready-{budget}"},
                                json={"model": "m", "messages": messages, "tools": TOOLS, "user": f"t-{turn}"})
                assert r.status_code == 200, r.text
                headers.append(r.headers.get("x-contextrender-ready"))
                msg = r.json()["choices"][0]["message"]
                messages.append(msg)
                messages.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                                 "content": tool_result("r", turn, 0, msg["tool_calls"][0])})
            got = client.get(f"{url}/sessions/ready-{budget}/readiness").json()
    # turn 0's call needs nothing; each later answer is scored when the next request carries it
    assert headers == [None, None, "0/1" if not ready else "1/1", "0/2" if not ready else "2/2"]
    assert got["needing_calls"] == 3 and got["ready_calls"] == (3 if ready else 0)  # the proxy recorded the last
    [call] = got["previous_answer"]
    assert call["call"] == "lookup" and call["needed"] == ["REC_r_2_0"]
    assert call["missing"] == ([] if ready else ["REC_r_2_0"])
