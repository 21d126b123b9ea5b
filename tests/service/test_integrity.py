"""Data integrity in the service: atomic batches, real clients' messages, stream assembly,
bounded memory, one writer per graph, budgets refused up front."""

from __future__ import annotations

import json
import logging
import multiprocessing
import subprocess
import sys

import httpx
import pytest

from contextrender import ContextRender, HashingEmbedder
from contextrender.files import LockedError
from contextrender.graph import ContextGraph, GraphError
from contextrender.registry import build_policy, method_config
from contextrender.service.proxy import create_proxy_app
from contextrender.service.server import create_app
from contextrender.service.sessions import ContextService
from contextrender.service.streams import StreamAssembler

from .conftest import SYSTEM, serve
from .test_cli import REPO, free_port

METHODS = ["full", "prune", "compact", "recency_summary", "semantic_retrieval", "acon", "contextrender",
           "contextrender_plus"]


def _msgs(tag: str, n: int = 2) -> list[dict]:
    out = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {tag}"}]
    for i in range(n):
        cid = f"c_{tag}_{i}"
        out += [{"role": "assistant", "content": None,
                 "tool_calls": [{"id": cid, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": cid, "content": f"REC_{tag}_{i} " + "filler " * 200}]
    return out


@pytest.fixture
def svc(tmp_path):
    s = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64), default_budget=500)
    yield s
    s.close()


# -- 7: batches are atomic ---------------------------------------------------------------------------------


def test_batch_with_lone_surrogate_stores_nothing(svc):
    with serve(create_app(service=svc)) as url:
        good = _msgs("b", 2)
        bad = good[:3] + [{"role": "tool", "tool_call_id": "c_b_0", "content": "broken \ud800 text"}]
        # json.dumps escapes the surrogate as \ud800, exactly what a buggy client sends on the wire.
        raw = json.dumps(bad)
        assert "\\ud800" in raw
        r = httpx.post(f"{url}/sessions/atomic/messages", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "messages[3]" in r.json()["detail"] and "surrogate" in r.json()["detail"]
        assert not svc.exists("atomic") or svc.info("atomic").messages == 0
        # The client's corrected retry stores each message exactly once.
        r = httpx.post(f"{url}/sessions/atomic/messages", json=good)
        assert r.status_code == 200 and r.json()["added"] == len(good)
        assert svc.info("atomic").messages == len(good)
        # Same through sync mode, on top of the stored prefix.
        more = good + [{"role": "user", "content": "and \udfff"}]
        r = httpx.post(f"{url}/sessions/atomic/messages", content=json.dumps({"messages": more, "mode": "sync"}),
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and svc.info("atomic").messages == len(good)


def test_proxy_rejects_bad_batch_before_storing(svc, fake_upstream):
    fake, up = fake_upstream
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=500)) as url:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi \ud800"}]}
        r = httpx.post(f"{url}/v1/chat/completions", content=json.dumps(body),
                       headers={"content-type": "application/json", "x-contextrender-session": "px"})
        assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]
        assert not svc.exists("px") and fake.requests == []


def test_graph_batch_rolls_back_and_memory_matches_file(tmp_path):
    path = tmp_path / "g.sqlite"
    g1, g2 = ContextGraph(path), ContextGraph(path)
    s1, s2 = g1.session("shared"), g2.session("shared")
    s1.extend(_msgs("x", 1))
    # g2's in-memory view is stale: its append collides with g1's rows. It must refuse, not corrupt.
    with pytest.raises(GraphError, match="another writer"):
        s2.extend([{"role": "user", "content": "late"}, {"role": "user", "content": "later"}])
    # g2 reloaded from the file: it now holds exactly g1's messages and can continue consistently.
    assert len(s2) == len(s1) == 4 and s2.openai_messages() == s1.openai_messages()
    s2.add({"role": "user", "content": "after reload"})
    g1.close(), g2.close()
    with ContextGraph(path) as g:
        msgs = g.session("shared").openai_messages()
    assert [m["content"] for m in msgs][-1] == "after reload" and len(msgs) == 5


# -- 8: messages real clients send -------------------------------------------------------------------------


def test_developer_role_is_the_system_prompt(svc):
    as_system = _msgs("d", 2)
    as_developer = [{**as_system[0], "role": "developer"}] + as_system[1:]
    with serve(create_app(service=svc)) as url:
        a = httpx.post(f"{url}/sessions/sys/render", json={"messages": as_system, "budget": 500}).json()
        b = httpx.post(f"{url}/sessions/dev/render", json={"messages": as_developer, "budget": 500}).json()
        assert a["tokens"] == b["tokens"] and a["full_tokens"] == b["full_tokens"]
        assert b["messages"][0]["role"] == "developer"


def test_legacy_function_role_is_a_clear_400(svc, fake_upstream):
    _fake, up = fake_upstream
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=500)) as url:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"},
                                           {"role": "assistant", "content": None,
                                            "function_call": {"name": "f", "arguments": "{}"}},
                                           {"role": "function", "name": "f", "content": "42"}]}
        r = httpx.post(f"{url}/v1/chat/completions", json=body)
        assert r.status_code == 400 and "legacy function-calling" in r.json()["error"]["message"]
        # SDK dumps carry function_call: null on every assistant message; that is fine.
        ok = {"model": "m", "messages": [{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": "yo", "function_call": None},
                                         {"role": "user", "content": "again"}]}
        assert httpx.post(f"{url}/v1/chat/completions", json=ok).status_code == 200


# -- 9: stream assembly --------------------------------------------------------------------------------------


def _sse(*deltas: object, finish: str | None = "tool_calls") -> list[bytes]:
    out = [f"data: {json.dumps({'choices': [{'index': 0, 'delta': d}]})}\n\n".encode() for d in deltas]
    out.append(f"data: {json.dumps({'choices': [{'index': 0, 'delta': {}, 'finish_reason': finish}]})}\n\n".encode())
    out.append(b"data: [DONE]\n\n")
    return out


def _assemble(chunks: list[bytes]) -> dict:
    asm = StreamAssembler()
    for c in chunks:
        asm.feed(c)
    asm.close()
    return asm.message()


def test_fragments_without_index_are_split_by_id():
    msg = _assemble(_sse(
        {"tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"function": {"arguments": '{"city": "Paris"}'}}]},
        {"tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}))
    calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
    assert calls == [("call_1", "get_weather", '{"city": "Paris"}'), ("call_2", "get_time", "{}")]


def test_null_index_and_junk_deltas_do_not_raise():
    msg = _assemble(_sse(
        {"tool_calls": [{"index": None, "id": "a", "function": {"name": "f", "arguments": "{"}}]},
        {"tool_calls": [{"index": None, "function": {"arguments": "}"}}]},
        "not an object", {"tool_calls": ["junk", {"index": 0, "function": "junk"}]},
        {"tool_calls": [{"index": 3, "id": "b", "function": {"name": "g", "arguments": {"x": 1}}}]}))
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        ("a", "f", "{}"), ("b", "g", '{"x": 1}')]
    # Index reuse with a new id (some servers restart at 0 per call) starts a new call.
    msg = _assemble(_sse({"tool_calls": [{"index": 0, "id": "p", "function": {"name": "f", "arguments": "1"}}]},
                         {"tool_calls": [{"index": 0, "id": "q", "function": {"name": "g", "arguments": "2"}}]}))
    assert [c["id"] for c in msg["tool_calls"]] == ["p", "q"]


def test_broken_stream_is_relayed_whole_and_recorded_best_effort(svc, fake_upstream, caplog):
    fake, up = fake_upstream
    chunks = _sse({"content": "partial "}, "junk-delta",
                  {"tool_calls": [{"index": None, "id": "s1", "function": {"name": "lookup", "arguments": "{}"}}]})
    chunks.insert(1, b"data: {not json\n\n")
    fake.stream_override = chunks
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=500)) as url, caplog.at_level(logging.WARNING):
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                          headers={"x-contextrender-session": "bs"}) as r:
            raw = b"".join(r.iter_raw())
        assert r.status_code == 200 and raw == b"".join(chunks)  # every byte reached the client
    stored = list(svc.transcript("bs").messages)
    assert stored[-1]["tool_calls"][0]["id"] == "s1" and stored[-1]["content"] == "partial "


# -- 10: bounded memory, one writer, budgets -----------------------------------------------------------------


def test_session_cache_is_bounded_and_reloads_identically(tmp_path):
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64), default_budget=500,
                         max_sessions=3)
    try:
        first = None
        for i in range(10):
            out = svc.render(f"s{i}", messages=_msgs(f"m{i}", 3), budget=500)
            first = first or out
            assert svc.loaded_sessions() <= 3
        again = svc.render("s0", budget=500)  # evicted long ago; reloaded from the file
        assert again.messages == first.messages and again.visible == first.visible
        assert len(svc.graph._sessions) <= 3
    finally:
        svc.close()


def _open_service(path: str, q: multiprocessing.Queue) -> None:  # pragma: no cover - runs in a child
    try:
        ContextService(path, embedder=HashingEmbedder(dim=8))
        q.put("opened")
    except LockedError as e:
        q.put(f"locked: {e}")


def test_two_services_on_one_graph_refuse(tmp_path):
    path = str(tmp_path / "g.sqlite")
    svc = ContextService(path, embedder=HashingEmbedder(dim=8))
    try:
        with pytest.raises(LockedError, match="in use by pid"):
            ContextService(path, embedder=HashingEmbedder(dim=8))
        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_open_service, args=(path, q))
        p.start()
        p.join(60)
        msg = q.get(timeout=5)
        assert msg.startswith("locked:") and "pid" in msg
    finally:
        svc.close()
    ContextService(path, embedder=HashingEmbedder(dim=8)).close()  # released on close


def test_second_serve_process_exits_with_holder(tmp_path):
    graph = str(tmp_path / "g.sqlite")
    svc = ContextService(graph, embedder=HashingEmbedder(dim=8))
    try:
        proc = subprocess.run([sys.executable, "-m", "contextrender.cli", "serve", "--graph", graph, "--embedding",
                               "hashing", "--port", str(free_port())], capture_output=True, text=True, cwd=REPO,
                              timeout=120)
        assert proc.returncode == 2 and "in use by pid" in proc.stderr
    finally:
        svc.close()


def test_nonpositive_budgets_refused_up_front(tmp_path):
    s = ContextGraph().session("b")
    s.extend(_msgs("b", 1))
    for name in METHODS:
        policy = build_policy(method_config(name), embedder=HashingEmbedder(dim=16))
        for bad in (0, -5):
            with pytest.raises(ValueError, match="positive"):
                policy.render(s, bad)
    with pytest.raises(ValueError, match="positive"):
        ContextRender(embedder=HashingEmbedder(dim=16)).select(s, 0)
    with pytest.raises(ValueError, match="positive"):
        ContextService(":memory:", embedder=HashingEmbedder(dim=8), default_budget=0)
    with pytest.raises(ValueError, match="positive"):
        create_proxy_app("http://127.0.0.1:9/v1", budget=-1, embedding="hashing")
    for cmd in (["serve"], ["proxy", "--upstream", "http://127.0.0.1:9/v1"]):
        proc = subprocess.run([sys.executable, "-m", "contextrender.cli", *cmd, "--budget", "0", "--graph",
                               str(tmp_path / "x.sqlite")], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert proc.returncode == 2 and "positive integer" in proc.stderr
